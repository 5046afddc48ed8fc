"""What every read model shares: the WHERE conditions a run and an "as of" time make, and the
log's vocabulary (which event starts or ends an episode, which terminations are the harness's,
which decision leaves which candidate status). Here so that no read model imports another for
them."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from producers.episode import HARNESS_TERMINATIONS

# A scenario is saturated when every evaluated model passes it at least this often: what the report
# tells a reader. The gate retires at a lower bar (GateConfig.retire_min_success, 0.90, on fewer
# seeds) on purpose: it acts on selection sweeps of 10-20 seeds, where 0.95 is one failure away
# from 0.90, and a scenario that every model passes at 0.90 no longer separates them.
SATURATION_RATE = 0.95
# Terminations that say nothing about the policy: left out of success rates, counted as invalid.
INVALID_TERMINATIONS = HARNESS_TERMINATIONS
# ModelRegistered.kind of the reference policy: it validates scenarios, it is not ranked.
ORACLE_KIND = "oracle"
# Decision types and the candidate status each leaves behind when it is the latest.
DECISION_STATUS = {"Promoted": "promoted", "Rejected": "rejected", "Deferred": "deferred",
                   "ReviewRequested": "review", "Retired": "retired"}


ENDED = "envelope.event_type = 'EpisodeEnded'"
STARTED = "envelope.event_type = 'EpisodeStarted'"


# --- scope ------------------------------------------------------------------------------------

def _scope(run_id: str | None, as_of: datetime | None, params: dict, prefix: str = "") -> list[str]:
    """WHERE conditions for a run and an "as of" time, with their bound parameters added to params."""
    conditions = []
    if run_id is not None:
        params["run_id"] = run_id
        conditions.append(f"{prefix}envelope.run_id = {{run_id:String}}")
    if as_of is not None:
        if as_of.tzinfo is None:
            raise ValueError(f"as_of must be timezone-aware, got naive {as_of!r}")
        params["as_of"] = as_of.astimezone(UTC)
        conditions.append(f"{prefix}envelope.event_time <= {{as_of:DateTime64(6, 'UTC')}}")
    return conditions


def _where(conditions: Iterable[str]) -> str:
    conditions = [c for c in conditions if c]
    return (" WHERE " + " AND ".join(conditions)) if conditions else ""


def _utc(value: datetime) -> datetime:
    """ClickHouse hands DateTime64(6, 'UTC') back naive."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
