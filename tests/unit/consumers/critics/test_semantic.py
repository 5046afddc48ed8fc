"""The semantic VLM judge against a local OpenAI-compatible server that judges well or misbehaves."""

from __future__ import annotations

import hashlib
import json
import time

import numpy as np
import openai
import pytest
from openai_judge_server import OpenAIJudgeServer

from consumers.critics.exceptions import ConfigError, CriticInputError
from consumers.critics.semantic import (
    BLANK_CONTROL,
    FENCED_PARSER,
    JUDGMENT,
    PARSER,
    UNRELATED_CONTROL,
    ReplyError,
    SemanticConfig,
    SemanticJudge,
    circular_bias,
    parse_reply,
    select_frames,
)
from producers.keyframes import KeyframeStore

TASK = "lift the red cube"
MODEL = "judge-vl"


def frames(store: KeyframeStore, count: int = 3, size: tuple[int, int] = (48, 64)) -> list[str]:
    """Keyframes of a red square rising over a grey table, stored by content."""
    out = []
    for i in range(count):
        img = np.full((*size, 3), 90, np.uint8)
        y = size[0] - 12 - 6 * i
        img[y:y + 10, 20:30] = (200, 30, 30)
        out.append(store.put(img))
    return out


@pytest.fixture
def store(tmp_path) -> KeyframeStore:
    return KeyframeStore(tmp_path / "keyframes")


@pytest.fixture
def server():
    with OpenAIJudgeServer(task=TASK, model=MODEL) as s:
        yield s


def judge_for(server: OpenAIJudgeServer, store: KeyframeStore, **over) -> SemanticJudge:
    cfg = SemanticConfig(endpoint=server.base_url, model=MODEL, **({"timeout_s": 5.0} | over))
    client = openai.OpenAI(base_url=server.base_url, api_key="test-key", max_retries=0)
    return SemanticJudge(client, cfg, store)


def evidence(verdict) -> dict:
    return json.loads(verdict.fields()["evidence_json"])


# -- a good judge ----------------------------------------------------------------------------------

def test_a_good_judge_passes_and_every_call_is_evidenced(server, store):
    shas = frames(store)
    v = judge_for(server, store).judge(TASK, shas, ["scripted-fine", "scripted-clumsy"])
    assert (v.ran, v.passed, v.score, v.backend) == (True, True, 0.92, "openai-compatible")
    assert v.reason == "score 0.9200 >= threshold 0.8; controls 0.0500 (blank), 0.0500 (unrelated task) below it"
    assert server.roles() == [JUDGMENT, BLANK_CONTROL, UNRELATED_CONTROL]
    calls = evidence(v)["calls"]
    assert [c["role"] for c in calls] == [JUDGMENT, BLANK_CONTROL, UNRELATED_CONTROL]
    for call, request in zip(calls, server.requests, strict=True):
        # the exact frames sent, by hash and size, as the server received them
        assert [(f["sha256"], f["width"], f["height"]) for f in call["frames"]] == \
            [(i["sha256"], i["width"], i["height"]) for i in request.images]
        assert call["prompt_sha256"] == hashlib.sha256(
            json.dumps([request.system, request.text], sort_keys=True, separators=(",", ":"),
                       ensure_ascii=False).encode()).hexdigest()
        assert call["response_sha256"] == hashlib.sha256(request.reply).hexdigest()
        assert (call["requested_model"], call["served_model"], call["finish_reason"]) == (MODEL, MODEL, "stop")
        assert call["usage"]["total_tokens"] == 960 and call["latency_s"] >= 0.0
        assert call["provider_request_id"].startswith("req-") and call["parser"] == PARSER and call["ok"]
        assert request.body["model"] == MODEL and request.body["temperature"] == 0.0
        assert request.headers["authorization"] == "Bearer test-key"
    assert [f["sha256"] for f in calls[0]["frames"]] == shas  # real frames, byte for byte
    assert all(i["uniform"] for i in server.requests[1].images)  # blank frames of the same sizes
    assert calls[1]["frames"][0]["width"] == 64 and calls[1]["frames"][0]["height"] == 48
    assert calls[2]["task"] == SemanticConfig().unrelated_task and calls[2]["frames"] == calls[0]["frames"]
    # one prompt: the controls differ from the judgment only where the task is
    assert server.requests[1].text == server.requests[0].text
    assert server.requests[2].text.replace(json.dumps(SemanticConfig().unrelated_task), json.dumps(TASK)) == \
        server.requests[0].text
    # identify, then judge
    text = server.requests[0].text
    assert text.index("identify") < text.index("judge:") < text.index("Task:")
    assert calls[0]["provider_success"] is True and calls[0]["provider_success_matches_score_gate"] is True


