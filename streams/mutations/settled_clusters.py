"""The clusters a failure-guided cycle chooses from: the clusterer re-run over the failures the
cycle sees, in episode-id order.

    settled = SettledClustering(ClustererConfig(), EmbeddingConfig())
    clusters = settled.clusters(analysed)        # EpisodeAnalysed records -> latest ClusterUpdated per cluster
    cands = guided_candidates(clusters.events, ...)
    cand = clusters.to_live(cand, live_labels)   # source_cluster_id: the live cluster most of its episodes are in

Why not the live clusters: the online clusterer is a function of arrival order (a micro-cluster's
first member is its representative; which points join which micro-cluster depends on who came
first), and two rollout processes deliver a sweep's failures in a different order each run. Seeded
from the live clusters, two runs of one seed drew different candidates from their second cycle on
(#17). Re-run over the same set of failures sorted by episode id (episode ids are a function of
request and seed), the clusters, their ids (this namespace's, ``<namespace>/settled``), their
representatives and so the candidates are a function of the failures alone. The live clusters
stay what Grafana and the report show; a candidate names the live cluster that holds most of its
cluster's episodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from streams.failures.clusterer import NOISE_ID, ClustererConfig, OnlineFailureClusterer
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, embed, facts
from streams.failures.summaries import FeatureDescriber
from streams.mutations.operators import Candidate


@dataclass(frozen=True)
class SettledClusters:
    events: list[dict]  # the latest ClusterUpdated of every cluster with members, by cluster id
    members: dict[str, list[str]]  # cluster id -> its episodes, sorted

    def live_cluster(self, cluster_id: str, live_labels: Mapping[str, str]) -> str:
        """The live cluster holding most of this cluster's episodes (ties: the smaller id), else
        this cluster's own id (its episodes are noise in the live clusters)."""
        votes = Counter(live_labels[e] for e in self.members.get(cluster_id, ())
                        if live_labels.get(e, NOISE_ID) != NOISE_ID)
        if not votes:
            return cluster_id
        return min(votes, key=lambda c: (-votes[c], c))

    def to_live(self, candidate: Candidate, live_labels: Mapping[str, str]) -> Candidate:
        if candidate.source_cluster_id is None:
            return candidate
        return replace(candidate, source_cluster_id=self.live_cluster(candidate.source_cluster_id, live_labels))


@dataclass(frozen=True)
class SettledClustering:
    clusterer: ClustererConfig
    embedding: EmbeddingConfig

    def clusters(self, analysed: Iterable[dict]) -> SettledClusters:
        """Clusters of the given EpisodeAnalysed records (each with episode_id, model_id,
        scenario_id, scenario, steps, termination, quality, moments), taken in by episode id, then
        re-clustered once more so the last of them count."""
        config = replace(self.clusterer, namespace=f"{self.clusterer.namespace}/settled")
        clusterer = OnlineFailureClusterer(config, FeatureDescriber(self.embedding), producer="mutator")
        latest: dict[str, dict] = {}

        def keep(events: list[dict]) -> None:
            for e in events:
                if e["envelope"]["event_type"] == "ClusterUpdated":
                    latest[e["cluster_id"]] = e

        episodes = sorted(analysed, key=lambda e: e["episode_id"])
        for event in episodes:
            episode = FailedEpisode.from_analysed(event)
            keep(clusterer.add(episode.episode_id, episode.scenario_id, embed(episode, self.embedding),
                               facts(episode)))
        keep(clusterer.recluster())
        members: dict[str, list[str]] = {}
        for event in episodes:
            label = clusterer.label_of(event["episode_id"])
            if label is not None:
                members.setdefault(label, []).append(event["episode_id"])
        return SettledClusters([latest[c] for c in sorted(latest) if latest[c]["size"] > 0], members)
