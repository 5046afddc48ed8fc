"""Feasibility pre-check of a LIBERO scenario (a mutation's child above all), in the LIBERO venv:
is the scene physically sound, and can the oracle still reach the goal?

    report = check_feasibility(spec, seeds=range(3))
    report.feasible, report.reasons     # False, ["seed 1: ketchup_sepa1 and milk_1 interpenetrate 12 mm", ...]

For each seed, after LiberoEnv.reset (init state, layout perturbations, settle steps):
- objects rest: every object's speed is below REST_SPEED_MPS (a body still sliding or falling was
  placed badly);
- no interpenetration: no contact between two objects, or an object and the table, is deeper
  than MAX_PENETRATION_M;
- the target is on the work surface: it did not fall below its init-state height by more than
  MAX_SINK_M (pushed through, or off, the floor or table);
then the oracle (ScriptedPickPlace with perfect skill) runs the episode and must succeed by
LIBERO's own goal check. The scenario is feasible when at least ``min_success`` of the seeds pass
all of these (default: all of them).

``python -m producers.libero.feasibility < scenario.json`` runs it in the LIBERO venv for a process
that cannot import LIBERO (the streams worker's mutator, through infra/libero_feasibility.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from producers.libero.exceptions import LiberoError
from schemas.exceptions import LiberoScenarioError
from schemas.libero_scenario import LiberoScenario

REST_SPEED_MPS = 0.02
MAX_PENETRATION_M = 0.005
MAX_SINK_M = 0.03


@dataclass(frozen=True)
class FeasibilityReport:
    scenario_id: str
    seeds: tuple[int, ...]
    passed: tuple[int, ...]
    reasons: tuple[str, ...] = field(default_factory=tuple)
    min_success: int = 0

    @property
    def feasible(self) -> bool:
        return len(self.passed) >= self.min_success


def scene_problems(env, seed: int) -> list[str]:
    """What is physically wrong with the scene right after ``env.reset(seed)``."""
    problems = []
    for name, speed in env.object_speeds().items():
        if speed > REST_SPEED_MPS:
            problems.append(f"seed {seed}: {name} is still moving at {speed:.3f} m/s after settling")
    worst: dict[tuple[str, str], float] = {}
    for a, b, depth in env.penetrations():
        key = (a, b) if a < b else (b, a)
        worst[key] = max(worst.get(key, 0.0), depth)
    for (a, b), depth in sorted(worst.items()):
        if depth > MAX_PENETRATION_M:
            problems.append(f"seed {seed}: {a} and {b} interpenetrate {depth * 1000:.0f} mm")
    z = float(env.signals()["object_poses"][0]["pos"][2])
    z0 = env.placed_heights.get(env.target)
    if z0 is not None and z < z0 - MAX_SINK_M:
        problems.append(f"seed {seed}: the target {env.target} fell {100 * (z0 - z):.0f} cm while settling")
    return problems


def check_feasibility(spec: LiberoScenario, seeds: Iterable[int] = range(3), min_success: int | None = None,
                      env=None) -> FeasibilityReport:
    """Runs the checks above; ``env`` may be a LiberoEnv already built for ``spec``."""
    from producers.libero.env import LiberoEnv
    from producers.libero.policies import ScriptedPickPlace
    from producers.libero.rollout import run_episode

    seeds = tuple(int(s) for s in seeds)
    own = env is None
    env = env or LiberoEnv(spec)
    passed, reasons = [], []
    try:
        for seed in seeds:
            env.reset(seed)
            problems = scene_problems(env, seed)
            if problems:
                reasons.extend(problems)
                continue
            outcome, _ = run_episode(env, ScriptedPickPlace(), seed)
            if not outcome.success:
                reasons.append(f"seed {seed}: the oracle did not reach the goal ({outcome.termination}"
                               f"{': ' + outcome.error if outcome.error else ''})")
                continue
            passed.append(seed)
    finally:
        if own:
            env.close()
    need = len(seeds) if min_success is None else min_success
    return FeasibilityReport(spec.scenario_id, seeds, tuple(passed), tuple(reasons), need)


def report_json(report: FeasibilityReport) -> dict:
    """The report as JSON (what ``python -m producers.libero.feasibility`` prints)."""
    return {"scenario_id": report.scenario_id, "feasible": report.feasible, "seeds": list(report.seeds),
            "passed": list(report.passed), "reasons": list(report.reasons), "min_success": report.min_success}


def main(argv: list[str] | None = None) -> int:
    """In the LIBERO venv: a scenario record (JSON) on stdin -> its report as the last stdout line.

        <libero python> -m producers.libero.feasibility [--seeds 0 1 2] [--min-success N] < scenario.json
    """
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="python -m producers.libero.feasibility")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--min-success", type=int, default=None)
    args = parser.parse_args(argv)
    spec = LiberoScenario.from_dict(json.loads(sys.stdin.read()))
    try:
        report = check_feasibility(spec, args.seeds, args.min_success)
    except (LiberoError, LiberoScenarioError) as exc:  # the scene does not build or reset: infeasible, said so
        need = len(args.seeds) if args.min_success is None else args.min_success
        report = FeasibilityReport(spec.scenario_id, tuple(args.seeds), (),
                                   (f"the scene does not build: {type(exc).__name__}: {exc}",), need)
    print(json.dumps(report_json(report)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
