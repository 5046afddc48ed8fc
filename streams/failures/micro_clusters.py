"""The micro-cluster level of OnlineFailureClusterer (streams.failures.clusterer): tallying an
episode's facts, fading, the centre and squared-distance matrix kept per add, merging the two
closest micro-clusters, resolving merged ids, and the faded weights and sums a re-clustering reads.
A mixin over the clusterer's own state (``config``, ``micro``, ``_order``, ``_c``, ``_d2``,
``_alias``, ``_member``), kept apart so the clusterer module holds the online/macro flow and this
one the micro-cluster centroid maths.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from streams.failures.cluster_records import MicroCluster
from streams.failures.embedding import EpisodeFacts


class MicroClusters:
    """Micro-cluster upkeep for OnlineFailureClusterer; not usable on its own."""

    def _tally(self, micro: MicroCluster, scenario_id: str, facts: EpisodeFacts) -> None:
        micro.scenarios[scenario_id] += 1
        micro.models[facts.model_id] += 1
        micro.types.update(facts.failure_types)
        if facts.root_type is not None:
            micro.roots[facts.root_type] += 1
        for name, value in facts.site:
            micro.site_sum[name] += value
            micro.site_n[name] += 1
        self._trim(micro)

    def _fade(self, micro: MicroCluster, now: int) -> None:
        hl = self.config.half_life_updates
        if hl is not None and now > micro.updated:
            factor = 0.5 ** ((now - micro.updated) / hl)
            micro.weight *= factor
            micro.ls *= factor
            micro.ss *= factor
        micro.updated = now

    def _trim(self, micro: MicroCluster) -> None:
        keep = max(4 * self.config.top_scenarios, 20)
        if len(micro.scenarios) > 2 * keep:
            micro.scenarios = Counter(dict(micro.scenarios.most_common(keep)))

    def _set_centre(self, row: int, centre: np.ndarray) -> None:
        n = len(self._order)
        self._c[row] = centre
        d = ((self._c[:n] - centre) ** 2).sum(axis=1)
        d[row] = np.inf
        self._d2[row, :n] = d
        self._d2[:n, row] = d

    def _merge_closest(self, now: int) -> None:
        n = len(self._order)
        i, j = divmod(int(np.argmin(self._d2[:n, :n])), n)
        a, b = self.micro[self._order[i]], self.micro[self._order[j]]
        self._fade(a, now)
        self._fade(b, now)
        keep, gone = (a, b) if a.count >= b.count else (b, a)
        keep.count += gone.count
        keep.weight += gone.weight
        keep.ls += gone.ls
        keep.ss += gone.ss
        for name in ("scenarios", "models", "types", "roots", "site_sum", "site_n"):
            getattr(keep, name).update(getattr(gone, name))
        for label, episodes in gone.members.items():
            keep.members.setdefault(label, []).extend(episodes)
            for e in episodes:
                self._member[e] = keep.id
        self._trim(keep)
        self._alias[gone.id] = keep.id
        del self.micro[gone.id]
        gone_row, keep_row, last = self._order.index(gone.id), self._order.index(keep.id), n - 1
        if gone_row != last:  # the last row takes the gone one's place
            self._order[gone_row] = self._order[last]
            self._c[gone_row] = self._c[last]
            self._d2[gone_row, :n] = self._d2[last, :n]
            self._d2[:n, gone_row] = self._d2[:n, last]
            self._d2[gone_row, gone_row] = np.inf
            keep_row = gone_row if keep_row == last else keep_row
        self._order.pop()
        self._d2[last, :n] = np.inf
        self._d2[:n, last] = np.inf
        self._set_centre(keep_row, keep.centre)

    def _resolve(self, micro_id: int) -> int:
        while micro_id in self._alias:
            micro_id = self._alias[micro_id]
        return micro_id

    def _faded(self, ids: list[int], now: int) -> tuple[np.ndarray, np.ndarray]:
        """Micro-cluster weights and linear sums faded to ``now``, without touching the micro-clusters."""
        weights = np.array([self.micro[m].weight for m in ids])
        sums = np.vstack([self.micro[m].ls for m in ids])
        hl = self.config.half_life_updates
        if hl is not None:
            factor = np.array([0.5 ** ((now - self.micro[m].updated) / hl) for m in ids])
            weights = weights * factor
            sums = sums * factor[:, None]
        return weights, sums
