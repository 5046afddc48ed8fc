"""`status` on a log that holds a registration of a model the registry file does not hold (a stray
ModelRegistered): it is named as registered but not served, so nobody waits on its sweeps."""

from __future__ import annotations

import json

from stack_helpers import ROOT, run_chdb, sepa


def test_status_names_a_registered_model_that_no_rollout_worker_serves(tmp_path):
    memory_dir = tmp_path / "m"
    run_chdb(memory_dir, f"""
import sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from evidence_factory import store_events
from consumers.evidence.store import migrate
from schemas.events import make_event
migrate(store)
store_events(store, [make_event("ModelRegistered", (m, "1"), "sync-models", "sync-models", model_id=m, version="1",
                                kind="scripted", description="", params={{}}) for m in ("ghost-model", "oracle")])
""")
    report = json.loads(sepa(memory_dir, "status", "--json").stdout)
    assert report["memory"]["model_versions"] == {"ghost-model": "1", "oracle": "1"}
    assert report["memory"]["unserved_models"] == ["ghost-model"]
    printed = sepa(memory_dir, "status").stdout
    assert "registered but not in the model registry file (not swept, not validated): ['ghost-model']" in printed
