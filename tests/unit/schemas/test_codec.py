import math

import pytest

from schemas.codec import Codec, require_finite
from schemas.events import make_event, stable_id
from schemas.exceptions import DecodeError, InvalidEvent


def step(t=0, **over):
    fields = dict(episode_id="ep-1", t=t, action=[0.1] * 7, eef_pos=[0.1, 0.2, 0.3], eef_quat=[0.0, 0.0, 0.0, 1.0],
                  gripper_opening=0.04, gripper_force=0.0,
                  object_poses=[{"name": "cube", "pos": [0.0, 0.0, 0.8], "quat": [0.0, 0.0, 0.0, 1.0]}],
                  contacts=[{"a": "gripper", "b": "cube", "normal_force": 1.5}], joint_torques=[0.5] * 7,
                  joint_pos=[0.1] * 7, reward=0.0, goal_distance=0.1, object_lift=0.0, keyframe_sha256=None)
    fields.update(over)
    return make_event("Step", ("ep-1", t), "test", "run-1", **fields)


def test_round_trip_keeps_every_field():
    codec = Codec()
    event = step(3)
    decoded = codec.decode(codec.encode(event))
    assert decoded["envelope"] == event["envelope"]
    assert decoded["t"] == 3 and decoded["contacts"][0]["b"] == "cube"
    assert decoded["object_poses"][0]["pos"] == pytest.approx([0.0, 0.0, 0.8])


def test_framing_is_confluent():
    data = Codec().encode(step())
    assert data[0] == 0
    from schemas.manifest import current_manifest

    assert int.from_bytes(data[1:5], "big") == current_manifest().latest("Step").schema_id


def test_event_ids_are_stable_and_distinct():
    assert step(1)["envelope"]["event_id"] == step(1)["envelope"]["event_id"]
    assert step(1)["envelope"]["event_id"] != step(2)["envelope"]["event_id"]
    assert stable_id("a", 1) != stable_id("a1")


@pytest.mark.parametrize("data, reason", [
    (b"", "too short"),
    (b"garbage bytes here", "magic byte"),
    (b"\x00\x00\x00\x99\x99body", "schema id"),
])
def test_decode_names_what_is_wrong(data, reason):
    with pytest.raises(DecodeError, match=reason):
        Codec().decode(data)


def test_truncated_and_padded_bodies_are_refused():
    data = Codec().encode(step())
    with pytest.raises(DecodeError, match="undecodable"):
        Codec().decode(data[:-20])
    with pytest.raises(DecodeError, match="trailing"):
        Codec().decode(data + b"\x00\x01")


def test_encode_refuses_a_value_that_does_not_match():
    event = step()
    event["t"] = "seven"
    with pytest.raises(InvalidEvent, match="Step"):
        Codec().encode(event)


def test_naive_event_time_is_refused():
    from datetime import datetime

    from schemas.events import envelope

    with pytest.raises(ValueError, match="timezone-aware"):
        envelope("Step", ("x",), "p", "r", event_time=datetime(2026, 1, 1))


def test_require_finite_names_the_field():
    require_finite(step())
    with pytest.raises(DecodeError, match="gripper_force"):
        require_finite(step(gripper_force=math.nan))
    with pytest.raises(DecodeError, match="eef_pos"):
        require_finite(step(eef_pos=[0.0, math.inf, 0.0]))


def test_the_magic_byte_is_read_unsigned():
    with pytest.raises(DecodeError, match="magic byte 255 is not"):
        Codec().decode(b"\xff" + bytes(20))


def test_a_body_cut_anywhere_gets_a_reason_without_memory_addresses():
    data = Codec().encode(step())
    for cut in range(1, len(data)):
        reasons = set()
        for _ in range(2):
            with pytest.raises(DecodeError) as raised:
                Codec().decode(data[:cut])
            reasons.add(str(raised.value))
        (reason,) = reasons
        assert " at 0x" not in reason and "object" not in reason, (cut, reason)


@pytest.mark.parametrize("data", [
    b"", b"\x00\x00", b"garbage bytes here", b"\x00\x00\x00\x99\x99body",
    b"\x00\x00\x00\x00\x11\x7f\x01",  # Step's schema id, an event_id longer than the message
])
def test_frame_and_decode_give_the_same_reason(data):
    codec = Codec()
    with pytest.raises(DecodeError) as framed:
        codec.frame(data)
    with pytest.raises(DecodeError) as decoded:
        codec.decode(data)
    assert str(framed.value) == str(decoded.value)


def test_a_topic_refuses_an_event_type_it_does_not_carry_before_the_body_is_read():
    from schemas.catalog import BY_NAME

    data = Codec().encode(step())
    with pytest.raises(DecodeError, match="Step .* does not belong on topic benchmark.decisions"):
        Codec().decode(data[:-20], BY_NAME["benchmark.decisions"])


# -- values of any size -------------------------------------------------------------------------

def test_a_value_over_the_message_limit_is_refused_by_size_before_anything_else():
    from schemas.catalog import MAX_MESSAGE_BYTES

    codec = Codec()
    big = codec.encode(step())[:5] + b"\x00" * (10 * 1024 * 1024)  # a valid header, 10 MB of body
    for refuse in (codec.frame, codec.decode):
        with pytest.raises(DecodeError, match=f"message of {len(big)} bytes is over the {MAX_MESSAGE_BYTES}-byte"):
            refuse(big)
    event = step()
    event["action"] = [0.5] * (MAX_MESSAGE_BYTES // 4 + 1)  # Avro floats: 4 bytes each
    with pytest.raises(InvalidEvent, match="over the 1000000-byte limit"):
        codec.encode(event)


def test_a_dead_letter_of_a_huge_value_keeps_an_excerpt_its_size_and_hash_and_can_be_sent():
    import hashlib

    from schemas.catalog import DEAD_LETTER_EXCERPT_BYTES, MAX_MESSAGE_BYTES
    from schemas.events import dead_letter

    value = bytes(range(256)) * (40 * 1024)  # 10 MiB
    dead = dead_letter("sink", "r", "sepa.rollout.steps", 0, 7, b"k" * 100_000, value, "undecodable " * 300)
    assert dead["original"] == value[:DEAD_LETTER_EXCERPT_BYTES]
    assert len(dead["source_key"]) == DEAD_LETTER_EXCERPT_BYTES
    assert dead["reason"].endswith(f"[value of {len(value)} bytes, sha256 {hashlib.sha256(value).hexdigest()}; "
                                   f"its first {DEAD_LETTER_EXCERPT_BYTES} bytes kept]")
    assert dead["reason"].startswith("undecodable") and len(dead["reason"]) <= 2000
    assert len(Codec().encode(dead)) < MAX_MESSAGE_BYTES  # the dead letter itself is always sendable
    small = dead_letter("sink", "r", "t", 0, 1, None, b"abc", "bad")
    assert small["original"] == b"abc" and small["reason"] == "bad"
