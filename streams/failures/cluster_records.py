"""The records an OnlineFailureClusterer keeps: one MicroCluster per dense spot (updated per
add) and one MacroCluster per announced cluster (rebuilt by a re-clustering). Plain dataclasses,
apart from streams.failures.clusterer so that its micro-cluster upkeep
(streams.failures.micro_clusters) and its output events (streams.failures.cluster_events) share
them without importing the clusterer.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from producers.fixed_order import dot


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
    representative_scenario: dict | None = None
    scenarios: Counter = field(default_factory=Counter)
    models: Counter = field(default_factory=Counter)
    types: Counter = field(default_factory=Counter)  # episodes with a moment of each type
    roots: Counter = field(default_factory=Counter)  # episodes by root-moment type
    site_sum: Counter = field(default_factory=Counter)  # SITE_FEATURES name -> sum over members
    site_n: Counter = field(default_factory=Counter)  # ... and how many members carried it
    members: dict[str, list[str]] = field(default_factory=dict)  # announced cluster id -> episodes

    @property
    def centre(self) -> np.ndarray:
        return self.ls / self.weight

    @property
    def radius(self) -> float:
        """RMS distance of the members from the centre."""
        c = self.centre
        return math.sqrt(max(0.0, self.ss / self.weight - float(dot(c, c))))


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
    failure_types: dict[str, float] = field(default_factory=dict)
    root_types: dict[str, float] = field(default_factory=dict)
    model_counts: dict[str, int] = field(default_factory=dict)
    site: dict[str, float] = field(default_factory=dict)
    representative_scenario: dict | None = None
    event_time: datetime | None = None  # of its last ClusterUpdated
