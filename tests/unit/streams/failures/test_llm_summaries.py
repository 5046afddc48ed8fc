"""The LLM cluster-summary hook end to end, without the network: settings -> openai client ->
LlmSummarizer -> the clusterer agent's summary step, against an OpenAI-compatible server on
127.0.0.1 started by the test."""

from __future__ import annotations

import asyncio
import logging

import pytest
from analysed_episodes import KINDS, analysed_episodes, is_failure, kind_of
from openai_stub_server import OpenAIStub
from test_cluster_stage import CODEC, PREFIX, Clock, wire

from infra.settings import Settings
from infra.streams_config import llm_summarizer
from streams.exceptions import ConfigError
from streams.failures.agents import llm_summaries
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer
from streams.failures.collector import ClusterStage, CollectorConfig
from streams.failures.embedding import EmbeddingConfig
from streams.failures.summaries import FeatureDescriber


def settings_for(stub: OpenAIStub, **over) -> Settings:
    return Settings(openai_base_url=stub.base_url, openai_model="stub-model", openai_api_key="test-key", **over)


def clustered_stage() -> tuple[ClusterStage, list[dict]]:
    """A cluster stage that has formed one slip cluster and published its feature summary."""
    ecfg = EmbeddingConfig()
    clusterer = OnlineFailureClusterer(ClustererConfig(recluster_every=10, recluster_fraction=10.0),
                                       FeatureDescriber(ecfg), "run-s")
    stage = ClusterStage(clusterer, ecfg, CollectorConfig(), PREFIX, "run-s", clock=Clock(), want_llm_summaries=True)
    slippery = [e for e in analysed_episodes(120, seed=31, failure_share=1.0)
                if kind_of(e) == KINDS[0] and is_failure(e)][:10]
    out = stage.process(wire(slippery))
    updates = [e for e in map(CODEC.decode, (o.value for o in out)) if e["envelope"]["event_type"] == "ClusterUpdated"]
    return stage, updates


def test_summaries_come_from_the_configured_server():
    reply = "Lifted cubes slip out of the closed gripper and drop."
    with OpenAIStub(reply=reply) as stub:
        llm = llm_summarizer(settings_for(stub))
        stage, updates = clustered_stage()
        assert [u["summary_source"] for u in updates] == ["features"]
        out = asyncio.run(llm_summaries(stage, llm))
    (event,) = [CODEC.decode(o.value) for o in out]
    assert (event["summary_source"], event["summary"]) == ("llm", reply)
    assert event["cluster_id"] == updates[0]["cluster_id"] and event["size"] == updates[0]["size"] == 10
    assert event["envelope"]["event_id"] != updates[0]["envelope"]["event_id"]
    # the next position: after the update and the 10 re-assignments it led to
    assert event["position"] == updates[0]["position"] + 11 == stage.clusterer.position - 1
    assert event["revision"] == updates[0]["revision"]
    ((headers, body),) = stub.requests
    assert body["model"] == "stub-model" and headers["authorization"] == "Bearer test-key"
    assert updates[0]["summary"] in body["messages"][-1]["content"]  # the feature summary is the prompt's ground


def test_a_server_error_keeps_the_feature_summary(caplog):
    with OpenAIStub(status=500) as stub:
        llm = llm_summarizer(settings_for(stub))
        stage, updates = clustered_stage()
        with caplog.at_level(logging.WARNING, logger="sepa.streams.failures.agents"):
            out = asyncio.run(llm_summaries(stage, llm))
    assert out == [] and [u["summary_source"] for u in updates] == ["features"]
    assert len(stub.requests) >= 1 and "keeping the feature summary" in caplog.text
    assert "stub-model" in caplog.text and "InternalServerError" in caplog.text


def test_without_a_model_configured_summaries_stay_features_only():
    assert llm_summarizer(Settings()) is None


@pytest.mark.parametrize("over,named", [
    ({"openai_model": None}, "SEPA_OPENAI_MODEL"),
    ({"openai_api_key": None}, "OPENAI_API_KEY"),
])
def test_half_a_configuration_is_refused_with_the_setting_named(over, named):
    settings = Settings(openai_base_url="http://127.0.0.1:9/v1", openai_model="m", openai_api_key="k")
    with pytest.raises(ConfigError, match=named):
        llm_summarizer(settings.model_copy(update=over))
