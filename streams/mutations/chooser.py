"""Which operators to apply: failure-guided from the clusters, blind for the baseline arm,
compositions of promoted factors; and the feasibility pre-check before anything is proposed.

    config = ChooserConfig()
    cands = guided_candidates(cluster_events, seed=7, config=config, parents=active_by_id)
    cands = blind_candidates(active_specs, n=6, seed=7, config=config)
    cand = compose(base, [(promoted_a, parent_a), (promoted_b, parent_b)])
    proposal = propose(cands)            # Proposal: proposed and infeasible, each with its result
    proposal.proposed[0].feasibility.to_json()
    proposal = propose_guided(cluster_events, seed=7, parents=active_by_id)   # both steps at once

Failure-guided: for each live cluster (size > 0; largest first, at most ``max_clusters``; with
``focus`` models given, the clusters holding most of their episodes first: the rare failures and
fragile successes of models tied at the top, the only ones that can separate them) the
operator is drawn from the cluster's root failure types (the first moment of its episodes; the
types of all moments when no root types are given; the dominant type as the last resort) through
FAILURE_OPERATORS, except with probability ``exploration``, when it is drawn uniformly from every
operator (``params["chosen_by"]`` says "failure:<type>" or "exploration"). Coverage-aware: an
operator whose least tested factor n scenarios test already (the active ones, and the candidates
this cycle drew before it) is kept with probability 1/(1+n), else the draw is an exploration one,
which goes to a factor nothing tests yet while there is one; so one dominant failure mode (knocked
objects on Lift) seeds its factor once or twice, not the whole benchmark. Either way an operator of
several factors changes the one the benchmark tests least (Coverage.least): exploration drawn for
"place" makes a place variant, not a hold, and a material draw after a mass scenario a friction
one. The parent is the cluster's representative scenario, else its most frequent scenario in
``parents``.

Blind: the same operators with their blind parameter ranges, no cluster, an operator drawn
uniformly, parents drawn uniformly from the given scenarios.

Perception: when no registered model sees pixels or reads the instruction (``perceiving`` false:
only the scripted models and the oracle, which read poses), no arm draws what only such a model
feels: no paraphrase, camera or lighting operator (OperatorFamily.perception_operators) and no tint
of material's colour variant. Such a candidate can make no registered model fail.

Per benchmark: the parent's benchmark picks the operator family (``family_for``): robosuite's
operators (operators.py, FAILURE_OPERATORS here) or LIBERO's (libero_operators.py, its own
failure-type map and ranges under ``ChooserConfig.libero``); the draws are the same for both.

Deterministic: every draw comes from operators.rng_for(seed, arm, cluster or parent, index), so
the same inputs and seed give the same candidates, in the same order. A candidate identical to its
parent or to an earlier candidate is dropped; an operator that has nothing to change (a time
budget already at its floor) is skipped and the next draw tried, up to ``max_attempts`` draws per
wanted candidate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from schemas.libero_scenario import LiberoScenario
from schemas.scenario import ScenarioSpec
from streams.mutations.exceptions import CompositionError, OperatorError, SeedError
from streams.mutations.libero_operators import LiberoChooserConfig, libero_family
from streams.mutations.operator_config import OperatorConfig
from streams.mutations.operators import (
    MAX_ACTIVE_PER_FACTOR,
    OPERATOR_FACTORS,
    OPERATORS,
    PERCEPTION_FACTORS,
    Candidate,
    FailureSeed,
    OperatorFamily,
    rng_for,
)

# Failure type -> the operators that make that failure more likely (issue 10 section 1).
FAILURE_OPERATORS: dict[str, tuple[str, ...]] = {
    "slip": ("material",),
    "drop": ("material",),
    "excessive_force": ("material",),
    "knocked_object": ("distractor",),
    "collision": ("distractor",),
    "wrong_object": ("distractor",),
    "grasp_miss": ("pose",),
    "out_of_reach": ("pose",),
    "joint_limit": ("pose",),
    "timeout": ("time_budget", "horizon_extension"),
    "stall": ("time_budget", "horizon_extension"),
}


@dataclass(frozen=True, kw_only=True)
class ChooserConfig:
    """exploration: share of guided draws that ignore the failure types. candidates_per_cluster,
    max_clusters: how many guided candidates per cycle. max_attempts: draws per wanted candidate
    before giving up on it."""

    exploration: float = 0.2
    # what exploration draws from
    exploration_operators: tuple[str, ...] = tuple(sorted(OPERATORS))
    # Some registered model sees pixels or reads the instruction (a websocket policy). When none
    # does, exploration leaves out the operators only such a model feels (a paraphrase, a camera:
    # OperatorFamily.perception_operators): their candidates cannot make a registered model fail,
    # and each one spends a slot and its validation rollouts on nothing.
    perceiving: bool = True
    candidates_per_cluster: int = 3
    max_clusters: int = 4
    max_attempts: int = 4
    operators: OperatorConfig = field(default_factory=OperatorConfig)
    # LIBERO parents: their operators' exploration set and ranges (streams/mutations/libero_operators.py)
    libero: LiberoChooserConfig = field(default_factory=LiberoChooserConfig)

    def __post_init__(self) -> None:
        if isinstance(self.exploration, bool) or not isinstance(self.exploration, (int, float)) \
                or not 0.0 <= self.exploration <= 1.0:
            raise ValueError(f"ChooserConfig.exploration must be in [0, 1], got {self.exploration!r}")
        unknown = set(self.exploration_operators) - set(OPERATORS)
        if unknown or not self.exploration_operators:
            raise ValueError(f"ChooserConfig.exploration_operators must be some of {sorted(OPERATORS)}, "
                             f"got {self.exploration_operators!r}")
        for name in ("candidates_per_cluster", "max_clusters", "max_attempts"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ChooserConfig.{name} must be a positive integer, got {v!r}")


def family_for(parent: ScenarioSpec | LiberoScenario, config: ChooserConfig) -> OperatorFamily:
    """The operators for the parent's benchmark: LIBERO's (libero_operators.py) for a
    LiberoScenario, robosuite's (operators.py) otherwise; exploration without the perception
    operators when no registered model perceives (``config.perceiving``)."""
    if isinstance(parent, LiberoScenario):
        family = libero_family(config.libero)
    else:
        family = OperatorFamily("robosuite", OPERATORS, FAILURE_OPERATORS, tuple(config.exploration_operators),
                                config.operators, OPERATOR_FACTORS)
    if config.perceiving:
        return family
    felt = tuple(op for op in family.exploration_operators if op not in family.perception_operators)
    cfg = family.config  # material's colour variant: a tint no pose reader sees
    cfg = replace(cfg, guided_material_weights=(*cfg.guided_material_weights[:2], 0.0),
                  blind_material_weights=(*cfg.blind_material_weights[:2], 0.0))
    # nor does coverage count colour as material's: never tested, it would make material look new forever
    reach = {op: fs if set(fs) <= PERCEPTION_FACTORS else tuple(f for f in fs if f not in PERCEPTION_FACTORS)
             for op, fs in family.operator_factors.items()}
    return replace(family, exploration_operators=felt or family.exploration_operators, config=cfg,
                   operator_factors=reach)


def operator_weights(seed: FailureSeed,
                     failure_operators: Mapping[str, tuple[str, ...]] = FAILURE_OPERATORS) -> dict[str, float]:
    """Operator -> weight from the cluster's failure types (each type's share split evenly over
    its operators); empty when none of its types maps to an operator."""
    types = seed.root_types or seed.failure_types or ({seed.dominant_failure_type: 1.0}
                                                      if seed.dominant_failure_type else {})
    weights: dict[str, float] = {}
    for kind in sorted(types):
        ops = failure_operators.get(kind, ())
        for op in ops:
            weights[op] = weights.get(op, 0.0) + types[kind] / len(ops)
    return {op: w for op, w in weights.items() if w > 0}


@dataclass(frozen=True)
class Coverage:
    """What the active benchmark already tests: factor -> its active scenarios. An operator whose
    every factor is at MAX_ACTIVE_PER_FACTOR is not drawn (the gate would turn its candidate away
    for breadth), and exploration draws from the operators that reach a factor the benchmark does
    not test yet, while there are any: a benchmark of one factor ranks models by one skill."""

    factors: Mapping[str, int] = field(default_factory=dict)

    def full(self, op: str, family: OperatorFamily) -> bool:
        reach = family.operator_factors.get(op, ())
        return bool(reach) and all(self.factors.get(f, 0) >= MAX_ACTIVE_PER_FACTOR for f in reach)

    def new(self, op: str, family: OperatorFamily) -> bool:
        reach = family.operator_factors.get(op, ())
        return not reach or any(self.factors.get(f, 0) == 0 for f in reach)

    def tested(self, op: str, family: OperatorFamily) -> int:
        """How many scenarios test the least tested factor ``op`` reaches (0 for an operator that
        reaches an untested factor, or whose factors are not known)."""
        reach = family.operator_factors.get(op, ())
        return min((self.factors.get(f, 0) for f in reach), default=0)

    def least(self, op: str, family: OperatorFamily) -> tuple[str, ...] | None:
        """The factors ``op`` reaches that the benchmark tests least (none at the cap): what its
        draw should change, so that an operator chosen for a factor nobody tests changes that
        one. None when its factors are not known."""
        reach = [f for f in family.operator_factors.get(op, ()) if self.factors.get(f, 0) < MAX_ACTIVE_PER_FACTOR]
        if not reach:
            return None
        fewest = min(self.factors.get(f, 0) for f in reach)
        return tuple(f for f in reach if self.factors.get(f, 0) == fewest)

    def plus(self, factor: str) -> Coverage:
        """This coverage with one more scenario on ``factor`` (a candidate drawn this cycle)."""
        return Coverage({**self.factors, factor: self.factors.get(factor, 0) + 1})


def _choose(seed: FailureSeed, rng, config: ChooserConfig, family: OperatorFamily,
            coverage: Coverage = Coverage()) -> tuple[str, str, tuple[str, ...] | None]:
    """(operator, why, the factors its draw may change: Coverage.least)."""
    weights = {op: w for op, w in operator_weights(seed, family.failure_operators).items()
               if not coverage.full(op, family)}
    explore = float(rng.random()) < config.exploration
    if not explore and weights:
        names = sorted(weights)
        total = sum(weights[n] for n in names)
        op = names[int(rng.choice(len(names), p=[weights[n] / total for n in names]))]
        # A failure the benchmark already tests n times keeps its operator with chance 1/(1+n); else
        # the draw goes to a factor nobody tests yet: one dominant failure mode (knocked objects)
        # must not become the whole benchmark, which would then rank models by one skill.
        n = coverage.tested(op, family)
        explore = n > 0 and float(rng.random()) >= 1.0 / (1 + n)
    if explore or not weights:
        names = sorted(op for op in family.exploration_operators if not coverage.full(op, family))
        fresh = [op for op in names if coverage.new(op, family)]
        names = fresh or names or sorted(family.exploration_operators)
        op = names[int(rng.integers(len(names)))]
        return op, "exploration", coverage.least(op, family)
    types = seed.root_types or seed.failure_types or {seed.dominant_failure_type: 1.0}
    cause = max((t for t in types if op in family.failure_operators.get(t, ())), key=lambda t: (types[t], t))
    return op, f"failure:{cause}", coverage.least(op, family)


def _parent_of(seed: FailureSeed,
               parents: Mapping[str, ScenarioSpec | LiberoScenario]) -> ScenarioSpec | LiberoScenario:
    if seed.representative_scenario is not None:
        return seed.representative_scenario
    for sid, _ in sorted(seed.scenario_counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if sid in parents:
            return parents[sid]
    raise SeedError(f"cluster {seed.cluster_id}: no representative scenario and none of its scenarios "
                    f"{sorted(seed.scenario_counts)} is among the {len(parents)} known parents")


@dataclass(frozen=True)
class Skipped:
    """A cluster or draw that produced no candidate, and why."""

    key: str
    reason: str


@dataclass
class Generated:
    candidates: list[Candidate]
    skipped: list[Skipped]


class _Collector:
    def __init__(self, exclude: Iterable[str] = ()):
        self.seen = set(exclude)
        self.out: list[Candidate] = []
        self.skipped: list[Skipped] = []

    def add(self, cand: Candidate) -> bool:
        if cand.spec.scenario_id == cand.parent.scenario_id or cand.spec.scenario_id in self.seen:
            return False
        self.seen.add(cand.spec.scenario_id)
        self.out.append(cand)
        return True


def guided_candidates(clusters: Sequence[Mapping[str, Any] | FailureSeed], seed: int,
                      config: ChooserConfig | None = None, parents: Mapping[str, ScenarioSpec] | None = None,
                      exclude: Iterable[str] = (), focus: Sequence[str] = (),
                      coverage: Coverage = Coverage()) -> Generated:
    """Failure-guided candidates from ClusterUpdated dicts (or FailureSeeds). ``exclude``:
    scenario ids not to propose again (the active benchmark, earlier candidates); ``focus``: model
    ids whose clusters go first; ``coverage``: what the benchmark tests already (Coverage)."""
    cfg = config or ChooserConfig()
    parents = parents or {}
    col = _Collector(exclude)
    seeds: list[FailureSeed] = []
    for c in clusters:
        try:
            seeds.append(c if isinstance(c, FailureSeed) else FailureSeed.from_event(c))
        except SeedError as exc:
            cid = c.get("cluster_id") if isinstance(c, Mapping) else None
            col.skipped.append(Skipped(f"cluster {cid}", str(exc)))
    latest: dict[str, FailureSeed] = {}
    for s in seeds:  # the latest revision of each cluster
        if s.cluster_id not in latest or s.revision >= latest[s.cluster_id].revision:
            latest[s.cluster_id] = s
    def focus_share(s: FailureSeed) -> int:
        return sum(s.model_counts.get(m, 0) for m in focus)
    live = sorted((s for s in latest.values() if s.size > 0 and (not focus or focus_share(s) > 0)),
                  key=lambda s: (-focus_share(s), -s.size, s.cluster_id))
    if focus:  # the others after: a focus with few clusters still fills the cycle
        live += sorted((s for s in latest.values() if s.size > 0 and focus_share(s) == 0),
                       key=lambda s: (-s.size, s.cluster_id))
    for s in live[:cfg.max_clusters]:
        try:
            parent = _parent_of(s, parents)
        except SeedError as exc:
            col.skipped.append(Skipped(f"cluster {s.cluster_id}", str(exc)))
            continue
        family = family_for(parent, cfg)
        for i in range(cfg.candidates_per_cluster):
            drawn = len(col.out)
            _draw(col, f"cluster {s.cluster_id} #{i}", cfg,
                  lambda a, s=s, i=i: rng_for(seed, "guided", s.cluster_id, i, a),
                  lambda rng, s=s, family=family, coverage=coverage: _choose(s, rng, cfg, family, coverage),
                  parent, s, family)
            if len(col.out) > drawn:  # the cycle's own candidates count as tested for its later draws
                coverage = coverage.plus(col.out[-1].factor)
    return Generated(col.out, col.skipped)


def blind_candidates(parents: Sequence[ScenarioSpec], n: int, seed: int, config: ChooserConfig | None = None,
                     exclude: Iterable[str] = ()) -> Generated:
    """``n`` blind candidates: operator and parent drawn uniformly, blind parameter ranges (none
    that only a perceiving model feels, when none is registered: ``config.perceiving``)."""
    cfg = config or ChooserConfig()
    if not parents:
        raise OperatorError("blind_candidates needs at least one parent scenario")
    ordered = sorted(parents, key=lambda p: p.scenario_id)
    col = _Collector(exclude)
    for i in range(n):
        pick = rng_for(seed, "blind-parent", i)
        parent = ordered[int(pick.integers(len(ordered)))]
        family = family_for(parent, cfg)
        # what no registered model could feel is left out here too: a baseline worth beating
        names = sorted(op for op in family.operators if cfg.perceiving or op not in family.perception_operators)

        def choose(rng, names=names):
            return names[int(rng.integers(len(names)))], "blind", None
        _draw(col, f"blind #{i}", cfg, lambda a, i=i: rng_for(seed, "blind", i, a), choose, parent, None, family)
    return Generated(col.out, col.skipped)


def _draw(col: _Collector, key: str, cfg: ChooserConfig, rng_at: Callable[[int], Any],
          choose: Callable[[Any], tuple[str, str, tuple[str, ...] | None]], parent: ScenarioSpec | LiberoScenario,
          seed: FailureSeed | None, family: OperatorFamily) -> None:
    reasons = []
    for attempt in range(cfg.max_attempts):
        rng = rng_at(attempt)
        op, why, factors = choose(rng)
        # only an operator of several factors takes ``factors``, and only when it narrows them
        narrows = factors is not None and set(family.operator_factors.get(op, ())) - set(factors)
        try:
            cand = family.operators[op](parent, seed, rng, family.config,
                                        **({"factors": factors} if narrows else {}))
        except OperatorError as exc:
            reasons.append(str(exc))
            continue
        cand = Candidate(spec=cand.spec, parent=cand.parent, operator=cand.operator, factor=cand.factor,
                         params={**cand.params, "chosen_by": why, "attempt": str(attempt)},
                         generator=cand.generator, source_cluster_id=cand.source_cluster_id)
        if col.add(cand):
            return
        reasons.append(f"{op} repeated an existing scenario ({cand.spec.scenario_id})")
    col.skipped.append(Skipped(key, "; ".join(reasons) or "no draw"))


# -- compositions -------------------------------------------------------------------------------

_COMPOSABLE = ("placement_x_range", "placement_y_range", "pose_offset_xyz", "object_friction", "object_mass",
               "object_rgba", "object_size_scale", "distractors", "instruction", "horizon", "success_hold_steps",
               "place_target_xy")


def _diff(child: ScenarioSpec, parent: ScenarioSpec) -> dict[str, Any]:
    return {f: getattr(child, f) for f in _COMPOSABLE if getattr(child, f) != getattr(parent, f)}


def compose(base: ScenarioSpec, promoted: Sequence[tuple[ScenarioSpec, ScenarioSpec]]) -> Candidate:
    """One scenario carrying the changes of several promoted single-factor scenarios, each given
    with its parent, onto ``base`` (their common parent): factor "composition", params naming the
    parents. Refuses fewer than two, other parents than ``base``, and two that set one field
    differently (distractors are concatenated; a hold's horizon and a time budget conflict)."""
    if len(promoted) < 2:
        raise CompositionError(f"a composition needs at least two promoted scenarios, got {len(promoted)}")
    if any(isinstance(s, LiberoScenario) for s in (base, *(x for pair in promoted for x in pair))):
        raise CompositionError("compositions compose robosuite scenarios only; a LIBERO scenario was given")
    changes: dict[str, Any] = {}
    names = []
    for child, parent in promoted:
        if parent.scenario_id != base.scenario_id:
            raise CompositionError(f"{child.scenario_id} was mutated from {parent.scenario_id}, not from the base "
                                   f"{base.scenario_id}")
        diff = _diff(child, parent)
        if not diff:
            raise CompositionError(f"{child.scenario_id} changes nothing against its parent")
        for f, v in diff.items():
            if f == "distractors":
                v = changes.get(f, base.distractors) + v[len(base.distractors):]
            elif f in changes and changes[f] != v:
                raise CompositionError(f"{child.scenario_id} sets {f} to {v!r}, another promoted scenario to "
                                       f"{changes[f]!r}")
            changes[f] = v
        names.append(child.scenario_id)
    try:
        spec = base.mutate(**changes)
    except ValueError as exc:
        raise CompositionError(f"the composition of {names} is not a valid scenario: {exc}") from exc
    return Candidate(spec=spec, parent=base, operator="composition", factor="composition",
                     params={"parents": ",".join(names), "fields": ",".join(sorted(changes))},
                     generator="composition")


# -- feasibility before proposing ---------------------------------------------------------------

@dataclass(frozen=True)
class Checked:
    candidate: Candidate
    feasibility: Any  # producers.sim.feasibility.FeasibilityResult


@dataclass
class Proposal:
    """``proposed``: feasible candidates, ``infeasible``: the rest with the reason in their
    result; ``cost_s``: wall time of all checks."""

    proposed: list[Checked]
    infeasible: list[Checked]
    cost_s: float
    skipped: list[Skipped] = field(default_factory=list)  # draws that made no candidate

    def extend(self, other: Proposal) -> None:
        """Adds another proposal's candidates, check time and skipped draws to this one."""
        self.proposed += other.proposed
        self.infeasible += other.infeasible
        self.cost_s += other.cost_s
        self.skipped += other.skipped

    @property
    def mean_check_s(self) -> float:
        n = len(self.proposed) + len(self.infeasible)
        return self.cost_s / n if n else math.nan


def propose(candidates: Sequence[Candidate], check: Callable[[ScenarioSpec], Any] | None = None) -> Proposal:
    """Runs the feasibility pre-check on every candidate (default
    producers.sim.feasibility.check_feasibility) and splits them."""
    if check is None:
        from producers.sim.feasibility import check_feasibility as check  # the simulator, only when used
    t0 = time.perf_counter()
    ok, bad = [], []
    for cand in candidates:
        result = check(cand.spec)
        (ok if result.feasible else bad).append(Checked(cand, result))
    return Proposal(ok, bad, time.perf_counter() - t0)


def propose_guided(clusters: Sequence[Mapping[str, Any] | FailureSeed], seed: int,
                   config: ChooserConfig | None = None, parents: Mapping[str, ScenarioSpec] | None = None,
                   exclude: Iterable[str] = (), check: Callable[[ScenarioSpec], Any] | None = None,
                   focus: Sequence[str] = ()) -> Proposal:
    """guided_candidates(), then propose(): what a cycle's failure-guided arm proposes."""
    generated = guided_candidates(clusters, seed, config, parents, exclude, focus)
    proposal = propose(generated.candidates, check)
    proposal.skipped = generated.skipped
    return proposal


def propose_blind(parents: Sequence[ScenarioSpec], n: int, seed: int, config: ChooserConfig | None = None,
                  exclude: Iterable[str] = (), check: Callable[[ScenarioSpec], Any] | None = None) -> Proposal:
    """blind_candidates(), then propose(): what a cycle's blind arm proposes."""
    generated = blind_candidates(parents, n, seed, config, exclude)
    proposal = propose(generated.candidates, check)
    proposal.skipped = generated.skipped
    return proposal
