"""What one failed episode costs the online clusterer, and what a restore costs.

Usage:
    nice -n 10 .venv/bin/python bench/clusterer.py [--episodes 20000] [--spread 0.25]

Prints, for ``--episodes`` embeddings drawn around 12 centres (``--spread``: per-dimension noise;
0.25 puts nearly every point in a micro-cluster of its own, so the micro-cluster cap of 400 is hit
and every add merges two: the worst case), the p50/p99 of an add without and with the scheduled
re-clustering it ran, one explicit re-clustering at the end, and, for synthetic EpisodeAnalysed
events through the stage (decode, embed, add, encode), the time per input and per restored event.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from analysed_episodes import analysed_episodes  # noqa: E402

from schemas.codec import Codec  # noqa: E402
from streams.deadletter import RawMessage  # noqa: E402
from streams.failures.clusterer import ClustererConfig, OnlineFailureClusterer  # noqa: E402
from streams.failures.collector import ClusterLog, ClusterStage, CollectorConfig  # noqa: E402
from streams.failures.embedding import EmbeddingConfig, feature_names  # noqa: E402
from streams.failures.history import Analysed  # noqa: E402
from streams.failures.summaries import FeatureDescriber  # noqa: E402


def adds(n: int, spread: float) -> None:
    dims = len(feature_names())
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(12, dims))
    centres *= 4.0 / np.linalg.norm(centres, axis=1, keepdims=True)
    xs = centres[rng.integers(12, size=n)] + rng.normal(0, spread, size=(n, dims))
    clusterer = OnlineFailureClusterer(ClustererConfig())
    plain, scheduled = [], []
    for i, x in enumerate(xs):
        t0 = time.perf_counter()
        clusterer.add(f"e{i}", "scn", x)
        took = time.perf_counter() - t0
        (scheduled if clusterer.updates == clusterer._last_scheduled else plain).append(took)
    t0 = time.perf_counter()
    clusterer.recluster()
    once = time.perf_counter() - t0
    p = np.array(plain) * 1e6
    s = np.array(scheduled) * 1e3
    print(f"{n} adds, spread {spread}: {len(clusterer.micro)} micro-clusters, {len(clusterer.clusters)} clusters, "
          f"revision {clusterer.revision}")
    print(f"  add: p50 {np.median(p):.0f} us, p99 {np.percentile(p, 99):.0f} us ({len(p)} adds)")
    print(f"  add + scheduled re-clustering: p50 {np.median(s):.1f} ms, p99 {np.percentile(s, 99):.1f} ms "
          f"({len(s)} of them)")
    print(f"  one re-clustering of {len(clusterer.micro)} micro-clusters: {once * 1e3:.1f} ms")


def stage_and_restore(n: int) -> None:
    codec = Codec()
    raws = [RawMessage("b.failures.episodes", 0, i, e["episode_id"].encode(), codec.encode(e))
            for i, e in enumerate(analysed_episodes(n, seed=1))]

    def stage() -> ClusterStage:
        ecfg = EmbeddingConfig()
        return ClusterStage(OnlineFailureClusterer(ClustererConfig(), FeatureDescriber(ecfg), "b"), ecfg,
                            CollectorConfig(), "b.", "b")

    live = stage()
    t0 = time.perf_counter()
    out = live.process(raws)
    processed = time.perf_counter() - t0
    t0 = time.perf_counter()
    history = ClusterLog(codec)
    for i, o in enumerate(out):
        history.add(RawMessage("b.failures.clusters", 0, i, o.key, o.value))
    analysed = Analysed(codec)
    wanted = history.intake_episodes()
    for raw in raws:
        analysed.add(raw.value, wanted)
    restored = stage()
    restored.restore(history, analysed)
    took = time.perf_counter() - t0
    assert restored.clusterer.state() == live.clusterer.state()
    print(f"stage: {n} EpisodeAnalysed ({live.stats['taken_in']} failed) in {processed:.2f} s, "
          f"{processed / n * 1e6:.0f} us per input; {len(out)} events out")
    print(f"restore of those {len(out)} events (log + episodes + re-execution, state checked equal): {took:.2f} s, "
          f"{took / len(out) * 1e6:.0f} us per event")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=20000)
    parser.add_argument("--spread", type=float, default=0.25)
    args = parser.parse_args()
    adds(args.episodes, args.spread)
    stage_and_restore(min(args.episodes, 5000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
