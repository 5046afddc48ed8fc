"""consumers.exports.lerobot_stats against LeRobot 0.6.1's rules, written out here from
src/lerobot/datasets/compute_stats.py and checked with numpy and by hand (with tolerances: nothing
here depends on this machine's floating-point kernels)."""

from __future__ import annotations

import numpy as np
import pytest

from consumers.exports import lerobot_stats as ls

STAT_NAMES = ["min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99"]


def test_vector_stats_of_a_known_array():
    rng = np.random.default_rng(0)
    values = rng.normal([1.0, -2.0, 50.0], [0.5, 3.0, 10.0], size=(400, 3)).astype(np.float32)
    stats = ls.vector_stats(values)
    assert list(stats) == STAT_NAMES
    exact = values.astype(np.float64)
    assert stats["count"].tolist() == [400]
    assert np.array_equal(stats["min"], values.min(axis=0)) and np.array_equal(stats["max"], values.max(axis=0))
    assert np.allclose(stats["mean"], exact.mean(axis=0), rtol=1e-5)
    assert np.allclose(stats["std"], exact.std(axis=0), rtol=1e-3)
    # Histogram quantiles: within one of the 5000 bins of the order statistic the target count reaches.
    width = (exact.max(axis=0) - exact.min(axis=0)) / ls.NUM_QUANTILE_BINS
    ordered = np.sort(exact, axis=0)
    for q in ls.QUANTILES:
        reached = ordered[int(np.ceil(q * len(values))) - 1]
        assert (np.abs(stats[ls.quantile_key(q)] - reached) <= width * 1.001 + 1e-9).all(), q


def test_quantiles_by_hand_on_0_to_99():
    stats = ls.vector_stats(np.arange(100, dtype=np.float32))
    width = 99 / 5000
    # q50: the target count 50 is reached in the bin of the value 49 (its only value), so the
    # interpolation goes to that bin's upper edge: 49 + less than one bin.
    assert 49 <= stats["q50"][0] <= 49 + width
    # q01: the target count 1 is reached in the very first bin, whose lower edge is returned (0 - 1e-10).
    assert stats["q01"][0] == pytest.approx(0.0, abs=1e-6)
    assert 98 <= stats["q99"][0] <= 98 + width
    assert stats["mean"][0] == pytest.approx(49.5) and stats["std"][0] == pytest.approx(np.arange(100).std(), rel=1e-5)


def test_shapes_and_dtypes_follow_lerobot():
    scalar = ls.vector_stats(np.array([1.0, 2.0, 4.0], dtype=np.float32))  # a shape (1,) feature
    assert {k: v.shape for k, v in scalar.items()} == {k: (1,) for k in STAT_NAMES}
    vector = ls.vector_stats(np.ones((5, 4), dtype=np.float32))
    assert all(v.shape == ((1,) if k == "count" else (4,)) for k, v in vector.items())
    # float32 features are reduced in float32, integer ones promoted to float64 (np.result_type(dtype, float32)).
    assert scalar["mean"].dtype == np.float32 and scalar["std"].dtype == np.float32
    assert ls.vector_stats(np.arange(6, dtype=np.int64))["mean"].dtype == np.float64
    with pytest.raises(ValueError, match=r"\(2, 2, 2\)"):
        ls.vector_stats(np.zeros((2, 2, 2)))


def test_one_frame_uses_basic_stats_with_quantiles_at_the_mean():
    stats = ls.vector_stats(np.array([[3.0, -1.0]], dtype=np.float32))
    assert stats["count"].tolist() == [1] and stats["std"].tolist() == [0.0, 0.0]
    for q in ls.QUANTILES:
        assert stats[ls.quantile_key(q)].tolist() == [3.0, -1.0]


def test_bin_edges_keep_the_dtype_as_numpy_2_does():
    # numpy 2 keeps float32 scalar - 1e-10 and linspace between float32 scalars in float32; numpy 1
    # would widen both. The edges must be numpy 2's whichever numpy runs the tests.
    edges = ls._bin_edges(np.float32(0.5), np.float32(0.75))
    assert edges.dtype == np.float32 and len(edges) == ls.NUM_QUANTILE_BINS + 1
    assert edges[0] == np.float32(0.5) - np.float32(1e-10) and edges[-1] == np.float32(0.75) + np.float32(1e-10)
    assert (np.diff(edges) >= 0).all()
    wide = ls._bin_edges(np.float64(0.5), np.float64(0.75))
    assert wide.dtype == np.float64 and wide[0] == 0.5 - 1e-10 and wide[-1] == 0.75 + 1e-10
    flat = ls._bin_edges(np.float32(2.0), np.float32(2.0))  # a constant feature: every edge at the value
    assert (flat == np.float32(2.0)).all()


