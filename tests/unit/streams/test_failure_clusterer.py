"""Online failure clustering: agreement with batch DBSCAN, ids stable across re-clustering,
schema-valid events, failure-profile embeddings, the optional language-model summary hook."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from schemas.codec import Codec
from streams.exceptions import ClustererError, ConfigError, SummaryError
from streams.failures.clusterer import (
    ClustererConfig,
    OnlineFailureClusterer,
    adjusted_rand,
    batch_dbscan,
)
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, decode, embed, feature_names
from streams.failures.summaries import FeatureDescriber, LlmSummarizer

DIMS = len(feature_names())
CFG = ClustererConfig(micro_radius=0.5, macro_eps=1.2, macro_min_weight=3, recluster_every=50)


def blobs(seed: int, n_per: int, k: int, spread: float = 0.08, sep: float = 4.0):
    """k well-separated Gaussian blobs in DIMS dimensions, shuffled; returns (xs, true labels)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, DIMS))
    centres *= sep / np.linalg.norm(centres, axis=1, keepdims=True)
    xs = np.vstack([c + rng.normal(0, spread, size=(n_per, DIMS)) for c in centres])
    y = np.repeat(np.arange(k), n_per)
    order = rng.permutation(len(xs))
    return xs[order], y[order], centres


def feed(clusterer, xs, prefix="e", start=0):
    events = []
    for i, x in enumerate(xs, start):
        events += clusterer.add(f"{prefix}{i}", f"scn-{prefix}", x)
    return events


def of_type(events, event_type):
    return [e for e in events if e["envelope"]["event_type"] == event_type]


def test_online_labels_agree_with_batch_dbscan_on_separated_blobs(record_property):
    xs, _, _ = blobs(seed=1, n_per=150, k=4)
    clusterer = OnlineFailureClusterer(CFG)
    times = []
    for i, x in enumerate(xs):
        t0 = time.perf_counter()
        clusterer.add(f"e{i}", "scn", x)
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    clusterer.recluster()
    recluster_ms = (time.perf_counter() - t0) * 1e3
    online = clusterer.labels([f"e{i}" for i in range(len(xs))])
    batch = batch_dbscan(xs, eps=CFG.macro_eps, min_samples=5)
    ari = adjusted_rand(online, batch)
    median_us, p99_us = np.median(times) * 1e6, np.percentile(times, 99) * 1e6
    record_property("clusterer_add_median_us", median_us)
    record_property("clusterer_recluster_ms", recluster_ms)
    print(f"clusterer: {len(xs)} adds, median {median_us:.0f} us, p99 {p99_us:.0f} us (incl. periodic "
          f"re-clustering), one re-clustering of {len(clusterer.micro)} micro-clusters {recluster_ms:.1f} ms; "
          f"ARI vs batch {ari:.3f}")
    assert len(set(batch)) == 4 and -1 not in set(batch)
    assert len(clusterer.clusters) == 4
    assert ari >= 0.9


def test_a_micro_cluster_cap_still_recovers_the_blobs():
    xs, y, _ = blobs(seed=2, n_per=100, k=3)
    clusterer = OnlineFailureClusterer(ClustererConfig(micro_radius=0.3, max_micro_clusters=12, macro_eps=1.2,
                                                       recluster_every=50))
    feed(clusterer, xs)
    clusterer.recluster()
    assert len(clusterer.micro) <= 12
    assert adjusted_rand(clusterer.labels([f"e{i}" for i in range(len(xs))]), y) >= 0.9


def test_cluster_ids_stay_stable_across_reclusterings_and_a_new_blob_gets_a_new_id():
    xs, y, centres = blobs(seed=3, n_per=200, k=3)
    ab = xs[y < 2]
    clusterer = OnlineFailureClusterer(CFG)
    feed(clusterer, ab[:150])
    clusterer.recluster()
    ids = {}
    for i, label in enumerate(y[y < 2][:150]):
        ids.setdefault(int(label), set()).add(clusterer.label_of(f"e{i}"))
    assert all(len(v) == 1 for v in ids.values()) and ids[0] != ids[1]
    id_a, id_b = ids[0].pop(), ids[1].pop()
    # more of A and B, then a third blob, with several re-clusterings in between
    rest = np.vstack([ab[150:], xs[y == 2]])
    events = feed(clusterer, rest, start=150)
    events += clusterer.recluster()
    assert clusterer.revision >= 5
    assert set(clusterer.clusters) >= {id_a, id_b} and len(clusterer.clusters) == 3
    (id_c,) = set(clusterer.clusters) - {id_a, id_b}
    labels = clusterer.labels([f"e{i}" for i in range(len(ab) + (y == 2).sum())])
    truth = list(y[y < 2]) + [2] * int((y == 2).sum())
    assert all(lbl == {0: id_a, 1: id_b, 2: id_c}[t] for lbl, t in zip(labels, truth, strict=True))
    retired = [e for e in of_type(events, "ClusterUpdated") if e["size"] == 0]
    assert retired == []


