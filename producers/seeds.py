"""Which seeds choose the benchmark and which seeds measure it.

    sweep_request(scenario, model, version, selection_seeds(20))   # feeds failures, validation, the gate
    sweep_request(scenario, model, version, held_out_seeds(20))    # measures: nothing decides on it

Selection seeds (0 .. HELD_OUT_FROM-1) are the loop's: the sweeps whose failures are clustered and
mutated, the critics' paired validation arms, the gate's saturation and redundancy checks. A score
read on them is in-sample: a scenario was promoted *because* some model failed on those seeds, so
that model's rate there is biased low (the winner's curse).

Held-out seeds (HELD_OUT_FROM ..) measure. The clusterer passes over their episodes and every store
query that decides (gate, critics) reads selection seeds only, so they take no part in choosing any
scenario. One range serves every benchmark version: since nothing selects on it there is nothing
to leak by reusing it, and the same seeds on every version and model make versions and models
comparable seed for seed (paired tests). What the range cannot guard against is a person tuning the
loop on its figures; bench/ validates on models the loop never saw for that.
"""

from __future__ import annotations

HELD_OUT_FROM = 1_000_000  # far above any selection seed the loop or the critics use (hundreds at most)
# Where the measurement seeds start within the held-out range. LIBERO starts each episode from one
# of 50 fixed init states per task, seed mod 50: from here the first 25 measurement seeds start from
# init states 25-49, which no default sweep (seeds 0-19) starts from. (The critics' validation arms
# may reach them; with 50 states, some sharing is the benchmark's, not ours to remove.)
MEASUREMENT_OFFSET = 25


def selection_seeds(n: int) -> list[int]:
    return list(range(n))


def held_out_seeds(n: int) -> list[int]:
    first = HELD_OUT_FROM + MEASUREMENT_OFFSET
    return list(range(first, first + n))


def is_held_out(seed: int | None) -> bool:
    return seed is not None and seed >= HELD_OUT_FROM
