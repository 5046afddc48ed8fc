"""content_digest, what two runs of one seed are compared by, does not depend on the order the log
holds the same decisions in (their event times come from the episodes' wall clocks: CI saw two
runs promote the same scenarios at the same versions with the same ids, in another time order)."""

from __future__ import annotations

import uuid

from evidence_factory import EvidenceLog, spec, store_events

from consumers import state as q
from consumers.evidence.store import migrate


def test_the_same_decisions_in_another_time_order_give_the_same_content_digest(chdb_store):
    log = EvidenceLog()
    for i, name in enumerate(("a", "b", "c"), start=1):
        log.promoted(spec(name), i)
    times = [e["envelope"]["event_time"] for e in log.events]
    swapped = [{**e, "envelope": {**e["envelope"], "event_time": t}} for e, t in zip(log.events, reversed(times),
                                                                                   strict=True)]
    stores = []
    for events in (log.events, swapped):
        store = chdb_store.with_database(f"test_{uuid.uuid4().hex[:10]}")
        migrate(store)
        store_events(store, events)
        stores.append(store)
    first, second = (q.derived_state(s)["promotions"] for s in stores)
    assert first != second and sorted(first) == sorted(second), "the same promotions in another order"
    assert q.content_digest(stores[0]) == q.content_digest(stores[1])
