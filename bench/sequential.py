"""The robustness critic's sequential rule on synthetic Bernoulli arms: its error rates and its cost.

Every scenario class fixes true success rates: the oracle's on the candidate, and each registered
model's on the parent and on the candidate. A trial draws every arm's outcomes seed by seed
(independent Bernoulli draws, numpy seeded per class and trial) and runs the rule
(consumers/critics/sequential.py) look by look until it decides. The class's truth says whether
promoting it is right:
  promote   - every check's alternative holds (solvable, reproducible, harder, discriminative);
  reject    - at least one check's null holds (the class names which);
  borderline - in between (no error is counted; the promotion rate is printed).

Most classes have four registered models, saturated on the parent as scripted models are on
robosuite; the one-model-* classes have eight, four of them pixel policies low on the parent, and
a shift that only one of those feels (LIBERO's moved camera with the learned family).

Prints per class: promotions, the mean looks and seeds per arm, the mean rollouts per model
(registered models and the oracle, the parent's control arm included) and the new rollouts per
model when the parent arm's first --sweep-seeds seeds exist already from the sweeps; then the
false-promotion rate (over the reject classes, and the worst class), the false-rejection rate
(over the promote classes, and the worst class), and the mean rollouts per model over all classes,
with the rule's nominal values beside them (consumers/critics/sequential.py states them); and
the wall time.

Usage:
    python bench/sequential.py [--trials 5000] [--seed 0] [--sweep-seeds 10] [--seed-effect 0.0]
                               [--set look_seeds=4 alpha_spending=0,0.4,0.2,0.2,0.2 ...]

--seed-effect S shares a per-seed latent (sd S, probit scale) among every arm, so a hard seed is
hard for every model and for both the candidate and its parent, as with deterministic rollouts of
one scene per seed; the marginal rates stay those of the class.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from consumers.critics.sequential import ACCEPT, SequentialConfig, decide  # noqa: E402

NORMAL = NormalDist()
PROMOTE, REJECT, BORDERLINE = "promote", "reject", "borderline"
PARENT = (0.97, 0.95, 0.93, 0.92)  # a saturated base: every registered model >= 90% on the parent
# LIBERO with the learned family: four scripted pose readers at the top, four pixel policies low
# on the base; a perception shift (a moved camera) is felt by one pixel policy only
MIXED_PARENT = (0.97, 0.95, 0.95, 0.93, 0.35, 0.30, 0.25, 0.10)


@dataclass(frozen=True)
class ScenarioClass:
    name: str
    truth: str  # promote | reject | borderline
    why: str
    oracle: float
    candidate: tuple[float, ...]
    parent: tuple[float, ...] = PARENT


CLASSES = (
    ScenarioClass("discriminative", PROMOTE, "design point: spread 0.70, worst drops 0.67",
                  0.98, (0.95, 0.75, 0.50, 0.25)),
    ScenarioClass("discriminative-strong", PROMOTE, "spread 0.90", 0.99, (0.95, 0.60, 0.30, 0.05)),
    ScenarioClass("design-minimum", PROMOTE, "the design alternative's edge: spread 0.60, worst drops 0.60",
                  0.95, (0.92, 0.80, 0.60, 0.32)),
    ScenarioClass("not-harder", REJECT, "harder null: candidate = parent", 0.98, PARENT),
    ScenarioClass("parent-already-discriminates", REJECT, "harder null: the parent discriminates as much",
                  0.98, (0.95, 0.70, 0.50, 0.30), (0.95, 0.70, 0.50, 0.30)),
    ScenarioClass("not-discriminative", REJECT, "discriminative null: every model at 0.45",
                  0.98, (0.45, 0.45, 0.45, 0.45)),
    ScenarioClass("too-hard", REJECT, "discriminative null: every model at 0.05", 0.97, (0.05,) * 4),
    ScenarioClass("unsolvable", REJECT, "solvable null: oracle 0.30", 0.30, (0.25, 0.15, 0.10, 0.05)),
    ScenarioClass("oracle-at-null", REJECT, "solvable null at its boundary: oracle 0.60",
                  0.60, (0.95, 0.75, 0.50, 0.25)),
    ScenarioClass("fails-once", REJECT, "reproducible null at its boundary: worst fails 0.20",
                  0.98, (1.00, 0.95, 0.90, 0.80), (1.0,) * 4),
    ScenarioClass("one-model-feels", PROMOTE, "8 models: one pixel policy drops 0.35 -> 0.00, no other moves",
                  0.99, (0.97, 0.95, 0.95, 0.93, 0.00, 0.30, 0.25, 0.10), MIXED_PARENT),
    ScenarioClass("one-model-noise", REJECT, "harder null with 8 models, four at 0.10-0.35 on both arms",
                  0.99, MIXED_PARENT, MIXED_PARENT),
    ScenarioClass("below-design", BORDERLINE, "spread 0.55, worst drops 0.52", 0.97, (0.95, 0.85, 0.65, 0.40)),
    ScenarioClass("borderline-spread", BORDERLINE, "spread 0.30", 0.97, (0.90, 0.80, 0.70, 0.60)),
    ScenarioClass("borderline-oracle", BORDERLINE, "oracle 0.80", 0.80, (0.95, 0.75, 0.50, 0.25)),
    ScenarioClass("one-model-halves", BORDERLINE, "8 models: one pixel policy drops 0.35 -> 0.15",
                  0.99, (0.97, 0.95, 0.95, 0.93, 0.15, 0.30, 0.25, 0.10), MIXED_PARENT),
)


def draw(rng: np.random.Generator, rates, n: int, seed_effect: float, z: np.ndarray) -> np.ndarray:
    """Bernoulli outcomes (len(rates) x n) at the given rates; with seed_effect > 0 every arm shares a
    per-seed latent z (a hard seed is hard for every model and both arms), the marginal rates unchanged."""
    rates = np.asarray(rates, dtype=float)
    if seed_effect <= 0:
        return rng.random((len(rates), n)) < rates[:, None]
    scale = np.sqrt(1.0 + seed_effect ** 2)
    a = np.array([NORMAL.inv_cdf(min(max(r, 1e-12), 1 - 1e-12)) for r in rates]) * scale
    return a[:, None] + seed_effect * z[None, :] + rng.standard_normal((len(rates), n)) > 0


def simulate(cls: ScenarioClass, cfg: SequentialConfig, trials: int, seed: int, sweep_seeds: int,
             seed_effect: float = 0.0) -> dict:
    n = cfg.max_seeds
    promoted, looks, seeds, per_model, new_per_model = 0, 0, 0, 0.0, 0.0
    models = len(cls.candidate)
    for trial in range(trials):
        rng = np.random.default_rng([seed, CLASSES.index(cls), trial])
        z = rng.standard_normal(n)
        oracle = draw(rng, [cls.oracle], n, seed_effect, z)[0].tolist()
        cand = draw(rng, cls.candidate, n, seed_effect, z)
        par = draw(rng, cls.parent, n, seed_effect, z)
        arms = {f"m{i}": list(zip(cand[i].tolist(), par[i].tolist(), strict=True)) for i in range(models)}
        d = decide(oracle, arms, cfg)
        promoted += d.action == ACCEPT
        looks += d.look
        seeds += d.seeds
        per_model += d.rollouts_per_model
        new_per_model += d.new_rollouts(sweep_seeds) / (models + 1)
    return {"promoted": promoted / trials, "looks": looks / trials, "seeds": seeds / trials,
            "per_model": per_model / trials, "new_per_model": new_per_model / trials}


def parse_overrides(items: list[str]) -> dict:
    fields = {f.name: f.type for f in dataclasses.fields(SequentialConfig)}
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"--set {item}: SequentialConfig has no field {key!r} (fields: {', '.join(fields)})")
        kind = str(fields[key])
        if "tuple" in kind:
            out[key] = tuple(float(x) for x in value.split(","))
        else:
            out[key] = int(value) if kind == "int" else float(value)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=5000, help="trials per scenario class")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep-seeds", type=int, default=10,
                    help="seeds of the parent arm already run by the sweeps (for the new-rollouts figure)")
    ap.add_argument("--seed-effect", type=float, default=0.0,
                    help="sd of a per-seed latent shared by every arm (0 = independent arms): correlated outcomes")
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="SequentialConfig overrides")
    args = ap.parse_args()
    cfg = SequentialConfig(**parse_overrides(args.set))
    models = len(PARENT)  # the cost figures' cap is the four-model classes'
    started = time.perf_counter()
    print(f"rule: {cfg}")
    print(f"{args.trials} trials per class, seed {args.seed}, {models} registered models "
          f"(8 in the one-model-* classes) + the oracle, "
          f"parent arm's first {args.sweep_seeds} seeds from sweeps, "
          + (f"seed effect {args.seed_effect} (correlated arms)" if args.seed_effect > 0 else "independent arms")
          + "\n")
    print(f"{'class':30s} {'truth':10s} {'promoted':>8s} {'looks':>6s} {'seeds/arm':>9s} "
          f"{'rollouts/model':>14s} {'new/model':>9s}  why")
    results = {}
    for cls in CLASSES:
        r = results[cls.name] = simulate(cls, cfg, args.trials, args.seed, args.sweep_seeds, args.seed_effect)
        print(f"{cls.name:30s} {cls.truth:10s} {r['promoted']:8.4f} {r['looks']:6.2f} {r['seeds']:9.2f} "
              f"{r['per_model']:14.2f} {r['new_per_model']:9.2f}  {cls.why}")

    def of(truth: str) -> list[tuple[str, dict]]:
        return [(c.name, results[c.name]) for c in CLASSES if c.truth == truth]

    bad, good = of(REJECT), of(PROMOTE)
    fp = [r["promoted"] for _, r in bad]
    fn = [1.0 - r["promoted"] for _, r in good]
    worst_fp = max(bad, key=lambda x: x[1]["promoted"])
    worst_fn = min(good, key=lambda x: x[1]["promoted"])
    cost = [r["per_model"] for r in results.values()]
    new = [r["new_per_model"] for r in results.values()]
    max_cost = cfg.max_seeds * (2 * models + 1) / (models + 1)
    print()
    print(f"false-promotion rate   mean {np.mean(fp):.4f}  worst {max(fp):.4f} ({worst_fp[0]})   "
          f"nominal <= {cfg.alpha} per class (intersection-union, union-bound spending)")
    design, edge = 1.0 - results["discriminative"]["promoted"], 1.0 - results["design-minimum"]["promoted"]
    print(f"false-rejection rate   mean {np.mean(fn):.4f}  worst {max(fn):.4f} ({worst_fn[0]})   "
          f"design point {design:.4f} (nominal <= 0.05), edge {edge:.4f} (nominal <= 0.25)")
    print(f"rollouts per model     mean {np.mean(cost):.2f} over the classes (max class {max(cost):.2f})   "
          f"budget <= 20, the rule's cap {max_cost:.1f} with {models} models")
    print(f"new rollouts per model mean {np.mean(new):.2f} (parent seeds < {args.sweep_seeds} reused)")
    print(f"wall time {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
