"""Hard cases as a LeRobot dataset in the v3.0 layout today's LeRobot loaders read.

Followed from huggingface/lerobot (0.6.2, ``src/lerobot/``), not guessed:
- ``datasets/dataset_metadata.py``: ``CODEBASE_VERSION = "v3.0"``; the loader refuses v2.x
  (``check_version_compatibility`` in ``datasets/utils.py`` raises BackwardCompatibilityError).
- ``datasets/utils.py``: the paths (``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``,
  ``meta/episodes/chunk-000/file-000.parquet``, ``data/chunk-000/file-000.parquet``) and the
  fields of ``DatasetInfo`` (info.json, in its ``to_dict`` order).
- ``utils/constants.py``: ``DEFAULT_FEATURES`` (timestamp float32, frame_index, episode_index,
  index, task_index int64, each shape (1,)).
- ``datasets/feature_utils.py`` ``get_hf_features_from_features``: shape (1,) -> a scalar column,
  (n,) -> a fixed-length list, ``image`` -> an HF ``Image`` (struct of PNG ``bytes`` and ``path``).
- ``datasets/dataset_writer.py`` ``save_episode`` / ``_save_episode_data``: ``index`` runs over the
  whole dataset, ``episode_index``/``frame_index`` per episode, ``timestamp = frame_index / fps``,
  ``task_index`` from tasks.parquet; ``io_utils.write_table_one_row_group_per_episode``: one
  parquet row group per episode.
- ``datasets/dataset_metadata.py`` ``save_episode`` / ``_save_episode_metadata``: the episodes
  parquet (``episode_index``, ``tasks``, ``length``, ``data/chunk_index``, ``data/file_index``,
  ``dataset_from_index``, ``dataset_to_index``, ``meta/episodes/chunk_index``,
  ``meta/episodes/file_index``, ``stats/<feature>/<stat>``), ``save_episode_tasks`` /
  ``io_utils.write_tasks``: tasks.parquet is a pandas frame indexed by ``task`` with ``task_index``.
- ``datasets/compute_stats.py``: per feature ``min, max, mean, std, count, q01, q10, q50, q90,
  q99``; images per channel, shape (3, 1, 1), scaled to [0, 1]; dataset stats aggregate the
  episodes' (``aggregate_feature_stats``: count-weighted mean, pooled variance, and the
  quantiles' envelope). Per-episode quantiles here are exact (LeRobot estimates them from
  histograms).

What the columns hold (one frame per control step, ``fps`` = the simulator's control rate):
- ``observation.state`` float32: joint positions, end-effector position and quaternion (xyzw),
  gripper opening; ``observation.environment_state`` float32: the target object's position and
  quaternion (present when every frame has one); ``action`` float32: the policy's action;
  ``next.reward`` float32.
- ``observation.images.keyframe`` (image): keyframes are rendered every few steps, not every
  frame, so each frame holds the latest keyframe at or before it (the episode's first keyframe
  before that one); an episode with no keyframe on disk holds a black frame. Present only when
  some exported episode has a keyframe file.
- Episodes whose stored steps are not exactly 0..steps-1 (pruned, or not landed yet) are left out
  and reported; the JSONL export still carries them. Extra episode columns (``episode_id``,
  ``scenario_id``, ``model_id``, ``kind``, ``failure_types``, ``success``, ``termination``) tie
  each episode back to the evidence log.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from consumers.evidence.store import EvidenceStore
from consumers.exports.exceptions import IncompatibleEpisodes, NothingToExport
from consumers.exports.output import ExportFilters, ExportSummary, Keyframes, fresh_output, select
from consumers.exports.queries import HardCase, StepRow, episode_steps

CODEBASE_VERSION = "v3.0"
# robosuite's control rate in this project (producers/sim/envs.py CONTROL_FREQ_HZ); eval farms
# recording at another rate pass their own.
DEFAULT_FPS = 20
CHUNKS_SIZE = 1000  # LeRobot DEFAULT_CHUNK_SIZE
DATA_FILES_SIZE_IN_MB = 100  # LeRobot DEFAULT_DATA_FILE_SIZE_IN_MB
VIDEO_FILES_SIZE_IN_MB = 200  # LeRobot DEFAULT_VIDEO_FILE_SIZE_IN_MB
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)  # LeRobot DEFAULT_QUANTILES
IMAGE_KEY = "observation.images.keyframe"
EPISODES_PER_QUERY = 50

DEFAULT_FEATURES = {
    "timestamp": {"dtype": "float32", "shape": [1], "names": None},
    "frame_index": {"dtype": "int64", "shape": [1], "names": None},
    "episode_index": {"dtype": "int64", "shape": [1], "names": None},
    "index": {"dtype": "int64", "shape": [1], "names": None},
    "task_index": {"dtype": "int64", "shape": [1], "names": None},
}
_IMAGE_TYPE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])


@dataclass(frozen=True)
class _Layout:
    """The dataset's feature shapes, fixed by the first episode and required of every other one."""

    joints: int
    action: int
    environment_state: bool
    image_shape: tuple[int, int, int] | None

    def features(self) -> dict[str, dict]:
        state_names = ([f"joint_pos.{i}" for i in range(self.joints)] + ["eef_pos.x", "eef_pos.y", "eef_pos.z"]
                       + ["eef_quat.x", "eef_quat.y", "eef_quat.z", "eef_quat.w", "gripper_opening"])
        features = {
            "observation.state": {"dtype": "float32", "shape": [len(state_names)], "names": state_names},
            "action": {"dtype": "float32", "shape": [self.action],
                       "names": [f"action.{i}" for i in range(self.action)]},
            "next.reward": {"dtype": "float32", "shape": [1], "names": None},
        }
        if self.environment_state:
            features["observation.environment_state"] = {
                "dtype": "float32", "shape": [7],
                "names": ["object.x", "object.y", "object.z", "object.qx", "object.qy", "object.qz", "object.qw"]}
        if self.image_shape is not None:
            features[IMAGE_KEY] = {"dtype": "image", "shape": list(self.image_shape),
                                   "names": ["height", "width", "channels"]}
        return {**features, **DEFAULT_FEATURES}


