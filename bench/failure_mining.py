"""Failure mining quality on the labelled failure set: how right the detector and clusterer are.

Prints, from one labelled set (producers/sim/failure_set.py; generated first if absent):
  1. per failure type: precision, recall, F1 at the episode level, and the macro F1 over the types
     the set covers. A detection of the expected type is a true positive; a type that is neither
     expected nor one of the case's consequences at or after its cause step is a false positive;
  2. moment timing: the first moment of the expected type against the labelled cause step, the
     share within +-5 steps, and the median / max error;
  3. successful episodes flagged: share of successful baseline episodes with any failure moment;
  4. clustering: every failed episode's embedding goes through the online clusterer in a shuffled
     (seeded) arrival order; the adjusted Rand index of its final clusters against batch DBSCAN on
     the same embeddings, and the per-update latency (p50 / p99).

The events go through the detector agent's own core (DetectorStage: decode, route, detect, encode)
as Confluent-framed Avro messages, interleaved across episodes the way a topic partition delivers
them; nothing is read from the labels but the labels.

Usage:
    python bench/failure_mining.py [--set eval_memory/failure_set] [--seeds 10] [--regenerate]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from producers.sim import failure_set  # noqa: E402
from schemas.codec import Codec  # noqa: E402
from streams.deadletter import RawMessage  # noqa: E402
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer, adjusted_rand, batch_dbscan  # noqa: E402
from streams.failures.detector import FAILURE_TYPES, DetectorConfig  # noqa: E402
from streams.failures.embedding import EmbeddingConfig, FailedEpisode, embed  # noqa: E402
from streams.failures.router import DetectorStage, RouterConfig  # noqa: E402

TIMING_TOLERANCE_STEPS = 5
PREFIX = "bench."
BATCH = 500  # messages per DetectorStage.process call, like one take_events batch


def detect(events: dict[str, list[dict]], shuffle_seed: int = 0) -> dict[str, list[dict]]:
    """FailureMoments per episode id, from the events run through DetectorStage. Steps of
    different episodes interleave (seeded), each episode's own order is kept, as on a partition."""
    codec = Codec()
    by_episode: dict[str, list[dict]] = defaultdict(list)
    for event_type in ("EpisodeStarted", "Step", "EpisodeEnded"):
        for e in events[event_type]:
            by_episode[e["episode_id"]].append(e)
    queues = [sorted(evs, key=lambda e: (e["envelope"]["event_type"] != "EpisodeStarted",
                                         e["envelope"]["event_type"] == "EpisodeEnded", e.get("t", 0)))
              for evs in by_episode.values()]
    rng = np.random.default_rng(shuffle_seed)
    stream: list[RawMessage] = []
    heads = [0] * len(queues)
    live = [i for i, q in enumerate(queues) if q]
    while live:
        i = live[int(rng.integers(len(live)))]
        e = queues[i][heads[i]]
        heads[i] += 1
        if heads[i] == len(queues[i]):
            live.remove(i)
        topic = "rollout.steps" if e["envelope"]["event_type"] == "Step" else "rollout.episodes"
        stream.append(RawMessage(PREFIX + topic, 0, len(stream), e["episode_id"].encode(), codec.encode(e)))
    stage = DetectorStage(DetectorConfig(), RouterConfig(end_grace_s=0.0), PREFIX, "bench", codec=codec)
    out = []
    for k in range(0, len(stream), BATCH):
        out += stage.process(stream[k:k + BATCH])
    out += stage.tick()
    moments: dict[str, list[dict]] = defaultdict(list)
    for m in out:
        event = codec.decode(m.value)
        if m.topic != "failures.moments":
            raise RuntimeError(f"the detector dead-lettered a labelled event: {event}")
        moments[event["episode_id"]].append(event)
    return moments


