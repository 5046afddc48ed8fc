from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.settings import load_settings, settings_environ


def test_environment_and_file_and_overrides_in_order(tmp_path):
    config = tmp_path / "sepa.toml"
    config.write_text('topic_prefix = "file."\nsink_batch_max = 10\n')
    settings = load_settings(config_file=config, environ={"SEPA_SINK_BATCH_MAX": "20"}, memory_dir=Path("/m"))
    assert settings.topic_prefix == "file."
    assert settings.sink_batch_max == 20
    assert settings.memory_dir == Path("/m")
    assert settings.embedded_broker and settings.embedded_store


def test_bad_values_are_quoted():
    with pytest.raises(ValidationError, match="ftp://x"):
        load_settings(environ={"SEPA_CLICKHOUSE_URL": "ftp://x"})
    with pytest.raises(ValidationError, match="topic_prefix"):
        load_settings(environ={"SEPA_TOPIC_PREFIX": "bad prefix/"})


def test_settings_are_frozen():
    settings = load_settings(environ={})
    with pytest.raises(ValidationError):
        settings.topic_prefix = "x"


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.toml"):
        load_settings(config_file=tmp_path / "nope.toml", environ={})


def test_the_streams_processing_guarantee_is_a_setting():
    assert load_settings(environ={}).streams_processing_guarantee == "at_least_once"
    settings = load_settings(environ={"SEPA_STREAMS_PROCESSING_GUARANTEE": "exactly_once"})
    assert settings.streams_processing_guarantee == "exactly_once"
    with pytest.raises(ValidationError, match="at_most_once"):
        load_settings(environ={"SEPA_STREAMS_PROCESSING_GUARANTEE": "at_most_once"})


def test_the_openai_key_falls_back_to_openai_api_key_and_stays_secret():
    assert load_settings(environ={}).openai_api_key is None
    settings = load_settings(environ={"OPENAI_API_KEY": "sk-plain"})
    assert settings.openai_api_key.get_secret_value() == "sk-plain"
    assert "sk-plain" not in repr(settings) and "sk-plain" not in settings.model_dump_json()
    ours = load_settings(environ={"OPENAI_API_KEY": "sk-plain", "SEPA_OPENAI_API_KEY": "sk-ours"})
    assert ours.openai_api_key.get_secret_value() == "sk-ours"
    # a child process (the faust worker) gets the key itself, not the mask
    assert settings_environ(settings)["SEPA_OPENAI_API_KEY"] == "sk-plain"
    assert load_settings(environ=settings_environ(settings)) == settings


def test_every_setting_reaches_a_child_through_its_environment_alone(tmp_path):
    settings = load_settings(environ={"SEPA_STREAMS_WEB": "true", "SEPA_STREAMS_WEB_PORT": "7001",
                                      "SEPA_BROKER_TIMEOUT_S": "2.5", "SEPA_ROLLOUT_PROCESSES": "3",
                                      "SEPA_SCHEMA_REGISTRY_URL": "http://127.0.0.1:8081"},
                             memory_dir=tmp_path)
    assert (settings.streams_web, settings.streams_web_port, settings.broker_timeout_s) == (True, 7001, 2.5)
    assert load_settings(environ=settings_environ(settings)) == settings
    assert load_settings(environ={}).streams_web is False  # faust's web server is off unless asked for


def test_a_child_gets_the_settings_and_no_other_sepa_variable(tmp_path, monkeypatch):
    from infra.supervisor import child_environ

    config = tmp_path / "sepa.toml"
    config.write_text('topic_prefix = "file."\n')
    monkeypatch.setenv("SEPA_CONFIG", str(config))
    monkeypatch.setenv("SEPA_NOT_A_SETTING", "x")
    settings = load_settings(memory_dir=Path("rel"))
    env = child_environ(settings, "127.0.0.1:9")
    assert "SEPA_CONFIG" not in env and "SEPA_NOT_A_SETTING" not in env
    child = load_settings(environ=env)
    assert child.topic_prefix == "file." and child.bootstrap_servers == "127.0.0.1:9"
    assert child.memory_dir == Path("rel").resolve()


def test_nonsense_is_refused_naming_the_setting():
    with pytest.raises(ValidationError, match="broker_timeout_s"):
        load_settings(environ={"SEPA_BROKER_TIMEOUT_S": "0"})
    with pytest.raises(ValidationError, match="rollout_processes"):
        load_settings(environ={"SEPA_ROLLOUT_PROCESSES": "0"})
