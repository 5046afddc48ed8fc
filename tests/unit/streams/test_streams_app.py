"""The faust app factory: settings the notes require, topics as raw bytes, agents per config.
Builds apps only; connects to nothing."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from infra.settings import Settings
from streams.exceptions import ConfigError


@pytest.fixture(scope="module")
def app_module():
    return importlib.import_module("streams.app")


def config(app_module, tmp_path: Path, **over):
    return app_module.StreamsConfig(bootstrap_servers="127.0.0.1:9092,127.0.0.1:9093", topic_prefix="x.",
                                    data_dir=tmp_path / "faust", **over)


def test_defaults_follow_the_platform_notes(app_module, tmp_path):
    app = app_module.make_app(config(app_module, tmp_path))
    assert app.conf.broker_session_timeout == 6.0
    assert app.conf.processing_guarantee.value == "at_least_once"
    assert [str(u) for u in app.conf.broker] == ["kafka://127.0.0.1:9092", "kafka://127.0.0.1:9093"]
    assert app.conf.topic_allow_declare is False and app.conf.web_enabled is False
    assert set(app.agents) == {"failure-detector", "failure-clusterer"}
    detector = app.agents["failure-detector"]
    assert set(detector.channel.topics) == {"x.rollout.steps", "x.rollout.episodes"}
    assert detector.channel.value_serializer == "raw" and detector.channel.key_serializer == "raw"
    assert set(app.agents["failure-clusterer"].channel.topics) == {"x.failures.moments", "x.rollout.episodes"}
    assert (tmp_path / "faust").is_dir()


def test_exactly_once_is_selectable_and_nonsense_is_refused(app_module, tmp_path):
    app = app_module.make_app(config(app_module, tmp_path, processing_guarantee="exactly_once"))
    assert app.conf.processing_guarantee.value == "exactly_once"
    with pytest.raises(ConfigError, match="at_most_once"):
        config(app_module, tmp_path, processing_guarantee="at_most_once")
    with pytest.raises(ConfigError, match="bootstrap"):
        app_module.StreamsConfig(bootstrap_servers="")


def test_a_detector_only_worker_has_no_clusterer(app_module, tmp_path):
    app = app_module.make_app(config(app_module, tmp_path, run_clusterer=False))
    assert set(app.agents) == {"failure-detector"}


def test_config_from_project_settings(app_module, tmp_path):
    settings = Settings(memory_dir=tmp_path, topic_prefix="p.", session_timeout_ms=4000)
    cfg = app_module.StreamsConfig.from_settings(settings, "127.0.0.1:1")
    assert (cfg.topic_prefix, cfg.broker_session_timeout_s, cfg.data_dir) == ("p.", 4.0, tmp_path / "faust")


def test_importing_the_module_builds_no_app(app_module):
    assert app_module._app is None
    with pytest.raises(AttributeError):
        app_module.not_there  # noqa: B018
