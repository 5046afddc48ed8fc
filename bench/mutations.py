"""Generation ahead of validation: what the mutation operators make of the base benchmark's
failures, what the feasibility pre-check costs, and how often a candidate separates the models.

1. Sweeps every registered model over base Lift (seeds 0..N-1), runs the failure detector on each
   failed episode and groups the failures by root type (the first moment) into cluster-like
   failure seeds (ClusterUpdated dicts: failure_types, root_types, site = mean of where the root
   moment happened, representative scenario). This stands in for the clusterer, which groups by
   embedding, not type: the point here is the operators, not the clustering.
2. Generates failure-guided candidates from those seeds and as many blind ones (same operators,
   blind parameter ranges, no seed), and runs the feasibility pre-check on every one: counts,
   the reasons of the infeasible ones and the check's cost per candidate.
3. With --rollouts K: runs every registered model on each feasible candidate (seeds 0..K-1) and
   counts the discriminative ones the way the gate will ask: the oracle solves it (>= 90%), the
   ranked models' success falls with their rank (Spearman >= 0.8) and best minus worst non-oracle
   model >= 30 points. A rough preview of the loop's guided-vs-blind comparison, not the gate.

Usage:
    nice -n 10 python bench/mutations.py [--sweep-seeds 20] [--seed 7] [--rollouts 10] [--processes 2]
                                         [--per-cluster 3] [--exploration 0.2]

Prints a table per arm, then one JSON document.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from multiprocessing import Pool
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import producers.sim  # noqa: E402, F401  (MUJOCO_GL before mujoco)
from schemas.scenario import ScenarioSpec  # noqa: E402

BASE = ScenarioSpec(env_name="Lift", horizon=200, instruction="lift the cube")
ORACLE_SOLVES = 0.9
MIN_SPEARMAN = 0.8
MIN_SPREAD = 0.3

_envs: dict = {}


def _env(spec: ScenarioSpec):
    from producers.sim.envs import make_env

    env = _envs.get(spec.scenario_id)
    if env is None:
        env = _envs[spec.scenario_id] = make_env(spec)
    return env


def _sweep_task(task: tuple[dict, str, list[int]]) -> list[dict]:
    """Episodes of one model on one scenario; for failed ones, the root moment and where it happened."""
    from producers.recorder import EpisodeIdentity, EpisodeRecorder
    from producers.sim.failure_set import _Collect
    from producers.sim.models import load_models
    from producers.sim.rollout import Episode
    from streams.failures.detector import DetectorConfig, EpisodeDetector

    spec_dict, model_id, seeds = task
    spec = ScenarioSpec.from_dict(spec_dict)
    env = _env(spec)
    model = next(m for m in load_models() if m.model_id == model_id)
    out = []
    for seed in seeds:
        identity = EpisodeIdentity("bench", "robosuite", spec.env_name, spec.to_dict(), model_id, model.version, seed,
                                   request_id=f"bench-{model_id}-{seed}")
        sink = _Collect()
        episode = Episode(env, model.make_policy(), seed)
        with EpisodeRecorder(sink, identity) as recorder:
            for r in episode:
                recorder.step(r.action, r.signals, r.reward, r.success)
            o = episode.outcome
            recorder.end(o.success, o.termination, o.error)
        row = {"model_id": model_id, "seed": seed, "success": o.success}
        if not o.success:
            steps = [e for e in sink.events if e["envelope"]["event_type"] == "Step"]
            end = next(e for e in sink.events if e["envelope"]["event_type"] == "EpisodeEnded")
            det = EpisodeDetector(DetectorConfig(), end["episode_id"], end["scenario_id"], end["model_id"])
            moments = sorted([m for s in steps for m in det.on_step(s)] + det.on_end(end), key=lambda m: m["step"])
            row["types"] = sorted({m["failure_type"] for m in moments})
            if moments:
                root = moments[0]
                at = steps[min(root["step"], len(steps) - 1)]
                start = steps[0]["object_poses"][0]["pos"]
                obj = at["object_poses"][0]["pos"]
                row["root"] = root["failure_type"]
                row["site"] = {"eef_x": at["eef_pos"][0], "eef_y": at["eef_pos"][1], "eef_z": at["eef_pos"][2],
                               "object_x": obj[0], "object_y": obj[1], "object_z": obj[2],
                               "object_dx": obj[0] - start[0], "object_dy": obj[1] - start[1]}
        out.append(row)
    return out


def failure_seeds(rows: list[dict], spec: ScenarioSpec) -> list[dict]:
    """Failed episodes grouped by root type, as ClusterUpdated-shaped dicts."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if not r["success"] and "root" in r:
            groups[r["root"]].append(r)
    seeds = []
    for root, members in sorted(groups.items()):
        n = len(members)
        types: dict[str, float] = defaultdict(float)
        for m in members:
            for t in m["types"]:
                types[t] += 1 / n
        site = {k: float(np.mean([m["site"][k] for m in members])) for k in members[0]["site"]}
        seeds.append({"cluster_id": f"root-{root}", "size": n, "revision": 1, "dominant_failure_type": root,
                      "failure_types": dict(types), "root_types": {root: 1.0}, "site": site,
                      "scenario_counts": {spec.scenario_id: n}, "representative_scenario": spec.to_dict()})
    return seeds


def _pool_map(fn, tasks, processes):
    if processes <= 1:
        return [fn(t) for t in tasks]
    with Pool(processes) as pool:
        return pool.map(fn, tasks, chunksize=1)


def _split(seeds: list[int], processes: int) -> list[list[int]]:
    return [seeds[i::processes] for i in range(processes) if seeds[i::processes]]


