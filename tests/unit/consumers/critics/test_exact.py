"""The critics' exact tails against brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import pytest

from consumers.critics.exact import (
    binom_cdf,
    binom_sf,
    fisher_greater,
    lower_bound,
    range_power,
    range_sf,
    signflip_sf,
    tarone,
    upper_bound,
)


def pmf(k, n, p):
    return math.comb(n, k) * p ** k * (1 - p) ** (n - k)


@pytest.mark.parametrize("n,p", [(5, 0.3), (10, 0.6), (20, 0.95), (7, 0.0), (7, 1.0)])
def test_binomial_tails(n, p):
    for k in range(-1, n + 2):
        sf = sum(pmf(i, n, p) for i in range(max(k, 0), n + 1))
        assert binom_sf(k, n, p) == pytest.approx(sf, abs=1e-12)
        assert binom_cdf(k, n, p) == pytest.approx(1 - sum(pmf(i, n, p) for i in range(max(k + 1, 0), n + 1)),
                                                   abs=1e-12)


def test_fisher_against_the_hypergeometric():
    # 9/10 vs 2/10: P(X >= 9), X ~ Hypergeom(20, 11, 10)
    assert fisher_greater(9, 10, 2, 10) == pytest.approx((55 * 9 + 11) / math.comb(20, 10))
    assert fisher_greater(0, 5, 5, 5) == pytest.approx(1.0)


def test_range_sf_against_enumeration():
    models, n = 3, 4
    for total in range(models * n + 1):
        for spread in range(n + 2):
            num = sum(math.prod(math.comb(n, s) for s in c)
                      for c in itertools.product(range(n + 1), repeat=models)
                      if sum(c) == total and max(c) - min(c) >= spread)
            assert range_sf(models, n, total, spread) == pytest.approx(num / math.comb(models * n, total), abs=1e-12)


def test_signflip_is_the_sign_test_for_unit_magnitudes_and_enumerates_otherwise():
    assert signflip_sf((1,) * 7, 7) == pytest.approx(2 ** -7)
    assert signflip_sf((1,) * 8, 4) == pytest.approx(binom_sf(6, 8, 0.5))  # sum >= 4 <=> 6+ positive
    mags = (0, 1, 2, 2, 3)
    tail = sum(1 for e in itertools.product((-1, 1), repeat=5) if sum(a * b for a, b in zip(e, mags, strict=True)) >= 3)
    assert signflip_sf(mags, 3) == pytest.approx(tail / 32)


def test_tarone_gives_no_share_of_the_level_to_a_test_that_cannot_reject():
    # floors 2^-8 (a model that lost 8 seeds of 8) and 0.5 (one discordant seed), 1.0 (none)
    assert tarone((2 ** -8, 0.5, 1.0), (2 ** -8, 0.5, 1.0), 0.0125) == (2 ** -8, 0)  # K = 1: Bonferroni would say 3x
    # two tests that can reject share it: K = 2
    p, best = tarone((2 ** -8, 0.6), (2 ** -8, 2 ** -9), 0.0125)
    assert (p, best) == (2 * 2 ** -8, 0)
    assert tarone((0.5,), (0.5,), 0.05) == (1.0, None)  # nothing can reject at 0.05
    assert tarone((0.01,), (0.01,), 0.0) == (1.0, None)  # a look that spends nothing rejects nothing
    with pytest.raises(ValueError, match="2 p-values but 1 floors"):
        tarone((0.1, 0.2), (0.1,), 0.05)


def test_tarone_holds_its_level_over_exchangeable_discordant_seeds():
    """Under 'candidate = parent' every model's parent-only count is Binomial(discordant, 1/2): the
    chance of any rejection, summed exactly over the outcomes, stays <= the level."""
    discordant, level = (8, 7, 3, 0), 0.0125
    reject = 0.0
    for outcome in itertools.product(*(range(n + 1) for n in discordant)):
        ps = tuple(binom_sf(b, n, 0.5) for b, n in zip(outcome, discordant, strict=True))
        if tarone(ps, tuple(0.5 ** n for n in discordant), level)[0] <= level:
            reject += math.prod(math.comb(n, b) * 0.5 ** n for b, n in zip(outcome, discordant, strict=True))
    assert 0.0 < reject <= level


def test_clopper_pearson_bounds_hit_their_level():
    for n in (5, 10, 20):
        for s in range(n + 1):
            u, lo = upper_bound(s, n, 0.05), lower_bound(s, n, 0.05)
            assert lo <= s / n <= u
            if s < n:
                assert binom_cdf(s, n, u) == pytest.approx(0.05, abs=1e-9)
            if s > 0:
                assert binom_sf(s, n, lo) == pytest.approx(0.05, abs=1e-9)
    assert upper_bound(5, 5, 0.05) == 1.0 and lower_bound(0, 5, 0.05) == 0.0


def test_range_power_is_a_probability_that_grows_with_the_spread():
    low = range_power((5, 5, 5, 5), 10, 20, 0.0125)
    high = range_power((2, 5, 8, 10), 10, 20, 0.0125)
    assert 0.0 <= low < 0.05 < 0.9 < high <= 1.0 + 1e-12
