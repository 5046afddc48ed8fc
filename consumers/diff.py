"""Comparing two models, or two versions of one model, scenario by scenario:
`sepa-eval diff MODEL_A MODEL_B`, `sepa-eval diff MODEL@1 MODEL@2`.

A is the baseline, B the model under test; differences are B - A. A model named without a version
is taken at its latest version (consumers.state: versions are never pooled). Per scenario of the
benchmark version (default: the latest; every scenario both were run on before the first
promotion):
- both success rates with 95% Wilson intervals (one trial per seed and variant, as everywhere);
- where the two share (seed, variant) pairs, the paired difference on those pairs with the exact
  McNemar test on the discordant pairs and a Newcombe interval; where they share none, Fisher's
  exact test on the two independent arms;
- a verdict after Holm's step-down correction over the scenarios tested. Holm controls the
  family-wise error rate (the chance that *any* scenario is called a regression by luck) under
  any dependence between scenarios, which is what a CI gate that fails a build needs; it is
  uniformly more powerful than Bonferroni.

`compare_with_previous` is the same comparison of a model's version (default: its latest) against
its previous version that has trials on the benchmark version's scenarios: what a CI check of a new
model version runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from consumers import state as bs
from consumers.evidence.store import EvidenceStore
from consumers.statistics import PairedDifference, fisher_exact_p, holm_adjusted, newcombe_unpaired_interval, paired

# Family-wise error rate of the diff's verdicts (after Holm).
DIFF_ALPHA = 0.05
CORRECTION = "Holm (family-wise error rate)"


class DiffInputError(ValueError):
    """Bad input to a model comparison: an unknown model or version, the same arm twice, an unknown
    benchmark version."""


@dataclass(frozen=True)
class ModelRef:
    """A model, at a version or (version None) at its latest."""

    model_id: str
    version: str | None = None

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """``MODEL`` or ``MODEL@VERSION`` (the last ``@`` splits, so a model id may hold one)."""
        model_id, at, version = text.rpartition("@") if "@" in text else (text, "", "")
        if not model_id.strip() or (at and not version.strip()):
            raise DiffInputError(f"{text!r} is not a model: write MODEL or MODEL@VERSION")
        return cls(model_id.strip(), version.strip() if at else None)

    def __str__(self) -> str:
        return self.model_id if self.version is None else f"{self.model_id}@{self.version}"


@dataclass(frozen=True)
class ScenarioComparison:
    scenario_id: str
    a: bs.ModelScenarioScore | None
    b: bs.ModelScenarioScore | None
    pairs: PairedDifference | None  # arm 1 = A, arm 2 = B, on the (seed, variant) pairs both ran
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
    version: int | None  # the benchmark version; None: every scenario (nothing promoted yet)
    alpha: float
    correction: str
    scenarios: tuple[ScenarioComparison, ...]
    overall_a: bs.ModelScore | None
    overall_b: bs.ModelScore | None
    model_version_a: str = ""  # the versions compared (resolved: a model named alone is at its latest)
    model_version_b: str = ""

    @property
    def label_a(self) -> str:
        return f"{self.model_a}@{self.model_version_a}"

    @property
    def label_b(self) -> str:
        return f"{self.model_b}@{self.model_version_b}"

    @property
    def regressions(self) -> tuple[str, ...]:
        return tuple(s.scenario_id for s in self.scenarios if s.verdict == "regression")

    @property
    def improvements(self) -> tuple[str, ...]:
        return tuple(s.scenario_id for s in self.scenarios if s.verdict == "improvement")


def _resolve(ref: ModelRef, latest: dict[str, str], with_trials: dict[str, set[str]], run_id: str | None,
             seeds: bs.Seeds = None) -> ModelRef:
    """The ref at a definite version that has episodes, or a DiffInputError saying what exists."""
    where = (f" on {seeds} seeds" if seeds else "") + (f" for run {run_id!r}" if run_id else "")
    if ref.model_id not in with_trials:
        raise DiffInputError(f"model {ref.model_id!r} has no episodes in the evidence log{where} "
                             f"(models with episodes: {', '.join(sorted(with_trials)) or 'none'})")
    versions = ", ".join(sorted(with_trials[ref.model_id]))
    if ref.version is None:
        version = latest.get(ref.model_id)
        if version not in with_trials[ref.model_id]:
            raise DiffInputError(f"model {ref.model_id!r} at its latest version {version!r} has no episodes in the "
                                 f"evidence log{where} (versions with episodes: {versions}; name one as "
                                 f"{ref.model_id}@VERSION)")
        return ModelRef(ref.model_id, version)
    if ref.version not in with_trials[ref.model_id]:
        raise DiffInputError(f"model {ref.model_id!r} version {ref.version!r} has no episodes in the evidence "
                             f"log{where} (versions with episodes: {versions})")
    return ref


def compare_models(store: EvidenceStore, model_a: str | ModelRef, model_b: str | ModelRef, *,
                   version: int | None = None, alpha: float = DIFF_ALPHA, run_id: str | None = None,
                   as_of: datetime | None = None, seeds: bs.Seeds = None) -> ModelDiff:
    """B against A per scenario of the benchmark ``version``. A string is parsed as the CLI parses
    it (``MODEL`` at its latest version, or ``MODEL@VERSION``); a model id that holds an ``@`` is
    passed as ``ModelRef(model_id)``. ``seeds`` keeps held-out or selection seeds only
    (state.HELD_OUT / SELECTION; None: every seed)."""
    a, b = (m if isinstance(m, ModelRef) else ModelRef.parse(m) for m in (model_a, model_b))
    if not 0 < alpha < 1:
        raise DiffInputError(f"alpha must be between 0 and 1, got {alpha}")
    if a == b:
        raise DiffInputError(f"diff needs two different models (or two versions of one), got {str(a)!r} twice")
    every = bs.scores(store, model_versions=bs.ALL_VERSIONS, run_id=run_id, as_of=as_of, seeds=seeds)
    with_trials: dict[str, set[str]] = {}
    for s in every:
        if s.model_version is not None:
            with_trials.setdefault(s.model_id, set()).add(s.model_version)
    latest = bs.latest_model_versions(store, as_of=as_of)
    a, b = _resolve(a, latest, with_trials, run_id, seeds), _resolve(b, latest, with_trials, run_id, seeds)
    if a == b:
        raise DiffInputError(f"diff needs two different models (or two versions of one): {model_a} and {model_b} "
                             f"are both {a}")
    if version is None:
        version = bs.current_version(store, run_id=run_id, as_of=as_of)
    try:
        scenario_ids = bs.version_scenarios(store, version, run_id=run_id, as_of=as_of)
    except bs.UnknownVersion as exc:
        raise DiffInputError(str(exc)) from exc
    arms = {(a.model_id, a.version), (b.model_id, b.version)}
    in_scope = set(scenario_ids) if scenario_ids is not None else None
    table = [s for s in every if (s.model_id, s.model_version) in arms
             and (in_scope is None or s.scenario_id in in_scope)]
    scores = {(s.model_id, s.model_version, s.scenario_id): s for s in table}
    by_pair = bs.outcomes_by_pair(bs.trials(store, model_ids=[a.model_id, b.model_id], scenario_ids=scenario_ids,
                                            model_versions=bs.ALL_VERSIONS, run_id=run_id, as_of=as_of,
                                            seeds=seeds))
    ids = scenario_ids if scenario_ids is not None else sorted({s.scenario_id for s in table})
    drafts = [_compare(sid, scores.get((a.model_id, a.version, sid)), scores.get((b.model_id, b.version, sid)),
                       by_pair.get((a.model_id, a.version, sid), {}), by_pair.get((b.model_id, b.version, sid), {}))
              for sid in ids]
    tested = [i for i, d in enumerate(drafts) if d[3] is not None]
    adjusted = dict(zip(tested, holm_adjusted([drafts[i][3] for i in tested]), strict=True))
    comparisons = []
    for i, (sid, sa, sb, p, pairs, test, diff, interval) in enumerate(drafts):
        q = adjusted.get(i)
        verdict = ("not compared" if q is None else "no significant difference" if q >= alpha or not diff
                   else "regression" if diff < 0 else "improvement")
        comparisons.append(ScenarioComparison(sid, sa, sb, pairs, test, p, q, diff, interval, verdict))
    pooled = {(m.model_id, m.model_version): m for m in bs.pooled_scores(table)}
    return ModelDiff(a.model_id, b.model_id, version, alpha, CORRECTION, tuple(comparisons),
                     pooled.get((a.model_id, a.version)), pooled.get((b.model_id, b.version)), a.version, b.version)


def compare_with_previous(store: EvidenceStore, model_id: str, *, model_version: str | None = None,
                          version: int | None = None, alpha: float = DIFF_ALPHA, run_id: str | None = None,
                          as_of: datetime | None = None, seeds: bs.Seeds = None) -> ModelDiff | None:
    """``model_id`` at ``model_version`` (default: its latest) against its previous version that has
    trials on the scenarios of benchmark ``version`` (default: the latest), per scenario, as
    compare_models does. None when no earlier version has trials there (nothing to compare with)."""
    if version is None:
        version = bs.current_version(store, run_id=run_id, as_of=as_of)
    try:
        scenario_ids = bs.version_scenarios(store, version, run_id=run_id, as_of=as_of)
        target = model_version or bs.latest_model_versions(store, as_of=as_of).get(model_id)
        previous = bs.previous_model_version(store, model_id, version=target, scenario_ids=scenario_ids,
                                             run_id=run_id, as_of=as_of, seeds=seeds)
    except (bs.UnknownVersion, bs.UnknownModelVersion) as exc:
        raise DiffInputError(str(exc)) from exc
    if previous is None:
        return None
    return compare_models(store, ModelRef(model_id, previous.version), ModelRef(model_id, target), version=version,
                          alpha=alpha, run_id=run_id, as_of=as_of, seeds=seeds)


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
        "model_a": diff.model_a, "model_b": diff.model_b, "model_version_a": diff.model_version_a,
        "model_version_b": diff.model_version_b, "version": diff.version, "alpha": diff.alpha,
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