def score(labels: list[failure_set.LabelledEpisode], moments: dict[str, list[dict]]) -> dict:
    tp, fp, fn = Counter(), Counter(), Counter()
    errors: list[int] = []
    errors_by_type: dict[str, list[int]] = defaultdict(list)
    fp_cases: dict[str, Counter] = defaultdict(Counter)
    flagged = successes = 0
    for lab in labels:
        mine = sorted(moments.get(lab.episode_id, []), key=lambda m: m["step"])
        if lab.expected is None:
            if not lab.success:
                continue  # a baseline that failed has no known cause: not scored
            successes += 1
            flagged += bool(mine)
        first: dict[str, int] = {}
        for m in mine:
            first.setdefault(m["failure_type"], m["step"])
        if lab.expected is not None:
            if lab.expected in first:
                tp[lab.expected] += 1
                if lab.cause_step is not None:
                    errors.append(first[lab.expected] - lab.cause_step)
                    errors_by_type[lab.expected].append(first[lab.expected] - lab.cause_step)
            else:
                fn[lab.expected] += 1
        cause = lab.cause_step if lab.cause_step is not None else 0
        for ftype, step in first.items():
            if ftype == lab.expected:
                continue
            if ftype in lab.after and step >= cause:
                continue
            fp[ftype] += 1
            fp_cases[ftype][lab.case] += 1
    covered = sorted({lab.expected for lab in labels if lab.expected is not None}, key=FAILURE_TYPES.index)
    per_type = {}
    for t in covered:
        p = tp[t] / (tp[t] + fp[t]) if tp[t] + fp[t] else 0.0
        r = tp[t] / (tp[t] + fn[t]) if tp[t] + fn[t] else 0.0
        err = np.array(errors_by_type[t]) if errors_by_type[t] else np.zeros(1)
        per_type[t] = {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0,
                       "tp": tp[t], "fp": fp[t], "fn": fn[t], "median_error": float(np.median(err)),
                       "within": float(np.mean(np.abs(err) <= TIMING_TOLERANCE_STEPS))}
    uncovered_fp = {t: fp[t] for t in FAILURE_TYPES if t not in covered and fp[t]}
    abs_err = np.abs(np.array(errors)) if errors else np.zeros(0)
    return {"per_type": per_type, "macro_f1": float(np.mean([v["f1"] for v in per_type.values()])),
            "timing_within": float(np.mean(abs_err <= TIMING_TOLERANCE_STEPS)) if errors else 0.0,
            "timing_median": float(np.median(abs_err)) if errors else 0.0,
            "timing_max": int(abs_err.max()) if errors else 0, "timed": len(errors),
            "flagged": flagged, "successes": successes,
            "fp_cases": fp_cases, "uncovered_fp": uncovered_fp}