def test_two_clusters_bridged_by_new_failures_merge_under_one_surviving_id():
    rng = np.random.default_rng(4)
    a, b = np.zeros(DIMS), np.zeros(DIMS)
    b[0] = 3.0
    clusterer = OnlineFailureClusterer(CFG)
    feed(clusterer, np.vstack([a + rng.normal(0, 0.05, (60, DIMS)), b + rng.normal(0, 0.05, (40, DIMS))]))
    clusterer.recluster()
    assert len(clusterer.clusters) == 2
    big = clusterer.label_of("e0")
    small = clusterer.label_of("e60")
    bridge = np.array([a + (b - a) * f for f in np.linspace(0.1, 0.9, 9) for _ in range(5)])
    events = feed(clusterer, bridge, prefix="br") + clusterer.recluster()
    assert list(clusterer.clusters) == [big]
    assert clusterer.label_of("e60") == big
    (retired,) = [e for e in of_type(events, "ClusterUpdated") if e["size"] == 0]
    assert retired["cluster_id"] == small and retired["summary"].endswith(f"merged into {big}")


def test_faded_clusters_dissolve_and_are_retired():
    rng = np.random.default_rng(5)
    old, new = np.zeros(DIMS), np.full(DIMS, 0.8)
    clusterer = OnlineFailureClusterer(ClustererConfig(micro_radius=0.6, macro_eps=1.2, recluster_every=20,
                                                       half_life_updates=30))
    feed(clusterer, old + rng.normal(0, 0.05, (40, DIMS)))
    clusterer.recluster()
    old_id = clusterer.label_of("e0")
    events = feed(clusterer, new + rng.normal(0, 0.05, (300, DIMS)), prefix="n")
    assert old_id not in clusterer.clusters
    assert clusterer.label_of("e0") is None
    assert any(e["cluster_id"] == old_id and e["size"] == 0 and "dissolved" in e["summary"]
               for e in of_type(events, "ClusterUpdated"))


def test_events_are_schema_valid_once_per_episode_and_replay_identically():
    xs, _, _ = blobs(seed=6, n_per=40, k=2)
    runs = []
    for _ in range(2):
        clusterer = OnlineFailureClusterer(CFG, run_id="run-1")
        events = feed(clusterer, xs) + clusterer.recluster()
        events += feed(clusterer, xs[:10])  # re-delivered episodes count once
        runs.append(events)
    first, second = runs
    assert [e["envelope"]["event_id"] for e in first] == [e["envelope"]["event_id"] for e in second]
    assigned = of_type(first, "ClusterAssigned")
    assert sorted(e["episode_id"] for e in assigned) == sorted(f"e{i}" for i in range(len(xs)))
    codec = Codec()
    for e in first:
        assert codec.decode(codec.encode(e))["envelope"]["event_id"] == e["envelope"]["event_id"]
    for e in assigned:
        assert len(e["embedding"]) == DIMS and e["distance"] >= 0.0


def test_bad_input_and_config_are_refused():
    clusterer = OnlineFailureClusterer(CFG)
    clusterer.add("e0", "s", np.zeros(DIMS))
    with pytest.raises(ClustererError, match="e1"):
        clusterer.add("e1", "s", np.zeros(DIMS + 1))
    with pytest.raises(ClustererError):
        clusterer.add("e2", "s", np.full(DIMS, np.nan))
    with pytest.raises(ConfigError, match="macro_eps"):
        ClustererConfig(macro_eps=0)
    with pytest.raises(ClustererError):
        adjusted_rand([None, "a"], [0])


# -- embeddings of failure profiles ------------------------------------------------------------

def moment(failure_type: str, step: int, severity: float, **features) -> dict:
    return {"failure_type": failure_type, "step": step, "severity": severity,
            "features": {"goal_distance_m": 0.04, "object_lift_m": 0.0, **features}}


