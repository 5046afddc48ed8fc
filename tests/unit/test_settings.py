from pathlib import Path

import pytest
from pydantic import ValidationError

from infra.settings import load_settings


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
