"""What every export shares: the filters, the output directory rules, keyframe lookup, the summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from consumers.evidence.store import EvidenceStore
from consumers.exports.exceptions import NothingToExport, OutputExists
from consumers.exports.queries import HardCase, episodes


@dataclass(frozen=True)
class ExportFilters:
    since: datetime | None = None  # episodes that ended at or after this time
    failure_type: str | None = None  # episodes with a moment of this type
    include_recovered: bool = False  # also successes that recovered from a failure moment ("hard" only)
    outcome: str = "hard"  # hard: failures (export-hard-cases); success; any (queries.OUTCOMES)
    model_id: str | None = None
    scenario_id: str | None = None
    request_id: str | None = None

    def describe(self) -> str:
        kinds = {"hard": "failed and recovered" if self.include_recovered else "failed only",
                 "success": "successes only", "any": "any outcome"}[self.outcome]
        parts = [f"ended since {self.since.isoformat()}" if self.since else "any time",
                 f"failure type {self.failure_type}" if self.failure_type else "any failure type", kinds]
        parts += [f"{name} {value}" for name, value in (("model", self.model_id), ("scenario", self.scenario_id),
                                                        ("request", self.request_id)) if value]
        return ", ".join(parts)


@dataclass
class ExportSummary:
    format: str
    output: Path
    episodes: int = 0
    failed: int = 0
    recovered: int = 0
    succeeded: int = 0  # successes with no recovered moment (chosen exports only)
    cameras: tuple[str, ...] = ()  # LeRobot video features written, one per camera
    frames: int = 0
    keyframes: int = 0  # keyframe files found and exported
    keyframes_missing: int = 0  # referenced by a step but not on disk (pruned, or another machine's)
    skipped: dict[str, str] = field(default_factory=dict)  # episode_id -> why it is not in the export


def select(store: EvidenceStore, filters: ExportFilters) -> list[HardCase]:
    cases = episodes(store, filters.outcome, since=filters.since, failure_type=filters.failure_type,
                     include_recovered=filters.include_recovered, model_id=filters.model_id,
                     scenario_id=filters.scenario_id, request_id=filters.request_id)
    if not cases:
        raise NothingToExport(f"no episode in the evidence log matches ({filters.describe()}); "
                              "nothing was written")
    return cases


def fresh_output(output: Path) -> Path:
    """The output directory, created; refused when it already holds anything."""
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise OutputExists(f"{output} already exists and is not an empty directory; exports never overwrite")
    output.mkdir(parents=True, exist_ok=True)
    return output


class Keyframes:
    """Keyframe files by sha256, laid out as producers.keyframes.KeyframeStore writes them."""

    def __init__(self, root: Path | None):
        self.root = root

    def path(self, sha256: str | None) -> Path | None:
        if not sha256 or self.root is None:
            return None
        path = self.root / sha256[:2] / f"{sha256}.png"
        return path if path.is_file() else None