def profile_episode(kind: str, i: int, rng) -> FailedEpisode:
    steps = 200
    jitter = int(rng.integers(-8, 9))
    if kind == "slippery":
        moments = [moment("slip", 60 + jitter, 0.6, object_lift_m=0.08), moment("drop", 63 + jitter, 0.4),
                   moment("timeout", 199, 1.0)]
        scenario = {"object_friction": 0.1, "object_mass": 0.5, "object_size_scale": 1.0, "distractors": [],
                    "pose_offset_xyz": [0.0, 0.0, 0.0]}
        peak = 40.0
    elif kind == "miss":
        moments = [moment("grasp_miss", 45 + jitter, 1.0), moment("stall", 110 + jitter, 1.0),
                   moment("timeout", 199, 1.0)]
        scenario = {"object_friction": None, "object_mass": None, "object_size_scale": 1.0, "distractors": [],
                    "pose_offset_xyz": [0.05, 0.0, 0.0]}
        peak = 5.0
    else:  # cluttered
        moments = [moment("collision", 30 + jitter, 0.5), moment("knocked_object", 32 + jitter, 0.4,
                                                                 displacement_m=0.08),
                   moment("timeout", 199, 1.0)]
        scenario = {"object_friction": None, "object_mass": None, "object_size_scale": 1.0,
                    "distractors": [{}, {}, {}], "pose_offset_xyz": [0.0, 0.0, 0.0]}
        peak = 80.0
    quality = {"peak_contact_force": peak * (1 + 0.1 * rng.normal()), "mean_contact_force": peak / 4}
    return FailedEpisode(f"{kind}-{i}", f"scn-{kind}", "model", steps, "timeout", moments, quality, scenario)


def test_failure_profiles_cluster_apart_with_readable_summaries():
    rng = np.random.default_rng(7)
    kinds = ["slippery", "miss", "cluttered"]
    episodes = [profile_episode(kinds[i % 3], i, rng) for i in range(90)]
    ecfg = EmbeddingConfig()
    clusterer = OnlineFailureClusterer(ClustererConfig(recluster_every=30), FeatureDescriber(ecfg))
    events = []
    for ep in episodes:
        events += clusterer.add(ep.episode_id, ep.scenario_id, embed(ep, ecfg))
    truth = [ep.episode_id.split("-")[0] for ep in episodes]
    assert adjusted_rand(clusterer.labels([ep.episode_id for ep in episodes]), truth) >= 0.9
    latest = {e["cluster_id"]: e for e in of_type(events, "ClusterUpdated")}
    dominant = {e["dominant_failure_type"] for e in latest.values() if e["size"] > 0}
    assert dominant == {"slip", "grasp_miss", "collision"}  # not "timeout": it is in every one, but last
    for e in latest.values():
        assert e["summary_source"] == "features"
        assert e["dominant_failure_type"] in e["summary"]
    slippery = next(e for e in latest.values() if e["dominant_failure_type"] == "slip")
    assert "low-friction" in slippery["summary"] and "drop" in slippery["summary"]


def test_embedding_layout_and_decoding():
    rng = np.random.default_rng(8)
    ep = profile_episode("slippery", 0, rng)
    ecfg = EmbeddingConfig()
    x = embed(ep, ecfg)
    assert x.shape == (DIMS,) and np.all(np.isfinite(x))
    f = decode(x, ecfg)
    assert f["type:slip"] == 1.0 and f["type:grasp_miss"] == 0.0
    assert f["when:slip"] == pytest.approx((ep.moments[0]["step"] + 1) / 200)
    assert f["when:timeout"] == 1.0
    assert f["scn_low_friction"] == pytest.approx(0.5)  # friction 0.1 -> log10(10) / 2
    assert f["lift_max"] == pytest.approx(0.08 / ecfg.lift_scale_m)


# -- the optional language-model hook ------------------------------------------------------------

class FakeChat:
    def __init__(self, reply: str | Exception):
        self.reply = reply
        self.calls = []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    def create(self, **kwargs):
        self.calls.append(kwargs)
        if isinstance(self.reply, Exception):
            raise self.reply
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])


def test_llm_summarizer_uses_the_given_client_and_reports_failures():
    rng = np.random.default_rng(9)
    ecfg = EmbeddingConfig()
    clusterer = OnlineFailureClusterer(ClustererConfig(recluster_every=10), FeatureDescriber(ecfg))
    for i in range(10):
        ep = profile_episode("miss", i, rng)
        clusterer.add(ep.episode_id, ep.scenario_id, embed(ep, ecfg))
    (cluster,) = clusterer.clusters.values()
    stats = clusterer.stats(cluster)
    fake = FakeChat("  Grasps close beside the object, then the arm waits.  ")
    text = LlmSummarizer(fake, model="m-1").summarize(stats, cluster.summary)
    assert text == "Grasps close beside the object, then the arm waits."
    assert fake.calls[0]["model"] == "m-1" and cluster.summary in fake.calls[0]["messages"][1]["content"]
    event = clusterer.updated_event(cluster, text, "llm")
    assert event["summary_source"] == "llm"
    assert Codec().decode(Codec().encode(event))["summary"] == text
    with pytest.raises(SummaryError, match="TimeoutError"):
        LlmSummarizer(FakeChat(TimeoutError("slow")), model="m-1").summarize(stats, cluster.summary)
    with pytest.raises(SummaryError, match="empty"):
        LlmSummarizer(FakeChat(""), model="m-1").summarize(stats, cluster.summary)
