"""The labelled failure set: seeded robosuite episodes under injected causes, each labelled with the
failure type its cause must produce and the control step at which the cause became physical fact.

    python -m producers.sim.failure_set --out eval_memory/failure_set --seeds 30
    episodes = generate(CASES, seeds=30)                 # in code: LabelledEpisode per run
    labels, events = load(Path("eval_memory/failure_set"))

It is the ground truth that ``bench/failure_mining.py`` scores the failure detector and clusterer
against. A label never comes from the detector: the expected type is the injected cause, and the
cause step is read from the simulation with a definition of its own (``Case.cause``; the ones that
need a physical threshold use a different quantity from the detector's, e.g. the hand sliding
5 mm along the object for a slip, where the detector watches the finger-pad force).

Causes, one case each (Lift unless noted; every case also has an oracle baseline in "success"):

    success         oracle on benign variants (colour, mass, placement) -> no failure at all
    success_expert  the scripted expert (noisy actions) on the same variants; only its successes
                    are labelled (a failure of it has no known cause)
    grasp_miss      the policy believes the cube is 7-9 cm from where it is
    slip            a heavy (0.8-2 kg), slippery (friction 0.05-0.3) cube
    drop            the policy opens the gripper once the cube is 5-9 cm up
    knocked_object  a 1-1.5 N push on the cube for 2 steps before the grasp
    excessive_force a 150-190 N downward push on the hand for 5 steps
    collision       the policy believes the cube is 2-4 cm lower (the fingers hit the table)
    stall           the policy freezes at step 5-15
    out_of_reach    the cube is placed 0.33-0.35 m forward of the table centre
    wrong_object    Stack: the policy believes cubeA is where cubeB is
    timeout         a horizon of 20-35 steps

Each case lists ``after``: the types its cause leads to physically (a missed grasp leaves the hand
hovering: a stall, then a timeout). They are not false positives when they come at or after the
cause step; anything else, or anything before the cause, is. joint_limit has no case here: no
injected cause drives a Panda joint into its limit without reaching out of reach first.

Files in ``--out``: ``labels.jsonl`` (one LabelledEpisode per line) and one Avro object container
per event type (``EpisodeStarted.avro``, ``Step.avro``, ``EpisodeEnded.avro``) with the project's
schemas, i.e. exactly what the rollout worker would have published.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import numpy as np

from producers.fixed_order import norm
from producers.recorder import EpisodeIdentity, EpisodeRecorder, simulator_versions
from producers.sim.envs import SimEnv, make_env
from producers.sim.faults import FreezeAt, PerceptionOffset, ReleaseWhenLifted
from producers.sim.perturb import Push
from producers.sim.policies import Policy, make_policy
from producers.sim.rollout import Episode
from schemas.loader import expanded_schema
from schemas.scenario import ScenarioSpec

RUN_ID = "failure-set"
EVENT_TYPES = ("EpisodeStarted", "Step", "EpisodeEnded")
# A stall is a window without progress: it exists once the window is full (the detector's default
# window, 2 s at 20 Hz). The label says so rather than pretending a frozen policy stalls at once.
STALL_WINDOW_STEPS = 40
SLIDE_M = 0.005  # the hand moved this far relative to the gripped object: it slides in the grasp
FALL_M = 0.01  # the released object is this far below where it was let go: it is falling
REST_M = 0.001  # fingers moving less than this per step (2 cm/s) have come to rest
NEAREST_M = 0.005  # within this of the closest the hand ever gets to the object: the arm is spent

BASE_LIFT = ScenarioSpec(env_name="Lift", horizon=150, instruction="lift the cube")
BASE_STACK = ScenarioSpec(env_name="Stack", horizon=200, instruction="stack the red cube on the green cube")


@dataclass(frozen=True)
class Setup:
    spec: ScenarioSpec
    policy: Policy
    pushes: tuple[Push, ...] = ()
    stop_on_success: bool = True


@dataclass(frozen=True)
class Trace:
    """What a cause definition may look at: the whole simulated episode, privileged."""

    steps: list[dict]  # Step events
    policy: Policy
    pushes: tuple[Push, ...]


@dataclass(frozen=True)
class Case:
    name: str
    expected: str | None  # the failure type the cause must produce; None: no failure at all
    after: tuple[str, ...]  # types the cause leads to, fine at or after the cause step
    setup: Callable[[int, np.random.Generator], Setup]
    cause: Callable[[Trace], int | None]  # the step the cause became physical fact
    repeat: int = 1  # seeds run = repeat x the seeds asked for (more successes: a false-flag rate needs them)


@dataclass(frozen=True)
class LabelledEpisode:
    case: str
    seed: int
    episode_id: str
    scenario_id: str
    expected: str | None
    after: list[str]
    cause_step: int | None
    success: bool
    termination: str
    steps: int
    notes: dict = field(default_factory=dict)


# -- cause definitions ----------------------------------------------------------------------

def _closing(step: dict) -> bool:
    return step["action"][-1] > 0.0


def _target_pos(step: dict) -> np.ndarray:
    return np.asarray(step["object_poses"][0]["pos"], dtype=float)


def _contact(step: dict, a: str, b: str) -> float:
    lo, hi = sorted((a, b))
    return sum(c["normal_force"] for c in step["contacts"] if c["a"] == lo and c["b"] == hi)


def _fingers_at_rest_after_close(trace: Trace) -> int | None:
    """The first close: the step its fingers come to rest (an empty close shuts them)."""
    steps = trace.steps
    start = next((i for i, s in enumerate(steps) if _closing(s)), None)
    if start is None:
        return None
    for i in range(start + 1, len(steps)):
        if abs(steps[i]["gripper_opening"] - steps[i - 1]["gripper_opening"]) < REST_M:
            return steps[i]["t"]
    return None


def _hand_slides_on_object(trace: Trace) -> int | None:
    """After the pads first press the object with the gripper closing, the first step the hand has
    moved SLIDE_M relative to the object (in the world frame) while still closing."""
    name = trace.steps[0]["object_poses"][0]["name"]
    ref = None
    for s in trace.steps:
        if ref is None:
            if _closing(s) and _contact(s, "gripper", name) > 0.0:
                ref = np.asarray(s["eef_pos"]) - _target_pos(s)
            continue
        if not _closing(s):
            return None
        if norm(np.asarray(s["eef_pos"]) - _target_pos(s) - ref) >= SLIDE_M:
            return s["t"]
    return None


def _falling_after_release(trace: Trace) -> int | None:
    released = trace.policy.injected_at
    if released is None:
        return None
    z0 = None
    for s in trace.steps:
        if s["t"] == released:
            z0 = _target_pos(s)[2]
        elif z0 is not None and z0 - _target_pos(s)[2] >= FALL_M:
            return s["t"]
    return None


def _first_push(trace: Trace) -> int | None:
    return min((p.start_step for p in trace.pushes), default=None)


def _hand_meets_table(trace: Trace) -> int | None:
    return next((s["t"] for s in trace.steps if _contact(s, "gripper", "table") > 0.0), None)


def _freeze_plus_window(trace: Trace) -> int | None:
    frozen = trace.policy.injected_at
    return None if frozen is None else frozen + STALL_WINDOW_STEPS - 1


def _hand_as_near_as_it_gets(trace: Trace) -> int | None:
    gaps = [float(norm((np.asarray(s["eef_pos"]) - _target_pos(s))[:2])) for s in trace.steps]
    if not gaps:
        return None
    nearest = min(gaps)
    return next(s["t"] for s, g in zip(trace.steps, gaps, strict=True) if g <= nearest + NEAREST_M)


def _closing_on_other_object(trace: Trace) -> int | None:
    names = [p["name"] for p in trace.steps[0]["object_poses"][1:]]
    for s in trace.steps:
        if _closing(s) and any(_contact(s, "gripper", n) > 0.0 for n in names):
            return s["t"]
    return None


def _last_step(trace: Trace) -> int | None:
    return trace.steps[-1]["t"] if trace.steps else None


def _no_cause(trace: Trace) -> None:
    return None


# -- cases ----------------------------------------------------------------------------------

def _oracle() -> Policy:
    return make_policy("oracle")


def _heading(rng: np.random.Generator, distance: tuple[float, float]) -> tuple[float, float, float]:
    angle, d = rng.uniform(0.0, 2 * math.pi), rng.uniform(*distance)
    return (d * math.cos(angle), d * math.sin(angle), 0.0)


def _pick(rng: np.random.Generator, options: Sequence[Any]) -> Any:
    return options[int(rng.integers(len(options)))]


# Scenario variants are few and fixed, so a set of N seeds builds a handful of envs, not N.
_BENIGN = (BASE_LIFT, BASE_LIFT.mutate(object_rgba=(0.2, 0.6, 0.9, 1.0)), BASE_LIFT.mutate(object_mass=0.15),
           BASE_LIFT.mutate(placement_x_range=(-0.08, 0.08), placement_y_range=(-0.08, 0.08)))
_SLIPPERY = tuple(BASE_LIFT.mutate(object_friction=f, object_mass=m) for f, m in ((0.05, 0.8), (0.15, 1.2), (0.3, 2.0)))
_FAR = BASE_LIFT.mutate(placement_x_range=(0.33, 0.35), placement_y_range=(-0.05, 0.05))


def _wrong_object_setup(seed: int, rng: np.random.Generator) -> Setup:
    # Where cubeB will be is known only after the reset: let the policy look it up then.
    return Setup(BASE_STACK, _BelieveOtherCube(_oracle()))


class _BelieveOtherCube(PerceptionOffset):
    """Sees cubeA where cubeB is (the offset is set from the first observation)."""

    def __init__(self, inner: Policy):
        super().__init__(inner, (0.0, 0.0, 0.0))

    def _act(self, obs, signals):
        if self.injected_at is None:
            poses = {p["name"]: p["pos"] for p in signals["object_poses"]}
            self.offset = (poses["cubeB"][0] - poses["cubeA"][0], poses["cubeB"][1] - poses["cubeA"][1], 0.0)
        return super()._act(obs, signals)


CASES: tuple[Case, ...] = (
    Case("success", None, (), lambda seed, rng: Setup(_pick(rng, _BENIGN), _oracle()), _no_cause, repeat=3),
    Case("success_expert", None, (), lambda seed, rng: Setup(_pick(rng, _BENIGN), make_policy("scripted-expert")),
         _no_cause, repeat=2),
    Case("grasp_miss", "grasp_miss", ("stall", "timeout"),
         lambda seed, rng: Setup(BASE_LIFT, PerceptionOffset(_oracle(), _heading(rng, (0.07, 0.09)))),
         _fingers_at_rest_after_close),
    Case("slip", "slip", ("grasp_miss", "stall", "timeout"),
         lambda seed, rng: Setup(_pick(rng, _SLIPPERY), _oracle()), _hand_slides_on_object),
    Case("drop", "drop", ("stall", "timeout"),
         lambda seed, rng: Setup(BASE_LIFT, ReleaseWhenLifted(_oracle(), float(rng.uniform(0.05, 0.09))),
                                 stop_on_success=False),
         _falling_after_release),
    Case("knocked_object", "knocked_object", ("grasp_miss", "stall", "timeout"),
         lambda seed, rng: Setup(BASE_LIFT, _oracle(), (Push(
             target="object", force_xyz=tuple(float(rng.uniform(1.0, 1.5)) * v for v in _heading(rng, (1.0, 1.0))),
             start_step=int(rng.integers(3, 9)), duration_steps=2),)),
         _first_push),
    Case("excessive_force", "excessive_force", ("collision", "knocked_object", "grasp_miss", "stall", "timeout"),
         lambda seed, rng: Setup(BASE_LIFT, _oracle(), (Push(
             target="hand", force_xyz=(0.0, 0.0, -float(rng.uniform(150.0, 190.0))),
             start_step=int(rng.integers(5, 11)), duration_steps=5),)),
         _first_push),
    Case("collision", "collision", ("excessive_force", "stall", "grasp_miss", "knocked_object", "timeout"),
         lambda seed, rng: Setup(BASE_LIFT, PerceptionOffset(_oracle(), (0.0, 0.0, -float(rng.uniform(0.02, 0.04))))),
         _hand_meets_table),
    Case("stall", "stall", ("timeout",),
         lambda seed, rng: Setup(BASE_LIFT, FreezeAt(_oracle(), int(rng.integers(5, 16)))), _freeze_plus_window),
    Case("out_of_reach", "out_of_reach", ("excessive_force", "collision", "grasp_miss", "stall", "timeout"),
         lambda seed, rng: Setup(_FAR, _oracle()), _hand_as_near_as_it_gets),
    Case("wrong_object", "wrong_object", ("collision", "stall", "timeout"), _wrong_object_setup,
         _closing_on_other_object),
    Case("timeout", "timeout", (),
         lambda seed, rng: Setup(BASE_LIFT.mutate(horizon=int(rng.integers(20, 36))), _oracle()), _last_step),
)
BY_NAME = {c.name: c for c in CASES}


# -- running --------------------------------------------------------------------------------

class _Collect:
    """A Publisher stand-in for the recorder: keeps the events instead of sending them."""

    def __init__(self) -> None:
        self.events: list[dict] = []

    def publish(self, event: dict) -> None:
        self.events.append(event)


@functools.cache
def _simulator() -> str:
    return simulator_versions("robosuite", "mujoco")


def run_case(case: Case, seed: int, envs: dict[str, SimEnv]) -> tuple[LabelledEpisode, list[dict]]:
    """One labelled episode: its label and the events the recorder made of it."""
    rng = np.random.default_rng([seed, sum(map(ord, case.name))])
    setup = case.setup(seed, rng)
    env = envs.get(setup.spec.scenario_id)
    if env is None:
        env = envs[setup.spec.scenario_id] = make_env(setup.spec)
    identity = EpisodeIdentity(RUN_ID, "robosuite", setup.spec.env_name, setup.spec.to_dict(),
                               f"{case.name}:{setup.policy.name}", "1", seed, request_id=f"{case.name}-{seed}",
                               producer="failure-set", simulator=_simulator())
    sink = _Collect()
    episode = Episode(env, setup.policy, seed, perturbations=setup.pushes, stop_on_success=setup.stop_on_success)
    with EpisodeRecorder(sink, identity) as recorder:
        for record in episode:
            recorder.step(record.action, record.signals, record.reward, record.success)
        out = episode.outcome
        recorder.end(out.success, out.termination, out.error)
    steps = [e for e in sink.events if e["envelope"]["event_type"] == "Step"]
    cause = case.cause(Trace(steps, setup.policy, setup.pushes))
    label = LabelledEpisode(case=case.name, seed=seed, episode_id=identity.episode_id,
                            scenario_id=setup.spec.scenario_id, expected=case.expected, after=list(case.after),
                            cause_step=cause, success=out.success, termination=out.termination, steps=out.steps,
                            notes={"policy": setup.policy.name, "pushes": [p.to_dict() for p in setup.pushes],
                                   "injected_at": getattr(setup.policy, "injected_at", None)})
    return label, sink.events


def _run_cases(jobs: list[tuple[str, int]]) -> list[tuple[LabelledEpisode, list[dict]]]:
    envs: dict[str, SimEnv] = {}
    try:
        return [run_case(BY_NAME[name], seed, envs) for name, seed in jobs]
    finally:
        for env in envs.values():
            env.close()


def generate(cases: Iterable[Case], seeds: int, processes: int = 1) -> list[tuple[LabelledEpisode, list[dict]]]:
    """Runs every case on seeds 0 .. seeds * case.repeat - 1. With ``processes`` > 1, the runs are
    spread over spawned processes (an episode is a function of case and seed alone: same result)."""
    jobs = [(c.name, s) for c in cases for s in range(seeds * c.repeat)]
    if processes <= 1:
        return _run_cases(jobs)
    import multiprocessing

    shares = [jobs[i::processes] for i in range(processes)]
    with ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn")) as pool:
        results = [r for part in pool.map(_run_cases, shares) for r in part]
    order = {job: i for i, job in enumerate(jobs)}
    return sorted(results, key=lambda r: order[(r[0].case, r[0].seed)])


# -- files ----------------------------------------------------------------------------------

def save(out: Path, results: list[tuple[LabelledEpisode, list[dict]]]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "labels.jsonl", "w") as f:
        for label, _ in results:
            f.write(json.dumps(asdict(label)) + "\n")
    for event_type in EVENT_TYPES:
        records = [e for _, events in results for e in events if e["envelope"]["event_type"] == event_type]
        with open(out / f"{event_type}.avro", "wb") as f:
            fastavro.writer(f, fastavro.parse_schema(expanded_schema(event_type)), records, codec="deflate")


def load(directory: Path) -> tuple[list[LabelledEpisode], dict[str, list[dict]]]:
    """(labels, events by event type) as save() wrote them."""
    labels_path = directory / "labels.jsonl"
    if not labels_path.exists():
        raise FileNotFoundError(f"no labelled failure set in {directory} (labels.jsonl missing): "
                                f"run python -m producers.sim.failure_set --out {directory}")
    labels = [LabelledEpisode(**json.loads(line)) for line in labels_path.read_text().splitlines() if line]
    events = {}
    for event_type in EVENT_TYPES:
        with open(directory / f"{event_type}.avro", "rb") as f:
            events[event_type] = list(fastavro.reader(f))
    return labels, events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("eval_memory/failure_set"))
    parser.add_argument("--seeds", type=int, default=30, help="episodes per case (times the case's repeat); "
                        "bench/failure_mining.py tunes on seeds 0-9 and scores on the rest")
    parser.add_argument("--cases", nargs="*", default=[c.name for c in CASES], choices=[c.name for c in CASES])
    parser.add_argument("--processes", type=int, default=2)
    args = parser.parse_args(argv)
    results = generate([BY_NAME[n] for n in args.cases], args.seeds, processes=args.processes)
    save(args.out, results)
    for name in args.cases:
        mine = [label for label, _ in results if label.case == name]
        print(f"{name:16s} {len(mine):3d} episodes, {sum(m.success for m in mine):3d} succeeded, "
              f"cause step found in {sum(m.cause_step is not None for m in mine)}")
    print(f"wrote {len(results)} labelled episodes to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
