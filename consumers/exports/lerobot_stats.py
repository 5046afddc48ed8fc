"""LeRobot 0.6.1's dataset statistics, ported (numpy only) so the export's stats equal LeRobot's own.

Followed from huggingface/lerobot v0.6.1, ``src/lerobot/datasets/compute_stats.py`` unless named:
- ``RunningQuantileStats``: ``update`` on one batch then ``get_statistics`` -> ``_running_stats``
  (float32 promotion of the batch, ``np.mean`` of values and squares, std = sqrt(max(0, E[x^2] - E[x]^2)),
  quantiles from 5000-bin histograms over [min - 1e-10, max + 1e-10] interpolated within the bin:
  ``_compute_single_quantile`` -> ``_quantile``). LeRobot feeds ``get_feature_stats`` one batch per episode,
  so the histogram re-binning of later updates (``_adjust_histograms``) is never reached and not ported.
- ``get_feature_stats`` with ``_prepare_array_for_stats``, ``_compute_basic_stats`` (fewer than two rows:
  numpy's own min/max/mean/std, every quantile = the mean) and the ``_reshape_*`` helpers ->
  ``vector_stats`` (axis 0) and ``image_stats`` (axis (0, 2, 3)).
- ``compute_episode_stats``: a vector feature's stats over the episode's stacked values (shape (1,)
  features as a 1-d array, keepdims); an image or video feature's over ``sample_images`` (uint8,
  channel first, ``auto_downsample_height_width``), divided by 255 and squeezed to shape (3, 1, 1).
  ``estimate_num_samples``, ``sample_indices``, ``auto_downsample_height_width``, ``sample_images`` keep
  their names; ``sample_images`` takes a loader instead of paths (``io_utils.load_image_as_numpy``:
  ``np.array(PIL.Image.open(p).convert("RGB"), dtype=uint8)``, then channel first).
- ``aggregate_feature_stats`` / ``aggregate_stats``: count-weighted mean, pooled variance, min of mins, max
  of maxes, and each quantile the count-weighted mean of the episodes' (0.6.1; 0.6.2 changed it).
  ``dataset_metadata.py`` ``save_episode`` folds the episodes in one at a time,
  ``stats = aggregate_stats([stats, episode_stats])`` -> ``fold_episode``.

What the caller hands in is what ``dataset_writer.py`` ``save_episode`` hands ``compute_episode_stats``:
float32 features as float32 arrays, ``timestamp`` as float64 (``frame_index / fps`` in Python),
``frame_index``, ``index``, ``episode_index``, ``task_index`` as int64; the batch is then promoted with
``np.result_type(dtype, float32)``, so float32 features are reduced in float32 and the rest in float64.

LeRobot 0.6.1 runs on numpy 2, where a float32 scalar minus a Python float stays float32 (NEP 50) and
``np.linspace`` between float32 scalars is float32; numpy 1 would widen both to float64 and move the
bin edges. The edges are therefore built with explicit dtypes (``_bin_edges``), giving numpy 2's edges
whichever numpy runs this.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # DEFAULT_QUANTILES
NUM_QUANTILE_BINS = 5000  # RunningQuantileStats(num_quantile_bins=5000)
EDGE_PADDING = 1e-10  # the first update's histogram range: [min - 1e-10, max + 1e-10]

Stats = dict[str, np.ndarray]


def quantile_key(q: float) -> str:
    return f"q{int(q * 100):02d}"


# --- one feature of one episode -------------------------------------------------------------------

def vector_stats(values: np.ndarray) -> Stats:
    """compute_episode_stats of a non-image feature: per dimension over the frames (axis 0).

    ``values`` is (frames,) for a shape (1,) feature (stats of shape (1,)) or (frames, n) (stats (n,))."""
    if values.ndim not in (1, 2):
        raise ValueError(f"a vector feature's values are (frames,) or (frames, n), got shape {values.shape}")
    rows = values.reshape(-1, 1) if values.ndim == 1 else values
    stats = _basic_stats(rows, len(values)) if rows.shape[0] < 2 else _running_stats(rows, len(values))
    if values.ndim == 1:  # keepdims: _reshape_for_vector_stats gives shape (1,)
        stats = {k: v if k == "count" else v.reshape(1) for k, v in stats.items()}
    return stats


def image_stats(length: int, load: Callable[[int], np.ndarray]) -> Stats:
    """compute_episode_stats of an image or video feature: per channel over the sampled frames, in
    [0, 1], shape (3, 1, 1); ``count`` is the number of frames sampled. ``load(i)`` is frame i, (H, W, 3) uint8."""
    images = sample_images(length, load)
    batch, channels = images.shape[0], images.shape[1]
    rows = images.transpose(0, 2, 3, 1).reshape(-1, channels)  # _prepare_array_for_stats, axis (0, 2, 3)
    stats = _basic_stats(rows, batch) if rows.shape[0] < 2 else _running_stats(rows, batch)
    # keepdims (1, C, 1, 1), then /255 and squeezed to (C, 1, 1) by compute_episode_stats.
    return {k: v if k == "count" else np.squeeze(v.reshape(1, -1, 1, 1) / 255.0, axis=0) for k, v in stats.items()}


def estimate_num_samples(dataset_len: int, min_num_samples: int = 100, max_num_samples: int = 10_000,
                         power: float = 0.75) -> int:
    if dataset_len < min_num_samples:
        min_num_samples = dataset_len
    return max(min_num_samples, min(int(dataset_len**power), max_num_samples))


def sample_indices(data_len: int) -> list[int]:
    num_samples = estimate_num_samples(data_len)
    return np.round(np.linspace(0, data_len - 1, num_samples)).astype(int).tolist()


def auto_downsample_height_width(img: np.ndarray, target_size: int = 150, max_size_threshold: int = 300) -> np.ndarray:
    """Every k-th row and column of a (C, H, W) image whose longer side is 300 or more, k = side // 150."""
    _, height, width = img.shape
    if max(width, height) < max_size_threshold:
        return img
    downsample_factor = int(width / target_size) if width > height else int(height / target_size)
    return img[:, ::downsample_factor, ::downsample_factor]


