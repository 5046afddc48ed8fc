"""Incremental clustering of failed-episode embeddings, with cluster ids stable across re-clustering.

    clusterer = OnlineFailureClusterer(ClustererConfig(), describer=FeatureDescriber(EmbeddingConfig()))
    events = clusterer.add(episode_id, scenario_id, x)   # ClusterAssigned / ClusterUpdated dicts
    events += clusterer.recluster()                       # also runs every ``recluster_every`` adds
    clusterer.label_of(episode_id)                        # current macro cluster id, or None (noise)

Two levels, in the spirit of DenStream / CluStream, written with numpy:

- Micro-clusters, updated per failure: a point joins the nearest micro-cluster whose centre is
  within ``micro_radius``, else starts a new one; over ``max_micro_clusters`` the two closest
  merge. Each keeps a (faded, if ``half_life_updates`` is set) weight, linear sum and square sum,
  a member count, its first member as representative and a scenario tally.
- Macro-clusters, recomputed periodically: sklearn DBSCAN over the micro-cluster centres,
  weighted by micro-cluster weight (``eps=macro_eps``, ``min_samples=macro_min_weight``).

Stable ids: each re-clustering matches new macro-clusters to the previous ones by weighted
Jaccard overlap of their micro-cluster members (Hungarian assignment, at least
``match_min_overlap``), then the rest by centroid distance (at most ``match_max_distance``).
A match keeps its id; a new cluster gets the next id of this clusterer's namespace; an old
cluster left without a match is retired with a ClusterUpdated of size 0 naming where its members
went. Ids are a function of the input order, so a replay yields the same ids.

Events: ClusterAssigned once per episode, when it first belongs to a macro-cluster (at ``add`` if
its micro-cluster already has one, else at the next re-clustering that gives it one; later drift
is visible through ``label_of``, not re-announced). ClusterUpdated for every new or changed
cluster at each re-clustering, natural key (cluster_id, revision, summary_source).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field, fields

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score

from schemas.events import make_event, stable_id
from streams.exceptions import ClustererError, ConfigError
from streams.failures.summaries import ClusterStats

CLUSTERER_VERSION = "failure-clusterer/1.0"
PRODUCER = "failure-clusterer"
NOISE = -1


@dataclass(frozen=True, kw_only=True)
class ClustererConfig:
    """Distances are in embedding units (see streams.failures.embedding)."""

    micro_radius: float = 0.5  # a point joins the nearest micro-cluster within this distance
    max_micro_clusters: int = 400  # above this the two closest micro-clusters merge
    half_life_updates: float | None = None  # micro weights halve every this many adds; None = no fading
    macro_eps: float = 1.25  # DBSCAN eps over micro-cluster centres; keep it above 2 * micro_radius,
    # the largest gap between neighbouring micro-centres of one dense region
    macro_min_weight: int = 3  # DBSCAN min_samples, summed micro-cluster weight (~episodes)
    recluster_every: int = 50  # adds between macro re-clusterings
    match_min_overlap: float = 0.2  # weighted Jaccard overlap for a new cluster to inherit an old id
    match_max_distance: float = 1.0  # else centroid distance within which it inherits one
    top_scenarios: int = 5  # scenarios named per cluster
    namespace: str = "failures"  # cluster ids derive from it and a sequence number

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "namespace" or (f.name == "half_life_updates" and value is None):
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or value <= 0:
                raise ConfigError(f"ClustererConfig.{f.name} must be a finite number > 0, got {value!r}")
        for name in ("max_micro_clusters", "macro_min_weight", "recluster_every", "top_scenarios"):
            if not isinstance(getattr(self, name), int):
                raise ConfigError(f"ClustererConfig.{name} must be an integer, got {getattr(self, name)!r}")
        if self.max_micro_clusters < 2:
            raise ConfigError(f"ClustererConfig.max_micro_clusters must be >= 2, got {self.max_micro_clusters!r}")
        if not 0 < self.match_min_overlap <= 1:
            raise ConfigError(f"ClustererConfig.match_min_overlap must be in (0, 1], got {self.match_min_overlap!r}")
        if self.macro_eps <= self.micro_radius:
            raise ConfigError(f"ClustererConfig.macro_eps ({self.macro_eps}) must exceed micro_radius "
                              f"({self.micro_radius}); above 2 * micro_radius keeps dense regions connected")
        if not self.namespace:
            raise ConfigError("ClustererConfig.namespace must not be empty")


@dataclass
class MicroCluster:
    id: int
    count: int  # episodes absorbed (never faded)
    weight: float  # faded count
    ls: np.ndarray  # faded linear sum
    ss: float  # faded sum of squared norms
    updated: int  # add index the fading was last applied at
    representative_episode_id: str
    representative_scenario_id: str
    scenarios: Counter = field(default_factory=Counter)

    @property
    def centre(self) -> np.ndarray:
        return self.ls / self.weight

    @property
    def radius(self) -> float:
        """RMS distance of the members from the centre."""
        c = self.centre
        return math.sqrt(max(0.0, self.ss / self.weight - float(c @ c)))


@dataclass
class MacroCluster:
    id: str
    micro_ids: frozenset[int]
    centroid: np.ndarray
    size: int
    representative_episode_id: str
    representative_scenario_id: str
    top_scenarios: tuple[tuple[str, int], ...]
    revision: int  # clusterer revision of its last ClusterUpdated
    dominant: str = "unknown"
    summary: str = ""


class _GenericDescriber:
    def describe(self, stats: ClusterStats) -> tuple[str, str]:
        return "unknown", f"{stats.size} failed episodes"


class OnlineFailureClusterer:
    """Micro-clusters per add, DBSCAN macro-clusters per re-clustering, stable ids. Not thread-safe."""

    def __init__(self, config: ClustererConfig, describer=None, run_id: str = "", producer: str = PRODUCER):
        self.config = config
        self.describer = describer or _GenericDescriber()
        self.run_id = run_id
        self.producer = producer
        self.dims: int | None = None
        self.updates = 0
        self.revision = 0
        self.micro: dict[int, MicroCluster] = {}
        self.clusters: dict[str, MacroCluster] = {}
        self._next_micro = 0
        self._next_cluster = 0
        self._alias: dict[int, int] = {}  # merged micro id -> the id it merged into
        self._member: dict[str, int] = {}  # episode id -> micro id it joined
        self._macro_of: dict[int, str] = {}  # micro id -> macro cluster id (last re-clustering)
        self._pending: dict[str, tuple[np.ndarray, str]] = {}  # not yet assigned: x, scenario
        self._assigned: set[str] = set()
        # centre matrix, rows aligned with self._order
        self._order: list[int] = []
        self._centres = np.zeros((0, 0))

    # -- online part ------------------------------------------------------------------------

    def add(self, episode_id: str, scenario_id: str, x: np.ndarray) -> list[dict]:
        """Absorb one failed episode; returns ClusterAssigned (if it lands in a known cluster)
        and, every ``recluster_every`` adds, the re-clustering's events."""
        x = np.asarray(x, dtype=float)
        if self.dims is None:
            self.dims = x.shape[0]
            self._centres = np.zeros((0, self.dims))
        if x.shape != (self.dims,) or not np.all(np.isfinite(x)):
            raise ClustererError(f"episode {episode_id}: embedding must be {self.dims} finite numbers, "
                                 f"got shape {x.shape}")
        if episode_id in self._member:
            return []  # re-delivered: each episode counts once
        self.updates += 1
        now = self.updates
        micro = None
        if self._order:
            d = np.linalg.norm(self._centres - x, axis=1)
            j = int(np.argmin(d))
            if d[j] <= self.config.micro_radius:
                micro = self.micro[self._order[j]]
                self._fade(micro, now)
                micro.count += 1
                micro.weight += 1.0
                micro.ls += x
                micro.ss += float(x @ x)
                micro.scenarios[scenario_id] += 1
                self._trim(micro)
                self._centres[j] = micro.centre
        if micro is None:
            micro = MicroCluster(self._next_micro, 1, 1.0, x.copy(), float(x @ x), now, episode_id, scenario_id,
                                 Counter({scenario_id: 1}))
            self._next_micro += 1
            self.micro[micro.id] = micro
            self._order.append(micro.id)
            self._centres = np.vstack([self._centres, x[None, :]])
            if len(self._order) > self.config.max_micro_clusters:
                self._merge_closest(now)
        self._member[episode_id] = micro.id
        events: list[dict] = []
        macro_id = self._macro_of.get(self._resolve(micro.id))
        if macro_id is not None:
            events.append(self._assigned_event(episode_id, scenario_id, x, self.clusters[macro_id]))
        else:
            self._pending[episode_id] = (x, scenario_id)
        if self.updates % self.config.recluster_every == 0:
            events += self.recluster()
        return events

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

    def _merge_closest(self, now: int) -> None:
        c = self._centres
        sq = (c * c).sum(axis=1)
        d2 = sq[:, None] + sq[None, :] - 2 * c @ c.T
        np.fill_diagonal(d2, np.inf)
        i, j = np.unravel_index(int(np.argmin(d2)), d2.shape)
        a, b = self.micro[self._order[i]], self.micro[self._order[j]]
        self._fade(a, now)
        self._fade(b, now)
        keep, gone = (a, b) if a.count >= b.count else (b, a)
        keep.count += gone.count
        keep.weight += gone.weight
        keep.ls += gone.ls
        keep.ss += gone.ss
        keep.scenarios.update(gone.scenarios)
        self._trim(keep)
        self._alias[gone.id] = keep.id
        del self.micro[gone.id]
        gone_row = self._order.index(gone.id)
        keep_row = self._order.index(keep.id)
        self._centres[keep_row] = keep.centre
        self._centres = np.delete(self._centres, gone_row, axis=0)
        del self._order[gone_row]

    def _resolve(self, micro_id: int) -> int:
        while micro_id in self._alias:
            micro_id = self._alias[micro_id]
        return micro_id

    # -- macro part -------------------------------------------------------------------------

    def recluster(self) -> list[dict]:
        """DBSCAN over micro-cluster centres, ids matched to the previous clusters; returns the
        ClusterUpdated events of new, changed and retired clusters and the ClusterAssigned of
        episodes that now belong to a cluster."""
        if not self._order:
            return []
        self.revision += 1
        now = self.updates
        for m in self.micro.values():
            self._fade(m, now)
        ids = list(self._order)
        centres = np.array([self.micro[i].centre for i in ids])
        w = np.array([self.micro[i].weight for i in ids])
        # A precomputed distance matrix: at a few hundred micro-clusters it is tiny, and it skips
        # sklearn's threaded neighbour search, whose start-up costs ~30 ms per call.
        sq = (centres * centres).sum(axis=1)
        dist = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * centres @ centres.T, 0.0))
        labels = DBSCAN(eps=self.config.macro_eps, min_samples=self.config.macro_min_weight, metric="precomputed") \
            .fit(dist, sample_weight=w).labels_
        groups: dict[int, list[int]] = {}
        for micro_id, label in zip(ids, labels, strict=True):
            if label != NOISE:
                groups.setdefault(int(label), []).append(micro_id)
        new = [frozenset(g) for _, g in sorted(groups.items())]
        old = list(self.clusters.values())
        old_members = [frozenset(self._resolve(m) for m in c.micro_ids) for c in old]
        weight_of = {i: self.micro[i].weight for i in ids}
        new_centroids = [self._centroid(g) for g in new]
        pairs = self._match(new, new_centroids, old, old_members, weight_of)

        events: list[dict] = []
        clusters: dict[str, MacroCluster] = {}
        for k, members in enumerate(new):
            prev = old[pairs[k]] if k in pairs else None
            cid = prev.id if prev is not None else self._new_id()
            cluster = self._build(cid, members, new_centroids[k], prev)
            clusters[cid] = cluster
            changed = prev is None or prev.size != cluster.size or prev.micro_ids != cluster.micro_ids \
                or not np.allclose(prev.centroid, cluster.centroid)
            if changed:
                events.append(self._updated_event(cluster))
            else:
                cluster.revision, cluster.dominant, cluster.summary = prev.revision, prev.dominant, prev.summary
        matched_old = set(pairs.values())
        for o, (prev, members) in enumerate(zip(old, old_members, strict=True)):
            if o in matched_old:
                continue
            heirs = Counter()
            for cid, c in clusters.items():
                shared = members & c.micro_ids
                if shared:
                    heirs[cid] = sum(weight_of.get(m, 0.0) for m in shared)
            where = f"merged into {heirs.most_common(1)[0][0]}" if heirs else "dissolved into noise"
            events.append(self._retired_event(prev, where))
        self.clusters = clusters
        self._macro_of = {m: c.id for c in clusters.values() for m in c.micro_ids}
        for episode_id, (x, scenario_id) in list(self._pending.items()):
            cid = self._macro_of.get(self._resolve(self._member[episode_id]))
            if cid is not None:
                events.append(self._assigned_event(episode_id, scenario_id, x, clusters[cid]))
                del self._pending[episode_id]
        return events

    def _centroid(self, members: frozenset[int]) -> np.ndarray:
        total = sum(self.micro[m].weight for m in members)
        return sum(self.micro[m].ls for m in members) / total

    def _match(self, new, new_centroids, old, old_members, weight_of) -> dict[int, int]:
        """new index -> old index, by overlap then by centroid distance (Hungarian both times)."""
        pairs: dict[int, int] = {}
        if not new or not old:
            return pairs
        overlap = np.zeros((len(new), len(old)))
        for k, a in enumerate(new):
            for o, b in enumerate(old_members):
                inter = sum(weight_of.get(m, 0.0) for m in a & b)
                if inter > 0:
                    union = sum(weight_of.get(m, 0.0) for m in a | b)
                    overlap[k, o] = inter / union
        rows, cols = linear_sum_assignment(-overlap)
        for k, o in zip(rows, cols, strict=True):
            if overlap[k, o] >= self.config.match_min_overlap:
                pairs[int(k)] = int(o)
        rest_new = [k for k in range(len(new)) if k not in pairs]
        rest_old = [o for o in range(len(old)) if o not in pairs.values()]
        if rest_new and rest_old:
            dist = np.array([[float(np.linalg.norm(new_centroids[k] - old[o].centroid)) for o in rest_old]
                             for k in rest_new])
            rows, cols = linear_sum_assignment(dist)
            for r, c in zip(rows, cols, strict=True):
                if dist[r, c] <= self.config.match_max_distance:
                    pairs[rest_new[r]] = rest_old[c]
        return pairs

    def _new_id(self) -> str:
        self._next_cluster += 1
        return f"fc-{stable_id('failure-cluster', self.config.namespace, self._next_cluster)[:12]}"

    def _build(self, cid: str, members: frozenset[int], centroid: np.ndarray, prev: MacroCluster | None) \
            -> MacroCluster:
        micros = [self.micro[m] for m in members]
        nearest = min(micros, key=lambda m: (float(np.linalg.norm(m.centre - centroid)), -m.count, m.id))
        scenarios = Counter()
        for m in micros:
            scenarios.update(m.scenarios)
        top = tuple(sorted(scenarios.items(), key=lambda kv: (-kv[1], kv[0]))[:self.config.top_scenarios])
        return MacroCluster(cid, members, centroid, sum(m.count for m in micros),
                            nearest.representative_episode_id, nearest.representative_scenario_id, top,
                            self.revision)

    def stats(self, cluster: MacroCluster) -> ClusterStats:
        return ClusterStats(cluster.id, cluster.size, cluster.centroid, cluster.representative_episode_id,
                            cluster.representative_scenario_id, cluster.top_scenarios)

    # -- events -----------------------------------------------------------------------------

    def _assigned_event(self, episode_id: str, scenario_id: str, x: np.ndarray, cluster: MacroCluster) -> dict:
        self._assigned.add(episode_id)
        return make_event("ClusterAssigned", (episode_id, cluster.id), self.producer, self.run_id,
                          cluster_id=cluster.id, episode_id=episode_id, scenario_id=scenario_id,
                          distance=float(np.linalg.norm(x - cluster.centroid)), embedding=x.tolist(),
                          clusterer_version=CLUSTERER_VERSION)

    def _updated_event(self, cluster: MacroCluster) -> dict:
        dominant, summary = self.describer.describe(self.stats(cluster))
        cluster.dominant, cluster.summary = dominant, summary
        return self.updated_event(cluster, summary, "features")

    def updated_event(self, cluster: MacroCluster, summary: str, source: str) -> dict:
        """ClusterUpdated for ``cluster`` at its revision; ``source`` is "features" or "llm"."""
        return make_event("ClusterUpdated", (cluster.id, cluster.revision, source), self.producer, self.run_id,
                          cluster_id=cluster.id, centroid=cluster.centroid.tolist(), size=cluster.size,
                          representative_episode_id=cluster.representative_episode_id,
                          representative_scenario_id=cluster.representative_scenario_id,
                          dominant_failure_type=cluster.dominant, summary=summary, summary_source=source,
                          clusterer_version=CLUSTERER_VERSION)

    def _retired_event(self, cluster: MacroCluster, where: str) -> dict:
        return make_event("ClusterUpdated", (cluster.id, self.revision, "features"), self.producer, self.run_id,
                          cluster_id=cluster.id, centroid=cluster.centroid.tolist(), size=0,
                          representative_episode_id=cluster.representative_episode_id,
                          representative_scenario_id=cluster.representative_scenario_id,
                          dominant_failure_type=cluster.dominant,
                          summary=f"retired at revision {self.revision}: {where}", summary_source="features",
                          clusterer_version=CLUSTERER_VERSION)

    # -- queries ----------------------------------------------------------------------------

    def label_of(self, episode_id: str) -> str | None:
        """The macro cluster the episode's micro-cluster belongs to now (None: noise / not yet)."""
        micro = self._member.get(episode_id)
        return None if micro is None else self._macro_of.get(self._resolve(micro))

    def labels(self, episode_ids) -> list[str | None]:
        return [self.label_of(e) for e in episode_ids]

    @property
    def pending(self) -> int:
        """Episodes absorbed but not yet in any macro cluster."""
        return len(self._pending)


BATCH_MIN_SAMPLES = 5  # batch reference: DBSCAN's usual default core size


def batch_dbscan(embeddings: np.ndarray, eps: float | None = None, min_samples: int = BATCH_MIN_SAMPLES) \
        -> np.ndarray:
    """Plain sklearn DBSCAN over every embedding at once: the batch reference (-1 = noise).
    ``eps`` defaults to ClustererConfig().macro_eps, so online and batch use one density scale."""
    eps = ClustererConfig().macro_eps if eps is None else eps
    return DBSCAN(eps=eps, min_samples=min_samples).fit(np.asarray(embeddings, dtype=float)).labels_


def adjusted_rand(online_labels, batch_labels) -> float:
    """Adjusted Rand index between online labels (cluster ids, None = noise) and batch labels.
    Noise is one label on each side, as DBSCAN reports it."""
    online = ["~noise" if v is None else str(v) for v in online_labels]
    batch = [str(v) for v in batch_labels]
    if len(online) != len(batch):
        raise ClustererError(f"{len(online)} online labels vs {len(batch)} batch labels")
    return float(adjusted_rand_score(batch, online))
