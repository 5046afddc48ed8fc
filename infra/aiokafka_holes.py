"""faust's consumer (aiokafka) reading every partition without holes: infra/offset_holes.py says why.

    read_contiguously()   # once per process, before faust's consumer fetches (the streams worker)

A module of its own because aiokafka is not in every venv that reads our topics (LIBERO's is not).
"""

from __future__ import annotations

from aiokafka.consumer import fetcher

from infra.offset_holes import Holes


class ContiguousPartitionRecords(fetcher.PartitionRecords):
    """aiokafka's records of one fetched partition, cut at the first hole: the fetcher's position
    stays at the hole, so its next fetch asks for the missing batch again."""

    holes = Holes()

    def __init__(self, tp, records, *args, **kwargs):
        super().__init__(tp, _UpToHole(tp, records, self), *args, **kwargs)


class _UpToHole:
    """The fetched batches of ``owner``'s partition up to the first one beyond its next offset."""

    def __init__(self, tp, records, owner: ContiguousPartitionRecords):
        self._tp, self._records, self._owner = tp, records, owner
        self._peeked = None

    def has_next(self) -> bool:
        if self._peeked is None and self._records.has_next():
            self._peeked = self._records.next_batch()
        if self._peeked is None:
            return False
        expected, found = self._owner.next_fetch_offset, self._peeked.base_offset
        if found > expected and self._owner.holes.wait(self._tp.topic, self._tp.partition, expected, found):
            return False
        self._owner.holes.closed(self._tp.topic, self._tp.partition)
        return True

    def next_batch(self):
        batch, self._peeked = self._peeked, None
        return batch


def read_contiguously() -> None:
    """Makes aiokafka (faust's consumer) in this process read every partition without holes."""
    fetcher.PartitionRecords = ContiguousPartitionRecords
