"""Determinism across machines: one digest per episode of a fixed set, to compare between machines
and BLAS kernels.

Runs every registered model (the scripted ones and the oracle) on Lift, Stack and PickPlaceCan
and one or two models on a scenario per mutation factor (and a push), a few seeds each, through
the rollout worker's own path (producers.sim.rollout.Episode, producers.recorder with a final
keyframe), and prints one line per episode:

    <label> digest <16 hex>  steps=<n> <termination>

The digest hashes the Avro bytes of the episode's Step events and its EpisodeEnded (the final
keyframe's sha256 included), wall times left out. The last line digests all lines. Then the
failure detector and the clusterer run over the episodes' events (streams/failures, the pure
stages), and one more line digests what they decided (moments and clusters).

The lines must be identical on every machine and under every BLAS kernel numpy may pick. Check
by hand, setting a kernel in one command only (never in tests or CI):

    python bench/determinism.py > a.txt
    OPENBLAS_CORETYPE=Haswell python bench/determinism.py > b.txt     # also Prescott, Sandybridge
    diff a.txt b.txt && echo identical

LIBERO's episodes run in the LIBERO venv (robosuite 1.4): ``--libero`` takes libero_object tasks
0 and 1, every scripted model on the base scenario and the oracle on one scenario per LIBERO
mutation axis (producers/libero/mutations.py PROBE):

    ~/.cache/sepa-eval/libero-0.1.1/bin/python bench/determinism.py --libero

Usage:
    python bench/determinism.py [--seeds 2] [--processes 2] [--quick]
    <LIBERO venv>/bin/python bench/determinism.py --libero [--seeds 2]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
from datetime import UTC, datetime
from multiprocessing import Pool
from pathlib import Path

# The project root instead of bench/ (whose libero.py would shadow the libero package)
sys.path[0] = str(Path(__file__).resolve().parents[1])

from producers.recorder import EpisodeIdentity, record_episode  # noqa: E402
from schemas.codec import Codec  # noqa: E402

EPOCH = datetime(2000, 1, 1, tzinfo=UTC)  # every event_time, so the digest holds contents only
LIBERO_SUITE, LIBERO_TASKS = "libero_object", (0, 1)


def _robosuite_scenarios() -> tuple[dict, dict]:
    """(base scenarios by task, one scenario per mutation factor): robosuite 1.5, this venv only."""
    from schemas.scenario import Distractor, ScenarioSpec

    bases = {"Lift": ScenarioSpec(env_name="Lift", horizon=150, instruction="lift the cube"),
             "Stack": ScenarioSpec(env_name="Stack", horizon=200, instruction="stack the red cube on the green cube"),
             "PickPlaceCan": ScenarioSpec(env_name="PickPlaceCan", horizon=200, instruction="put the can in its bin")}
    lift = bases["Lift"]
    # one scenario per robosuite mutation factor (streams/mutations/operators.py FACTORS)
    return bases, {
        "placement": lift.mutate(placement_x_range=(0.05, 0.1), placement_y_range=(-0.1, -0.05)),
        "pose": lift.mutate(pose_offset_xyz=(0.04, -0.03, 0.0)),
        "friction": lift.mutate(object_friction=0.15, object_mass=0.4),
        "mass": lift.mutate(object_mass=0.8),
        "colour": lift.mutate(object_rgba=(0.2, 0.8, 0.3, 1.0)),
        "size": lift.mutate(object_size_scale=0.7),
        "distractors": lift.mutate(distractors=(Distractor(kind="box", size=0.025, x=0.05, y=0.03),
                                                Distractor(kind="cylinder", size=0.02, x=-0.06, y=0.05))),
        "instruction": lift.mutate(instruction="pick the red block up off the table"),
        "horizon": lift.mutate(horizon=90),
        "hold": lift.mutate(success_hold_steps=30, horizon=200),
        "place": lift.mutate(place_target_xy=(0.1, 0.08), horizon=250),
        "composition": lift.mutate(object_friction=0.3, pose_offset_xyz=(-0.03, 0.02, 0.0),
                                   distractors=(Distractor(kind="ball", size=0.02, x=0.04, y=0.0),)),
        "stack-distractor": bases["Stack"].mutate(distractors=(Distractor(kind="box", size=0.02, x=0.12, y=0.12),),
                                                  object_friction=0.5),
    }
PUSH = {"target": "hand", "force_xyz": (0.0, 6.0, 0.0), "start_step": 15, "duration_steps": 10}


class _Collect:
    """A Publisher stand-in that keeps the events (the bench needs no broker)."""

    def __init__(self):
        self.events: list[dict] = []

    def publish(self, event: dict) -> None:
        self.events.append(event)


def _jobs(seeds: int, quick: bool, libero: bool) -> list[tuple]:
    """(label, benchmark, scenario dict, model id, seed, pushed) per episode."""
    from producers.sim.models import load_models  # the registry file (no robosuite import)

    models = [m.model_id for m in load_models()]
    jobs = []
    if libero:
        from producers.libero.env import libero_package_dir
        from producers.libero.mutations import PROBE
        from producers.libero.tasks import TaskCatalog

        catalog = TaskCatalog(libero_package_dir())
        names = catalog.tasks(LIBERO_SUITE)
        for seed in range(seeds):
            for ti in LIBERO_TASKS:
                base = catalog.base_scenario(LIBERO_SUITE, names[ti], None)
                for model in (models[:2] if quick else models):
                    jobs.append((f"{LIBERO_SUITE}/{ti}/{model}/seed{seed}", "libero", base.to_dict(), model, seed,
                                 False))
                for axis, mutate in PROBE.items():
                    jobs.append((f"{LIBERO_SUITE}/{ti}/{axis}/{models[0]}/seed{seed}", "libero", mutate(base).to_dict(),
                                 models[0], seed, False))
        return jobs
    bases, factors = _robosuite_scenarios()
    for seed in range(seeds):
        for env_name, spec in bases.items():
            for model in (models[:2] if quick else models):
                jobs.append((f"{env_name}/{model}/seed{seed}", "robosuite", spec.to_dict(), model, seed, False))
        for factor, spec in factors.items():
            for model in (models[:1] if quick else [models[0], models[-1]]):
                jobs.append((f"{factor}/{model}/seed{seed}", "robosuite", spec.to_dict(), model, seed, False))
        jobs.append((f"push/{models[-1]}/seed{seed}", "robosuite", bases["Lift"].to_dict(), models[-1], seed, True))
    return jobs


def _episode(benchmark: str, scenario: dict, model_id: str, seed: int, pushed: bool):
    """(env, Episode) of the rollout worker of that benchmark."""
    if benchmark == "libero":
        from producers.libero.env import LiberoEnv
        from producers.libero.rollout import Episode
        from producers.libero.worker import load_libero_models
        from schemas.libero_scenario import LiberoScenario

        model = load_libero_models()[model_id]
        env = LiberoEnv(LiberoScenario.from_dict(scenario), keyframes=True)
        return env, model, Episode(env, model.make_policy(), seed)
    from producers.sim.envs import make_env
    from producers.sim.models import load_models
    from producers.sim.perturb import Push
    from producers.sim.rollout import Episode
    from schemas.scenario import ScenarioSpec

    model = {m.model_id: m for m in load_models()}[model_id]
    env = make_env(ScenarioSpec.from_dict(scenario), keyframes=True)
    pushes = (Push(**PUSH),) if pushed else ()
    return env, model, Episode(env, model.make_policy(), seed, perturbations=pushes)


def _run(job: tuple) -> tuple[str, str, list[dict]]:
    from producers.keyframes import KeyframeStore

    label, benchmark, scenario, model_id, seed, pushed = job
    env, model, episode = _episode(benchmark, scenario, model_id, seed, pushed)
    try:
        collect = _Collect()
        identity = EpisodeIdentity(run_id="determinism", benchmark=benchmark, task=scenario["env_name"],
                                   scenario=scenario, model_id=model.model_id, model_version=model.version, seed=seed,
                                   variant="push" if pushed else "", simulator="")
        with tempfile.TemporaryDirectory() as frames:
            summary = record_episode(episode, collect, identity, KeyframeStore(Path(frames)))
    finally:
        env.close()
    codec, h = Codec(), hashlib.sha256()
    events = []
    for event in collect.events:
        event = {**event, "envelope": {**event["envelope"], "event_time": EPOCH}}
        events.append(event)
        if event["envelope"]["event_type"] in ("Step", "EpisodeEnded"):
            h.update(codec.encode(event))
    line = f"{label:<44} digest {h.hexdigest()[:16]}  steps={summary.steps} {summary.termination}"
    return label, line, events


def _detector_digest(episodes: list[list[dict]]) -> str:
    """What the online failure detector (streams/failures/detector.py, its pure stage) decides from
    these episodes: every FailureMoment, times left out."""
    from streams.failures.detector import DetectorConfig, EpisodeDetector

    codec, h = Codec(), hashlib.sha256()
    for events in episodes:
        start = events[0]
        detector = EpisodeDetector(DetectorConfig(), start["episode_id"], start["scenario_id"], start["model_id"])
        moments = []
        for event in events[1:]:
            kind = event["envelope"]["event_type"]
            moments += detector.on_step(event) if kind == "Step" else detector.on_end(event)
        for moment in moments:
            h.update(codec.encode({**moment, "envelope": {**moment["envelope"], "event_time": EPOCH}}))
    return h.hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--quick", action="store_true", help="fewer models per scenario")
    parser.add_argument("--libero", action="store_true", help="LIBERO's episodes (run with the LIBERO venv's python)")
    args = parser.parse_args()
    jobs = _jobs(args.seeds, args.quick, args.libero)
    with Pool(args.processes) as pool:
        results = pool.map(_run, jobs, chunksize=1)
    everything = hashlib.sha256()
    for _, line, _ in results:
        print(line, flush=True)
        everything.update(line.encode())
    print(f"{'failure detector':<44} digest {_detector_digest([events for _, _, events in results])}")
    print(f"{'all ' + str(len(results)) + ' episodes':<44} digest {everything.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
