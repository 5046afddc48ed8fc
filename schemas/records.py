"""Typed, frozen records of every Avro schema in schemas/avro: GENERATED, do not edit.

Regenerate with ``python -m schemas.records_codegen write`` after changing a schema. Arrays are
tuples, maps are read-only mappings, enums are Literal strings. schemas/typed.py converts between
these records and the dicts fastavro reads and writes (``to_record``, ``to_avro``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Literal


def _empty_map() -> Mapping:
    return MappingProxyType({})



@dataclass(frozen=True, slots=True, kw_only=True)
class Envelope:
    """Carried by every event. event_id is stable (derived from the event's natural key) so a replayed
    or re-sent event deduplicates.
    """

    event_id: str
    event_type: str
    event_time: datetime
    producer: str
    run_id: str
    schema_version: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Distractor:
    """The Avro record Distractor."""

    kind: str
    size: float
    x: float
    y: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectPose:
    """The Avro record ObjectPose."""

    name: str
    pos: tuple[float, ...]
    quat: tuple[float, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class Contact:
    """Summed normal force between two contact groups this step: 'gripper' (hand and fingers), 'robot'
    (the arm's other links), 'table' (table, floor, fixed arena), or an object's name from the
    step's object_poses; a != b.
    """

    a: str
    b: str
    normal_force: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionQuality:
    """How an episode was executed, not only whether it succeeded. Computed from its steps."""

    smoothness_jerk: float
    path_efficiency: float
    peak_contact_force: float
    mean_contact_force: float
    time_to_success: int | None = None
    regrasp_count: int
    idle_steps: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ScenarioSpec:
    """A task variant. scenario_id is a content hash of every field but parent_id. Unions of null with
    a complex type are avoided on purpose: ClickHouse has no Nullable(Array) or Nullable(Tuple).
    """

    scenario_id: str
    parent_id: str | None = None
    benchmark: str = 'robosuite'
    env_name: str
    robot: str = 'Panda'
    horizon: int
    instruction: str
    placement_x_range: tuple[float, ...] = ()
    placement_y_range: tuple[float, ...] = ()
    pose_offset_xyz: tuple[float, ...] = (0.0, 0.0, 0.0)
    object_friction: float | None = None
    object_mass: float | None = None
    object_rgba: tuple[float, ...] = ()
    object_size_scale: float = 1.0
    distractors: tuple[Distractor, ...] = ()
    seed: int = 0
    success_hold_steps: int = 0
    place_target_xy: tuple[float, ...] = ()
    suite: str = ''
    init_state_index: int = 0
    perturbations: Mapping[str, float] = field(default_factory=_empty_map)


@dataclass(frozen=True, slots=True, kw_only=True)
class MomentOutcome:
    """A FailureMoment of the episode, with whether the episode later recovered from it."""

    moment_id: str
    failure_type: str
    step: int
    severity: float
    features: Mapping[str, float]
    recovered_step: int = -1
    recovery: str = ''


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidateProposed:
    """The Avro record CandidateProposed."""

    envelope: Envelope
    scenario_id: str
    parent_scenario_id: str
    operator: str
    params: Mapping[str, str]
    source_cluster_id: str | None = None
    scenario: ScenarioSpec
    mutator_version: str
    factor: str = ''
    generator: str = ''
    cycle_id: str = ''
    feasibility_json: str = '{}'


@dataclass(frozen=True, slots=True, kw_only=True)
class CandidatesGenerated:
    """The mutator's answer to one CycleStarted: the seeds it used, what it proposed, what failed the
    feasibility pre-check.
    """

    envelope: Envelope
    cycle_id: str
    generator: str
    seeds: tuple[str, ...]
    proposed: tuple[str, ...]
    infeasible: Mapping[str, str] = field(default_factory=_empty_map)
    mutator_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterAssigned:
    """An episode's cluster at one clusterer revision. The intake assignment (intake=true) carries the
    embedding the clusterer absorbed; cluster_id is 'noise' while the episode belongs to no cluster
    yet. The latest assignment by position is the current one.
    """

    envelope: Envelope
    cluster_id: str
    episode_id: str
    scenario_id: str
    distance: float
    embedding: tuple[float, ...]
    clusterer_version: str
    model_id: str = ''
    intake: bool = False
    revision: int = 0
    position: int = 0


SummarySource = Literal["llm", "features"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterUpdated:
    """A cluster's state at one clusterer revision (size 0: retired). Carries what a mutator needs: the
    failure types, where the failures happened, the representative's scenario.
    """

    envelope: Envelope
    cluster_id: str
    centroid: tuple[float, ...]
    size: int
    representative_episode_id: str
    representative_scenario_id: str
    dominant_failure_type: str
    summary: str
    summary_source: SummarySource
    clusterer_version: str
    revision: int = 0
    position: int = 0
    failure_types: Mapping[str, float] = field(default_factory=_empty_map)
    root_types: Mapping[str, float] = field(default_factory=_empty_map)
    model_counts: Mapping[str, int] = field(default_factory=_empty_map)
    scenario_counts: Mapping[str, int] = field(default_factory=_empty_map)
    site: Mapping[str, float] = field(default_factory=_empty_map)
    representative_scenario: ScenarioSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class CriticVerdict:
    """ran=false means the critic did not really run (no endpoint, stub backend): missing evidence,
    never a pass.
    """

    envelope: Envelope
    scenario_id: str
    critic: str
    critic_version: str
    ran: bool
    score: float | None = None
    passed: bool | None = None
    backend: str
    reason: str
    evidence_json: str = '{}'
    rollouts: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class CycleStarted:
    """One evolution cycle opened by the orchestrator: the mutator generates from the failure clusters
    as of clusters_position, within the budget.
    """

    envelope: Envelope
    cycle_id: str
    cycle: int
    benchmark_version: int
    clusters_position: int
    generator: str
    max_candidates: int
    seed: int
    models: tuple[str, ...] = ()
    focus_models: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class DeadLetter:
    """A message a consumer could not accept, kept whole with the reason."""

    envelope: Envelope
    source_topic: str
    source_partition: int
    source_offset: int
    source_key: bytes | None = None
    original: bytes
    reason: str
    consumer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Deferred:
    """The Avro record Deferred."""

    envelope: Envelope
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...] = ()
    gate_version: str
    checks_json: str = '{}'


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeAnalysed:
    """The failure detector's last word on one episode: every moment it emitted, which the episode
    recovered from, and the end. One per ended episode, on a single-partition topic: the clusterer's
    input.
    """

    envelope: Envelope
    episode_id: str
    scenario_id: str
    model_id: str
    scenario: ScenarioSpec
    success: bool
    termination: str
    steps: int
    quality: ExecutionQuality
    analysed: bool
    reason: str = ''
    moments: tuple[MomentOutcome, ...] = ()
    detector_version: str
    seed: int | None = None


Termination = Literal["success", "timeout", "policy_error", "env_error", "aborted"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeEnded:
    """The Avro record EpisodeEnded."""

    envelope: Envelope
    episode_id: str
    scenario_id: str
    model_id: str
    success: bool
    termination: Termination
    steps: int
    total_reward: float
    quality: ExecutionQuality
    error: str | None = None
    final_keyframe_sha256: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EpisodeStarted:
    """The Avro record EpisodeStarted."""

    envelope: Envelope
    episode_id: str
    request_id: str | None = None
    benchmark: str
    task: str
    scenario_id: str
    scenario: ScenarioSpec
    instruction: str
    model_id: str
    model_version: str
    seed: int
    variant: str = ''
    simulator: str = ''


FailureType = Literal[
    "grasp_miss",
    "slip",
    "drop",
    "knocked_object",
    "excessive_force",
    "collision",
    "stall",
    "out_of_reach",
    "joint_limit",
    "wrong_object",
    "timeout",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureMoment:
    """The Avro record FailureMoment."""

    envelope: Envelope
    episode_id: str
    scenario_id: str
    model_id: str
    failure_type: FailureType
    step: int
    severity: float
    features: Mapping[str, float]
    detector_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRegistered:
    """The Avro record ModelRegistered."""

    envelope: Envelope
    model_id: str
    version: str
    kind: str
    description: str = ''
    params: Mapping[str, str] = field(default_factory=_empty_map)


@dataclass(frozen=True, slots=True, kw_only=True)
class Promoted:
    """The Avro record Promoted."""

    envelope: Envelope
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...] = ()
    gate_version: str
    checks_json: str = '{}'
    benchmark_version: int = 0
    scenario: ScenarioSpec
    parent_scenario_id: str = ''
    source_cluster_id: str = ''
    factor: str = ''


@dataclass(frozen=True, slots=True, kw_only=True)
class Rejected:
    """The Avro record Rejected."""

    envelope: Envelope
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...] = ()
    gate_version: str
    checks_json: str = '{}'


@dataclass(frozen=True, slots=True, kw_only=True)
class Retired:
    """The Avro record Retired."""

    envelope: Envelope
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...] = ()
    gate_version: str
    checks_json: str = '{}'
    benchmark_version: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewDecided:
    """The Avro record ReviewDecided."""

    envelope: Envelope
    scenario_id: str
    approved: bool
    reviewer: str
    note: str = ''


@dataclass(frozen=True, slots=True, kw_only=True)
class ReviewRequested:
    """The Avro record ReviewRequested."""

    envelope: Envelope
    scenario_id: str
    reason: str
    evidence_event_ids: tuple[str, ...] = ()
    gate_version: str
    checks_json: str = '{}'


RolloutPurpose = Literal["sweep", "validation", "adhoc"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutRequested:
    """The Avro record RolloutRequested."""

    envelope: Envelope
    request_id: str
    scenario_id: str
    scenario: ScenarioSpec
    model_id: str
    seeds: tuple[int, ...]
    purpose: RolloutPurpose
    keyframe_every: int = 0
    cameras: tuple[str, ...] = ()
    camera_size: int = 128


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """One control step: the action taken at t and the signals after it. Keyed by episode_id so an
    episode's steps stay in order on one partition. The failure detector reads these fields with the
    conventions below (world frame, metres, newtons, radians, xyzw quaternions);
    producers/recorder.py checks them at step() and documents them for eval farms.
    """

    envelope: Envelope
    episode_id: str
    t: int
    action: tuple[float, ...]
    eef_pos: tuple[float, ...]
    eef_quat: tuple[float, ...]
    gripper_opening: float
    gripper_force: float
    object_poses: tuple[ObjectPose, ...]
    contacts: tuple[Contact, ...]
    joint_torques: tuple[float, ...]
    joint_pos: tuple[float, ...]
    reward: float
    goal_distance: float
    object_lift: float
    keyframe_sha256: str | None = None
    frames: Mapping[str, str] = field(default_factory=_empty_map)


# Every record class by its Avro name.
RECORDS: dict[str, type] = {
    "Envelope": Envelope,
    "Distractor": Distractor,
    "ObjectPose": ObjectPose,
    "Contact": Contact,
    "ExecutionQuality": ExecutionQuality,
    "ScenarioSpec": ScenarioSpec,
    "MomentOutcome": MomentOutcome,
    "CandidateProposed": CandidateProposed,
    "CandidatesGenerated": CandidatesGenerated,
    "ClusterAssigned": ClusterAssigned,
    "ClusterUpdated": ClusterUpdated,
    "CriticVerdict": CriticVerdict,
    "CycleStarted": CycleStarted,
    "DeadLetter": DeadLetter,
    "Deferred": Deferred,
    "EpisodeAnalysed": EpisodeAnalysed,
    "EpisodeEnded": EpisodeEnded,
    "EpisodeStarted": EpisodeStarted,
    "FailureMoment": FailureMoment,
    "ModelRegistered": ModelRegistered,
    "Promoted": Promoted,
    "Rejected": Rejected,
    "Retired": Retired,
    "ReviewDecided": ReviewDecided,
    "ReviewRequested": ReviewRequested,
    "RolloutRequested": RolloutRequested,
    "Step": Step,
}
