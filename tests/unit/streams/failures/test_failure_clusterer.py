"""Online failure clustering: agreement with batch DBSCAN, ids stable across re-clustering,
positioned output whose latest assignment per episode is its cluster, re-clusterings that change
nothing leave no trace, schema-valid events carrying what a mutator needs, failure-profile
embeddings, the optional language-model summary hook."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from analysed_episodes import analysed_episodes, is_failure, kind_of

from schemas.codec import Codec
from streams.exceptions import ClustererError, ConfigError, SummaryError
from streams.failures.clusterer import (
    NOISE_ID,
    ClustererConfig,
    OnlineFailureClusterer,
    adjusted_rand,
    batch_dbscan,
)
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, decode, embed, facts, feature_names
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


def latest_assignments(events) -> dict[str, str]:
    """episode -> cluster of its latest ClusterAssigned by position, as a reader of the log derives it."""
    latest = {}
    for e in sorted(of_type(events, "ClusterAssigned"), key=lambda e: e["position"]):
        latest[e["episode_id"]] = e["cluster_id"]
    return latest


def test_online_labels_agree_with_batch_dbscan_on_separated_blobs():
    xs, _, _ = blobs(seed=1, n_per=150, k=4)
    clusterer = OnlineFailureClusterer(CFG)
    for i, x in enumerate(xs):
        clusterer.add(f"e{i}", "scn", x)
    clusterer.recluster()
    online = clusterer.labels([f"e{i}" for i in range(len(xs))])
    batch = batch_dbscan(xs, eps=CFG.macro_eps, min_samples=5)
    ari = adjusted_rand(online, batch)
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
    moved = [e for e in of_type(events, "ClusterAssigned") if not e["intake"] and not e["episode_id"].startswith("br")]
    # the small cluster's 40 episodes are re-assigned to the big one, each once, after the retirement
    assert sorted(e["episode_id"] for e in moved) == sorted(f"e{i}" for i in range(60, 100))
    assert all(e["cluster_id"] == big and e["position"] > retired["position"] and e["embedding"] == []
               for e in moved)


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
    assert {latest_assignments(events).get(f"e{i}") for i in range(40)} == {NOISE_ID}  # announced as noise


def test_every_intake_is_announced_at_once_and_the_latest_assignment_is_the_label():
    xs, _, _ = blobs(seed=10, n_per=60, k=3)
    clusterer = OnlineFailureClusterer(CFG, run_id="run-1")
    events = []
    for i, x in enumerate(xs):
        out = clusterer.add(f"e{i}", "scn", x)
        assert out[0]["envelope"]["event_type"] == "ClusterAssigned" and out[0]["intake"]
        assert out[0]["episode_id"] == f"e{i}" and out[0]["embedding"] == x.tolist()
        assert latest_assignments(out)[f"e{i}"] == (clusterer.label_of(f"e{i}") or NOISE_ID)  # its re-clustering too
        events += out
    events += clusterer.recluster()
    positions = [e["position"] for e in events]
    assert positions == list(range(len(events)))
    assert len({e["envelope"]["event_id"] for e in events}) == len(events)
    assert [e["revision"] for e in events] == sorted(e["revision"] for e in events)
    assert events[-1]["revision"] == clusterer.revision
    intakes = [e for e in of_type(events, "ClusterAssigned") if e["intake"]]
    assert [e["episode_id"] for e in intakes] == [f"e{i}" for i in range(len(xs))]
    latest = latest_assignments(events)
    assert all(latest[f"e{i}"] == (clusterer.label_of(f"e{i}") or NOISE_ID) for i in range(len(xs)))
    assert set(latest.values()) == set(clusterer.clusters)  # everything clustered after the last re-clustering
    # the early episodes were noise at intake and announced again when their cluster formed
    assert intakes[0]["cluster_id"] == NOISE_ID and latest["e0"] != NOISE_ID
    sizes = {cid: sum(1 for c in latest.values() if c == cid) for cid in clusterer.clusters}
    assert sizes == {cid: c.size for cid, c in clusterer.clusters.items()}


def test_the_schedule_reclusters_young_clusterers_often_and_then_every_recluster_every():
    clusterer = OnlineFailureClusterer(ClustererConfig(recluster_every=20, recluster_fraction=0.1))
    gaps = []
    for n in (1, 9, 10, 19, 20, 150, 199, 200, 1000):
        clusterer.updates = n
        gaps.append(clusterer.recluster_gap())
    assert gaps == [1, 1, 1, 1, 2, 15, 19, 20, 20]


@pytest.mark.parametrize("half_life", [None, 30.0])
def test_a_reclustering_that_changes_nothing_leaves_no_trace(half_life):
    xs, _, _ = blobs(seed=11, n_per=50, k=2)
    clusterer = OnlineFailureClusterer(ClustererConfig(micro_radius=0.5, macro_eps=1.2, half_life_updates=half_life))
    feed(clusterer, xs)
    clusterer.recluster()
    before = clusterer.state()
    assert clusterer.recluster() == [] and clusterer.recluster() == []
    assert clusterer.state() == before  # no revision bump, no fading applied, no id drawn


def test_events_are_schema_valid_once_per_episode_and_replay_identically():
    xs, _, _ = blobs(seed=6, n_per=40, k=2)
    runs = []
    for _ in range(2):
        clusterer = OnlineFailureClusterer(CFG, run_id="run-1")
        events = feed(clusterer, xs) + clusterer.recluster()
        assert feed(clusterer, xs[:10]) == []  # re-delivered episodes count once
        runs.append(events)
    first, second = runs
    codec = Codec()
    assert [codec.encode(e)[5:] for e in first] != []
    assert [e["envelope"]["event_id"] for e in first] == [e["envelope"]["event_id"] for e in second]
    assert [{**e, "envelope": {**e["envelope"], "event_time": None}} for e in first] == \
        [{**e, "envelope": {**e["envelope"], "event_time": None}} for e in second]
    intakes = [e for e in of_type(first, "ClusterAssigned") if e["intake"]]
    assert sorted(e["episode_id"] for e in intakes) == sorted(f"e{i}" for i in range(len(xs)))
    for e in first:
        assert codec.decode(codec.encode(e))["envelope"]["event_id"] == e["envelope"]["event_id"]
    for e in intakes:
        assert len(e["embedding"]) == DIMS and e["distance"] >= 0.0


def test_cluster_updates_carry_what_a_mutator_needs():
    ecfg = EmbeddingConfig()
    codec = Codec()
    analysed = [codec.decode(codec.encode(e)) for e in analysed_episodes(240, seed=12) if is_failure(e)]
    clusterer = OnlineFailureClusterer(ClustererConfig(), FeatureDescriber(ecfg))
    events = []
    for e in analysed:
        episode = FailedEpisode.from_analysed(e)
        events += clusterer.add(e["episode_id"], e["scenario_id"], embed(episode, ecfg), facts(episode),
                                event_time=e["envelope"]["event_time"])
    events += clusterer.recluster()  # sizes as of now: intakes since the last one joined known clusters
    assert adjusted_rand(clusterer.labels([e["episode_id"] for e in analysed]), [kind_of(e) for e in analysed]) == 1.0
    latest = {}
    for e in of_type(events, "ClusterUpdated"):
        latest[e["cluster_id"]] = e
    by_id = {e["episode_id"]: e for e in analysed}
    for cid, update in latest.items():
        members = [by_id[eid] for eid, c in latest_assignments(events).items() if c == cid]
        assert update["size"] == len(members) == clusterer.clusters[cid].size
        (kind,) = {kind_of(m) for m in members}
        first_type = {"slippery": "slip", "miss": "grasp_miss", "cluttered": "collision", "reach": "out_of_reach"}[kind]
        assert update["root_types"] == {first_type: 1.0} and update["dominant_failure_type"] == first_type
        assert update["failure_types"] == {t: 1.0 for t in update["failure_types"]}
        assert "timeout" in update["failure_types"]
        assert update["model_counts"] == {m: sum(1 for e in members if e["model_id"] == m)
                                          for m in sorted({e["model_id"] for e in members})}
        assert sum(update["scenario_counts"].values()) == len(members)
        roots = [min(m["moments"], key=lambda x: x["step"]) for m in members]
        for name in ("eef_x", "object_y", "object_dx"):
            assert update["site"][name] == pytest.approx(np.mean([r["features"][name] for r in roots]))
        force = {"slip": "grip_force_n", "grasp_miss": "peak_grip_force_n", "collision": "force_n"}.get(first_type)
        assert ("force_n" in update["site"]) == (force is not None)
        rep = by_id[update["representative_episode_id"]]
        assert update["representative_scenario"] == rep["scenario"]
        assert update["representative_scenario_id"] == rep["scenario_id"]
        assert update["envelope"]["event_time"] <= max(m["envelope"]["event_time"] for m in analysed)
        assert codec.decode(codec.encode(update))["site"] == update["site"]


def test_bad_input_and_config_are_refused():
    clusterer = OnlineFailureClusterer(CFG)
    clusterer.add("e0", "s", np.zeros(DIMS))
    with pytest.raises(ClustererError, match="e1"):
        clusterer.add("e1", "s", np.zeros(DIMS + 1))
    with pytest.raises(ClustererError):
        clusterer.add("e2", "s", np.full(DIMS, np.nan))
    with pytest.raises(ConfigError, match="macro_eps"):
        ClustererConfig(macro_eps=0)
    with pytest.raises(ConfigError, match="recluster_fraction"):
        ClustererConfig(recluster_fraction=-0.1)
    assert clusterer.add("e0", "s", np.ones(DIMS)) == []  # known: nothing, even with another embedding
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


def test_an_analysed_episode_embeds_like_its_moments_did_and_unknown_types_are_named():
    codec = Codec()
    (event,) = [codec.decode(codec.encode(e)) for e in analysed_episodes(10, seed=13) if is_failure(e)][:1]
    ecfg = EmbeddingConfig()
    by_hand = FailedEpisode(event["episode_id"], event["scenario_id"], event["model_id"], event["steps"],
                            event["termination"], list(reversed(event["moments"])), event["quality"], event["scenario"])
    by_hand.moments.sort(key=lambda m: m["step"])
    assert np.array_equal(embed(FailedEpisode.from_analysed(event), ecfg), embed(by_hand, ecfg))
    f = facts(FailedEpisode.from_analysed(event))
    root = min(event["moments"], key=lambda m: m["step"])
    assert f.root_type == root["failure_type"] and dict(f.site)["eef_x"] == root["features"]["eef_x"]
    assert f.model_id == event["model_id"] and "timeout" in f.failure_types and f.scenario == event["scenario"]
    event["moments"][0]["failure_type"] = "teleported"
    with pytest.raises(ValueError, match="unknown failure type 'teleported'"):
        embed(FailedEpisode.from_analysed(event), ecfg)


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
    position = clusterer.position
    event = clusterer.summary_event(cluster.id, cluster.revision, text)
    assert event["summary_source"] == "llm" and event["position"] == position == clusterer.position - 1
    assert event["revision"] == cluster.revision and event["size"] == cluster.size
    assert Codec().decode(Codec().encode(event))["summary"] == text
    assert clusterer.summary_event(cluster.id, cluster.revision - 1, text) is None  # not that revision any more
    with pytest.raises(SummaryError, match="TimeoutError"):
        LlmSummarizer(FakeChat(TimeoutError("slow")), model="m-1").summarize(stats, cluster.summary)
    with pytest.raises(SummaryError, match="empty"):
        LlmSummarizer(FakeChat(""), model="m-1").summarize(stats, cluster.summary)