def sample_images(length: int, load: Callable[[int], np.ndarray]) -> np.ndarray:
    """(samples, C, h, w) uint8: the frames at sample_indices(length), channel first, downsampled."""
    if length < 1:
        raise ValueError(f"an image feature needs at least one frame, got {length}")
    indices = sample_indices(length)
    images = None
    for i, index in enumerate(indices):
        frame = np.asarray(load(index), dtype=np.uint8)
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"frame {index} is not (H, W, 3): shape {frame.shape}")
        img = auto_downsample_height_width(np.transpose(frame, (2, 0, 1)))
        if images is None:
            images = np.empty((len(indices), *img.shape), dtype=img.dtype)
        images[i] = img  # a differently sized frame fails here, as it does in LeRobot
    return images


def _basic_stats(rows: np.ndarray, count: int) -> Stats:
    """_compute_basic_stats: fewer than two rows, in the rows' own dtype; every quantile is the mean."""
    stats = {"min": np.min(rows, axis=0), "max": np.max(rows, axis=0), "mean": np.mean(rows, axis=0),
             "std": np.std(rows, axis=0), "count": np.array([count])}
    for q in QUANTILES:
        stats[quantile_key(q)] = stats["mean"].copy()
    return stats


def _running_stats(rows: np.ndarray, count: int) -> Stats:
    """RunningQuantileStats().update(rows); get_statistics(), with ``count`` as get_feature_stats sets it."""
    batch = rows.reshape(-1, rows.shape[-1])
    batch = batch.astype(np.result_type(batch.dtype, np.float32), copy=False)
    n = batch.shape[0]
    mean = np.mean(batch, axis=0)
    mean_of_squares = np.mean(batch**2, axis=0)
    low, high = np.min(batch, axis=0), np.max(batch, axis=0)
    # update() then folds the batch into the (equal) running values once more; kept for the same bits
    # (it turns a -0.0 mean into 0.0).
    mean += (np.mean(batch, axis=0) - mean) * (n / n)
    mean_of_squares += (np.mean(batch**2, axis=0) - mean_of_squares) * (n / n)
    variance = mean_of_squares - mean**2
    stats = {"min": low.copy(), "max": high.copy(), "mean": mean.copy(), "std": np.sqrt(np.maximum(0, variance)),
             "count": np.array([count])}
    cumulative = []
    for i in range(batch.shape[1]):
        edges = _bin_edges(low[i], high[i])
        histogram = np.zeros(NUM_QUANTILE_BINS)
        histogram += np.histogram(batch[:, i], bins=edges)[0]
        cumulative.append((np.cumsum(histogram), edges))
    for q in QUANTILES:
        stats[quantile_key(q)] = np.array([_quantile(cumsum, edges, q * n) for cumsum, edges in cumulative])
    return stats