def export_lerobot(store: EvidenceStore, output: Path, keyframe_root: Path | None,
                   filters: ExportFilters = ExportFilters(), fps: int = DEFAULT_FPS) -> ExportSummary:
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    cases = select(store, filters)
    keyframes = Keyframes(keyframe_root)
    summary = ExportSummary("lerobot", output)

    # First pass: which episodes can be frames (complete steps), and the shapes they share.
    usable: list[HardCase] = []
    shapes: dict[tuple, list[str]] = {}
    any_image: tuple[int, int, int] | None = None
    every_frame_has_object = True
    for page in _pages(cases):
        steps = episode_steps(store, [c.episode_id for c in page])
        for case in page:
            rows = steps[case.episode_id]
            if not rows or [s.t for s in rows] != list(range(case.steps)):
                summary.skipped[case.episode_id] = (f"stored steps are not 0..{case.steps - 1} "
                                                    f"({len(rows)} stored; pruned or not landed yet)")
                continue
            usable.append(case)
            shape = (len(rows[0].joint_pos), len(rows[0].action))
            if any((len(s.joint_pos), len(s.action)) != shape for s in rows):
                raise IncompatibleEpisodes(f"episode {case.episode_id} changes its joint or action size mid-episode")
            shapes.setdefault(shape, []).append(case.episode_id)
            every_frame_has_object &= all(s.object_poses for s in rows)
            for row in rows:
                path = keyframes.path(row.keyframe_sha256)
                if path is not None:
                    image_shape = _image(path).shape
                    any_image = any_image or image_shape
                    if image_shape != any_image:
                        raise IncompatibleEpisodes(
                            f"keyframes of different sizes ({any_image} and {image_shape} in episode "
                            f"{case.episode_id}); a LeRobot image feature has one shape")
                    break
    if not usable:
        raise NothingToExport(f"{len(cases)} episodes matched ({filters.describe()}) but none has its steps "
                              "stored completely; the JSONL export still carries them")
    if len(shapes) > 1:
        found = "; ".join(f"{j} joints / {a}-d action: {len(ids)} episodes (e.g. {ids[0]})"
                          for (j, a), ids in shapes.items())
        raise IncompatibleEpisodes(f"the episodes do not share one state and action size ({found}); "
                                   "a LeRobot dataset has one shape per feature, export them separately")
    ((joints, action),) = shapes
    layout = _Layout(joints, action, every_frame_has_object, any_image)
    features = layout.features()

    fresh_output(output)
    tasks: dict[str, int] = {}
    episode_rows: list[dict] = []
    episode_stats: list[dict] = []
    data_path = output / DATA_PATH.format(chunk_index=0, file_index=0)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    schema = _data_schema(features)
    frames_so_far = 0
    with pq.ParquetWriter(data_path, schema, compression="snappy", use_dictionary=True) as writer:
        for page in _pages(usable):
            steps = episode_steps(store, [c.episode_id for c in page])
            for case in page:
                task = case.instruction or case.scenario.get("env_name") or case.scenario_id
                task_index = tasks.setdefault(task, len(tasks))
                episode_index = len(episode_rows)
                columns, stats, images = _episode_columns(steps[case.episode_id], layout, keyframes, fps,
                                                          episode_index, frames_so_far, task_index)
                summary.keyframes += images.found
                summary.keyframes_missing += images.missing
                # One call, one row group: LeRobot's one-row-group-per-episode layout.
                writer.write_table(pa.table(columns, schema=schema))
                length = len(steps[case.episode_id])
                episode_rows.append(_episode_row(case, episode_index, task, length, frames_so_far, stats))
                episode_stats.append(stats)
                frames_so_far += length
                summary.episodes += 1
                summary.failed += case.kind == "failed"
                summary.recovered += case.kind == "recovered"
    summary.frames = frames_so_far

    _write_episodes(output, episode_rows)
    _write_tasks(output, tasks)
    stats = {key: _aggregate([s[key] for s in episode_stats]) for key in features}
    _write_json(output / STATS_PATH, {key: {k: v.tolist() for k, v in s.items()} for key, s in stats.items()})
    robots = {c.scenario.get("robot") for c in usable}
    info = {
        "codebase_version": CODEBASE_VERSION, "fps": fps, "features": features,
        "total_episodes": len(episode_rows), "total_frames": frames_so_far, "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB, "data_path": DATA_PATH, "video_path": None,
        "robot_type": robots.pop() if len(robots) == 1 and None not in robots else None,
        "splits": {"train": f"0:{len(episode_rows)}"},
    }
    _write_json(output / INFO_PATH, info)
    return summary


