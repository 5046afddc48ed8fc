"""One frozen settings object, built at the edge (the CLI) and passed down.

Sources, highest first: explicit overrides (CLI flags), environment variables (``SEPA_*``), a TOML
file (``--config`` / ``SEPA_CONFIG``), defaults. Nothing else in the code reads the environment.
``openai_api_key`` falls back to ``OPENAI_API_KEY`` when none of those sets it.

Mode selection: no ``bootstrap_servers`` -> the project starts its embedded Tansu broker; no
``clickhouse_url`` -> chDB in ``<memory_dir>/evidence``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator


class Settings(BaseModel):
    """Validated on construction; a bad value is quoted in the error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    memory_dir: Path = Field(Path("eval_memory"), description="pids, ports, chDB store, keyframes")
    topic_prefix: str = "sepa."
    bootstrap_servers: str | None = Field(None, description="Kafka bootstrap; unset = embedded Tansu")
    clickhouse_url: str | None = Field(None, description="http(s)://user:pw@host:port; unset = chDB")
    clickhouse_database: str = "sepa"
    schema_registry_url: str | None = None
    # Tansu joins a group in max(1 s, session.timeout/2): librdkafka's 45 s default means 23 s joins.
    session_timeout_ms: int = Field(6000, ge=1000)
    sink_batch_max: int = Field(20000, ge=1, description="messages per ClickHouse insert")
    sink_linger_ms: int = Field(200, ge=0, description="wait this long to fill a batch")
    store_endpoint_port: int = Field(0, ge=0, le=65535, description="owner endpoint port; 0 = free port")
    # Every command that needs the broker asks it first and gives up after this long, naming it.
    broker_timeout_s: float = Field(5.0, gt=0, description="how long a command waits for the broker to answer")
    # `up` waits this long for each child (pipeline, streams worker, rollout worker) to say it is ready.
    ready_timeout_s: float = Field(180.0, gt=0, description="how long `up` waits for its processes to be ready")
    rollout_processes: int = Field(2, ge=1, description="simulator processes of the rollout worker `up` starts")
    libero_worker: bool = Field(True, description="`up` also starts the LIBERO worker when its venv is set up")
    # faust's HTTP stats server: off unless asked for; on, it binds 127.0.0.1 (never faust's 0.0.0.0:6066).
    streams_web: bool = Field(False, description="the streams worker's faust web server, on 127.0.0.1")
    streams_web_port: int = Field(0, ge=0, le=65535, description="its port when on; 0 = a free port")
    # exactly_once is refused (streams/app.py says why): Tansu rejects aiokafka's InitProducerId v0,
    # and on Apache Kafka faust-streaming 0.15.3 leaves the moments in transactions that never
    # commit. at_least_once is lossless across restarts and re-emitted moments keep their ids.
    streams_processing_guarantee: Literal["at_least_once", "exactly_once"] = Field(
        "at_least_once", description="the faust worker's processing guarantee")
    # Cluster summaries from an OpenAI-compatible chat model: both set = on, neither = feature summaries.
    openai_base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1")
    openai_model: str | None = None
    openai_api_key: SecretStr | None = Field(None, description="unset = OPENAI_API_KEY")
    # The semantic critic's VLM judge (an OpenAI-compatible endpoint): both set = the gate requires
    # its verdict; neither = the critic says "not run" and the gate records semantic evidence missing.
    judge_base_url: str | None = Field(None, description="OpenAI-compatible endpoint of the VLM judge")
    judge_model: str | None = None
    judge_api_key: SecretStr | None = Field(None, description="unset = OPENAI_API_KEY")
    judge_timeout_s: float = Field(60.0, gt=0, description="per judge call")
    judge_threshold: float = Field(0.8, gt=0, le=1, description="a judgment passes at score >= this")
    # The clusterer also takes in successes with failure moments (fragile wins): at a saturated
    # benchmark they are most of what there is to mine. `run` waits for them too.
    cluster_fragile_successes: bool = True
    # The gate: a verdict missing this long after the proposal defers the candidate.
    gate_verdict_timeout_s: float = Field(1800.0, gt=0, description="s")
    # Sweeps (seeds 0..sweep_seeds-1 per model x active scenario): `run`'s default, `eval`'s default,
    # and what the streams worker's sweeper asks for when a new model version is registered. Keep one
    # value for all three: a sweep of other seeds is another request.
    sweep_seeds: int = Field(20, ge=1, description="seeds per model x active scenario in a sweep")
    # The model registry file every process reads (run, eval, sync-models, rollout, the rollout worker).
    models_file: Path | None = Field(None, description="models.yaml; unset = producers/sim/configs/models.yaml")

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_topic_safe(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not set(value) <= allowed:
            raise ValueError(f"topic_prefix {value!r} has characters Kafka topic names forbid")
        return value

    @field_validator("clickhouse_url")
    @classmethod
    def _url_scheme(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://", "chdb://")):
            raise ValueError(f"clickhouse_url {value!r} must start with http://, https:// or chdb://")
        return value

    @model_validator(mode="after")
    def _judge_complete(self) -> Settings:
        if (self.judge_base_url is None) != (self.judge_model is None):
            raise ValueError(f"the VLM judge needs both judge_base_url (SEPA_JUDGE_BASE_URL) and judge_model "
                             f"(SEPA_JUDGE_MODEL), got {self.judge_base_url!r} and {self.judge_model!r}")
        return self

    @property
    def judge_configured(self) -> bool:
        return self.judge_base_url is not None

    @property
    def embedded_broker(self) -> bool:
        return self.bootstrap_servers is None

    @property
    def run_dir(self) -> Path:
        return self.memory_dir / "run"

    @property
    def chdb_path(self) -> Path:
        return self.memory_dir / "evidence"

    @property
    def embedded_store(self) -> bool:
        return self.clickhouse_url is None or self.clickhouse_url.startswith("chdb://")

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"


def settings_environ(settings: Settings) -> dict[str, str]:
    """The SEPA_* variables that reproduce these settings in a child process: the one way settings
    reach the pipeline, the streams worker and the rollout worker (each calls load_settings).
    Secrets are passed in clear: the child needs them."""
    return {f"SEPA_{name.upper()}": value.get_secret_value() if isinstance(value, SecretStr) else str(value)
            for name, value in settings.model_dump().items() if value is not None}


def child_settings(settings: Settings, bootstrap: str) -> Settings:
    """The settings a child process is given: the broker resolved, and the paths absolute, since
    children run in the run dir (a relative memory dir or models file would move)."""
    return settings.model_copy(update={"bootstrap_servers": bootstrap, "memory_dir": settings.memory_dir.resolve(),
                                       "models_file": settings.models_file and settings.models_file.resolve()})


def load_settings(config_file: Path | None = None, environ: dict[str, str] | None = None,
                  **overrides) -> Settings:
    """The only place that reads the environment and the config file."""
    environ = dict(os.environ if environ is None else environ)
    config_file = config_file or (Path(environ["SEPA_CONFIG"]) if environ.get("SEPA_CONFIG") else None)
    values: dict = {}
    if config_file is not None:
        if not config_file.exists():
            raise FileNotFoundError(f"config file {config_file} does not exist")
        values.update(tomllib.loads(config_file.read_text()))
    for name in Settings.model_fields:
        key = f"SEPA_{name.upper()}"
        if key in environ:
            values[name] = environ[key]
    values.update({k: v for k, v in overrides.items() if v is not None})
    for key in ("openai_api_key", "judge_api_key"):
        if values.get(key) is None and environ.get("OPENAI_API_KEY"):
            values[key] = environ["OPENAI_API_KEY"]  # the variable OpenAI's tools use
    return Settings.model_validate(values)