def cluster(labels, events, moments, shuffle_seed: int = 0) -> dict:
    started = {e["episode_id"]: e for e in events["EpisodeStarted"]}
    ended = {e["episode_id"]: e for e in events["EpisodeEnded"]}
    config = EmbeddingConfig()
    failed = [lab for lab in labels if not lab.success and moments.get(lab.episode_id)]
    xs = []
    for lab in failed:
        end = ended[lab.episode_id]
        xs.append(embed(FailedEpisode(lab.episode_id, lab.scenario_id, end["model_id"], end["steps"],
                                      end["termination"], moments[lab.episode_id], end["quality"],
                                      started[lab.episode_id]["scenario"]), config))
    order = np.random.default_rng(shuffle_seed).permutation(len(failed))
    clusterer = OnlineFailureClusterer(ClustererConfig())
    update_s, recluster_adds_s = [], []
    for i in order:
        t0 = time.perf_counter()
        clusterer.add(failed[i].episode_id, failed[i].scenario_id, xs[i])
        took = time.perf_counter() - t0
        # every recluster_every-th add also re-clusters the macro level: timed apart
        (recluster_adds_s if clusterer.updates % clusterer.config.recluster_every == 0 else update_s).append(took)
    t0 = time.perf_counter()
    clusterer.recluster()
    recluster_s = time.perf_counter() - t0
    ids = [lab.episode_id for lab in failed]
    online = clusterer.labels(ids)
    batch = batch_dbscan(np.array(xs))
    by_cluster: dict[str, Counter] = defaultdict(Counter)
    for lab, c in zip(failed, online, strict=True):
        by_cluster[c or "noise"][lab.case] += 1
    return {"episodes": len(failed), "ari": adjusted_rand(online, batch),
            "ari_causes": adjusted_rand(online, [lab.case for lab in failed]),
            "recluster_adds_ms": np.array(recluster_adds_s) * 1000,
            "amortised_ms": (sum(update_s) + sum(recluster_adds_s) + recluster_s) / len(failed) * 1000,
            "online_clusters": len({c for c in online if c is not None}),
            "batch_clusters": len(set(batch) - {-1}), "update_ms": np.array(update_s) * 1000,
            "recluster_ms": recluster_s * 1000, "by_cluster": by_cluster}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=ROOT / "eval_memory" / "failure_set")
    parser.add_argument("--seeds", type=int, default=10, help="episodes per case when generating")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--regenerate", action="store_true")
    args = parser.parse_args()
    if args.regenerate or not (args.set / "labels.jsonl").exists():
        t0 = time.perf_counter()
        failure_set.save(args.set, failure_set.generate(failure_set.CASES, args.seeds, args.processes))
        print(f"generated the labelled set in {time.perf_counter() - t0:.0f} s -> {args.set}")
    labels, events = failure_set.load(args.set)
    print(f"labelled set: {len(labels)} episodes, {len(events['Step'])} steps, cases: "
          + ", ".join(f"{k} {v}" for k, v in Counter(lab.case for lab in labels).items()))

    t0 = time.perf_counter()
    moments = detect(events)
    detect_s = time.perf_counter() - t0
    s = score(labels, moments)
    print(f"\ndetector (DetectorStage, {len(events['Step']) / detect_s:,.0f} steps/s incl. decode/encode)")
    print(f"{'type':16s} {'P':>6s} {'R':>6s} {'F1':>6s}   tp  fp  fn   timing: median error, within +-5")
    for t, v in s["per_type"].items():
        print(f"{t:16s} {v['precision']:6.3f} {v['recall']:6.3f} {v['f1']:6.3f}  {v['tp']:3d} {v['fp']:3d} {v['fn']:3d}"
              f"   {v['median_error']:+5.1f} steps, {v['within']:.0%}")
    for t, cases in s["fp_cases"].items():
        print(f"  false positives of {t}: " + ", ".join(f"{c} {n}" for c, n in cases.items()))
    if s["uncovered_fp"]:
        print(f"  moments of types the set has no case for: {s['uncovered_fp']}")
    print(f"macro F1: {s['macro_f1']:.3f}   (target >= 0.90: {'met' if s['macro_f1'] >= 0.9 else 'MISSED'})")
    print(f"moment within +-{TIMING_TOLERANCE_STEPS} steps of the cause: {s['timing_within']:.1%} of {s['timed']} "
          f"detections (median |error| {s['timing_median']:.0f}, max {s['timing_max']}; target >= 90%: "
          f"{'met' if s['timing_within'] >= 0.9 else 'MISSED'})")
    rate = s["flagged"] / s["successes"] if s["successes"] else 0.0
    print(f"successful baseline episodes flagged: {s['flagged']}/{s['successes']} = {rate:.1%} "
          f"(target < 2%: {'met' if rate < 0.02 else 'MISSED'})")

    c = cluster(labels, events, moments)
    ms = c["update_ms"]
    print(f"\nclustering {c['episodes']} failed episodes: online {c['online_clusters']} clusters, "
          f"batch DBSCAN {c['batch_clusters']}")
    print(f"ARI online vs batch: {c['ari']:.3f}  (target >= 0.90: {'met' if c['ari'] >= 0.9 else 'MISSED'})")
    print(f"ARI online clusters vs injected causes: {c['ari_causes']:.3f}")
    rc = c["recluster_adds_ms"]
    print(f"online update (micro-clusters): p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms, "
          f"max {ms.max():.3f} ms (target < 1 ms: {'met' if np.percentile(ms, 99) < 1 else 'MISSED'})")
    print(f"macro re-clustering (every {ClustererConfig().recluster_every} updates, {len(rc) + 1} runs): "
          f"median {np.median(np.append(rc, c['recluster_ms'])):.1f} ms; amortised over all updates "
          f"{c['amortised_ms']:.3f} ms/update")
    for cid, cases in sorted(c["by_cluster"].items()):
        print(f"  {cid}: " + ", ".join(f"{k} {v}" for k, v in cases.most_common()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
