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