def _bin_edges(low: np.generic, high: np.generic) -> np.ndarray:
    """np.linspace(low - 1e-10, high + 1e-10, 5001) as numpy 2 computes it for scalars of their dtype."""
    dtype = low.dtype
    start = low - dtype.type(EDGE_PADDING)
    stop = high + dtype.type(EDGE_PADDING)
    div = NUM_QUANTILE_BINS
    delta = np.subtract(stop, start, dtype=dtype)
    edges = np.arange(0, NUM_QUANTILE_BINS + 1, dtype=dtype)
    step = delta / dtype.type(div)
    if step == 0:  # linspace's denormal branch (numpy gh-5437)
        edges /= div
        edges *= delta
    else:
        edges *= step
    edges += start
    edges[-1] = stop
    return edges


def _quantile(cumsum: np.ndarray, edges: np.ndarray, target_count: float) -> float:
    """_compute_single_quantile: the edge where the cumulative count reaches the target, interpolated."""
    idx = np.searchsorted(cumsum, target_count)
    if idx == 0:
        return edges[0]
    if idx >= len(cumsum):
        return edges[-1]
    count_before = cumsum[idx - 1]
    count_in_bin = cumsum[idx] - count_before
    if count_in_bin == 0:
        return edges[idx]
    fraction = (target_count - count_before) / count_in_bin
    return edges[idx] + fraction * (edges[idx + 1] - edges[idx])


# --- across episodes ------------------------------------------------------------------------------

def aggregate_feature_stats(stats_ft_list: list[Stats]) -> Stats:
    """One feature over several episodes (or partial aggregates): weighted by ``count``."""
    means = np.stack([s["mean"] for s in stats_ft_list])
    variances = np.stack([s["std"] ** 2 for s in stats_ft_list])
    counts = np.stack([s["count"] for s in stats_ft_list])
    total_count = counts.sum(axis=0)
    while counts.ndim < means.ndim:
        counts = np.expand_dims(counts, axis=-1)
    total_mean = (means * counts).sum(axis=0) / total_count
    delta_means = means - total_mean
    total_variance = ((variances + delta_means**2) * counts).sum(axis=0) / total_count
    aggregated = {"min": np.min(np.stack([s["min"] for s in stats_ft_list]), axis=0),
                  "max": np.max(np.stack([s["max"] for s in stats_ft_list]), axis=0),
                  "mean": total_mean, "std": np.sqrt(total_variance), "count": total_count}
    if stats_ft_list:
        for key in [k for k in stats_ft_list[0] if k.startswith("q") and k[1:].isdigit()]:
            if all(key in s for s in stats_ft_list):
                aggregated[key] = (np.stack([s[key] for s in stats_ft_list]) * counts).sum(axis=0) / total_count
    return aggregated


def aggregate_stats(stats_list: list[dict[str, Stats]]) -> dict[str, Stats]:
    """Every feature any of the stats has, each aggregated over the stats that have it."""
    keys = {key for stats in stats_list for key in stats}
    return {key: aggregate_feature_stats([stats[key] for stats in stats_list if key in stats]) for key in keys}


def fold_episode(dataset: dict[str, Stats] | None, episode: dict[str, Stats]) -> dict[str, Stats]:
    """The dataset's stats after one more episode, as LeRobotDatasetMetadata.save_episode updates them."""
    return aggregate_stats([dataset, episode]) if dataset is not None else episode
