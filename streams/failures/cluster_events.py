"""The output events of OnlineFailureClusterer (streams.failures.clusterer) on
failures.clusters: ClusterAssigned and ClusterUpdated, each at the next ``position`` (event id =
(namespace, position)) with the clusterer's ``revision``. A mixin over the clusterer's state
(``config``, ``producer``, ``run_id``, ``position``, ``revision``, ``clusters``, ``_facts``,
``_latest_time``), kept apart so the event layout sits in one place, away from the clustering.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np

from producers.fixed_order import norm
from schemas.events import make_event
from streams.failures.cluster_records import MacroCluster, MicroCluster

CLUSTERER_VERSION = "failure-clusterer/2.0"
EMPTY_SCENARIO = {"scenario_id": "", "env_name": "", "horizon": 0, "instruction": ""}  # ScenarioSpec default


class ClusterEvents:
    """Event building for OnlineFailureClusterer; not usable on its own."""

    def _event(self, event_type: str, revision: int, event_time: datetime | None, **fields) -> dict:
        position = self.position
        self.position += 1
        return make_event(event_type, (self.config.namespace, position), self.producer, self.run_id,
                          event_time=event_time, position=position, revision=revision,
                          clusterer_version=CLUSTERER_VERSION, **fields)

    def _assigned_event(self, episode_id: str, scenario_id: str | None, model_id: str | None, x: np.ndarray,
                        label: str, micro: MicroCluster, intake: bool, cluster: MacroCluster | None = None) -> dict:
        cluster = cluster or self.clusters.get(label)
        centre = cluster.centroid if cluster is not None else micro.centre
        if scenario_id is None:  # a re-assignment: what the intake said
            scenario_id, model_id = self._facts[episode_id]
        return self._event("ClusterAssigned", self.revision, self._latest_time,
                           cluster_id=label, episode_id=episode_id, scenario_id=scenario_id,
                           distance=float(norm(x - centre)), embedding=x.tolist() if intake else [],
                           model_id=model_id, intake=intake)

    def _updated_event(self, cluster: MacroCluster, summary: str, source: str) -> dict:
        return self._event("ClusterUpdated", cluster.revision, cluster.event_time, **self._cluster_fields(cluster),
                           size=cluster.size, summary=summary, summary_source=source)

    def _cluster_fields(self, cluster: MacroCluster) -> dict:
        return dict(cluster_id=cluster.id, centroid=cluster.centroid.tolist(),
                    representative_episode_id=cluster.representative_episode_id,
                    representative_scenario_id=cluster.representative_scenario_id,
                    dominant_failure_type=cluster.dominant, failure_types=cluster.failure_types,
                    root_types=cluster.root_types, model_counts=cluster.model_counts,
                    scenario_counts=dict(cluster.top_scenarios), site=cluster.site,
                    representative_scenario=cluster.representative_scenario or EMPTY_SCENARIO)

    def _retired_event(self, cluster: MacroCluster, where: str) -> dict:
        return self._event("ClusterUpdated", self.revision, self._latest_time, **self._cluster_fields(cluster),
                           size=0, summary=f"retired at revision {self.revision}: {where}", summary_source="features")

    def summary_event(self, cluster_id: str, revision: int, summary: str) -> dict | None:
        """The ClusterUpdated (summary_source "llm") carrying ``summary`` for the cluster at
        ``revision``, at the next position; None when the cluster has changed since."""
        cluster = self.clusters.get(cluster_id)
        if cluster is None or cluster.revision != revision:
            return None
        return self._updated_event(cluster, summary, "llm")

    def skip_position(self) -> None:
        """A restore met a recorded event it does not re-derive (a language-model summary)."""
        self.position += 1
