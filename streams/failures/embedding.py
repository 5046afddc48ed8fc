"""A compact, fixed-length embedding of one failed episode, and its inverse for summaries.

    episode = FailedEpisode.from_analysed(episode_analysed_event)   # or FailedEpisode(...) by hand
    x = embed(episode, EmbeddingConfig())      # np.ndarray, shape (len(feature_names()),)
    decode(centroid, config)                   # {feature name: value in its own units}
    facts(episode)                             # EpisodeFacts: what a cluster summary counts beyond x

Layout (``feature_names()``), each block multiplied by its weight so distances mix them as
configured; ``decode`` divides the weights back out, so a cluster centroid reads directly as
"fraction of episodes with a slip", "mean first-slip time as a fraction of the episode", ...:

The moments are every FailureMoment the episode got (EpisodeAnalysed.moments, recovered or not):
the embedding says what happened, the recovery fields do not enter it.

- ``root:<t>``   1 for the type of the episode's first moment, its likely root cause (11 dims;
  ties at one step go to the earlier type in FAILURE_TYPES). Consequences look alike across
  causes (a miss, a slip and a drop all end in a stall and a timeout); the first moment does not.
- ``type:<t>``   1 if the episode had a moment of failure type t (11 dims, FAILURE_TYPES order)
- ``when:<t>``   first moment of type t at step / episode steps, in (0, 1]; 0 if absent (11 dims)
- ``severity_max``, ``severity_mean``, ``moments`` (log1p(count) / log1p(moments_scale))
- ``force_peak``, ``force_mean``: EpisodeEnded.quality contact forces / force_scale_n
- ``goal_remaining``: goal_distance_m at the last moment / goal_scale_m
- ``lift_max``: highest object_lift_m at any moment / lift_scale_m
- ``displacement_max``: largest knocked-object displacement / displacement_scale_m
- ``scn_low_friction`` (log10(1/friction) / 2, 0 = unchanged), ``scn_mass`` (log10(mass /
  reference_mass_kg) / 2), ``scn_size`` (object_size_scale - 1), ``scn_distractors`` (count / 4),
  ``scn_offset`` (|pose_offset_xyz| / offset_scale_m)

Every ratio is clipped to [-clip, clip] so one extreme value cannot dominate a distance.

``facts`` keeps what a cluster's ClusterUpdated reports but the embedding does not hold: the model,
the failure types and the root type, and the *site* of the root moment (``SITE_FEATURES``: where the
hand and the target were, the target's offset from its start, the force at that moment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from functools import lru_cache

import numpy as np

from streams.exceptions import ConfigError
from streams.failures.detector import FAILURE_TYPES

EMBEDDING_VERSION = "failure-embedding/1.1"

_STATS = ("severity_max", "severity_mean", "moments")
_FORCE = ("force_peak", "force_mean")
_POSE = ("goal_remaining", "lift_max", "displacement_max")
_SCENARIO = ("scn_low_friction", "scn_mass", "scn_size", "scn_distractors", "scn_offset")


@dataclass(frozen=True, kw_only=True)
class EmbeddingConfig:
    """Block weights (dimensionless) and the scales that map physical values to ~[0, 1]."""

    root_weight: float = 1.0  # first-moment (root cause) type block
    type_weight: float = 1.0  # failure-type presence block
    timing_weight: float = 0.5  # first-occurrence timing block
    stats_weight: float = 0.5  # severity and moment-count block
    force_weight: float = 0.5  # contact-force block
    pose_weight: float = 0.5  # goal / lift / displacement block
    scenario_weight: float = 0.3  # scenario-parameter block
    moments_scale: float = 10.0  # moment count that maps to 1.0 (log scale)
    force_scale_n: float = 100.0  # contact force that maps to 1.0, N
    goal_scale_m: float = 0.10  # goal distance that maps to 1.0, m
    lift_scale_m: float = 0.20  # object lift that maps to 1.0, m
    displacement_scale_m: float = 0.20  # knocked-object displacement that maps to 1.0, m
    reference_mass_kg: float = 0.1  # object mass that maps to 0 (log scale), kg
    offset_scale_m: float = 0.10  # pose offset norm that maps to 1.0, m
    clip: float = 2.0  # every ratio is clipped to [-clip, clip]

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value < 0:
                raise ConfigError(f"EmbeddingConfig.{f.name} must be a finite number >= 0, got {value!r}")
        for name in ("moments_scale", "force_scale_n", "goal_scale_m", "lift_scale_m", "displacement_scale_m",
                     "reference_mass_kg", "offset_scale_m", "clip"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"EmbeddingConfig.{name} must be > 0, got {getattr(self, name)!r}")


# The site of a moment: where it happened (world frame, m) and the target's offset from its start (m).
SITE_POSITION = ("eef_x", "eef_y", "eef_z", "object_x", "object_y", "object_z", "object_dx", "object_dy")
# ``force_n`` of a site: the first of these features the moment carries (collision, slip/drop,
# wrong_object, excessive_force, grasp_miss name their force differently).
SITE_FORCE = ("force_n", "grip_force_n", "contact_force_n", "max_contact_force_n", "peak_grip_force_n")
SITE_FEATURES = SITE_POSITION + ("force_n",)


@dataclass
class FailedEpisode:
    """Everything the clusterer knows about one failed episode."""

    episode_id: str
    scenario_id: str
    model_id: str
    steps: int
    termination: str
    moments: list[dict] = field(default_factory=list)  # FailureMoment / MomentOutcome dicts
    quality: dict | None = None  # EpisodeEnded.quality
    scenario: dict | None = None  # the ScenarioSpec, when the start was seen

    @classmethod
    def from_analysed(cls, event: dict) -> FailedEpisode:
        """From an EpisodeAnalysed event (failures.episodes); moments in step order."""
        spec = event["scenario"]
        return cls(event["episode_id"], event["scenario_id"], event["model_id"], event["steps"],
                   event["termination"], sorted(event["moments"], key=lambda m: m["step"]), event["quality"],
                   spec if spec.get("env_name") else None)


@dataclass(frozen=True)
class EpisodeFacts:
    """What a cluster summary counts about one episode beyond its embedding (see ``facts``)."""

    model_id: str = ""
    failure_types: tuple[str, ...] = ()  # each type the episode had a moment of, FAILURE_TYPES order
    root_type: str | None = None  # the first moment's type
    site: tuple[tuple[str, float], ...] = ()  # (SITE_FEATURES name, value) the root moment carries
    scenario: dict | None = None  # ScenarioSpec


_INDEX = {t: i for i, t in enumerate(FAILURE_TYPES)}


def _type_index(moment: dict, episode_id: str) -> int:
    try:
        return _INDEX[moment["failure_type"]]
    except KeyError:
        raise ValueError(f"episode {episode_id}: moment at step {moment.get('step')} has unknown failure type "
                         f"{moment.get('failure_type')!r} (known: {', '.join(FAILURE_TYPES)})") from None


def root_moment(episode: FailedEpisode) -> dict | None:
    """The episode's first moment, its likely root cause (ties at one step: FAILURE_TYPES order)."""
    if not episode.moments:
        return None
    return min(episode.moments, key=lambda m: (int(m["step"]), _type_index(m, episode.episode_id)))


