"""Housekeeping: remove old step rows and the keyframe files only they refer to.

What goes: the Step rows of every episode whose last stored step is older than the cutoff (a
whole episode's steps or none, so no episode is left half-stored), and each keyframe file those
steps refer to that nothing kept refers to (no remaining step, no EpisodeEnded's final keyframe).
What stays, always: episodes (EpisodeStarted/Ended), failure moments, EpisodeAnalysed, clusters,
candidates, verdicts, decisions, cycles, models, dead letters. Scores, the active benchmark,
reviews, clusters and every report figure derive from those, so a prune changes none of them.

Each prune is recorded in ``{database}.prune_log`` (housekeeping, not an evidence table: no topic
feeds it): when, the cutoff, what it freed, and the count and XOR-of-hashes of the removed events
(the hash ``table_fingerprints`` uses), so what was removed can be accounted for later.

Replay after a prune, honestly:
- ``replay`` rebuilds the store from the topics, then re-applies the recorded prunes to the rebuilt
  database (``reapply_prunes``: the same rule at the latest cutoff) before the digests are compared.
  ``replay --verify`` therefore still compares everything, steps included: the rebuilt store must
  hold exactly the steps the live one kept, and every other table in full.
- It can rebuild every episode, moment, analysis, cluster, candidate, verdict and decision, and the
  steps that were not pruned (while the topics still hold them: rollout.steps keeps 14 days).
- It cannot bring back pruned steps or keyframes: they are gone from the store, keyframes never
  travel through Kafka, ``replay --republish`` republishes the store's log (which no longer has
  them), and a broker that still holds them has them deleted again by the re-applied prune.
  Re-running failure detection over pruned episodes is impossible; their moments and analyses
  are kept. The JSONL export still lists pruned episodes (``steps_complete: false``); the LeRobot
  export leaves them out and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from consumers.evidence.columns import table_columns
from consumers.evidence.store import EvidenceStore
from schemas.catalog import BY_NAME

log = logging.getLogger(__name__)

STEPS_TABLE = BY_NAME["rollout.steps"].table
PRUNE_LOG = "prune_log"

_PRUNE_LOG_DDL = f"""CREATE TABLE IF NOT EXISTS {{database}}.{PRUNE_LOG} (
  pruned_at DateTime64(6, 'UTC') DEFAULT now64(6),
  cutoff DateTime64(6, 'UTC'),
  episodes UInt64,
  step_rows UInt64,
  step_bytes UInt64,
  keyframe_files UInt64,
  keyframe_bytes UInt64,
  removed_events UInt64,
  removed_xor String
) ENGINE = MergeTree ORDER BY pruned_at"""

# Episodes whose last stored step is older than the cutoff: their steps go, all of them.
_OLD_EPISODES = (f"SELECT episode_id FROM {{database}}.{STEPS_TABLE} GROUP BY episode_id "
                 "HAVING max(envelope.event_time) < {cutoff:DateTime64(6, 'UTC')}")


@dataclass
class PruneResult:
    cutoff: datetime
    dry_run: bool
    episodes: int = 0  # episodes whose steps were (or would be) removed
    step_rows: int = 0  # Step events removed (each counted once, as every query counts it)
    step_bytes: int = 0  # bytes the steps table shrank by (estimated, proportional to rows, in a dry run)
    keyframe_files: int = 0
    keyframe_bytes: int = 0
    removed_xor: str = "0"
    keyframe_paths: list[Path] = field(default_factory=list, repr=False)


def ensure_prune_log(store: EvidenceStore) -> None:
    store.command(_PRUNE_LOG_DDL)


def prune(store: EvidenceStore, cutoff: datetime, keyframe_root: Path | None, dry_run: bool = False) -> PruneResult:
    """Remove the steps of episodes whose last step is older than cutoff, and their own keyframes."""
    if cutoff.tzinfo is None:
        raise ValueError(f"cutoff must be timezone-aware, got naive {cutoff!r}")
    ensure_prune_log(store)
    params = {"cutoff": cutoff}
    result = PruneResult(cutoff=cutoff, dry_run=dry_run)
    cols = ", ".join(f"`{c}`" for c in table_columns(BY_NAME["rollout.steps"]))
    (episodes, events, xor), = store.query(
        f"SELECT uniqExact(episode_id), count(), toString(groupBitXor(sipHash64(toString(tuple({cols}))))) "
        f"FROM {{database}}.{STEPS_TABLE} FINAL WHERE episode_id IN ({_OLD_EPISODES})", parameters=params)
    result.episodes, result.step_rows, result.removed_xor = int(episodes), int(events), str(xor)
    if result.step_rows == 0:
        return result

    result.keyframe_paths = _orphaned_keyframes(store, params, keyframe_root)
    result.keyframe_files = len(result.keyframe_paths)
    result.keyframe_bytes = sum(p.stat().st_size for p in result.keyframe_paths)
    before_bytes, before_rows = _table_size(store)
    if dry_run:
        physical = int(store.query(f"SELECT count() FROM {{database}}.{STEPS_TABLE} "
                                   f"WHERE episode_id IN ({_OLD_EPISODES})", parameters=params)[0][0])
        result.step_bytes = before_bytes * physical // before_rows if before_rows else 0
        return result

    _delete_old_steps(store, cutoff)
    result.step_bytes = max(0, before_bytes - _table_size(store)[0])
    for path in result.keyframe_paths:
        path.unlink(missing_ok=True)
    store.command(f"INSERT INTO {{database}}.{PRUNE_LOG} (cutoff, episodes, step_rows, step_bytes, keyframe_files, "
                  "keyframe_bytes, removed_events, removed_xor) VALUES ({cutoff:DateTime64(6, 'UTC')}, "
                  "{episodes:UInt64}, {rows:UInt64}, {bytes:UInt64}, {files:UInt64}, {kbytes:UInt64}, "
                  "{rows:UInt64}, {xor:String})",
                  parameters={"cutoff": cutoff, "episodes": result.episodes, "rows": result.step_rows,
                              "bytes": result.step_bytes, "files": result.keyframe_files,
                              "kbytes": result.keyframe_bytes, "xor": result.removed_xor})
    return result


def prune_horizon(store: EvidenceStore) -> datetime | None:
    """The latest cutoff any prune of this store used (the rule is monotone: it covers the others).
    Reads only: a store never pruned has no prune_log table."""
    (exists,), = store.query(f"EXISTS TABLE {{database}}.{PRUNE_LOG}")
    if not exists:
        return None
    (count, latest), = store.query(f"SELECT count(), max(cutoff) FROM {{database}}.{PRUNE_LOG}")
    if not count:
        return None
    return latest.replace(tzinfo=UTC) if latest.tzinfo is None else latest


def reapply_prunes(live: EvidenceStore, rebuilt: EvidenceStore) -> int:
    """Apply the live store's prunes to a store rebuilt from the topics; returns step rows removed."""
    horizon = prune_horizon(live)
    if horizon is None:
        return 0
    (rows,), = rebuilt.query(f"SELECT count() FROM {{database}}.{STEPS_TABLE} FINAL "
                             f"WHERE episode_id IN ({_OLD_EPISODES})", parameters={"cutoff": horizon})
    if rows:
        _delete_old_steps(rebuilt, horizon)
        log.info("re-applied the prune at cutoff %s to %s: %d step rows removed", horizon.isoformat(),
                 rebuilt.database, rows)
    return int(rows)