def test_image_stats_per_channel_in_0_1():
    frame = np.zeros((4, 6, 3), dtype=np.uint8)
    frame[..., 1] = 255
    frame[:2, :, 2] = 255  # channel 2: half black, half white
    stats = ls.image_stats(3, lambda i: frame)
    assert list(stats) == STAT_NAMES
    assert all(v.shape == (3, 1, 1) for k, v in stats.items() if k != "count")
    assert stats["count"].tolist() == [3]  # the frames sampled
    assert np.allclose(stats["mean"].ravel(), [0.0, 1.0, 0.5], atol=1e-6)
    assert np.allclose(stats["std"].ravel(), [0.0, 0.0, 0.5], atol=1e-4)
    assert stats["min"].ravel().tolist() == [0.0, 1.0, 0.0] and stats["max"].ravel().tolist() == [0.0, 1.0, 1.0]
    assert np.allclose(stats["q10"].ravel(), [0.0, 1.0, 0.0], atol=1e-3)
    assert np.allclose(stats["q90"].ravel(), [0.0, 1.0, 1.0], atol=1e-3)


def test_sampling_and_downsampling():
    assert ls.sample_indices(12) == list(range(12))
    assert len(ls.sample_indices(200)) == 100 and ls.sample_indices(200)[-1] == 199
    assert len(ls.sample_indices(1000)) == 177  # int(1000 ** 0.75)
    assert ls.auto_downsample_height_width(np.zeros((3, 240, 320))).shape == (3, 120, 160)  # every 2nd
    assert ls.auto_downsample_height_width(np.zeros((3, 299, 100))).shape == (3, 299, 100)
    loaded = []

    def load(i):
        loaded.append(i)
        return np.full((8, 8, 3), i % 256, dtype=np.uint8)

    stats = ls.image_stats(130, load)
    assert stats["count"].tolist() == [100] and loaded == ls.sample_indices(130) and loaded[-1] == 129


def test_aggregation_is_count_weighted_including_quantiles():
    rng = np.random.default_rng(1)
    first = rng.normal(0.0, 1.0, size=(10, 2)).astype(np.float32)
    second = rng.normal(5.0, 2.0, size=(30, 2)).astype(np.float32)
    a, b = ls.vector_stats(first), ls.vector_stats(second)
    both = ls.aggregate_feature_stats([a, b])
    pooled = np.concatenate([first, second]).astype(np.float64)
    assert both["count"].tolist() == [40]
    assert np.allclose(both["mean"], pooled.mean(axis=0), rtol=1e-5)
    assert np.allclose(both["std"], pooled.std(axis=0), rtol=1e-4)
    assert np.array_equal(both["min"], pooled.min(axis=0)) and np.array_equal(both["max"], pooled.max(axis=0))
    for q in ls.QUANTILES:
        key = ls.quantile_key(q)
        weighted = (10 * a[key].astype(np.float64) + 30 * b[key].astype(np.float64)) / 40
        assert np.allclose(both[key], weighted, rtol=1e-12), q
    # Not the envelope of the episodes' quantiles (the rule before LeRobot 0.6.1 as this exporter had it).
    assert (both["q01"] > np.minimum(a["q01"], b["q01"])).all()


def test_folding_episodes_one_at_a_time_matches_aggregating_them_together():
    rng = np.random.default_rng(2)
    episodes = [{"x": ls.vector_stats(rng.normal(i, 1.0, size=(n, 3)).astype(np.float32)),
                 "img": ls.image_stats(n, lambda t: np.full((4, 4, 3), t * 9 % 256, dtype=np.uint8))}
                for i, n in enumerate([5, 17, 9])]
    folded = None
    for episode in episodes:
        folded = ls.fold_episode(folded, episode)
    together = ls.aggregate_stats(episodes)
    assert set(folded) == {"x", "img"}
    for key in folded:
        assert folded[key]["count"].tolist() == together[key]["count"].tolist() == [31]
        for name in STAT_NAMES:
            assert np.allclose(folded[key][name], together[key][name], rtol=1e-12, atol=0), (key, name)
    assert folded["img"]["mean"].shape == (3, 1, 1)
    assert ls.fold_episode(None, episodes[0]) is episodes[0]