def _spearman(a: list[float], b: list[float]) -> float:
    ra, rb = (np.argsort(np.argsort(x, kind="stable")).astype(float) for x in (a, b))
    # average ranks for ties
    for x, r in ((a, ra), (b, rb)):
        for v in set(x):
            idx = [i for i, y in enumerate(x) if y == v]
            r[idx] = float(np.mean(r[idx]))
    if ra.std() == 0 or rb.std() == 0:
        return 0.0
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep-seeds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7, help="the mutator's seed")
    parser.add_argument("--rollouts", type=int, default=0, help="seeds per model per candidate (0: no rollouts)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--per-cluster", type=int, default=3, help="guided candidates per failure seed")
    parser.add_argument("--exploration", type=float, default=0.2)
    args = parser.parse_args()

    from producers.sim.feasibility import check_feasibility
    from producers.sim.models import load_models
    from streams.mutations.chooser import ChooserConfig, blind_candidates, guided_candidates, propose

    models = sorted(load_models(), key=lambda m: (m.rank is None, m.rank or 0))
    ids = [m.model_id for m in models]
    t0 = time.perf_counter()
    tasks = [(BASE.to_dict(), mid, part) for mid in ids for part in _split(list(range(args.sweep_seeds)),
                                                                           args.processes)]
    rows = [r for chunk in _pool_map(_sweep_task, tasks, args.processes) for r in chunk]
    sweep_s = time.perf_counter() - t0
    base_success = {mid: sum(r["success"] for r in rows if r["model_id"] == mid) for mid in ids}
    seeds = failure_seeds(rows, BASE)

    config = ChooserConfig(candidates_per_cluster=args.per_cluster, exploration=args.exploration)
    guided = guided_candidates(seeds, seed=args.seed, config=config).candidates
    blind = blind_candidates([BASE], max(len(guided), 1), seed=args.seed, config=config).candidates
    arms = {}
    for arm, cands in (("failure-guided", guided), ("blind", blind)):
        proposal = propose(cands, check=check_feasibility)
        arms[arm] = {"proposal": proposal}

    if args.rollouts:
        for arm in arms.values():
            specs = [c.candidate.spec for c in arm["proposal"].proposed]
            tasks = [(s.to_dict(), mid, part) for s in specs for mid in ids
                     for part in _split(list(range(args.rollouts)), args.processes)]
            t1 = time.perf_counter()
            results = _pool_map(_sweep_task, tasks, args.processes)
            arm["rollout_s"] = time.perf_counter() - t1
            rates: dict[tuple[str, str], list[bool]] = defaultdict(list)
            for (spec_dict, mid, _), chunk in zip(tasks, results, strict=True):
                rates[(spec_dict["scenario_id"], mid)].extend(r["success"] for r in chunk)
            arm["rates"] = {s.scenario_id: [float(np.mean(rates[(s.scenario_id, mid)])) for mid in ids] for s in specs}

    report = {"models_best_first": ids, "sweep": {"seeds": args.sweep_seeds, "success": base_success,
                                                  "seconds": round(sweep_s, 1)},
              "failure_seeds": [{k: s[k] for k in ("cluster_id", "size", "failure_types")} for s in seeds], "arms": {}}
    for name, arm in arms.items():
        p = arm["proposal"]
        out = {"candidates": len(p.proposed) + len(p.infeasible), "feasible": len(p.proposed),
               "infeasible": [{"factor": c.candidate.factor, "reason": c.feasibility.reason} for c in p.infeasible],
               "check_s_per_candidate": round(p.mean_check_s, 3), "rows": []}
        discriminative = 0
        for c in p.proposed:
            row = {"factor": c.candidate.factor, "operator": c.candidate.operator,
                   "chosen_by": c.candidate.params.get("chosen_by"), "scenario_id": c.candidate.scenario_id,
                   "params": {k: v for k, v in c.candidate.params.items() if k not in ("chosen_by", "attempt")}}
            if "rates" in arm:
                r = arm["rates"][c.candidate.scenario_id]
                ranked = r[1:]
                rho = _spearman([-i for i in range(len(ranked))], ranked)
                spread = max(ranked) - min(ranked)
                ok = r[0] >= ORACLE_SOLVES and rho >= MIN_SPEARMAN and spread >= MIN_SPREAD
                discriminative += ok
                row.update({"success": r, "spearman": round(rho, 2), "spread": round(spread, 2),
                            "discriminative": ok})
            out["rows"].append(row)
        if "rates" in arm:
            out["discriminative"] = discriminative
            out["rollout_s"] = round(arm["rollout_s"], 1)
        report["arms"][name] = out

    print(f"base sweep ({args.sweep_seeds} seeds): " + ", ".join(f"{m} {base_success[m]}" for m in ids))
    print("failure seeds: " + ", ".join(f"{s['cluster_id']} ({s['size']})" for s in seeds))
    for name, out in report["arms"].items():
        print(f"\n{name}: {out['candidates']} candidates, {out['feasible']} feasible, "
              f"pre-check {out['check_s_per_candidate']} s each"
              + (f", {out['discriminative']} discriminative" if "discriminative" in out else ""))
        for row in out["rows"]:
            cells = " ".join(f"{v:4.2f}" for v in row.get("success", []))
            print(f"  {row['factor']:<12} {str(row['chosen_by']):<22} {cells}"
                  + ("  <- discriminative" if row.get("discriminative") else ""))
        for bad in out["infeasible"]:
            print(f"  infeasible {bad['factor']}: {bad['reason']}")
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