def facts(episode: FailedEpisode) -> EpisodeFacts:
    types = sorted({_type_index(m, episode.episode_id) for m in episode.moments})
    root = root_moment(episode)
    site: list[tuple[str, float]] = []
    if root is not None:
        feats = root["features"]
        site = [(name, float(feats[name])) for name in SITE_POSITION if name in feats]
        force = next((feats[name] for name in SITE_FORCE if name in feats), None)
        if force is not None:
            site.append(("force_n", float(force)))
    return EpisodeFacts(episode.model_id, tuple(FAILURE_TYPES[i] for i in types),
                        None if root is None else root["failure_type"], tuple(site), episode.scenario)


@lru_cache(maxsize=1)
def feature_names() -> tuple[str, ...]:
    return (tuple(f"root:{t}" for t in FAILURE_TYPES) + tuple(f"type:{t}" for t in FAILURE_TYPES)
            + tuple(f"when:{t}" for t in FAILURE_TYPES)
            + _STATS + _FORCE + _POSE + _SCENARIO)


@lru_cache(maxsize=8)
def weights(config: EmbeddingConfig) -> np.ndarray:
    n = len(FAILURE_TYPES)
    w = ([config.root_weight] * n + [config.type_weight] * n + [config.timing_weight] * n
         + [config.stats_weight] * len(_STATS)
         + [config.force_weight] * len(_FORCE) + [config.pose_weight] * len(_POSE)
         + [config.scenario_weight] * len(_SCENARIO))
    out = np.array(w, dtype=float)
    out.setflags(write=False)
    return out