def _pages(cases: list[HardCase]):
    for start in range(0, len(cases), EPISODES_PER_QUERY):
        yield cases[start:start + EPISODES_PER_QUERY]


def _image(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


# --- frames ---------------------------------------------------------------------------------------

@dataclass
class _ImageCount:
    found: int = 0
    missing: int = 0


def _episode_columns(rows: list[StepRow], layout: _Layout, keyframes: Keyframes, fps: int, episode_index: int,
                     first_index: int, task_index: int) -> tuple[dict, dict, _ImageCount]:
    n = len(rows)
    frame_index = np.arange(n, dtype=np.int64)
    state = np.array([s.joint_pos + s.eef_pos + s.eef_quat + [s.gripper_opening] for s in rows], dtype=np.float32)
    values: dict[str, np.ndarray] = {
        "observation.state": state,
        "action": np.array([s.action for s in rows], dtype=np.float32),
        "next.reward": np.array([s.reward for s in rows], dtype=np.float32),
        "timestamp": (frame_index / fps).astype(np.float32),
        "frame_index": frame_index,
        "episode_index": np.full(n, episode_index, dtype=np.int64),
        "index": np.arange(first_index, first_index + n, dtype=np.int64),
        "task_index": np.full(n, task_index, dtype=np.int64),
    }
    if layout.environment_state:
        values["observation.environment_state"] = np.array(
            [s.object_poses[0]["pos"] + s.object_poses[0]["quat"] for s in rows], dtype=np.float32)
    stats = {key: _feature_stats(value) for key, value in values.items()}
    columns: dict[str, pa.Array] = {}
    for key, value in values.items():
        if value.ndim == 1:
            columns[key] = pa.array(value)
        else:
            columns[key] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
    count = _ImageCount()
    if layout.image_shape is not None:
        cells, distinct = _held_keyframes(rows, keyframes, layout.image_shape, count)
        columns[IMAGE_KEY] = pa.array(cells, type=_IMAGE_TYPE)
        stats[IMAGE_KEY] = _image_stats(distinct)
    return columns, stats, count


def _held_keyframes(rows: list[StepRow], keyframes: Keyframes, shape: tuple[int, int, int],
                    count: _ImageCount) -> tuple[list[dict], list[np.ndarray]]:
    """Per frame the latest keyframe at or before it (the first one before that), as PNG bytes."""
    found: list[tuple[int, dict, np.ndarray]] = []
    for row in rows:
        if not row.keyframe_sha256:
            continue
        path = keyframes.path(row.keyframe_sha256)
        if path is None:
            count.missing += 1
            continue
        found.append((row.t, {"bytes": path.read_bytes(), "path": path.name}, _image(path)))
    count.found += len(found)
    if not found:
        black = np.zeros(shape, dtype=np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(black).save(buffer, format="PNG")
        return [{"bytes": buffer.getvalue(), "path": None}] * len(rows), [black]
    cells, held, position = [], found[0][1], 0
    for row in rows:
        while position < len(found) and found[position][0] <= row.t:
            held = found[position][1]
            position += 1
        cells.append(held)
    return cells, [array for _, _, array in found]


# --- statistics (LeRobot compute_stats semantics) -------------------------------------------------

def _quantile_key(q: float) -> str:
    return f"q{int(q * 100):02d}"


def _feature_stats(value: np.ndarray) -> dict[str, np.ndarray]:
    """Per dimension over the frames; a scalar feature keeps shape (1,)."""
    data = value.astype(np.float64).reshape(len(value), -1)
    stats = {"min": data.min(axis=0), "max": data.max(axis=0), "mean": data.mean(axis=0), "std": data.std(axis=0),
             "count": np.array([len(value)], dtype=np.int64)}
    for q, level in zip(QUANTILES, np.quantile(data, QUANTILES, axis=0), strict=True):
        stats[_quantile_key(q)] = level
    return stats


def _image_stats(images: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Per channel over the episode's distinct keyframes, in [0, 1], shape (3, 1, 1)."""
    pixels = np.stack(images).astype(np.float64).reshape(-1, 3) / 255.0
    stats = {"min": pixels.min(axis=0), "max": pixels.max(axis=0), "mean": pixels.mean(axis=0),
             "std": pixels.std(axis=0)}
    for q, level in zip(QUANTILES, np.quantile(pixels, QUANTILES, axis=0), strict=True):
        stats[_quantile_key(q)] = level
    stats = {k: v.reshape(3, 1, 1) for k, v in stats.items()}
    stats["count"] = np.array([len(images)], dtype=np.int64)
    return stats


def _aggregate(per_episode: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """LeRobot's aggregate_feature_stats: weighted mean, pooled variance, quantile envelope."""
    means = np.stack([s["mean"] for s in per_episode])
    variances = np.stack([s["std"] ** 2 for s in per_episode])
    counts = np.array([int(s["count"][0]) for s in per_episode], dtype=np.float64)
    weights = counts.reshape((-1,) + (1,) * (means.ndim - 1))
    total = counts.sum()
    mean = (means * weights).sum(axis=0) / total
    variance = ((variances + (means - mean) ** 2) * weights).sum(axis=0) / total
    out = {"min": np.min(np.stack([s["min"] for s in per_episode]), axis=0),
           "max": np.max(np.stack([s["max"] for s in per_episode]), axis=0),
           "mean": mean, "std": np.sqrt(variance), "count": np.array([int(total)], dtype=np.int64)}
    for q in QUANTILES:
        key = _quantile_key(q)
        levels = np.stack([s[key] for s in per_episode])
        out[key] = levels.min(axis=0) if q <= 0.5 else levels.max(axis=0)
    return out


# --- files ----------------------------------------------------------------------------------------

def _arrow_type(feature: dict) -> pa.DataType:
    if feature["dtype"] == "image":
        return _IMAGE_TYPE
    scalar = {"float32": pa.float32(), "int64": pa.int64()}[feature["dtype"]]
    return scalar if feature["shape"] == [1] else pa.list_(scalar, feature["shape"][0])


def _hf_feature(feature: dict) -> dict:
    """The ``datasets`` (4.x) Features entry LeRobot's get_hf_features_from_features makes."""
    if feature["dtype"] == "image":
        return {"_type": "Image"}
    value = {"dtype": feature["dtype"], "_type": "Value"}
    return value if feature["shape"] == [1] else {"feature": value, "length": feature["shape"][0], "_type": "List"}


def _data_schema(features: dict[str, dict]) -> pa.Schema:
    fields = [pa.field(key, _arrow_type(ft)) for key, ft in features.items()]
    hf = {"info": {"features": {key: _hf_feature(ft) for key, ft in features.items()}}}
    return pa.schema(fields, metadata={"huggingface": json.dumps(hf)})


def _episode_row(case: HardCase, episode_index: int, task: str, length: int, first_index: int,
                 stats: dict[str, dict[str, np.ndarray]]) -> dict:
    row = {
        "episode_index": episode_index, "tasks": [task], "length": length,
        "data/chunk_index": 0, "data/file_index": 0,
        "dataset_from_index": first_index, "dataset_to_index": first_index + length,
        "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
        "episode_id": case.episode_id, "scenario_id": case.scenario_id, "model_id": case.model_id,
        "kind": case.kind, "failure_types": case.failure_types, "success": case.success,
        "termination": case.termination,
    }
    for key, feature_stats in stats.items():
        for name, value in feature_stats.items():
            row[f"stats/{key}/{name}"] = value.tolist()
    return row


def _write_episodes(output: Path, rows: list[dict]) -> None:
    path = output / EPISODES_PATH.format(chunk_index=0, file_index=0)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, compression="snappy")


def _write_tasks(output: Path, tasks: dict[str, int]) -> None:
    frame = pd.DataFrame({"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task"))
    frame.to_parquet(output / TASKS_PATH)


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4))
