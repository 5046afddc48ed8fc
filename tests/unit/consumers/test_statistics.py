"""The read side's statistics against independent references (scipy where it has the test) and
against their defining properties (coverage by simulation, seeded)."""

import math

import numpy as np
import pytest

from consumers.statistics import (
    binomial_two_sided_p,
    fisher_exact_p,
    holm_adjusted,
    mcnemar_exact_p,
    newcombe_paired_interval,
    newcombe_unpaired_interval,
    paired,
    spearman,
    wilson_interval,
)

scipy_stats = pytest.importorskip("scipy.stats")


def test_wilson_matches_the_closed_form_and_stays_honest_at_the_edges():
    lo, hi = wilson_interval(16, 20)
    assert (round(lo, 4), round(hi, 4)) == (0.5840, 0.9193)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 10)[1] > 0.25
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0) and wilson_interval(10, 10)[0] < 0.75
    assert wilson_interval(0, 0) == (0.0, 1.0)


@pytest.mark.parametrize("k,n", [(0, 5), (3, 10), (5, 10), (12, 40), (1, 1)])
def test_binomial_p_matches_scipy(k, n):
    assert binomial_two_sided_p(k, n) == pytest.approx(scipy_stats.binomtest(k, n, 0.5).pvalue)


def test_mcnemar_reads_only_the_discordant_pairs():
    assert mcnemar_exact_p(4, 0) == pytest.approx(0.125)
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(12, 0) == pytest.approx(2 / 2 ** 12)
    assert mcnemar_exact_p(3, 7) == mcnemar_exact_p(7, 3)


@pytest.mark.parametrize("a,na,b,nb", [(16, 20, 4, 20), (10, 10, 7, 10), (0, 5, 3, 5), (3, 8, 3, 8)])
def test_fisher_matches_scipy(a, na, b, nb):
    expected = scipy_stats.fisher_exact([[a, na - a], [b, nb - b]]).pvalue
    assert fisher_exact_p(a, na, b, nb) == pytest.approx(expected)


def test_holm_step_down():
    assert holm_adjusted([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm_adjusted([0.5, 0.001]) == pytest.approx([0.5, 0.002])
    assert holm_adjusted([]) == []


def test_spearman_matches_scipy_with_ties():
    x, y = [0.9, 0.5, 0.5, 0.1], [4, 3, 2, 1]
    assert spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic)
    assert spearman([1, 2], [2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1], [1, 2]) is None and spearman([1], [1]) is None


def test_paired_counts_by_seed():
    d = paired({0: True, 1: True, 2: False, 3: True}, {0: True, 1: False, 2: True, 5: False})
    assert (d.pairs, d.both, d.only_1, d.only_2, d.neither) == (3, 1, 1, 1, 0)
    assert d.difference == 0.0


def _coverage(interval, draws: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(draws):
        lo, hi, truth = interval(rng)
        hits += lo - 1e-12 <= truth <= hi + 1e-12
    return hits / draws


def test_newcombe_paired_interval_covers_the_true_difference():
    # correlated arms: P(both)=0.55, P(x only)=0.25, P(y only)=0.05, P(neither)=0.15 -> p_x - p_y = 0.2
    probs = [0.55, 0.25, 0.05, 0.15]

    def draw(rng):
        a, b, c, d = rng.multinomial(20, probs)
        lo, hi = newcombe_paired_interval(a, b, c, d)
        return lo, hi, 0.2

    assert _coverage(draw, 2000, seed=1) >= 0.93
    lo, hi = newcombe_paired_interval(16, 4, 0, 0)
    assert lo < 0.2 < hi and -1 <= lo and hi <= 1


def test_newcombe_unpaired_interval_covers_the_true_difference():
    def draw(rng):
        a, b = rng.binomial(20, 0.8), rng.binomial(25, 0.5)
        lo, hi = newcombe_unpaired_interval(a, 20, b, 25)
        return lo, hi, 0.5 - 0.8

    assert _coverage(draw, 2000, seed=2) >= 0.93
    assert newcombe_unpaired_interval(0, 0, 1, 2) == (-1.0, 1.0)
    assert not math.isnan(newcombe_unpaired_interval(10, 10, 0, 10)[0])