def test_the_evidence_holds_no_endpoint_key_or_image_bytes(server, store):
    v = judge_for(server, store).judge(TASK, frames(store))
    text = v.fields()["evidence_json"]
    assert server.base_url not in text and "127.0.0.1" not in text
    assert "test-key" not in text and "base64" not in text and str(store.root) not in text
    assert evidence(v)["rubric_sha256"] == hashlib.sha256(SemanticConfig().rubric.encode()).hexdigest()


def test_a_fenced_json_object_is_deframed_and_recorded_as_such(server, store):
    server.behaviour = "fenced"
    v = judge_for(server, store).judge(TASK, frames(store))
    assert (v.ran, v.passed) == (True, True)
    assert {c["parser"] for c in evidence(v)["calls"]} == {FENCED_PARSER}


def test_a_low_score_fails_without_running_the_controls(server, store):
    server.score = 0.5
    v = judge_for(server, store).judge(TASK, frames(store))
    assert (v.ran, v.passed, v.score) == (True, False, 0.5)
    assert v.reason.startswith("score 0.5000 < threshold 0.8 (controls not run")
    assert server.roles() == [JUDGMENT]


@pytest.mark.parametrize("score,passed", [(0.79995, True), (0.79994, False), (0.8, True)])
def test_the_gate_uses_the_score_rounded_to_4_decimals(server, store, score, passed):
    server.score = score
    v = judge_for(server, store).judge(TASK, frames(store))
    assert v.passed is passed and v.score == round(score, 4)


def test_the_models_own_boolean_is_kept_but_never_decides(server, store):
    server.behaviour = "good"
    judge = judge_for(server, store, threshold=0.95)  # 0.92 fails the gate, though the server says completed
    v = judge.judge(TASK, frames(store))
    call = evidence(v)["calls"][0]
    assert v.passed is False
    assert (call["provider_success"], call["provider_success_matches_score_gate"]) == (True, False)
    server.behaviour = "no_boolean"
    call = evidence(judge_for(server, store).judge(TASK, frames(store)))["calls"][0]
    assert (call["provider_success"], call["provider_success_matches_score_gate"]) == (None, None)


def test_frames_beyond_the_limit_are_sampled_evenly_with_first_and_last(server, store):
    shas = frames(store, count=10)
    v = judge_for(server, store, max_frames=4).judge(TASK, shas)
    assert evidence(v)["sampling"] == {"strategy": "keyframes-even", "available": 10, "selected": [0, 3, 6, 9],
                                       "coverage_complete": False}
    assert [i["sha256"] for i in server.requests[0].images] == [shas[i] for i in (0, 3, 6, 9)]


# -- controls ----------------------------------------------------------------------------------

def test_a_judge_that_passes_the_controls_is_not_trusted(server, store):
    server.behaviour = "pass_controls"
    v = judge_for(server, store).judge(TASK, frames(store))
    assert (v.ran, v.passed, v.score) == (True, False, 0.92)
    assert v.reason == ("judge not trusted: the blank control scored 0.9200 >= 0.8; the unrelated control scored "
                        "0.9200 >= 0.8 (judgment 0.9200)")


def test_a_judge_that_passes_only_the_unrelated_task_is_not_trusted_either(server, store):
    server.overrides[UNRELATED_CONTROL] = "pass_controls"
    v = judge_for(server, store).judge(TASK, frames(store))
    assert v.passed is False and "the unrelated control scored 0.9200" in v.reason and "blank" not in v.reason


def test_a_failed_control_call_leaves_the_judge_untrusted_and_the_verdict_missing(server, store):
    server.overrides[BLANK_CONTROL] = "malformed"
    v = judge_for(server, store).judge(TASK, frames(store))
    assert (v.ran, v.passed, v.score) == (False, None, None)
    assert v.reason.startswith("failed call (malformed_json) on the blank control:")
    assert server.roles() == [JUDGMENT, BLANK_CONTROL]


# -- misbehaving judges: a failed call, recorded, never a pass, never an exception ----------------

