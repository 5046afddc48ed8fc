"""The streams worker's edge (infra/streams_worker.py): settings -> StreamsConfig -> make_app with
the edge's codec, the summary model and faust's web server as the settings say. Builds apps only;
connects to nothing (the real worker process is in tests/integration/test_streams_worker_process.py)."""

from __future__ import annotations

import importlib

import pytest

from infra.settings import Settings
from schemas.codec import Codec
from schemas.registry import RegistrySchemaIds
from streams.exceptions import ConfigError


@pytest.fixture(scope="module")
def edge():
    return importlib.import_module("infra.streams_worker")


def test_config_from_project_settings(edge, tmp_path):
    settings = Settings(memory_dir=tmp_path, topic_prefix="p.", session_timeout_ms=4000)
    cfg = edge.streams_config(settings, "127.0.0.1:1")
    assert (cfg.topic_prefix, cfg.broker_session_timeout_s, cfg.data_dir) == ("p.", 4.0, tmp_path / "faust")
    assert cfg.bootstrap_servers == "127.0.0.1:1" and cfg.web_enabled is False


def test_the_processing_guarantee_comes_from_the_settings(edge, tmp_path):
    external = Settings(memory_dir=tmp_path, bootstrap_servers="127.0.0.1:1",
                        streams_processing_guarantee="exactly_once")
    with pytest.raises(ConfigError, match="SEPA_STREAMS_PROCESSING_GUARANTEE.*never commit"):
        edge.streams_config(external, "127.0.0.1:1")
    embedded = Settings(memory_dir=tmp_path, streams_processing_guarantee="exactly_once")
    with pytest.raises(ConfigError, match="SEPA_STREAMS_PROCESSING_GUARANTEE.*Tansu"):
        edge.streams_config(embedded, "127.0.0.1:9092")  # the address `up` resolved
    assert edge.streams_config(Settings(memory_dir=tmp_path), "127.0.0.1:1").processing_guarantee == "at_least_once"


def test_up_refuses_exactly_once_before_starting_anything(tmp_path):
    from infra.supervisor import up

    with pytest.raises(ConfigError, match="streams_processing_guarantee"):
        up(Settings(memory_dir=tmp_path, streams_processing_guarantee="exactly_once"))
    assert not (tmp_path / "run" / "state.json").exists()


def test_the_edge_wires_the_llm_summarizer_from_the_environment(edge, tmp_path, monkeypatch):
    for name, value in {"SEPA_BOOTSTRAP_SERVERS": "127.0.0.1:1", "SEPA_MEMORY_DIR": str(tmp_path),
                        "SEPA_OPENAI_BASE_URL": "http://127.0.0.1:1/v1", "SEPA_OPENAI_MODEL": "m",
                        "OPENAI_API_KEY": "k"}.items():
        monkeypatch.setenv(name, value)
    app = edge.app_from_environment()
    assert app.failure_cluster_stage.want_llm_summaries is True
    monkeypatch.delenv("SEPA_OPENAI_MODEL")
    monkeypatch.delenv("SEPA_OPENAI_BASE_URL")
    assert edge.app_from_environment().failure_cluster_stage.want_llm_summaries is False


def test_the_codec_built_at_the_edge_is_the_one_every_stage_uses(edge, tmp_path, monkeypatch):
    codec = Codec(RegistrySchemaIds("http://127.0.0.1:1"))
    app = edge.build_app(Settings(memory_dir=tmp_path), "127.0.0.1:1", codec)
    assert app.failure_detector_stage.codec is codec and app.failure_cluster_stage.codec is codec
    # and from the environment: a registry URL in the settings gives registry ids
    monkeypatch.setenv("SEPA_BOOTSTRAP_SERVERS", "127.0.0.1:1")
    monkeypatch.setenv("SEPA_MEMORY_DIR", str(tmp_path))
    monkeypatch.setenv("SEPA_SCHEMA_REGISTRY_URL", "http://127.0.0.1:2")
    stage_codec = edge.app_from_environment().failure_detector_stage.codec
    assert isinstance(stage_codec.schema_ids, RegistrySchemaIds) and stage_codec.schema_ids.url == "http://127.0.0.1:2"


def faust_worker_command_options(app, **given) -> None:
    """What `faust worker` does to the app's web settings before it starts it (faust/cli/worker.py)."""
    from faust.cli.worker import worker

    command = worker.__new__(worker)
    command.app = app
    options = {"with_web": True, "web_port": None, "web_bind": None, "web_host": None, "web_transport": None}
    command._init_worker_options(**{**options, **given})


def test_faust_web_server_stays_off_whatever_the_worker_command_says(edge, tmp_path):
    app = edge.build_app(Settings(memory_dir=tmp_path), "127.0.0.1:1", Codec())
    faust_worker_command_options(app)  # faust's default: --with-web
    assert app.conf.web_enabled is True  # faust's command set it ...
    assert app.boot_strategy._should_enable_web() is False  # ... and the app starts no web server
    assert list(app.boot_strategy.web_server()) == []


def test_faust_web_server_when_enabled_binds_localhost_on_a_free_port(edge, tmp_path):
    app = edge.build_app(Settings(memory_dir=tmp_path, streams_web=True), "127.0.0.1:1", Codec())
    faust_worker_command_options(app)
    assert app.boot_strategy._should_enable_web() is True and list(app.boot_strategy.web_server())
    assert app.conf.web_bind == "127.0.0.1" and app.conf.web_port not in (0, 6066)
    fixed = edge.build_app(Settings(memory_dir=tmp_path, streams_web=True, streams_web_port=7123), "127.0.0.1:1",
                           Codec())
    assert fixed.conf.web_port == 7123 and str(fixed.conf.canonical_url) == "http://127.0.0.1:7123"


def test_importing_the_module_builds_no_app(edge):
    assert edge._app is None
    with pytest.raises(AttributeError):
        edge.not_there  # noqa: B018
