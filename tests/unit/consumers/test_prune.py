"""prune on a real chDB store: what goes (old steps, their own keyframes), what never goes, what it
reports, and that a store rebuilt from topics that still hold the pruned steps reaches the same
digest once the recorded prune is re-applied."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "exports"))
from hard_case_world import build_world  # noqa: E402

from consumers.prune import prune, prune_horizon, reapply_prunes  # noqa: E402
from consumers.state import derived_state, state_digest, table_fingerprints  # noqa: E402
from schemas.events import make_event  # noqa: E402
from tests.store_events import store_events  # noqa: E402

NOW = datetime.now(UTC)
CUTOFF = NOW - timedelta(days=7)


def _world(store, root: Path):
    world = build_world(store, root, base_time=NOW)
    old = [e for e, steps in world.steps.items() if steps[-1]["envelope"]["event_time"] < CUTOFF]
    kept = [e for e in world.steps if e not in old]
    assert old and kept  # the world spans 16 days: both sides of a 7-day cutoff
    return world, old, kept


def _step_counts(store) -> dict[str, int]:
    return dict(store.query("SELECT episode_id, count() FROM {database}.rollout_steps FINAL GROUP BY episode_id"))


def test_prune_removes_old_steps_and_their_keyframes_and_nothing_else(store, tmp_path):
    world, old, kept = _world(store, tmp_path / "keyframes")
    # A kept episode showing a keyframe that an old step also shows: that file must stay.
    shared = world.steps[old[0]][0]["keyframe_sha256"]
    keeper = make_event("Step", ("ep-keeper", 0), "test", "prune-test", event_time=NOW,
                        **{**{k: v for k, v in world.steps[kept[0]][0].items() if k != "envelope"},
                           "episode_id": "ep-keeper", "keyframe_sha256": shared})
    store_events(store, [keeper])
    before = table_fingerprints(store)
    scores_before = derived_state(store)["scores"]
    files_before = sorted((tmp_path / "keyframes").rglob("*.png"))

    result = prune(store, CUTOFF, tmp_path / "keyframes")

    counts = _step_counts(store)
    assert set(counts) == set(kept) | {"ep-keeper"}
    assert all(counts[e] == len(world.steps[e]) for e in kept)
    assert result.episodes == len(old) and result.step_rows == sum(len(world.steps[e]) for e in old)
    assert result.step_bytes > 0
    after = table_fingerprints(store)
    assert {t: v for t, v in after.items() if t != "rollout_steps"} == \
        {t: v for t, v in before.items() if t != "rollout_steps"}
    assert derived_state(store)["scores"] == scores_before

    old_keyframes = {s["keyframe_sha256"] for e in old for s in world.steps[e] if s["keyframe_sha256"]}
    removed = {p.stem for p in files_before} - {p.stem for p in (tmp_path / "keyframes").rglob("*.png")}
    assert removed == old_keyframes - {shared}
    assert result.keyframe_files == len(removed) and result.keyframe_bytes > 0
    assert (tmp_path / "keyframes" / shared[:2] / f"{shared}.png").exists()

    assert prune_horizon(store) == CUTOFF
    again = prune(store, CUTOFF, tmp_path / "keyframes")
    assert again.step_rows == 0 and again.keyframe_files == 0


def test_dry_run_reports_the_same_and_removes_nothing(store, tmp_path):
    world, old, _ = _world(store, tmp_path / "keyframes")
    before = table_fingerprints(store)
    files = sorted((tmp_path / "keyframes").rglob("*.png"))
    plan = prune(store, CUTOFF, tmp_path / "keyframes", dry_run=True)
    assert table_fingerprints(store) == before and sorted((tmp_path / "keyframes").rglob("*.png")) == files
    assert prune_horizon(store) is None  # a dry run records nothing
    done = prune(store, CUTOFF, tmp_path / "keyframes")
    assert (plan.episodes, plan.step_rows, plan.keyframe_files, plan.keyframe_bytes) == \
        (done.episodes, done.step_rows, done.keyframe_files, done.keyframe_bytes)
    assert plan.step_bytes > 0 and plan.removed_xor == done.removed_xor


def test_nothing_old_prunes_nothing(store, tmp_path):
    build_world(store, tmp_path / "keyframes", base_time=NOW)
    result = prune(store, NOW - timedelta(days=365), tmp_path / "keyframes")
    assert (result.step_rows, result.episodes, result.keyframe_files) == (0, 0, 0)


def test_a_rebuild_that_still_has_the_pruned_steps_matches_once_the_prune_is_reapplied(store, chdb_store, tmp_path):
    world, old, _ = _world(store, tmp_path / "keyframes")
    prune(store, CUTOFF, tmp_path / "keyframes")
    # The topics still hold every event (within retention): a rebuild stores them all again.
    rebuilt = chdb_store.with_database(f"{store.database}_rebuild")
    rebuilt.command("DROP DATABASE IF EXISTS {database}")
    from consumers.evidence.store import migrate

    migrate(rebuilt)
    try:
        store_events(rebuilt, [*world.started.values(), *(s for steps in world.steps.values() for s in steps),
                               *world.ended.values()])
        store_events(rebuilt, _analysed_events(store))
        assert state_digest(derived_state(rebuilt)) != state_digest(derived_state(store))
        removed = reapply_prunes(store, rebuilt)
        assert removed == sum(len(world.steps[e]) for e in old)
        assert derived_state(rebuilt) == derived_state(store)
        assert reapply_prunes(store, rebuilt) == 0
    finally:
        rebuilt.command("DROP DATABASE IF EXISTS {database}")


def _analysed_events(store) -> list[dict]:
    """The live store's EpisodeAnalysed events, as the topic would hand them back."""
    from consumers.replay import stored_events
    from schemas.catalog import BY_NAME

    return list(stored_events(store, BY_NAME["failures.episodes"]))


def test_a_naive_cutoff_is_refused(store):
    with pytest.raises(ValueError, match="timezone-aware"):
        prune(store, datetime(2026, 1, 1), None)
