"""The statistics the read side reports: intervals for rates and paired differences, exact tests,
multiple-comparison corrections, rank agreement. Pure functions of counts, no store.

Everything here is exact or a score-type interval, because benchmark arms are small (tens of
rollouts) and rates sit near 0 or 1, where the normal approximation (Wald) is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """95% Wilson score interval: honest at small n and at 0% / 100%, unlike the normal one."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def binomial_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided p of k successes in n fair trials (doubling the smaller tail, capped at 1)."""
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(0, min(k, n - k) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def mcnemar_exact_p(b: int, c: int) -> float:
    """Exact McNemar test: under no difference the b + c discordant pairs split as a fair coin."""
    return binomial_two_sided_p(min(b, c), b + c)


def fisher_exact_p(a: int, n_a: int, b: int, n_b: int) -> float:
    """Two-sided Fisher exact test of a/n_a against b/n_b (tables as likely or less than the one seen)."""
    total, successes = n_a + n_b, a + b
    if n_a == 0 or n_b == 0 or successes in (0, total):
        return 1.0

    def prob(x: int) -> float:
        return math.comb(n_a, x) * math.comb(n_b, successes - x) / math.comb(total, successes)

    seen = prob(a)
    lo, hi = max(0, successes - n_b), min(n_a, successes)
    return min(1.0, sum(p for x in range(lo, hi + 1) if (p := prob(x)) <= seen * (1 + 1e-9)))


@dataclass(frozen=True)
class PairedDifference:
    """Two arms on the same seeds. ``difference`` = rate of arm 2 minus rate of arm 1 on the pairs.

    both / only_1 / only_2 / neither count the pairs by which arm succeeded; only_1 and only_2 are
    the discordant pairs the exact McNemar test reads.
    """

    pairs: int
    both: int
    only_1: int
    only_2: int
    neither: int

    @property
    def rate_1(self) -> float:
        return (self.both + self.only_1) / self.pairs if self.pairs else 0.0

    @property
    def rate_2(self) -> float:
        return (self.both + self.only_2) / self.pairs if self.pairs else 0.0

    @property
    def difference(self) -> float:
        return self.rate_2 - self.rate_1

    @property
    def interval(self) -> tuple[float, float]:
        return newcombe_paired_interval(self.both, self.only_2, self.only_1, self.neither)

    @property
    def p_value(self) -> float:
        return mcnemar_exact_p(self.only_1, self.only_2)


def paired(arm_1: Mapping[object, bool], arm_2: Mapping[object, bool]) -> PairedDifference:
    """Pair two arms' outcomes by seed (keys present in both)."""
    keys = arm_1.keys() & arm_2.keys()
    both = sum(1 for k in keys if arm_1[k] and arm_2[k])
    only_1 = sum(1 for k in keys if arm_1[k] and not arm_2[k])
    only_2 = sum(1 for k in keys if arm_2[k] and not arm_1[k])
    return PairedDifference(len(keys), both, only_1, only_2, len(keys) - both - only_1 - only_2)


def newcombe_paired_interval(both: int, only_x: int, only_y: int, neither: int,
                             z: float = Z_95) -> tuple[float, float]:
    """95% interval for p_x - p_y from paired binary outcomes (Newcombe 1998, method 10).

    p_x = (both + only_x) / n, p_y = (both + only_y) / n. It combines the two marginal Wilson
    intervals with the pairs' correlation, so it stays inside [-1, 1] and is sensible at 0 and n.
    """
    n = both + only_x + only_y + neither
    if n == 0:
        return (-1.0, 1.0)
    p_x, p_y = (both + only_x) / n, (both + only_y) / n
    l_x, u_x = wilson_interval(both + only_x, n, z)
    l_y, u_y = wilson_interval(both + only_y, n, z)
    denom = (both + only_x) * (only_y + neither) * (both + only_y) * (only_x + neither)
    phi = (both * neither - only_x * only_y) / math.sqrt(denom) if denom else 0.0
    d = p_x - p_y
    delta = math.sqrt(max(0.0, (p_x - l_x) ** 2 - 2 * phi * (p_x - l_x) * (u_y - p_y) + (u_y - p_y) ** 2))
    epsilon = math.sqrt(max(0.0, (u_x - p_x) ** 2 - 2 * phi * (u_x - p_x) * (p_y - l_y) + (p_y - l_y) ** 2))
    return (max(-1.0, d - delta), min(1.0, d + epsilon))


def newcombe_unpaired_interval(a: int, n_a: int, b: int, n_b: int, z: float = Z_95) -> tuple[float, float]:
    """95% interval for b/n_b - a/n_a from two independent arms (Newcombe 1998, method 10 hybrid score)."""
    if n_a == 0 or n_b == 0:
        return (-1.0, 1.0)
    p_a, p_b = a / n_a, b / n_b
    l_a, u_a = wilson_interval(a, n_a, z)
    l_b, u_b = wilson_interval(b, n_b, z)
    d = p_b - p_a
    return (max(-1.0, d - math.sqrt((p_b - l_b) ** 2 + (u_a - p_a) ** 2)),
            min(1.0, d + math.sqrt((u_b - p_b) ** 2 + (p_a - l_a) ** 2)))


def holm_adjusted(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (controls the family-wise error rate, any dependence)."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    adjusted = [1.0] * len(p_values)
    running = 0.0
    m = len(p_values)
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def average_ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their positions."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation (Pearson on average ranks); None with < 2 points or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return None
    rx, ry = average_ranks(x), average_ranks(y)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx = sum((a - mx) ** 2 for a in rx)
    syy = sum((b - my) ** 2 for b in ry)
    if sxx == 0 or syy == 0:
        return None
    return sxy / math.sqrt(sxx * syy)
