"""Exact small-sample tails for the critics: binomial, hypergeometric (Fisher), Clopper-Pearson.

Pure Python over ``math.comb`` with memoisation: the critics evaluate the same few (k, n) pairs
again and again (every look of every candidate, thousands of times in bench/sequential.py), and
no normal approximation is honest at 5-20 rollouts.
"""

from __future__ import annotations

import math
from functools import lru_cache

_BISECT_STEPS = 60  # 2^-60: far below any level a rule compares against


@lru_cache(maxsize=65536)
def binom_sf(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p)."""
    return _sf(k, n, p)


def _sf(k: int, n: int, p: float) -> float:
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    return min(1.0, math.fsum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1)))


@lru_cache(maxsize=65536)
def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return max(0.0, 1.0 - binom_sf(k + 1, n, p))


@lru_cache(maxsize=65536)
def fisher_greater(s_a: int, n_a: int, s_b: int, n_b: int) -> float:
    """One-sided Fisher exact p-value that arm a succeeds more often than arm b.

    P(X >= s_a) for X ~ Hypergeometric(population n_a + n_b, successes s_a + s_b, draws n_a):
    given the successes both arms had together, the chance arm a got at least as many as it did
    if both had the same success rate.
    """
    total, succ = n_a + n_b, s_a + s_b
    denom = math.comb(total, n_a)
    hi = min(n_a, succ)
    return min(1.0, math.fsum(math.comb(succ, i) * math.comb(total - succ, n_a - i)
                              for i in range(s_a, hi + 1)) / denom)


@lru_cache(maxsize=65536)
def upper_bound(successes: int, n: int, level: float) -> float:
    """One-sided Clopper-Pearson upper bound U: P(Bin(n, U) <= successes) = level (1.0 if all succeeded)."""
    if successes >= n:
        return 1.0
    lo, hi = successes / n, 1.0
    for _ in range(_BISECT_STEPS):
        mid = (lo + hi) / 2
        if 1.0 - _sf(successes + 1, n, mid) > level:  # P(Bin(n, mid) <= successes)
            lo = mid
        else:
            hi = mid
    return hi


@lru_cache(maxsize=65536)
def lower_bound(successes: int, n: int, level: float) -> float:
    """One-sided Clopper-Pearson lower bound L: P(Bin(n, L) >= successes) = level (0.0 if none succeeded)."""
    if successes <= 0:
        return 0.0
    return 1.0 - upper_bound(n - successes, n, level)


@lru_cache(maxsize=65536)
def range_sf(models: int, n: int, total: int, spread: int) -> float:
    """P(max - min >= spread) of ``models`` arms of n trials each, given ``total`` successes in all.

    The exact conditional test of "every arm has the same success rate" with the range as its
    statistic: given the total, the arms' counts are multivariate hypergeometric,
    P(s_1..s_M) = prod C(n, s_m) / C(M n, total), whatever the common rate. One test for the
    best-vs-worst comparison, with no Bonferroni factor for having picked the pair after looking.
    """
    if spread <= 0:
        return 1.0
    if spread > n:
        return 0.0

    def within(lo: int, hi: int) -> int:
        """Weight of the compositions of ``total`` with every arm's count in [lo, hi]."""
        if lo > hi:
            return 0
        base = {s: math.comb(n, s) for s in range(lo, hi + 1)}
        poly = {0: 1}
        for _ in range(models):
            nxt: dict[int, int] = {}
            for deg, w in poly.items():
                for s, c in base.items():
                    if deg + s <= total:
                        nxt[deg + s] = nxt.get(deg + s, 0) + w * c
            poly = nxt
        return poly.get(total, 0)

    narrow = 0  # weight of compositions with range <= spread - 1, by their minimum
    for lo in range(0, n + 1):
        hi = min(n, lo + spread - 1)
        narrow += within(lo, hi) - within(lo + 1, hi)
    ways = math.comb(models * n, total)
    return (ways - narrow) / ways  # exact integers: never 0 for a spread that can occur


@lru_cache(maxsize=65536)
def signflip_sf(magnitudes: tuple[int, ...], observed: int) -> float:
    """P(sum_i e_i |d_i| >= observed) for independent fair signs e_i: the exact paired sign-flip test.

    ``magnitudes`` are |d_i| per pair (order does not matter; pass them sorted so equal tuples
    share a cache entry). With every |d_i| = 1 this is the exact sign (McNemar) test.
    """
    counts = {0: 1}
    for d in magnitudes:
        if d == 0:
            continue
        nxt: dict[int, int] = {}
        for total, ways in counts.items():
            nxt[total + d] = nxt.get(total + d, 0) + ways
            nxt[total - d] = nxt.get(total - d, 0) + ways
        counts = nxt
    tail = sum(ways for total, ways in counts.items() if total >= observed)
    return tail / sum(counts.values())


@lru_cache(maxsize=65536)
def range_power(successes: tuple[int, ...], n: int, n_final: int, level: float) -> float:
    """Conditional power of the range test: P(range_sf at n_final <= level) if every arm goes on at
    its observed rate (plug-in, (s + 0.5) / (n + 1) so no rate is exactly 0 or 1) for the remaining
    n_final - n trials. ``successes`` sorted, so equal records share a cache entry."""
    rest = n_final - n
    models = len(successes)
    dist: dict[tuple[int, int, int], float] = {(0, -1, n_final + 1): 1.0}  # (total, max, min) -> probability
    for s in successes:
        p = (s + 0.5) / (n + 1)
        pmf = [math.comb(rest, f) * p ** f * (1 - p) ** (rest - f) for f in range(rest + 1)]
        nxt: dict[tuple[int, int, int], float] = {}
        for (total, hi, lo), w in dist.items():
            for f, q in enumerate(pmf):
                v = s + f
                key = (total + v, max(hi, v), min(lo, v))
                nxt[key] = nxt.get(key, 0.0) + w * q
        dist = nxt
    return math.fsum(w for (total, hi, lo), w in dist.items()
                     if range_sf(models, n_final, total, hi - lo) <= level)


def tarone(p_values: tuple[float, ...], floors: tuple[float, ...], level: float) -> tuple[float, int | None]:
    """Tarone's (1990) Bonferroni for discrete tests: (adjusted p of the best test, its index).

    A discrete test whose smallest attainable p-value (its ``floor``; for an exact McNemar test on
    n discordant seeds, 2^-n) exceeds level / K can never reject at that level, so it need not
    share the level. K is the smallest K >= 1 with at most K tests whose floor is <= level / K; the
    global null is rejected when some such test has p <= level / K (the union bound over K tests,
    so it holds under any dependence among them). The adjusted p returned is K x the best such
    p-value (<= level exactly when the procedure rejects), 1.0 when none can reject.
    """
    if len(p_values) != len(floors):
        raise ValueError(f"tarone: {len(p_values)} p-values but {len(floors)} floors")
    if level <= 0.0 or not p_values:
        return 1.0, None
    k = 1
    while sum(f <= level / k for f in floors) > k:
        k += 1
    testable = [i for i, f in enumerate(floors) if f <= level / k]
    if not testable:
        return 1.0, None
    best = min(testable, key=lambda i: (p_values[i], i))
    return min(1.0, k * p_values[best]), best
