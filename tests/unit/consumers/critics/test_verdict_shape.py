"""Every critic's verdict fields make a CriticVerdict the codec accepts, and survive the round trip."""

from __future__ import annotations

import json

import pytest
from test_safety import episode
from test_sequential import arm, bits

from consumers.critics.safety import judge_safety
from consumers.critics.semantic import SemanticConfig, SemanticJudge
from consumers.critics.sequential import SequentialConfig, decide
from producers.keyframes import KeyframeStore
from schemas.codec import Codec
from schemas.events import make_event


def verdicts(tmp_path) -> list[dict]:
    robustness = decide(bits("1" * 10), {"a": arm("1" * 10, "1" * 10), "b": arm("0" * 10, "1" * 10)})
    return [robustness.verdict_fields(SequentialConfig()),
            judge_safety([episode("o1"), episode("o2", peak=400.0)], "oracle").fields(),
            judge_safety([], "oracle").fields(),
            SemanticJudge(None, SemanticConfig(), KeyframeStore(tmp_path)).judge("lift the cube", []).fields()]


@pytest.mark.parametrize("index", range(4))
def test_verdict_fields_round_trip_through_the_codec(tmp_path, index):
    fields = verdicts(tmp_path)[index]
    event = make_event("CriticVerdict", ("scn-c", fields["critic"], fields["critic_version"]), "critics", "run-t",
                       scenario_id="scn-c", **fields)
    codec = Codec()
    back = codec.decode(codec.encode(event))
    assert {k: back[k] for k in fields} == fields
    json.loads(back["evidence_json"])