def _delete_old_steps(store: EvidenceStore, cutoff: datetime) -> None:
    # A mutation, waited for (mutations_sync=2), so the freed bytes can be measured right after.
    store.command(f"ALTER TABLE {{database}}.{STEPS_TABLE} DELETE WHERE episode_id IN ({_OLD_EPISODES}) "
                  "SETTINGS mutations_sync = 2", parameters={"cutoff": cutoff})


def _table_size(store: EvidenceStore) -> tuple[int, int]:
    (size, rows), = store.query("SELECT sum(bytes_on_disk), sum(rows) FROM system.parts "
                                "WHERE database = {db:String} AND table = {t:String} AND active",
                                parameters={"db": store.database, "t": STEPS_TABLE})
    return int(size or 0), int(rows or 0)


def _orphaned_keyframes(store: EvidenceStore, params: dict, keyframe_root: Path | None) -> list[Path]:
    """Keyframe files of the pruned steps that no kept step and no episode's final keyframe uses."""
    if keyframe_root is None or not keyframe_root.is_dir():
        return []
    rows = store.query(
        f"SELECT DISTINCT keyframe_sha256 FROM {{database}}.{STEPS_TABLE} "
        f"WHERE episode_id IN ({_OLD_EPISODES}) AND keyframe_sha256 IS NOT NULL "
        f"AND keyframe_sha256 NOT IN (SELECT keyframe_sha256 FROM {{database}}.{STEPS_TABLE} "
        f"  WHERE episode_id NOT IN ({_OLD_EPISODES}) AND keyframe_sha256 IS NOT NULL) "
        "AND keyframe_sha256 NOT IN (SELECT final_keyframe_sha256 FROM {database}.rollout_episodes "
        "  WHERE final_keyframe_sha256 IS NOT NULL)", parameters=params)
    paths = []
    for (sha256,) in rows:
        path = keyframe_root / sha256[:2] / f"{sha256}.png"
        if path.is_file():
            paths.append(path)
    return sorted(paths)
