"""The hole guard's rules (infra/offset_holes.py): wait for a hole, give up on one that stays open,
and aiokafka's fetched records cut at the first hole (infra/aiokafka_holes.py), on real record-batch bytes."""

from __future__ import annotations

import struct

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.structs import TopicPartition

from infra.aiokafka_holes import ContiguousPartitionRecords
from infra.offset_holes import Holes

TP = TopicPartition("sepa.rollout.episodes", 2)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_hole_is_waited_for_until_the_wait_is_over_then_read_past():
    clock = Clock()
    holes = Holes(wait_s=10.0, clock=clock)
    assert holes.wait("t", 0, 5, 9)
    clock.now = 9.9
    assert holes.wait("t", 0, 5, 9), "within the wait: read again"
    clock.now = 10.1
    assert not holes.wait("t", 0, 5, 9), "still open after the wait: read on"
    assert holes.wait("t", 0, 5, 9), "a hole given up on is forgotten; the next one is waited for afresh"


def test_a_new_hole_or_a_filled_one_restarts_the_wait():
    clock = Clock()
    holes = Holes(wait_s=10.0, clock=clock)
    assert holes.wait("t", 0, 5, 9)
    clock.now = 11.0
    assert holes.wait("t", 0, 20, 25), "another offset: a new hole"
    assert holes.wait("t", 1, 5, 9), "another partition: its own hole"
    holes.closed("t", 0)
    clock.now = 30.0
    assert holes.wait("t", 0, 20, 25), "the hole was filled, so a later one starts its own wait"


def batch(base_offset: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0, producer_id=-1,
                                        producer_epoch=-1, base_sequence=-1, batch_size=1 << 20)
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=1, key=None, value=value, headers=[])
    data = builder.build()
    data[0:8] = struct.pack(">q", base_offset)  # the broker's part: base offset is outside the CRC
    return bytes(data)


def fetched(fetch_offset: int, *batches: bytes, holes: Holes) -> tuple[list[int], int]:
    """The offsets aiokafka would deliver from one fetch reply, and where it would fetch next."""
    records = ContiguousPartitionRecords(TP, MemoryRecords(b"".join(batches)), [], fetch_offset, None, None,
                                         True, 0)
    records.holes = holes
    return [r.offset for r in records], records.next_fetch_offset



def test_fetched_records_stop_at_a_hole_and_the_next_fetch_asks_for_it():
    holes = Holes(wait_s=10.0)
    reply = (batch(0, [b"a", b"b", b"c"]), batch(3, [b"d", b"e"]), batch(8, [b"i", b"j"]))  # 5-7 not written yet
    assert fetched(0, *reply, holes=holes) == ([0, 1, 2, 3, 4], 5)
    assert fetched(5, batch(8, [b"i", b"j"]), holes=holes) == ([], 5), "still missing: nothing, same position"
    filled = (batch(5, [b"f", b"g", b"h"]), batch(8, [b"i", b"j"]))
    assert fetched(5, *filled, holes=holes) == ([5, 6, 7, 8, 9], 10)


def test_a_batch_starting_before_the_fetch_offset_is_no_hole():
    assert fetched(4, batch(3, [b"d", b"e"]), batch(5, [b"f"]), holes=Holes()) == ([4, 5], 6)


def test_a_hole_that_never_fills_is_read_past_after_the_wait():
    clock = Clock()
    holes = Holes(wait_s=10.0, clock=clock)
    assert fetched(5, batch(8, [b"i"]), holes=holes) == ([], 5)
    clock.now = 11.0
    assert fetched(5, batch(8, [b"i"]), holes=holes) == ([8], 9)
