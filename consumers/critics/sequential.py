"""The robustness critic's sequential rule: promote, reject or ask for more paired rollouts.

    decision = decide(oracle=[True, True, ...],                         # the oracle on the candidate
                      models={"scripted-fine": [(cand_ok, parent_ok), ...], ...},   # seed for seed
                      config=SequentialConfig())
    decision.action        # "continue" (run seeds up to decision.next_seeds per arm), "accept", "reject"
    decision.checks        # {"solvable": CheckResult, "reproducible": ..., "harder": ..., "discriminative": ...}
    decision.verdict_fields(config)   # CriticVerdict fields (critic="robustness"), once decided
    decision.evidence(config)         # its evidence_json as a record (schemas/verdict_evidence.py)

Data: for every registered model, (candidate success, parent success) on the same seeds, in seed
order (the parent arm is the control: the candidate's effect is measured seed for seed); for the
oracle, its candidate successes only (no check uses the oracle's control arm, so the critic never
requests it). The rule looks after every ``look_seeds`` seeds per arm, up to ``max_seeds``;
outcomes past the last complete look are ignored until the next look is complete. ``decide`` is a
pure function of the outcomes: it replays the looks from the first, so a restarted critic given
the same evidence reaches the same decision at the same look.

The four checks (each a null hypothesis the evidence must reject to pass):
- **solvable**: H0 "the oracle succeeds at most ``oracle_null_rate`` (0.6) of the time"; exact
  binomial test on the oracle's successes. Also, whatever the test says, a candidate is accepted
  only if the oracle succeeded in at least ``min_oracle_success`` (90%) of its validation episodes
  at that look: every promoted scenario is solved by the oracle in >= 90% of them, by construction.
- **reproducible**: H0 "no registered model fails it more than ``reproducible_null_failure``
  (0.2) of the time" (a model that failed once, not reliably); exact binomial test on each
  model's candidate failures, Bonferroni over the models.
- **harder** than the parent: H0 "the candidate is the parent, seed for seed" (swapping a seed's
  candidate and parent outcomes, for every model at once, changes nothing). One exact test per
  model (McNemar, one-sided: its parent-only seeds among its discordant ones are Binomial(., 1/2)
  under H0) and one pooled over the models (the paired sign-flip test on the per-seed net d_i =
  sum over models of [parent succeeded, candidate failed] - [the reverse]: flipping whole seeds
  keeps it exact however the models' outcomes depend on each other through the seed), joined by
  Tarone's Bonferroni for discrete tests: a test that has too few discordant seeds to reject at
  the look's level, whatever their signs (a pose reader that never moves on a camera shift), takes
  no share of it. The pooled test is the powerful one when several models lose (scripted models
  on a pose shift); the per-model tests when one model in many does (one pixel policy on a moved
  camera, while the others win and lose seeds at random and cancel in any sum). The evidence names
  the model that carries the test (else the one that lost most).
- **discriminative**: H0 "every registered model has the same success rate on the candidate";
  the exact conditional range test (best minus worst success count, given the total: the counts
  are then multivariate hypergeometric), one test for the best-vs-worst comparison with no
  Bonferroni factor for having picked the pair after looking (about 3x more powerful at 10 seeds
  than Fisher's test with M(M-1) corrections). It treats the models' arms as independent; models
  run on the same seeds are, if anything, positively correlated, which makes it conservative.

Why this design (group-sequential, exact tests, alpha spending by the union bound) over an SPRT
or a Bayesian rule: at 5-20 rollouts per arm only exact tests are honest, and four composite
hypotheses with nuisance parameters (the parent's rates, the other models) have no single
likelihood ratio for an SPRT nor a prior anyone would defend. Spending by the union bound needs
no joint distribution of the looks: look j may spend ``alpha * alpha_spending[j]`` and the chance
of ever crossing under H0 is at most ``alpha`` for every discrete test and every look schedule.
Look 1 spends nothing (no 5-seed oracle record rejects the solvable null, so nothing could be
accepted there; it is a futility look). A check crossed at a look stays passed (its first
crossing is the claim). The accept rule is an intersection-union test (Berger 1982): all four
must pass, so a candidate for which any one null holds is promoted with probability at most
``alpha``; the four need no correction among themselves.

Stops for futility are non-binding (they only ever reject, so they cannot raise the
false-promotion rate):
- curtailment: no continuation, however favourable, could pass the check (or the oracle's 90%)
  by ``max_seeds``; costs no power;
- beta spending against the design alternative (``beta * beta_spending[j]``, front-loaded so most
  bad candidates stop at look 1): solvable fails when the oracle's successes are improbably few
  for an oracle at ``oracle_design_rate``; reproducible when every model's failures are
  improbably few for one failing at ``reproducible_design_failure``; harder when every model's
  parent-only seeds are improbably few, among the seeds its parent succeeded on, for one losing
  ``harder_design_drop`` of them (a model the parent never carried says nothing); discriminative when
  one-sided Clopper-Pearson bounds (beta_j / 2 each) put every model's rate inside an interval
  narrower than ``discriminative_design_spread``. A candidate at the design alternative loses at
  most ``beta`` per check this way (and much less when its effects are larger);
- conditional power for discriminative: at the rates seen, the range test would pass by
  ``max_seeds`` with probability below ``futility_power`` (Lan, Simon & Halperin's stochastic
  curtailment): models that all sit at one middling rate are otherwise the costliest candidates.

Error rates, for the defaults with 4 registered models and the oracle. Nominal: false promotion
<= alpha = 0.05 for any candidate violating a null (proven, as above); false rejection <= 0.05
at the design point (oracle 0.98, models 0.95/0.75/0.50/0.25 against a parent at ~0.95) and
<= 0.25 at the edge of the design alternative (oracle 0.95, the worst model losing 0.6, spread
0.6). Measured by ``python bench/sequential.py`` (5000 seeded trials per class, ~2 min):
false promotion 0.020 at worst (all models at 0.45), 0.013 (the parent discriminates as much),
0.009 (oracle at 0.6), 0.003 (worst model failing 0.2), 0.002 (all models at 0.05), 0.000
(candidate = parent; oracle at 0.3); false rejection 0.037 at the design point, 0.199 at the
edge, 0.003 with spread 0.9. Cost: at most ``max_seeds`` per arm (36 rollouts per model with 4
models); per model, the control arm counted: 23.1 at the design point, 26.5 at the edge, 10.5
for a candidate no harder than its parent, 9.2 for an unsolvable one, 19.8 on average over the
bench's 13 four-model classes (13.2 new rollouts when the parent's first 10 seeds come from the
sweeps). With outcomes correlated through the seed (``--seed-effect 1``) false promotion is
0.013 at worst and the mean cost 19.1.

With eight models, four pose readers near 0.95 and four pixel policies at 0.10-0.35 on the parent
(LIBERO with the learned family), a candidate that takes one pixel policy from 0.35 to 0.00 and
moves no other is promoted 0.38 of the time (0.14 under the seed-pooled test alone, rule 1.0: its
sum is swamped by the others' random wins and losses); such a model can lose only the ~7 seeds in
20 its parent wins, which caps any test's power. A candidate equal to its parent there is
promoted 0.014 of the time. Both cost ~18.8 seeds per arm: a model that its parent carries on a
third of the seeds gives little evidence either way, so futility rarely stops them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from consumers.critics.exact import (
    binom_cdf,
    binom_sf,
    lower_bound,
    range_power,
    range_sf,
    signflip_sf,
    tarone,
    upper_bound,
)
from consumers.critics.exceptions import ConfigError, CriticError, CriticInputError
from schemas.verdict_evidence import ModelEvidence, RobustnessEvidence

CRITIC = "robustness"
CRITIC_VERSION = "robustness-sequential/2.0"  # 2.0: a harder test per model, joined by Tarone
BACKEND = "sequential-exact"

POOLED = "<pooled>"  # the harder check's pooled test, beside one test per model
CHECKS = ("solvable", "reproducible", "harder", "discriminative")
CONTINUE, ACCEPT, REJECT = "continue", "accept", "reject"
PASSED, FAILED, PENDING = "passed", "failed", "pending"


@dataclass(frozen=True)
class SequentialConfig:
    """The rule's design. Rates are probabilities in (0, 1); the defaults are the ones measured."""

    look_seeds: int = 5  # seeds per arm added between two looks (k)
    max_seeds: int = 20  # seeds per arm at the last look; a candidate undecided there is rejected
    alpha: float = 0.05  # false-promotion bound per check (and, by intersection-union, overall)
    # share of alpha each look may spend (sums to 1). Look 1 spends none: at 5 seeds no oracle
    # record rejects the solvable null, so nothing can be accepted there.
    alpha_spending: tuple[float, ...] = (0.0, 0.5, 0.25, 0.25)
    beta: float = 0.2  # futility spending per check against its design alternative
    beta_spending: tuple[float, ...] = (0.5, 0.25, 0.15, 0.1)  # front-loaded: most bad candidates stop at look 1
    # solvable
    oracle_null_rate: float = 0.6  # an oracle this good or worse is "unsolvable" (H0)
    oracle_design_rate: float = 0.95  # a solvable scenario's oracle, for futility
    min_oracle_success: float = 0.9  # observed oracle success at the accepting look, required
    # reproducible
    reproducible_null_failure: float = 0.2  # failing at most this often is "once", not reliably (H0)
    reproducible_design_failure: float = 0.6  # a reliably failing model, for futility
    # harder than the parent
    harder_design_drop: float = 0.6  # share of the seeds its parent won that a degraded model loses
    # discriminative
    discriminative_design_spread: float = 0.6  # best minus worst success rate, for futility
    # stop when, at the rates seen so far, the range test would pass at max_seeds with less than this
    futility_power: float = 0.05

    def __post_init__(self) -> None:
        if not isinstance(self.look_seeds, int) or self.look_seeds < 1:
            raise ConfigError(f"SequentialConfig.look_seeds must be a positive int, got {self.look_seeds!r}")
        if not isinstance(self.max_seeds, int) or self.max_seeds < self.look_seeds:
            raise ConfigError(f"SequentialConfig.max_seeds must be an int >= look_seeds ({self.look_seeds}), "
                              f"got {self.max_seeds!r}")
        if self.max_seeds % self.look_seeds:
            raise ConfigError(f"SequentialConfig.max_seeds ({self.max_seeds}) must be a multiple of "
                              f"look_seeds ({self.look_seeds}): every look adds look_seeds per arm")
        for name in ("alpha", "beta", "oracle_null_rate", "oracle_design_rate", "min_oracle_success",
                     "reproducible_null_failure", "reproducible_design_failure", "harder_design_drop",
                     "discriminative_design_spread", "futility_power"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0.0 < value < 1.0:
                raise ConfigError(f"SequentialConfig.{name} must be in (0, 1), got {value!r}")
        for name in ("alpha_spending", "beta_spending"):
            shares = getattr(self, name)
            if (not isinstance(shares, tuple) or len(shares) != self.looks
                    or not all(isinstance(x, int | float) and x >= 0.0 for x in shares)
                    or abs(sum(shares) - 1.0) > 1e-9):
                raise ConfigError(f"SequentialConfig.{name} must be {self.looks} non-negative shares "
                                  f"(one per look) summing to 1, got {shares!r}")
        if self.oracle_design_rate <= self.oracle_null_rate:
            raise ConfigError(f"SequentialConfig.oracle_design_rate ({self.oracle_design_rate}) must exceed "
                              f"oracle_null_rate ({self.oracle_null_rate})")
        if self.reproducible_design_failure <= self.reproducible_null_failure:
            raise ConfigError(f"SequentialConfig.reproducible_design_failure ({self.reproducible_design_failure}) "
                              f"must exceed reproducible_null_failure ({self.reproducible_null_failure})")

    @property
    def looks(self) -> int:
        return self.max_seeds // self.look_seeds

    def spending(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """(alpha_j, beta_j) spent at each look j = 1..looks."""
        return (tuple(self.alpha * x for x in self.alpha_spending),
                tuple(self.beta * x for x in self.beta_spending))


@dataclass(frozen=True)
class CheckResult:
    """One check at the deciding look. ``p_value`` is multiplicity-adjusted; it passed where <= ``alpha_j``."""

    name: str
    status: str  # passed | failed | pending
    p_value: float
    alpha_j: float
    passed_look: int  # first look its test crossed (0 = not yet)
    model: str | None  # the model (or pair "a>b") that carries the evidence
    reason: str


@dataclass(frozen=True)
class ModelCounts:
    """A registered model's counts over the first ``seeds`` seeds."""

    candidate_successes: int
    parent_successes: int
    parent_only: int  # seeds where the parent succeeded and the candidate failed (McNemar's b)
    candidate_only: int  # the reverse (McNemar's c)


@dataclass(frozen=True)
class Decision:
    action: str  # continue | accept | reject
    look: int  # the look it was decided at (0 = no complete look yet)
    seeds: int  # seeds per arm the decision used
    next_seeds: int | None  # for continue: seeds per arm needed for the next look
    checks: dict[str, CheckResult]
    oracle_successes: int
    models: dict[str, ModelCounts]
    reason: str
    unused_seeds: int = 0  # seeds given past the deciding look, not used
    history: tuple[dict, ...] = field(default_factory=tuple)  # every look replayed: {look, seeds, checks}

    @property
    def decided(self) -> bool:
        return self.action != CONTINUE

    @property
    def spread(self) -> float:
        """Best minus worst candidate success rate among the registered models (the verdict's score)."""
        if not self.seeds:
            return 0.0
        rates = [m.candidate_successes / self.seeds for m in self.models.values()]
        return max(rates) - min(rates)

    @property
    def candidate_rollouts(self) -> int:
        """Candidate-arm episodes behind the decision: every registered model and the oracle."""
        return self.seeds * (len(self.models) + 1)

    @property
    def control_rollouts(self) -> int:
        """Parent-arm (control) episodes behind the decision: every registered model, not the oracle."""
        return self.seeds * len(self.models)

    @property
    def rollouts(self) -> int:
        return self.candidate_rollouts + self.control_rollouts

    @property
    def rollouts_per_model(self) -> float:
        """Episodes per validated model (registered models and the oracle), the control arm counted."""
        return self.rollouts / (len(self.models) + 1)

    def new_rollouts(self, existing_control_seeds: int) -> int:
        """Episodes the validation had to run when the parent arm's first seeds exist (from sweeps)."""
        return self.candidate_rollouts + len(self.models) * max(0, self.seeds - existing_control_seeds)

    def evidence(self, config: SequentialConfig) -> RobustnessEvidence:
        """The verdict's evidence (schemas/verdict_evidence.py), the rule's whole trace given."""
        return RobustnessEvidence(
            rule=CRITIC_VERSION, action=self.action, look=self.look, seeds_per_arm=self.seeds,
            next_seeds=self.next_seeds, unused_seeds=self.unused_seeds, reason=self.reason,
            oracle_successes=self.oracle_successes,
            models={m: ModelEvidence(**asdict(c)) for m, c in self.models.items()},
            checks={n: asdict(c) for n, c in self.checks.items()},
            rollouts={"candidate": self.candidate_rollouts, "control": self.control_rollouts,
                      "total": self.rollouts, "per_model": self.rollouts_per_model},
            history=self.history, config=asdict(config))

    def verdict_fields(self, config: SequentialConfig) -> dict:
        """CriticVerdict fields but envelope and scenario_id; only for a decided candidate.

        ``rollouts`` counts the episodes behind the verdict, control arm included.
        """
        if not self.decided:
            raise CriticError(f"no robustness verdict yet: the rule asks for {self.next_seeds} seeds per arm")
        return {"critic": CRITIC, "critic_version": CRITIC_VERSION, "ran": True, "score": round(self.spread, 4),
                "passed": self.action == ACCEPT, "backend": BACKEND, "reason": self.reason,
                "evidence_json": self.evidence(config).to_json(), "rollouts": self.rollouts}


def decide(oracle: Sequence[bool], models: Mapping[str, Sequence[tuple[bool, bool]]],
           config: SequentialConfig | None = None) -> Decision:
    """Replay the looks over the outcomes given and return the first decisive one (or continue)."""
    cfg = config or SequentialConfig()
    oracle, models = _validated(oracle, models)
    available = min([len(oracle)] + [len(p) for p in models.values()])
    looks = min(available // cfg.look_seeds, cfg.looks)
    alphas, betas = cfg.spending()
    passed_at: dict[str, int] = {}
    history: list[dict] = []
    checks: dict[str, CheckResult] = {}
    counts: dict[str, ModelCounts] = _counts(models, 0)
    for j in range(1, looks + 1):
        n = j * cfg.look_seeds
        counts = _counts(models, n)
        s_o = sum(oracle[:n])
        net = [sum(int(p) - int(c) for c, p in (pairs[i] for pairs in models.values())) for i in range(n)]
        checks = _checks(cfg, j, n, s_o, counts, net, alphas, betas, passed_at)
        history.append({"look": j, "seeds": n,
                        "checks": {c.name: [c.status, round(c.p_value, 6)] for c in checks.values()}})
        failed = [c for c in checks.values() if c.status == FAILED]
        last = j == cfg.looks
        if failed or all(c.status == PASSED for c in checks.values()) or last:
            if failed:
                action, reason = REJECT, "; ".join(f"{c.name}: {c.reason}" for c in failed)
            elif all(c.status == PASSED for c in checks.values()):
                action, reason = ACCEPT, "; ".join(f"{c.name}: {c.reason}" for c in checks.values())
            else:
                pending = [c for c in checks.values() if c.status != PASSED]
                action = REJECT
                reason = (f"undecided at max_seeds={cfg.max_seeds}: "
                          + "; ".join(f"{c.name}: {c.reason}" for c in pending))
            return Decision(action, j, n, None, checks, s_o, counts, reason, available - n, tuple(history))
    n = looks * cfg.look_seeds
    reason = ("no complete look yet" if looks == 0 else
              "; ".join(f"{c.name}: {c.reason}" for c in checks.values() if c.status != PASSED))
    return Decision(CONTINUE, looks, n, n + cfg.look_seeds, checks, sum(oracle[:n]), counts, reason,
                    available - n, tuple(history))


def _validated(oracle, models) -> tuple[tuple[bool, ...], dict[str, tuple[tuple[bool, bool], ...]]]:
    if isinstance(oracle, str | bytes) or not isinstance(oracle, Sequence):
        raise CriticInputError(f"oracle outcomes must be a sequence of bools, got {type(oracle).__name__}")
    for i, ok in enumerate(oracle):
        if not isinstance(ok, bool):
            raise CriticInputError(f"oracle outcome at seed index {i} must be a bool, got {ok!r}")
    if not isinstance(models, Mapping) or len(models) < 2:
        raise CriticInputError(f"the rule needs at least two registered models (discriminative compares them), "
                               f"got {len(models) if isinstance(models, Mapping) else type(models).__name__}")
    out = {}
    for model, pairs in models.items():
        if not isinstance(model, str) or not model:
            raise CriticInputError(f"model ids must be non-empty strings, got {model!r}")
        if isinstance(pairs, str | bytes) or not isinstance(pairs, Sequence):
            raise CriticInputError(f"model {model}: outcomes must be a sequence of (candidate, parent) pairs")
        for i, pair in enumerate(pairs):
            if (not isinstance(pair, tuple | list) or len(pair) != 2
                    or not all(isinstance(x, bool) for x in pair)):
                raise CriticInputError(f"model {model}, seed index {i}: expected (candidate_success, "
                                       f"parent_success) bools, got {pair!r}")
        out[model] = tuple((bool(c), bool(p)) for c, p in pairs)
    return tuple(oracle), out


def _counts(models: dict[str, tuple[tuple[bool, bool], ...]], n: int) -> dict[str, ModelCounts]:
    out = {}
    for model, pairs in models.items():
        head = pairs[:n]
        out[model] = ModelCounts(sum(c for c, _ in head), sum(p for _, p in head),
                                 sum(p and not c for c, p in head), sum(c and not p for c, p in head))
    return out


def _checks(cfg: SequentialConfig, j: int, n: int, s_o: int, counts: dict[str, ModelCounts], net: list[int],
            alphas: tuple[float, ...], betas: tuple[float, ...], passed_at: dict[str, int]) -> dict[str, CheckResult]:
    """Every check at look j (n seeds per arm). ``passed_at`` carries first crossings between looks."""
    m = len(counts)
    a_j, b_j = alphas[j - 1], betas[j - 1]
    future = [(jj, jj * cfg.look_seeds) for jj in range(j + 1, cfg.looks + 1)]  # looks still to come

    def crossed(name: str, p: float) -> int:
        if name not in passed_at and a_j > 0.0 and p <= a_j:
            passed_at[name] = j
        return passed_at.get(name, 0)

    out: dict[str, CheckResult] = {}

    # solvable ---------------------------------------------------------------------------------
    p = binom_sf(s_o, n, cfg.oracle_null_rate)
    look = crossed("solvable", p)
    observed_ok = s_o >= cfg.min_oracle_success * n - 1e-9
    if look and observed_ok:
        status, why = PASSED, f"oracle {s_o}/{n} (test crossed at look {look}, p={p:.4g})"
    else:
        reachable = any((look or binom_sf(s_o + nn - n, nn, cfg.oracle_null_rate) <= alphas[jj - 1])
                        and s_o + nn - n >= cfg.min_oracle_success * nn - 1e-9 for jj, nn in future)
        if not reachable:
            status, why = FAILED, (f"oracle {s_o}/{n}: can no longer reach the test and "
                                   f"{cfg.min_oracle_success:.0%} by {cfg.max_seeds} seeds")
        elif binom_cdf(s_o, n, cfg.oracle_design_rate) <= b_j:
            status, why = FAILED, (f"oracle {s_o}/{n} is improbable for a solvable scenario "
                                   f"(P={binom_cdf(s_o, n, cfg.oracle_design_rate):.4g} at rate "
                                   f"{cfg.oracle_design_rate})")
        elif look:
            status, why = PENDING, (f"oracle {s_o}/{n} below {cfg.min_oracle_success:.0%} "
                                    f"(test crossed at look {look})")
        else:
            status, why = PENDING, f"oracle {s_o}/{n} (p={p:.4g} > {a_j:.4g})"
    out["solvable"] = CheckResult("solvable", status, p, a_j, look, None, why)

    # reproducible -------------------------------------------------------------------------------
    fails = {k: n - c.candidate_successes for k, c in counts.items()}
    best = max(fails, key=lambda k: (fails[k], k))
    p = min(1.0, m * binom_sf(fails[best], n, cfg.reproducible_null_failure))
    look = crossed("reproducible", p)
    if look:
        status, why = PASSED, f"{best} failed {fails[best]}/{n} (adjusted p={p:.4g}, look {look})"
    elif not any(min(1.0, m * binom_sf(fails[best] + nn - n, nn, cfg.reproducible_null_failure))
                 <= alphas[jj - 1] for jj, nn in future):
        status, why = FAILED, f"no model can fail reliably by {cfg.max_seeds} seeds (most: {best} {fails[best]}/{n})"
    elif all(binom_cdf(f, n, cfg.reproducible_design_failure) <= b_j for f in fails.values()):
        status, why = FAILED, (f"every model fails too rarely for a reproducible failure "
                               f"(most: {best} {fails[best]}/{n})")
    else:
        status, why = PENDING, f"most failures {best} {fails[best]}/{n} (adjusted p={p:.4g} > {a_j:.4g})"
    out["reproducible"] = CheckResult("reproducible", status, p, a_j, look, best, why)

    # harder than the parent ----------------------------------------------------------------------
    # One exact test per model (McNemar: its parent-only seeds among its discordant ones) and one
    # pooled over the models (the sign-flip test on d_i = sum over models of parent-only minus
    # candidate-only on seed i), joined by Tarone's Bonferroni: a test whose every outcome is too
    # weak to reject (a model that never lost or won a seed) takes no share of the level.
    level = a_j or next(a for a in alphas if a > 0.0)
    names = list(counts) + [POOLED]
    nonzero = sum(d != 0 for d in net)
    total = sum(net)
    tests = [binom_sf(c.parent_only, c.parent_only + c.candidate_only, 0.5) for c in counts.values()]
    tests.append(signflip_sf(tuple(sorted(abs(d) for d in net)), total) if total > 0 else 1.0)
    floors = [0.5 ** (c.parent_only + c.candidate_only) for c in counts.values()] + [0.5 ** nonzero]
    p, best = tarone(tuple(tests), tuple(floors), level)
    look = crossed("harder", p)
    most = max(counts, key=lambda k: (counts[k].parent_only - counts[k].candidate_only, k))
    lead = names[best] if best is not None else POOLED
    carrier = lead if lead != POOLED and counts[lead].parent_only > counts[lead].candidate_only else most
    mc = counts[carrier]
    tally = (f"{carrier} parent-only {mc.parent_only}, candidate-only {mc.candidate_only}; "
             f"net {total:+d} over all models and {n} seeds")
    via = "pooled sign-flip" if best == len(counts) else "McNemar"
    if look:
        status, why = PASSED, f"{tally} ({via}, Tarone-adjusted p={p:.4g}, look {look})"
    elif not any(min([binom_sf(c.parent_only + nn - n, c.parent_only + c.candidate_only + nn - n, 0.5)
                      for c in counts.values()]
                     + [signflip_sf(tuple(sorted([abs(d) for d in net] + [m] * (nn - n))), total + m * (nn - n))])
                 <= alphas[jj - 1] for jj, nn in future):
        status, why = FAILED, f"cannot be shown harder by {cfg.max_seeds} seeds ({tally})"
    elif all(not c.parent_successes or binom_cdf(c.parent_only, c.parent_successes, cfg.harder_design_drop) <= b_j
             for c in counts.values()):
        status, why = FAILED, f"no model loses enough against the parent ({tally})"
    else:
        status, why = PENDING, f"{tally} ({via}, Tarone-adjusted p={p:.4g} > {a_j:.4g})"
    out["harder"] = CheckResult("harder", status, p, a_j, look, carrier, why)

    # discriminative -----------------------------------------------------------------------------
    succ = {k: c.candidate_successes for k, c in counts.items()}
    hi = max(succ, key=lambda k: (succ[k], k))
    lo = min(succ, key=lambda k: (succ[k], k))
    p = range_sf(m, n, sum(succ.values()), succ[hi] - succ[lo])
    look = crossed("discriminative", p)
    tally = f"{hi} {succ[hi]}/{n} vs {lo} {succ[lo]}/{n}"
    spread_ub = (max(upper_bound(s, n, b_j / 2) for s in succ.values())
                 - min(lower_bound(s, n, b_j / 2) for s in succ.values()))
    if look:
        status, why = PASSED, f"{tally} (exact range p={p:.4g}, look {look})"
    elif spread_ub < cfg.discriminative_design_spread:
        status, why = FAILED, (f"the models' rates lie within {spread_ub:.2f} of each other "
                               f"(< {cfg.discriminative_design_spread}; {tally})")
    elif future and (power := range_power(tuple(sorted(succ.values())), n, cfg.max_seeds, alphas[-1])) \
            < cfg.futility_power:
        status, why = FAILED, (f"at the rates seen the models would be told apart by {cfg.max_seeds} seeds "
                               f"with probability {power:.3f} (< {cfg.futility_power}; {tally})")
    else:
        status, why = PENDING, f"{tally} (exact range p={p:.4g} > {a_j:.4g})"
    out["discriminative"] = CheckResult("discriminative", status, p, a_j, look, f"{hi}>{lo}", why)
    return out