@pytest.mark.parametrize("behaviour,kind", [
    ("refusal", "refusal"),
    ("length", "truncated"),
    ("content_filter", "content_filter"),
    ("no_finish_reason", "finish_reason"),
    ("wrong_model", "served_model_mismatch"),
    ("no_model", "served_model_mismatch"),
    ("malformed", "malformed_json"),
    ("duplicate_keys", "duplicate_keys"),
    ("prose", "prose_around_json"),
    ("trailing", "prose_around_json"),
    ("fence_with_prose", "prose_around_json"),
    ("two_fences", "prose_around_json"),
    ("partial_fence", "prose_around_json"),
    ("non_numeric_score", "wrong_types"),
    ("bool_score", "wrong_types"),
    ("string_boolean", "wrong_types"),
    ("out_of_range", "score_out_of_range"),
    ("nan_score", "malformed_json"),
    ("missing_key", "missing_keys"),
    ("extra_key", "unexpected_keys"),
    ("array", "not_an_object"),
    ("empty", "empty"),
    ("http_500", "http_status"),
    ("garbage_body", "bad_response"),
])
def test_a_misbehaving_judge_is_a_recorded_failed_call(server, store, behaviour, kind):
    server.behaviour = behaviour
    v = judge_for(server, store).judge(TASK, frames(store))
    assert (v.ran, v.passed, v.score) == (False, None, None)
    assert v.reason.startswith(f"failed call ({kind}): ")
    (call,) = evidence(v)["calls"]
    assert (call["ok"], call["failure"], call["role"]) == (False, kind, JUDGMENT)
    assert call["latency_s"] is not None
    if behaviour != "http_500":
        assert call["response_sha256"] == hashlib.sha256(server.requests[0].reply).hexdigest()
    fields = v.fields()
    assert fields["ran"] is False and fields["passed"] is None


def test_a_judge_that_times_out_is_a_failed_call_within_the_timeout(server, store):
    server.behaviour = "timeout"
    started = time.perf_counter()
    v = judge_for(server, store, timeout_s=0.3).judge(TASK, frames(store))
    elapsed = time.perf_counter() - started
    assert (v.ran, v.passed) == (False, None)
    assert v.reason == "failed call (timeout): no answer within 0.3 s"
    assert elapsed < 2.0  # no retry multiplied the wait (max_retries=0)


def test_an_unreachable_endpoint_is_a_failed_call(store):
    with OpenAIJudgeServer(task=TASK) as gone:
        url = gone.base_url
    client = openai.OpenAI(base_url=url, api_key="k", max_retries=0)
    cfg = SemanticConfig(endpoint=url, model=MODEL, timeout_s=2.0)
    v = SemanticJudge(client, cfg, store).judge(TASK, frames(store))
    assert (v.ran, v.passed) == (False, None) and v.reason.startswith("failed call (connection): ")


def test_an_accepted_served_alias_is_not_a_mismatch(server, store):
    server.behaviour = "wrong_model"
    v = judge_for(server, store, served_model_aliases=("other-judge-2",)).judge(TASK, frames(store))
    assert v.passed is True


# -- not run ---------------------------------------------------------------------------------------

def test_no_endpoint_is_not_run_and_missing_evidence(store):
    v = SemanticJudge(None, SemanticConfig(), store).judge(TASK, frames(store))
    assert (v.ran, v.passed, v.score, v.backend) == (False, None, None, "none")
    assert v.reason == "not run: no judge endpoint configured"
    assert v.fields()["critic"] == "semantic" and v.fields()["rollouts"] == 0


def test_a_configured_endpoint_without_a_client_is_not_run(server, store):
    v = SemanticJudge(None, SemanticConfig(endpoint=server.base_url, model=MODEL), store).judge(TASK, frames(store))
    assert (v.ran, v.backend, v.reason) == (False, "none", "not run: no client built for the judge endpoint")
    assert server.requests == []


def test_a_frame_missing_or_corrupt_in_the_store_is_not_run_and_no_call_is_made(server, store):
    shas = frames(store)
    v = judge_for(server, store).judge(TASK, shas[:2] + ["ab" * 32])
    assert (v.ran, v.passed) == (False, None) and v.reason.startswith(f"not run: keyframe {'ab' * 32} is not in")
    store.path_for(shas[0]).write_bytes(b"not a png")
    v = judge_for(server, store).judge(TASK, shas)
    assert v.ran is False and "is corrupt" in v.reason
    assert server.requests == []


def test_a_rollout_without_keyframes_is_not_run(server, store):
    v = judge_for(server, store).judge(TASK, [])
    assert (v.ran, v.reason) == (False, "not run: the rollout has no keyframes") and server.requests == []


# -- circular bias -------------------------------------------------------------------------------

def test_a_judge_of_the_family_of_a_model_under_evaluation_is_flagged(store):
    with OpenAIJudgeServer(task=TASK, model="Qwen2.5-VL-7B-Instruct") as server:
        cfg = SemanticConfig(endpoint=server.base_url, model="Qwen2.5-VL-7B-Instruct", timeout_s=5.0)
        client = openai.OpenAI(base_url=server.base_url, api_key="k", max_retries=0)
        v = SemanticJudge(client, cfg, store).judge(TASK, frames(store), ["qwen-vla-policy", "scripted-fine"])
    assert v.passed is True  # flagged, not failed
    assert evidence(v)["circular_bias"] == {"flagged": True, "family": "qwen", "models": ["qwen-vla-policy"]}
    assert v.reason.endswith("; circular bias: judge 'Qwen2.5-VL-7B-Instruct' is of family /qwen/ like qwen-vla-policy")


