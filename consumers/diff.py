"""Comparing two models scenario by scenario: `sepa-eval diff MODEL_A MODEL_B`.

A is the baseline, B the model under test; differences are B - A. Per scenario of the benchmark
version (default: the latest; every scenario both were run on before the first promotion):
- both success rates with 95% Wilson intervals (one trial per seed, as everywhere);
- where the two models share seeds, the paired difference on those seeds with the exact McNemar
  test on the discordant pairs and a Newcombe interval; where they share none, Fisher's exact test
  on the two independent arms;
- a verdict after Holm's step-down correction over the scenarios tested. Holm controls the
  family-wise error rate (the chance that *any* scenario is called a regression by luck) under
  any dependence between scenarios, which is what a CI gate that fails a build needs; it is
  uniformly more powerful than Bonferroni.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers import benchmark_state as bs
from consumers.evidence.store import EvidenceStore
from consumers.statistics import PairedDifference, fisher_exact_p, holm_adjusted, newcombe_unpaired_interval, paired

# Family-wise error rate of the diff's verdicts (after Holm).
DIFF_ALPHA = 0.05
CORRECTION = "Holm (family-wise error rate)"


class DiffInputError(ValueError):
    """Bad input to a model comparison: an unknown model, the same model twice, an unknown version."""


@dataclass(frozen=True)
class ScenarioComparison:
    scenario_id: str
    a: bs.ModelScenarioScore | None
    b: bs.ModelScenarioScore | None
    pairs: PairedDifference | None  # arm 1 = A, arm 2 = B, on the seeds both ran
    test: str  # mcnemar (paired) | fisher (no shared seed) | none (a side has no trial)
    p_value: float | None
    adjusted_p: float | None  # Holm over the scenarios tested
    difference: float | None  # B - A: on the pairs when paired, else of the two rates
    interval: tuple[float, float] | None
    verdict: str  # regression | improvement | no significant difference | not compared


@dataclass(frozen=True)
class ModelDiff:
    model_a: str
    model_b: str
    version: int | None  # None: every scenario (nothing promoted yet)
    alpha: float
    correction: str
    scenarios: tuple[ScenarioComparison, ...]
    overall_a: bs.ModelScore | None
    overall_b: bs.ModelScore | None

    @property
    def regressions(self) -> tuple[str, ...]:
        return tuple(s.scenario_id for s in self.scenarios if s.verdict == "regression")

    @property
    def improvements(self) -> tuple[str, ...]:
        return tuple(s.scenario_id for s in self.scenarios if s.verdict == "improvement")


def compare_models(store: EvidenceStore, model_a: str, model_b: str, *, version: int | None = None,
                   alpha: float = DIFF_ALPHA, run_id: str | None = None, as_of: datetime | None = None) -> ModelDiff:
    if model_a == model_b:
        raise DiffInputError(f"diff needs two different models, got {model_a!r} twice")
    if not 0 < alpha < 1:
        raise DiffInputError(f"alpha must be between 0 and 1, got {alpha}")
    known = {s.model_id for s in bs.scores(store, run_id=run_id, as_of=as_of)}
    for model in (model_a, model_b):
        if model not in known:
            raise DiffInputError(f"model {model!r} has no episodes in the evidence log"
                                 f"{' for run ' + repr(run_id) if run_id else ''} "
                                 f"(models with episodes: {', '.join(sorted(known)) or 'none'})")
    if version is None:
        version = bs.current_version(store, run_id=run_id, as_of=as_of)
    try:
        scenario_ids = bs.version_scenarios(store, version, run_id=run_id, as_of=as_of)
    except bs.UnknownVersion as exc:
        raise DiffInputError(str(exc)) from exc
    table = bs.scores(store, version=version, model_ids=[model_a, model_b], run_id=run_id, as_of=as_of)
    scores = {(s.model_id, s.scenario_id): s for s in table}
    trials = bs.trials(store, model_ids=[model_a, model_b], scenario_ids=scenario_ids, run_id=run_id, as_of=as_of)
    by_seed: dict[tuple[str, str], dict[int, bool]] = {}
    for t in trials:
        if t.valid and t.seed is not None:
            by_seed.setdefault((t.model_id, t.scenario_id), {})[t.seed] = t.success
    ids = scenario_ids if scenario_ids is not None else sorted({s.scenario_id for s in table})
    drafts = [_compare(sid, scores.get((model_a, sid)), scores.get((model_b, sid)),
                       by_seed.get((model_a, sid), {}), by_seed.get((model_b, sid), {})) for sid in ids]
    tested = [i for i, d in enumerate(drafts) if d[3] is not None]
    adjusted = dict(zip(tested, holm_adjusted([drafts[i][3] for i in tested]), strict=True))
    comparisons = []
    for i, (sid, a, b, p, pairs, test, diff, interval) in enumerate(drafts):
        q = adjusted.get(i)
        verdict = ("not compared" if q is None else "no significant difference" if q >= alpha or not diff
                   else "regression" if diff < 0 else "improvement")
        comparisons.append(ScenarioComparison(sid, a, b, pairs, test, p, q, diff, interval, verdict))
    pooled = {m.model_id: m for m in bs.pooled_scores(table)}
    return ModelDiff(model_a, model_b, version, alpha, CORRECTION, tuple(comparisons), pooled.get(model_a),
                     pooled.get(model_b))


def _compare(scenario_id: str, a: bs.ModelScenarioScore | None, b: bs.ModelScenarioScore | None,
             seeds_a: dict[int, bool], seeds_b: dict[int, bool]) -> tuple:
    if not a or not b or not a.episodes or not b.episodes:
        return (scenario_id, a, b, None, None, "none", None, None)
    pairs = paired(seeds_a, seeds_b)
    if pairs.pairs:
        return (scenario_id, a, b, pairs.p_value, pairs, "mcnemar", pairs.difference, pairs.interval)
    p = fisher_exact_p(a.successes, a.episodes, b.successes, b.episodes)
    return (scenario_id, a, b, p, None, "fisher", b.success_rate - a.success_rate,
            newcombe_unpaired_interval(a.successes, a.episodes, b.successes, b.episodes))


def as_dict(diff: ModelDiff) -> dict:
    """The comparison as JSON-able values (for --json)."""
    def score(s):
        return None if s is None else {"episodes": s.episodes, "successes": s.successes,
                                       "success_rate": s.success_rate, "interval": list(s.interval)}

    return {
        "model_a": diff.model_a, "model_b": diff.model_b, "version": diff.version, "alpha": diff.alpha,
        "correction": diff.correction, "regressions": list(diff.regressions),
        "improvements": list(diff.improvements), "overall_a": score(diff.overall_a),
        "overall_b": score(diff.overall_b),
        "scenarios": [{"scenario_id": s.scenario_id, "a": score(s.a), "b": score(s.b), "test": s.test,
                       "pairs": s.pairs.pairs if s.pairs else 0,
                       "a_only_successes": s.pairs.only_1 if s.pairs else None,
                       "b_only_successes": s.pairs.only_2 if s.pairs else None,
                       "difference": s.difference, "interval": list(s.interval) if s.interval else None,
                       "p_value": s.p_value, "adjusted_p": s.adjusted_p, "verdict": s.verdict}
                      for s in diff.scenarios],
    }


def rows(diff: ModelDiff) -> Sequence[tuple[str, ...]]:
    """One printable row per scenario: scenario, A, B, pairs, B-A [CI], test p, Holm p, verdict."""
    def rate(s):
        if s is None or not s.episodes:
            return "-"
        lo, hi = s.interval
        return f"{s.success_rate:.2f} [{lo:.2f},{hi:.2f}] n={s.episodes}"

    out = []
    for s in diff.scenarios:
        d = "-" if s.difference is None else (f"{100 * s.difference:+.0f} pp [{100 * s.interval[0]:+.0f},"
                                              f"{100 * s.interval[1]:+.0f}]")
        pairs = f"{s.pairs.pairs} ({s.pairs.only_1}/{s.pairs.only_2})" if s.pairs else "-"
        out.append((s.scenario_id, rate(s.a), rate(s.b), pairs, d,
                    "-" if s.p_value is None else f"{s.test} {s.p_value:.3g}",
                    "-" if s.adjusted_p is None else f"{s.adjusted_p:.3g}", s.verdict))
    return out
