"""Incremental clustering of failed-episode embeddings. Every output event has a position; ids,
revisions and contents are a function of the input order, so re-executing the output log
reproduces the state exactly (see streams.failures.collector for the restore).

    clusterer = OnlineFailureClusterer(ClustererConfig(), describer=FeatureDescriber(EmbeddingConfig()))
    events = clusterer.add(episode_id, scenario_id, x)   # ClusterAssigned(intake) [+ a re-clustering]
    events += clusterer.recluster()                       # also runs on its own schedule inside add
    clusterer.label_of(episode_id)                        # its current cluster id, or None (noise)

Two levels, in the spirit of DenStream / CluStream, written with numpy:

- Micro-clusters, updated per failure: a point joins the nearest micro-cluster whose centre is
  within ``micro_radius``, else starts a new one; over ``max_micro_clusters`` the two closest
  merge. Each keeps a (faded, if ``half_life_updates`` is set) weight, linear sum and square sum,
  a member count, its first member as representative, and tallies of scenarios, models, failure
  types, root types and root-moment sites (``EpisodeFacts``).
- Macro-clusters, recomputed on a schedule: sklearn DBSCAN over the micro-cluster centres,
  weighted by micro-cluster weight (``eps=macro_eps``, ``min_samples=macro_min_weight``).

Stable ids: each re-clustering matches new macro-clusters to the previous ones by weighted
Jaccard overlap of their micro-cluster members (Hungarian assignment, at least
``match_min_overlap``), then the rest by centroid distance (at most ``match_max_distance``).
A match keeps its id; a new cluster gets the next id of this clusterer's namespace; an old
cluster left without a match is retired with a ClusterUpdated of size 0 naming where its members
went.

Output (failures.clusters), each event with ``position`` (its index in this output, 0-based:
event id = (namespace, position)) and ``revision`` (effective re-clusterings so far):
- ``add``: ClusterAssigned(intake=true, the embedding, cluster_id = the episode's micro-cluster's
  current macro cluster, or "noise") at once. Then, when the schedule says so, a re-clustering.
- a re-clustering: ClusterUpdated for every new, changed and retired cluster, then
  ClusterAssigned(intake=false) for every episode whose cluster changed (to "noise" included).
  The latest assignment of an episode by position is its current cluster (``label_of``).
- ``summary_event``: a ClusterUpdated with a language model's summary for a cluster revision.

Schedule: a re-clustering runs inside ``add`` once ``max(1, min(recluster_every,
int(recluster_fraction * intakes)))`` intakes have passed since the last scheduled one: after each
of the first intakes, every 10% while the clusterer is young, every ``recluster_every`` later.
It depends on the intake count only, so re-executing the intakes re-executes it.

Purity: a re-clustering computes on faded copies and changes nothing (no revision, no fading, no
id) unless it emits events; ``add`` applies fading to the micro-clusters it touches only. So an
extra ``recluster()`` that finds nothing new leaves no trace, in the state or the log.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, fields
from datetime import datetime

import numpy as np
from scipy.optimize import linear_sum_assignment
from sklearn.cluster import DBSCAN
from sklearn.metrics import adjusted_rand_score

from producers.fixed_order import dot, norm
from schemas.events import stable_id
from streams.exceptions import ClustererError, ConfigError
from streams.failures.cluster_events import ClusterEvents
from streams.failures.cluster_records import MacroCluster, MicroCluster
from streams.failures.detector import FAILURE_TYPES
from streams.failures.embedding import SITE_FEATURES, EpisodeFacts
from streams.failures.micro_clusters import MicroClusters
from streams.failures.summaries import ClusterStats

PRODUCER = "failure-clusterer"
NOISE = -1  # DBSCAN's noise label
NOISE_ID = "noise"  # cluster_id of an assignment to no cluster


@dataclass(frozen=True, kw_only=True)
class ClustererConfig:
    """Distances are in embedding units (see streams.failures.embedding)."""

    micro_radius: float = 0.5  # a point joins the nearest micro-cluster within this distance
    max_micro_clusters: int = 400  # above this the two closest micro-clusters merge
    half_life_updates: float | None = None  # micro weights halve every this many adds; None = no fading
    macro_eps: float = 1.25  # DBSCAN eps over micro-cluster centres; keep it above 2 * micro_radius,
    # the largest gap between neighbouring micro-centres of one dense region
    macro_min_weight: int = 3  # DBSCAN min_samples, summed micro-cluster weight (~episodes)
    recluster_every: int = 50  # at most this many intakes between scheduled re-clusterings
    recluster_fraction: float = 0.1  # ... and at most this fraction of the intakes so far (at least 1)
    match_min_overlap: float = 0.2  # weighted Jaccard overlap for a new cluster to inherit an old id
    match_max_distance: float = 1.0  # else centroid distance within which it inherits one
    top_scenarios: int = 5  # scenarios named per cluster
    namespace: str = "failures"  # cluster ids and event ids derive from it

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


class _GenericDescriber:
    def describe(self, stats: ClusterStats) -> tuple[str, str]:
        return "unknown", f"{stats.size} failed episodes"


class OnlineFailureClusterer(MicroClusters, ClusterEvents):
    """Micro-clusters per add, DBSCAN macro-clusters on a schedule, stable ids, positioned output.
    Not thread-safe."""

    def __init__(self, config: ClustererConfig, describer=None, run_id: str = "", producer: str = PRODUCER):
        self.config = config
        self.describer = describer or _GenericDescriber()
        self.run_id = run_id
        self.producer = producer
        self.dims: int | None = None
        self.updates = 0  # intakes
        self.revision = 0  # effective re-clusterings
        self.position = 0  # of the next output event
        self.micro: dict[int, MicroCluster] = {}
        self.clusters: dict[str, MacroCluster] = {}
        self._next_micro = 0
        self._next_cluster = 0
        self._last_scheduled = 0  # intake count at the last scheduled re-clustering
        self._latest_time: datetime | None = None  # event_time of the latest intake
        self._alias: dict[int, int] = {}  # merged micro id -> the id it merged into
        self._member: dict[str, int] = {}  # episode id -> micro id it joined
        self._macro_of: dict[int, str] = {}  # micro id -> macro cluster id (last re-clustering)
        self._label: dict[str, str] = {}  # episode id -> cluster id of its latest assignment
        self._row: dict[str, int] = {}  # episode id -> row of its embedding in self._x
        self._facts: dict[str, tuple[str, str]] = {}  # episode id -> (scenario_id, model_id) at intake
        self._x = np.zeros((0, 0))
        # micro-cluster centres and their squared distances (inf on the diagonal and unused rows),
        # rows aligned with self._order; kept up to date per add so a merge costs O(n), not O(n^2)
        self._order: list[int] = []
        self._c = np.zeros((0, 0))
        self._d2 = np.zeros((0, 0))

    def blank(self) -> OnlineFailureClusterer:
        """A new, empty clusterer with the same configuration (what a restore re-executes into)."""
        return OnlineFailureClusterer(self.config, self.describer, self.run_id, self.producer)

    # -- online part ------------------------------------------------------------------------

    def add(self, episode_id: str, scenario_id: str, x: np.ndarray, facts: EpisodeFacts | None = None,
            event_time: datetime | None = None) -> list[dict]:
        """Absorb one failed episode; returns its ClusterAssigned(intake=true) and, when the
        schedule says so, a re-clustering's events. A known episode returns [] (re-delivered)."""
        x = np.asarray(x, dtype=float)
        dims = x.shape[0] if self.dims is None and x.ndim == 1 else self.dims
        if x.shape != (dims,) or not np.all(np.isfinite(x)):
            raise ClustererError(f"episode {episode_id}: embedding must be {dims} finite numbers, "
                                 f"got shape {x.shape}")
        if episode_id in self._member:
            return []  # re-delivered: each episode counts once
        if self.dims is None:
            self.dims = dims
            cap = self.config.max_micro_clusters + 1
            self._c = np.zeros((cap, dims))
            self._d2 = np.full((cap, cap), np.inf)
            self._x = np.zeros((64, dims))
        facts = facts or EpisodeFacts()
        self.updates += 1
        self._latest_time = event_time
        now = self.updates
        micro = None
        if self._order:
            d = np.linalg.norm(self._c[:len(self._order)] - x, axis=1)
            j = int(np.argmin(d))
            if d[j] <= self.config.micro_radius:
                micro = self.micro[self._order[j]]
                self._fade(micro, now)
                micro.count += 1
                micro.weight += 1.0
                micro.ls += x
                micro.ss += float(dot(x, x))
                self._set_centre(j, micro.centre)
        if micro is None:
            micro = MicroCluster(self._next_micro, 1, 1.0, x.copy(), float(dot(x, x)), now, episode_id, scenario_id,
                                 facts.scenario)
            self._next_micro += 1
            self.micro[micro.id] = micro
            self._order.append(micro.id)
            self._set_centre(len(self._order) - 1, x)
        self._tally(micro, scenario_id, facts)
        if len(self._order) > self.config.max_micro_clusters:
            self._merge_closest(now)
        home = self.micro[self._resolve(micro.id)]
        self._member[episode_id] = home.id
        label = self._macro_of.get(home.id, NOISE_ID)
        home.members.setdefault(label, []).append(episode_id)
        self._label[episode_id] = label
        self._facts[episode_id] = (scenario_id, facts.model_id)
        self._store(episode_id, x)
        events = [self._assigned_event(episode_id, scenario_id, facts.model_id, x, label, home, intake=True)]
        if self.updates - self._last_scheduled >= self.recluster_gap():
            self._last_scheduled = self.updates
            events += self.recluster()
        return events

    def recluster_gap(self) -> int:
        """Intakes between scheduled re-clusterings at the current intake count."""
        c = self.config
        return max(1, min(c.recluster_every, int(c.recluster_fraction * self.updates)))

    def _store(self, episode_id: str, x: np.ndarray) -> None:
        row = len(self._row)
        if row == self._x.shape[0]:
            self._x = np.vstack([self._x, np.zeros_like(self._x)])
        self._x[row] = x
        self._row[episode_id] = row

    # -- macro part -------------------------------------------------------------------------

    def recluster(self) -> list[dict]:
        """DBSCAN over micro-cluster centres, ids matched to the previous clusters; returns the
        ClusterUpdated events of new, changed and retired clusters and the ClusterAssigned of
        episodes whose cluster changed. Changes no state when it returns []."""
        if not self._order:
            return []
        ids = list(self._order)
        weights, sums = self._faded(ids, self.updates)
        # The distance matrix kept per add, precomputed for DBSCAN: at a few hundred micro-clusters it
        # is tiny, and it skips sklearn's threaded neighbour search, whose start-up costs ~30 ms a call.
        dist = np.sqrt(self._d2[:len(ids), :len(ids)])
        np.fill_diagonal(dist, 0.0)
        labels = DBSCAN(eps=self.config.macro_eps, min_samples=self.config.macro_min_weight, metric="precomputed") \
            .fit(dist, sample_weight=weights).labels_
        groups: dict[int, list[int]] = {}
        for micro_id, label in zip(ids, labels, strict=True):
            if label != NOISE:
                groups.setdefault(int(label), []).append(micro_id)
        new = [frozenset(g) for _, g in sorted(groups.items())]
        row = {m: i for i, m in enumerate(ids)}
        weight_of = {m: float(weights[i]) for i, m in enumerate(ids)}
        new_centroids = []
        for g in new:
            rows = [row[m] for m in sorted(g)]
            new_centroids.append(sums[rows].sum(axis=0) / weights[rows].sum())
        old = list(self.clusters.values())
        old_members = [frozenset(self._resolve(m) for m in c.micro_ids) for c in old]
        pairs = self._match(new, new_centroids, old, old_members, weight_of)

        revision = self.revision + 1
        next_cluster = self._next_cluster
        changed: list[MacroCluster] = []
        clusters: dict[str, MacroCluster] = {}
        for k, members in enumerate(new):
            prev = old[pairs[k]] if k in pairs else None
            nearest = self._nearest(members, new_centroids[k], row)
            size = sum(self.micro[m].count for m in members)
            if prev is not None and prev.micro_ids == members and prev.size == size \
                    and prev.representative_episode_id == nearest.representative_episode_id \
                    and np.allclose(prev.centroid, new_centroids[k]):
                clusters[prev.id] = prev
                continue
            if prev is None:
                next_cluster += 1
            cid = prev.id if prev is not None else self._cluster_id(next_cluster)
            cluster = self._build(cid, members, new_centroids[k], nearest, size, revision)
            clusters[cid] = cluster
            changed.append(cluster)
        retired: list[tuple[MacroCluster, str]] = []
        matched_old = set(pairs.values())
        for o, (prev, members) in enumerate(zip(old, old_members, strict=True)):
            if o in matched_old:
                continue
            heirs = Counter()
            for cid, c in clusters.items():
                shared = members & c.micro_ids
                if shared:
                    heirs[cid] = sum(weight_of.get(m, 0.0) for m in shared)
            retired.append((prev, f"merged into {heirs.most_common(1)[0][0]}" if heirs else "dissolved into noise"))
        macro_of = {m: c.id for c in clusters.values() for m in c.micro_ids}
        moves: list[tuple[MicroCluster, str]] = []  # micro-clusters with members announced elsewhere
        for m in ids:
            micro = self.micro[m]
            target = macro_of.get(m, NOISE_ID)
            if list(micro.members) != [target]:
                moves.append((micro, target))
        if not (changed or retired or moves):
            return []

        # commit: from here on the state changes, and every change is in the events returned
        self.revision = revision
        self._next_cluster = next_cluster
        self.clusters = clusters
        self._macro_of = macro_of
        events = []
        for cluster in changed:
            cluster.dominant, cluster.summary = self.describer.describe(self.stats(cluster))
            cluster.event_time = self._latest_time
            events.append(self._updated_event(cluster, cluster.summary, "features"))
        for prev, where in retired:
            events.append(self._retired_event(prev, where))
        for micro, target in moves:
            cluster = clusters.get(target)
            regrouped: list[str] = []
            for label, episodes in micro.members.items():
                regrouped += episodes
                if label == target:
                    continue
                for e in episodes:
                    self._label[e] = target
                    events.append(self._assigned_event(e, None, None, self._x[self._row[e]], target, micro,
                                                       intake=False, cluster=cluster))
            micro.members = {target: regrouped}
        return events

    def _nearest(self, members: frozenset[int], centroid: np.ndarray, row: dict[int, int]) -> MicroCluster:
        return min((self.micro[m] for m in members),
                   key=lambda m: (float(norm(self._c[row[m.id]] - centroid)), -m.count, m.id))

    def _match(self, new, new_centroids, old, old_members, weight_of) -> dict[int, int]:
        """new index -> old index, by overlap then by centroid distance (Hungarian both times)."""
        pairs: dict[int, int] = {}
        if not new or not old:
            return pairs
        overlap = np.zeros((len(new), len(old)))
        for k, a in enumerate(new):
            for o, b in enumerate(old_members):
                inter = sum(weight_of.get(m, 0.0) for m in sorted(a & b))
                if inter > 0:
                    union = sum(weight_of.get(m, 0.0) for m in sorted(a | b))
                    overlap[k, o] = inter / union
        rows, cols = linear_sum_assignment(-overlap)
        for k, o in zip(rows, cols, strict=True):
            if overlap[k, o] >= self.config.match_min_overlap:
                pairs[int(k)] = int(o)
        rest_new = [k for k in range(len(new)) if k not in pairs]
        rest_old = [o for o in range(len(old)) if o not in pairs.values()]
        if rest_new and rest_old:
            dist = np.array([[float(norm(new_centroids[k] - old[o].centroid)) for o in rest_old]
                             for k in rest_new])
            rows, cols = linear_sum_assignment(dist)
            for r, c in zip(rows, cols, strict=True):
                if dist[r, c] <= self.config.match_max_distance:
                    pairs[rest_new[r]] = rest_old[c]
        return pairs

    def _cluster_id(self, sequence: int) -> str:
        return f"fc-{stable_id('failure-cluster', self.config.namespace, sequence)[:12]}"

    def _build(self, cid: str, members: frozenset[int], centroid: np.ndarray, nearest: MicroCluster, size: int,
               revision: int) -> MacroCluster:
        scenarios, models, types, roots, site_sum, site_n = Counter(), Counter(), Counter(), Counter(), \
            Counter(), Counter()
        for m in sorted(members):
            micro = self.micro[m]
            scenarios.update(micro.scenarios)
            models.update(micro.models)
            types.update(micro.types)
            roots.update(micro.roots)
            site_sum.update(micro.site_sum)
            site_n.update(micro.site_n)
        top = tuple(sorted(scenarios.items(), key=lambda kv: (-kv[1], kv[0]))[:self.config.top_scenarios])
        return MacroCluster(
            cid, members, centroid, size, nearest.representative_episode_id, nearest.representative_scenario_id,
            top, revision,
            failure_types={t: types[t] / size for t in FAILURE_TYPES if types[t]},
            root_types={t: roots[t] / size for t in FAILURE_TYPES if roots[t]},
            model_counts={k: models[k] for k in sorted(models)},
            site={k: site_sum[k] / site_n[k] for k in SITE_FEATURES if site_n[k]},
            representative_scenario=nearest.representative_scenario)

    def stats(self, cluster: MacroCluster) -> ClusterStats:
        return ClusterStats(cluster.id, cluster.size, cluster.centroid, cluster.representative_episode_id,
                            cluster.representative_scenario_id, cluster.top_scenarios)

    # -- queries ----------------------------------------------------------------------------

    def label_of(self, episode_id: str) -> str | None:
        """The cluster of the episode's latest assignment (None: noise, or not taken in)."""
        label = self._label.get(episode_id)
        return None if label in (None, NOISE_ID) else label

    def labels(self, episode_ids) -> list[str | None]:
        return [self.label_of(e) for e in episode_ids]

    def knows(self, episode_id: str) -> bool:
        """True once the episode was taken in."""
        return episode_id in self._member

    @property
    def pending(self) -> int:
        """Episodes taken in whose latest assignment is noise."""
        return sum(len(m.members.get(NOISE_ID, ())) for m in self.micro.values())

    def state(self) -> dict:
        """Everything the clusterer holds, as plain values (tests compare a restored clusterer with
        one that never stopped)."""
        def plain(obj):
            if isinstance(obj, np.ndarray):
                return obj.tolist()
            if isinstance(obj, (MicroCluster, MacroCluster)):
                return {f.name: plain(getattr(obj, f.name)) for f in fields(obj)}
            if isinstance(obj, dict):
                return {k: plain(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return [plain(v) for v in obj]
            if isinstance(obj, frozenset):
                return sorted(obj)
            return obj

        names = ("dims", "updates", "revision", "position", "micro", "clusters", "_next_micro", "_next_cluster",
                 "_last_scheduled", "_alias", "_member", "_macro_of", "_label", "_row", "_order")
        out = {name: plain(getattr(self, name)) for name in names}
        out["_c"] = self._c[:len(self._order)].tolist()
        out["_d2"] = self._d2[:len(self._order), :len(self._order)].tolist()
        out["_x"] = self._x[:len(self._row)].tolist()
        out["_facts"] = plain(self._facts)
        return out


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