def test_circular_bias_patterns():
    patterns = SemanticConfig().family_patterns
    assert circular_bias("gpt-4o-mini", ["openvla-7b", "scripted-fine"], patterns)["flagged"] is False
    assert circular_bias("gpt-4o-mini", ["gpt-4o-policy"], patterns)["models"] == ["gpt-4o-policy"]
    assert circular_bias("gemini-2.0-flash", ["paligemma-pi0"], patterns)["family"] == "gemini|gemma"
    assert circular_bias("judge-vl", ["scripted-fine"], ("judge",))["flagged"] is False
    assert circular_bias("my-judge", ["my-policy"], ("^my-",))["flagged"] is True


# -- the strict parser on its own ----------------------------------------------------------------

GOOD = '{"observation": "a cube", "score": 0.9, "reason": "r", "task_completed": true}'


@pytest.mark.parametrize("text,parser", [
    (GOOD, PARSER),
    ("  \n" + GOOD + "\n", PARSER),
    ('{"observation": "a", "score": 1, "reason": "r"}', PARSER),  # a JSON integer is a number
    ("```json\n" + GOOD + "\n```", FENCED_PARSER),
])
def test_parse_reply_accepts_strict_verdicts(text, parser):
    obj, used = parse_reply(text)
    assert used == parser and obj["observation"] in ("a cube", "a")


@pytest.mark.parametrize("text,kind", [
    ("The score is 0.9.", "prose_around_json"),
    ("Verdict: " + GOOD, "prose_around_json"),
    (GOOD + " ok", "prose_around_json"),
    ("```\n" + GOOD + "\n```", "prose_around_json"),  # an untagged fence is not the JSON fence
    ("```json\n" + GOOD, "prose_around_json"),
    ('{"observation": "a", "score": 0.9, "reason": "r", "reason": "s"}', "duplicate_keys"),
    ('{"observation": "a", "score": 0.9, "reason": {"x": 1, "x": 2}}', "duplicate_keys"),
    ('{"observation": "a", "score": Infinity, "reason": "r"}', "malformed_json"),
    ('{"observation": "a" "score": 0.9}', "malformed_json"),
    ('{"observation": "a", "score": "0.9", "reason": "r"}', "wrong_types"),
    ('{"observation": "a", "score": 0.9, "reason": "r", "task_completed": 1}', "wrong_types"),
    ('{"observation": 3, "score": 0.9, "reason": "r"}', "wrong_types"),
    ('{"observation": "a", "score": -0.1, "reason": "r"}', "score_out_of_range"),
    ('{"observation": "a", "score": 0.9}', "missing_keys"),
    ('{"observation": "a", "score": 0.9, "reason": "r", "passed": true}', "unexpected_keys"),
    ("[1, 2]", "not_an_object"),
    ("   ", "empty"),
])
def test_parse_reply_refuses_everything_else(text, kind):
    with pytest.raises(ReplyError) as err:
        parse_reply(text)
    assert err.value.kind == kind


def test_select_frames():
    assert select_frames(3, 4) == [0, 1, 2]
    assert select_frames(10, 4) == [0, 3, 6, 9]
    assert select_frames(5, 2) == [0, 4]
    assert select_frames(5, 1) == [4]
    assert select_frames(0, 4) == []


# -- config and input --------------------------------------------------------------------------------

@pytest.mark.parametrize("over,match", [
    ({"endpoint": "http://x/v1"}, "needs both endpoint and model"),
    ({"model": "m"}, "needs both endpoint and model"),
    ({"endpoint": " ", "model": "m"}, "endpoint must be a non-empty string"),
    ({"api_key_env": "not a name"}, "api_key_env must be an environment variable name"),
    ({"timeout_s": 0}, "timeout_s must be > 0"),
    ({"threshold": 0.0}, "threshold must be in"),
    ({"threshold": 1.5}, "threshold must be in"),
    ({"max_frames": 0}, "max_frames must be an int >= 1"),
    ({"family_patterns": ("gpt(",)}, "is not a regex"),
    ({"rubric": ""}, "rubric must be non-empty"),
])
def test_bad_config_is_refused_quoting_the_value(over, match):
    with pytest.raises(ConfigError, match=match):
        SemanticConfig(**over)


def test_bad_input_from_the_caller_raises(store):
    judge = SemanticJudge(None, SemanticConfig(), store)
    with pytest.raises(CriticInputError, match="needs the task's instruction"):
        judge.judge("", [])
    with pytest.raises(CriticInputError, match="frames must be a sequence of keyframe sha256 strings"):
        judge.judge(TASK, "abc")
