"""Settings -> the streams processors' configs (StreamsConfig, the gate's, the mutator's), and what
the streams worker would refuse at start.

Apart from the faust edge (infra/streams_worker.py) so that `sepa-eval up` and `promote` can check
and build the same configs without importing the edge, and the edge imports the supervisor
(infra/processes.py: the broker it resolves) without a circle back.
"""

from __future__ import annotations

from infra.settings import Settings
from streams.app import EXACTLY_ONCE_REFUSED, StreamsConfig
from streams.exceptions import ConfigError
from streams.failures.collector import CollectorConfig
from streams.failures.summaries import LlmSummarizer
from streams.gate.gate import GateConfig
from streams.gate.sweeps import SweeperConfig
from streams.mutations.agent import MutatorConfig
from streams.mutations.chooser import ChooserConfig
from streams.mutations.operator_config import OperatorConfig
from streams.mutations.paraphrasers import LLMParaphraser


def processing_guarantee(settings: Settings) -> str:
    """``settings.streams_processing_guarantee``, refused where it cannot work (streams/app.py says why)."""
    guarantee = settings.streams_processing_guarantee
    if guarantee == "exactly_once":
        raise ConfigError(f"streams_processing_guarantee (SEPA_STREAMS_PROCESSING_GUARANTEE): {EXACTLY_ONCE_REFUSED}")
    return guarantee


def llm_summarizer(settings: Settings) -> LlmSummarizer | None:
    """The cluster-summary model the settings name (``openai_base_url`` and ``openai_model``), or
    None for feature summaries. Builds the OpenAI client."""
    if settings.openai_base_url is None and settings.openai_model is None:
        return None
    if not settings.openai_base_url or not settings.openai_model:
        raise ConfigError(f"LLM cluster summaries need both openai_base_url (SEPA_OPENAI_BASE_URL) and "
                          f"openai_model (SEPA_OPENAI_MODEL), got {settings.openai_base_url!r} and "
                          f"{settings.openai_model!r}")
    if settings.openai_api_key is None:
        raise ConfigError(f"LLM cluster summaries from {settings.openai_base_url} need an API key: set "
                          "SEPA_OPENAI_API_KEY or OPENAI_API_KEY (any value for a server that checks none)")
    import openai

    client = openai.OpenAI(base_url=settings.openai_base_url,
                           api_key=settings.openai_api_key.get_secret_value(), max_retries=1)
    return LlmSummarizer(client, model=settings.openai_model)


def check_settings(settings: Settings) -> None:
    """What the worker would refuse at start, for `sepa-eval up` to refuse before starting anything."""
    processing_guarantee(settings)
    llm_summarizer(settings)


def mutator_config(settings: Settings) -> MutatorConfig:
    """The mutator's config: instructions paraphrased by the OpenAI-compatible model the settings
    name (openai_base_url, openai_model), else by the deterministic templates."""
    operators = OperatorConfig()
    if settings.openai_base_url and settings.openai_model and settings.openai_api_key is not None:
        import openai

        client = openai.OpenAI(base_url=settings.openai_base_url,
                               api_key=settings.openai_api_key.get_secret_value(), max_retries=1)
        operators = OperatorConfig(paraphraser=LLMParaphraser(client, settings.openai_model))
    return MutatorConfig(chooser=ChooserConfig(operators=operators))


def gate_config(settings: Settings) -> GateConfig:
    """The promotion gate's config: the one the worker's gate and `sepa-eval promote` decide with
    (the same config gives the same decisions, event for event)."""
    return GateConfig(semantic_required=settings.judge_configured, verdict_timeout_s=settings.gate_verdict_timeout_s)


def served_models(settings: Settings) -> frozenset[str]:
    """The models the rollout workers serve: their registry file's."""
    from producers.sim.models import load_models

    return frozenset(m.model_id for m in load_models(settings.models_file))


def streams_config(settings: Settings, bootstrap_servers: str, **overrides) -> StreamsConfig:
    """The StreamsConfig the settings give, for the broker the edge resolved."""
    values = {"mutator": mutator_config(settings), "run_mutator": True, "run_gate": True, "run_sweeper": True,
              "collector": CollectorConfig(fragile_successes=settings.cluster_fragile_successes),
              "gate": gate_config(settings),
              "sweeper": SweeperConfig(sweep_seeds=settings.sweep_seeds, served_models=served_models(settings)),
              **overrides}
    return StreamsConfig(bootstrap_servers=bootstrap_servers, topic_prefix=settings.topic_prefix,
                         processing_guarantee=processing_guarantee(settings),
                         broker_session_timeout_s=settings.session_timeout_ms / 1000.0,
                         data_dir=settings.memory_dir / "faust", web_enabled=settings.streams_web, **values)
