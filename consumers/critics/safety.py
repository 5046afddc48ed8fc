"""The safety critic: does the candidate force even the oracle into unsafe contact?

    verdict = judge_safety(analysed, oracle_model_id="oracle", config=SafetyConfig())
    verdict.passed, verdict.score, verdict.reason
    verdict.fields()        # CriticVerdict fields but envelope and scenario_id

``analysed`` are the EpisodeAnalysed events (dicts shaped by the Avro schema) of the candidate's
validation rollouts: their ``quality`` (peak and mean contact force of the robot, summed over its
contacts, N) and their ``moments`` (excessive_force: finger force, hand/arm contact or joint torque
beyond the detector's limits; collision: hand/arm against the table, another object, or an arm
link against the target, with ``force_n`` and ``by_arm`` among its features).

An episode is **unsafe** when any of these holds (every threshold is a named SafetyConfig field):
- its peak contact force is at least ``unsafe_peak_contact_force_n``;
- its mean contact force over the episode is at least ``unsafe_mean_contact_force_n``
  (sustained pressing, not a moment's spike);
- it has an excessive_force moment of severity at least ``min_excessive_force_severity``;
- it has a collision with ``force_n`` at least ``unsafe_collision_force_n``, or at least
  ``unsafe_arm_collision_force_n`` when an arm link (not the hand) hit something.

The candidate is **rejected** when the oracle (a policy that solves the task with privileged
state, as gently as the scene lets it) is unsafe in at least ``min_unsafe_oracle_episodes`` of
its episodes and in at least ``max_oracle_unsafe_fraction`` of them: the scenario then forces
unsafe contact on whoever solves it, rather than the models being clumsy. The registered models'
unsafe episodes are reported in the evidence (they are failures to mine, not a reason to reject).
Score = the share of the oracle's episodes that were safe. With no oracle episode the critic did
not run (ran=false: missing evidence, never a pass).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from consumers.critics.exceptions import ConfigError, CriticInputError

CRITIC = "safety"
CRITIC_VERSION = "safety-contact/1.0"
BACKEND = "rule"


@dataclass(frozen=True)
class SafetyConfig:
    """Thresholds of unsafe contact. Forces in N; the defaults sit at or above the failure detector's
    own limits (streams/failures/detector.py: a held cube is ~40 N of finger force, crushing is
    above 70 N, any hand/arm contact above 150 N is excessive, a collision registers at 10 N)."""

    unsafe_peak_contact_force_n: float = 150.0
    unsafe_mean_contact_force_n: float = 70.0
    min_excessive_force_severity: float = 0.0  # every excessive_force moment counts by default
    unsafe_collision_force_n: float = 50.0  # a hand brushing the table (10-20 N) is not unsafe
    unsafe_arm_collision_force_n: float = 25.0  # an arm link hitting anything is, sooner
    min_unsafe_oracle_episodes: int = 2  # one unsafe episode is an accident, not a scenario property
    max_oracle_unsafe_fraction: float = 0.2

    def __post_init__(self) -> None:
        for name in ("unsafe_peak_contact_force_n", "unsafe_mean_contact_force_n", "unsafe_collision_force_n",
                     "unsafe_arm_collision_force_n"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"SafetyConfig.{name} must be a positive force in N, got {value!r}")
        if not isinstance(self.min_excessive_force_severity, int | float) or \
                not 0.0 <= self.min_excessive_force_severity <= 1.0:
            raise ConfigError(f"SafetyConfig.min_excessive_force_severity must be in [0, 1], "
                              f"got {self.min_excessive_force_severity!r}")
        if not isinstance(self.min_unsafe_oracle_episodes, int) or self.min_unsafe_oracle_episodes < 1:
            raise ConfigError(f"SafetyConfig.min_unsafe_oracle_episodes must be an int >= 1, "
                              f"got {self.min_unsafe_oracle_episodes!r}")
        if not isinstance(self.max_oracle_unsafe_fraction, int | float) or \
                not 0.0 < self.max_oracle_unsafe_fraction <= 1.0:
            raise ConfigError(f"SafetyConfig.max_oracle_unsafe_fraction must be in (0, 1], "
                              f"got {self.max_oracle_unsafe_fraction!r}")


@dataclass(frozen=True)
class EpisodeSafety:
    episode_id: str
    model_id: str
    peak_contact_force: float
    mean_contact_force: float
    unsafe: tuple[str, ...]  # why, one entry per criterion met (empty = safe)
    analysed: bool  # false: the detector could not analyse it, judged on its quality only


@dataclass(frozen=True)
class SafetyVerdict:
    ran: bool
    passed: bool | None
    score: float | None
    reason: str
    oracle: tuple[EpisodeSafety, ...]
    models: dict[str, tuple[int, int]]  # registered model -> (unsafe episodes, episodes)
    config: SafetyConfig

    def evidence(self) -> dict:
        return {"rule": CRITIC_VERSION, "config": asdict(self.config),
                "oracle_episodes": len(self.oracle),
                "oracle_unsafe": [asdict(e) for e in self.oracle if e.unsafe],
                "oracle_unanalysed": sorted(e.episode_id for e in self.oracle if not e.analysed),
                "oracle_peak_contact_force_max": max((e.peak_contact_force for e in self.oracle), default=None),
                "models_unsafe": {m: {"unsafe": u, "episodes": n} for m, (u, n) in sorted(self.models.items())}}

    def fields(self) -> dict:
        """CriticVerdict fields but envelope and scenario_id (the safety critic requests no rollouts)."""
        return {"critic": CRITIC, "critic_version": CRITIC_VERSION, "ran": self.ran,
                "score": None if self.score is None else round(self.score, 4), "passed": self.passed,
                "backend": BACKEND, "reason": self.reason,
                "evidence_json": json.dumps(self.evidence(), sort_keys=True, separators=(",", ":")),
                "rollouts": 0}


def episode_safety(event: Mapping, config: SafetyConfig) -> EpisodeSafety:
    """Judge one EpisodeAnalysed event; raises CriticInputError naming the episode if it is malformed."""
    episode_id = event.get("episode_id") if isinstance(event, Mapping) else None
    if not isinstance(episode_id, str) or not episode_id:
        raise CriticInputError(f"an EpisodeAnalysed event needs an episode_id, got {episode_id!r}")
    model_id = event.get("model_id")
    quality = event.get("quality")
    moments = event.get("moments", [])
    analysed = event.get("analysed", True)
    if not isinstance(model_id, str) or not model_id:
        raise CriticInputError(f"episode {episode_id}: model_id must be a non-empty string, got {model_id!r}")
    if not isinstance(quality, Mapping):
        raise CriticInputError(f"episode {episode_id}: quality must be an ExecutionQuality record, got {quality!r}")
    peak, mean = (_force(episode_id, quality, k) for k in ("peak_contact_force", "mean_contact_force"))
    if not isinstance(moments, Sequence) or isinstance(moments, str | bytes):
        raise CriticInputError(f"episode {episode_id}: moments must be a list, got {type(moments).__name__}")
    if not isinstance(analysed, bool):
        raise CriticInputError(f"episode {episode_id}: analysed must be a bool, got {analysed!r}")
    cfg = config
    why: list[str] = []
    if peak >= cfg.unsafe_peak_contact_force_n:
        why.append(f"peak contact {peak:.0f} N >= {cfg.unsafe_peak_contact_force_n:.0f} N")
    if mean >= cfg.unsafe_mean_contact_force_n:
        why.append(f"mean contact {mean:.0f} N >= {cfg.unsafe_mean_contact_force_n:.0f} N")
    for m in moments:
        if not isinstance(m, Mapping) or not isinstance(m.get("features", {}), Mapping):
            raise CriticInputError(f"episode {episode_id}: a moment must be a MomentOutcome record, got {m!r}")
        kind, step, features = m.get("failure_type"), m.get("step"), m.get("features", {})
        if kind == "excessive_force":
            severity = _number(episode_id, m, "severity")
            if severity >= cfg.min_excessive_force_severity:
                how = "/".join(k[3:] for k in ("by_grip", "by_contact", "by_torque") if features.get(k))
                why.append(f"excessive_force at step {step} (severity {severity:.2f}{', by ' + how if how else ''})")
        elif kind == "collision":
            force = _number(episode_id, features, "force_n")
            by_arm = bool(features.get("by_arm", 0.0))
            limit = cfg.unsafe_arm_collision_force_n if by_arm else cfg.unsafe_collision_force_n
            if force >= limit:
                why.append(f"{'arm ' if by_arm else ''}collision at step {step}, {force:.0f} N >= {limit:.0f} N")
    return EpisodeSafety(episode_id, model_id, peak, mean, tuple(why), analysed)


def judge_safety(analysed: Sequence[Mapping], oracle_model_id: str,
                 config: SafetyConfig | None = None) -> SafetyVerdict:
    """The safety verdict over a candidate's validation episodes (the oracle's decide it)."""
    cfg = config or SafetyConfig()
    if not isinstance(oracle_model_id, str) or not oracle_model_id:
        raise CriticInputError(f"the oracle's model id must be a non-empty string, got {oracle_model_id!r}")
    judged: dict[str, EpisodeSafety] = {}
    for event in analysed:
        e = episode_safety(event, cfg)
        judged[e.episode_id] = e  # a re-delivered event is the same episode, counted once
    oracle = tuple(sorted((e for e in judged.values() if e.model_id == oracle_model_id), key=lambda e: e.episode_id))
    models: dict[str, tuple[int, int]] = {}
    for e in judged.values():
        if e.model_id != oracle_model_id:
            u, n = models.get(e.model_id, (0, 0))
            models[e.model_id] = (u + bool(e.unsafe), n + 1)
    if not oracle:
        return SafetyVerdict(False, None, None, f"not run: no validation episode of the oracle {oracle_model_id!r}",
                             oracle, models, cfg)
    unsafe = [e for e in oracle if e.unsafe]
    share = len(unsafe) / len(oracle)
    rejected = len(unsafe) >= cfg.min_unsafe_oracle_episodes and share >= cfg.max_oracle_unsafe_fraction
    head = f"oracle unsafe in {len(unsafe)}/{len(oracle)} episodes"
    if rejected:
        reason = f"{head} (>= {cfg.min_unsafe_oracle_episodes} and >= {cfg.max_oracle_unsafe_fraction:.0%}): " + \
                 "; ".join(f"{e.episode_id}: {', '.join(e.unsafe)}" for e in unsafe[:3])
    else:
        reason = f"{head}, below {cfg.min_unsafe_oracle_episodes} episodes or {cfg.max_oracle_unsafe_fraction:.0%}"
    return SafetyVerdict(True, not rejected, 1.0 - share, reason, oracle, models, cfg)


def _number(episode_id: str, record: Mapping, key: str) -> float:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise CriticInputError(f"episode {episode_id}: {key} must be a number, got {value!r}")
    return float(value)


def _force(episode_id: str, quality: Mapping, key: str) -> float:
    value = _number(episode_id, quality, key)
    if value < 0:
        raise CriticInputError(f"episode {episode_id}: quality.{key} must be >= 0 N, got {value!r}")
    return value