def _ratio(value: float, scale: float, clip: float) -> float:
    r = value / scale
    if not math.isfinite(r):
        return 0.0
    return max(-clip, min(clip, r))


def embed(episode: FailedEpisode, config: EmbeddingConfig) -> np.ndarray:
    """The weighted embedding of one failed episode (see the module docstring for the layout)."""
    c = config.clip
    n = len(FAILURE_TYPES)
    presence = np.zeros(n)
    root = np.zeros(n)
    when = np.zeros(n)
    steps = max(int(episode.steps), 1)
    severities, lift_max, disp_max = [], 0.0, 0.0
    last_step, goal_last = -1, None
    for m in episode.moments:
        i = _type_index(m, episode.episode_id)
        frac = min(1.0, (int(m["step"]) + 1) / steps)
        if presence[i] == 0.0 or frac < when[i]:
            when[i] = frac
        presence[i] = 1.0
        severities.append(float(m["severity"]))
        feats = m["features"]
        lift_max = max(lift_max, feats.get("object_lift_m", 0.0))
        if m["failure_type"] == "knocked_object":
            disp_max = max(disp_max, feats.get("displacement_m", 0.0))
        if int(m["step"]) >= last_step and "goal_distance_m" in feats:
            last_step, goal_last = int(m["step"]), feats["goal_distance_m"]
    stats = [max(severities, default=0.0), float(np.mean(severities)) if severities else 0.0,
             _ratio(math.log1p(len(episode.moments)), math.log1p(config.moments_scale), c)]
    q = episode.quality or {}
    force = [_ratio(q.get("peak_contact_force", 0.0), config.force_scale_n, c),
             _ratio(q.get("mean_contact_force", 0.0), config.force_scale_n, c)]
    pose = [_ratio(goal_last or 0.0, config.goal_scale_m, c), _ratio(lift_max, config.lift_scale_m, c),
            _ratio(disp_max, config.displacement_scale_m, c)]
    s = episode.scenario or {}
    friction, mass = s.get("object_friction"), s.get("object_mass")
    offset = s.get("pose_offset_xyz") or (0.0, 0.0, 0.0)
    scenario = [
        _ratio(math.log10(1.0 / friction), 2.0, c) if friction else 0.0,
        _ratio(math.log10(mass / config.reference_mass_kg), 2.0, c) if mass else 0.0,
        _ratio(float(s.get("object_size_scale", 1.0)) - 1.0, 1.0, c),
        _ratio(float(len(s.get("distractors") or ())), 4.0, c),
        _ratio(math.sqrt(sum(float(v) ** 2 for v in offset)), config.offset_scale_m, c),
    ]
    first = root_moment(episode)
    if first is not None:
        root[_INDEX[first["failure_type"]]] = 1.0
    raw = np.concatenate([root, presence, when, stats, force, pose, scenario])
    return raw * weights(config)


def decode(vector: np.ndarray, config: EmbeddingConfig) -> dict[str, float]:
    """Undo the block weights: a centroid as {feature name: mean value in its own units}."""
    w = weights(config)
    raw = np.divide(vector, w, out=np.zeros_like(vector, dtype=float), where=w > 0)
    return dict(zip(feature_names(), raw.tolist(), strict=True))
