"""Episodes out of the evidence log as a LeRobot dataset in the v3.0 layout LeRobot 0.6.1 reads and writes.

Followed from huggingface/lerobot (v0.6.1, ``src/lerobot/``), not guessed:
- ``datasets/dataset_metadata.py``: ``CODEBASE_VERSION = "v3.0"``; the loader refuses v2.x
  (``check_version_compatibility`` in ``datasets/utils.py`` raises BackwardCompatibilityError).
- ``datasets/utils.py``: the paths (``meta/info.json``, ``meta/stats.json``, ``meta/tasks.parquet``,
  ``meta/episodes/chunk-000/file-000.parquet``, ``data/chunk-000/file-000.parquet``,
  ``DEFAULT_VIDEO_PATH``) and the fields of ``DatasetInfo`` (info.json, in its ``to_dict`` order);
  ``video_path`` is set only when there are videos (``create_empty_dataset_info(use_videos=...)``).
- ``utils/constants.py``: ``DEFAULT_FEATURES`` (timestamp float32, frame_index, episode_index,
  index, task_index int64, each shape (1,)).
- ``datasets/feature_utils.py`` ``get_hf_features_from_features``: shape (1,) -> a scalar column,
  (n,) -> a fixed-length list, ``image`` -> an HF ``Image`` (struct of PNG ``bytes`` and ``path``),
  ``video`` -> no column (the frames are in the videos).
- ``datasets/dataset_writer.py`` ``save_episode`` / ``_save_episode_data``: ``index`` runs over the
  whole dataset, ``episode_index``/``frame_index`` per episode, ``timestamp = frame_index / fps``,
  ``task_index`` from tasks.parquet; one ``ParquetWriter.write_table`` per episode, so one parquet row
  group per episode. ``_save_episode_video`` and ``video_utils.py``: see ``lerobot_video``.
- ``datasets/dataset_metadata.py`` ``save_episode`` / ``_save_episode_metadata``: the episodes
  parquet (``episode_index``, ``tasks``, ``length``, ``data/chunk_index``, ``data/file_index``,
  ``dataset_from_index``, ``dataset_to_index``, per video ``videos/<key>/chunk_index``, ``file_index``,
  ``from_timestamp``, ``to_timestamp``, then ``stats/<feature>/<stat>``, ``meta/episodes/chunk_index``,
  ``meta/episodes/file_index``), ``update_video_info``: a video feature's ``info`` block is
  ``get_video_info`` of the first episode's video; ``save_episode_tasks`` / ``io_utils.write_tasks``:
  tasks.parquet is a pandas frame indexed by ``task`` with ``task_index``.
- ``datasets/compute_stats.py``: per feature ``min, max, mean, std, count, q01, q10, q50, q90, q99``,
  computed as LeRobot computes them (see ``lerobot_stats``): per episode with ``RunningQuantileStats``
  (quantiles from 5000-bin histograms), images and videos per channel over sampled frames (the raw
  PNGs, before encoding), shape (3, 1, 1), scaled to [0, 1]; the dataset's stats fold the episodes in
  one at a time with ``aggregate_feature_stats``: count-weighted mean, pooled variance, min of mins,
  max of maxes, and each quantile the count-weighted mean of the episodes' quantiles.

What the columns hold (one frame per control step, ``fps`` = the simulator's control rate):
- ``observation.state`` float32: joint positions, end-effector position and quaternion (xyzw),
  gripper opening; ``observation.environment_state`` float32: the target object's position and
  quaternion (present when every frame has one); ``action`` float32: the policy's action;
  ``next.reward`` float32.
- ``observation.images.<camera>`` (video), one per camera, when the episodes were recorded with
  camera frames: frame t is what the camera saw before the action at t. Every exported episode must
  have the same cameras (an export mixing episodes with and without frames is refused); an episode
  whose frame files are not all in the keyframe store is left out and reported.
- ``observation.images.keyframe`` (image), only when no episode has camera frames: keyframes are
  rendered every few steps, not every frame, so each frame holds the latest keyframe at or before it
  (the episode's first keyframe before that one); an episode with no keyframe on disk holds a black
  frame. Present only when some exported episode has a keyframe file.
- Episodes whose stored steps are not exactly 0..steps-1 (pruned, or not landed yet) are left out
  and reported; the JSONL export still carries them. Extra episode columns (``episode_id``,
  ``scenario_id``, ``model_id``, ``kind``, ``failure_types``, ``success``, ``termination``) tie
  each episode back to the evidence log.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from consumers.evidence.store import EvidenceStore
from consumers.exports import lerobot_stats
from consumers.exports.exceptions import IncompatibleEpisodes, NothingToExport
from consumers.exports.lerobot_video import VIDEO_PATH, CameraVideos
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
QUANTILES = lerobot_stats.QUANTILES  # LeRobot DEFAULT_QUANTILES
IMAGE_KEY = "observation.images.keyframe"
CAMERA_KEY = "observation.images.{camera}"
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
    cameras: tuple[tuple[str, tuple[int, int, int]], ...] = ()  # (camera, (H, W, 3)), by camera name

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
        for camera, shape in self.cameras:
            features[CAMERA_KEY.format(camera=camera)] = {"dtype": "video", "shape": list(shape),
                                                          "names": ["height", "width", "channels"]}
        return {**features, **DEFAULT_FEATURES}


def export_lerobot(store: EvidenceStore, output: Path, keyframe_root: Path | None,
                   filters: ExportFilters = ExportFilters(), fps: int = DEFAULT_FPS) -> ExportSummary:
    if fps <= 0:
        raise ValueError(f"fps must be positive, got {fps}")
    cases = select(store, filters)
    keyframes = Keyframes(keyframe_root)
    summary = ExportSummary("lerobot", output)
    usable, layout = _survey(store, cases, keyframes, summary, filters)
    features = layout.features()

    fresh_output(output)
    scratch = Path(tempfile.mkdtemp(prefix=".episode-videos-", dir=output))
    try:
        videos = {CAMERA_KEY.format(camera=camera): CameraVideos(output, CAMERA_KEY.format(camera=camera), fps, scratch)
                  for camera, _ in layout.cameras}
        episode_rows, dataset_stats, tasks = _write_data(store, output, usable, layout, features, keyframes, videos,
                                                         fps, summary)
        for camera_videos in videos.values():
            camera_videos.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for key, camera_videos in videos.items():
        features[key]["info"] = camera_videos.info

    _write_episodes(output, episode_rows)
    _write_tasks(output, tasks)
    _write_json(output / STATS_PATH, {key: {k: v.tolist() for k, v in s.items()} for key, s in dataset_stats.items()})
    robots = {c.scenario.get("robot") for c in usable}
    info = {
        "codebase_version": CODEBASE_VERSION, "fps": fps, "features": features,
        "total_episodes": len(episode_rows), "total_frames": summary.frames, "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE, "data_files_size_in_mb": DATA_FILES_SIZE_IN_MB,
        "video_files_size_in_mb": VIDEO_FILES_SIZE_IN_MB, "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if videos else None,
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


def _png_shape(path: Path) -> tuple[int, int, int]:
    with Image.open(path) as image:  # reads the header only
        return image.height, image.width, 3


# --- which episodes, which features ---------------------------------------------------------------

def _survey(store: EvidenceStore, cases: list[HardCase], keyframes: Keyframes, summary: ExportSummary,
            filters: ExportFilters) -> tuple[list[HardCase], _Layout]:
    """The episodes that can be frames (complete steps, every camera frame on disk) and the shapes they share."""
    usable: list[HardCase] = []
    shapes: dict[tuple, list[str]] = {}
    camera_sets: dict[tuple[str, ...], list[str]] = {}  # () = recorded without cameras
    camera_shapes: dict[str, tuple[tuple[int, int, int], str]] = {}  # camera -> (shape, first episode)
    keyframe_shape: tuple[tuple[int, int, int], str] | None = None
    every_frame_has_object = True
    for page in _pages(cases):
        steps = episode_steps(store, [c.episode_id for c in page])
        for case in page:
            rows = steps[case.episode_id]
            if not rows or [s.t for s in rows] != list(range(case.steps)):
                summary.skipped[case.episode_id] = (f"stored steps are not 0..{case.steps - 1} "
                                                    f"({len(rows)} stored; pruned or not landed yet)")
                continue
            missing = _missing_frames(rows, keyframes)
            if missing:
                summary.skipped[case.episode_id] = missing
                continue
            usable.append(case)
            shape = (len(rows[0].joint_pos), len(rows[0].action))
            if any((len(s.joint_pos), len(s.action)) != shape for s in rows):
                raise IncompatibleEpisodes(f"episode {case.episode_id} changes its joint or action size mid-episode")
            shapes.setdefault(shape, []).append(case.episode_id)
            every_frame_has_object &= all(s.object_poses for s in rows)
            cameras = tuple(sorted(rows[0].frames))
            camera_sets.setdefault(cameras, []).append(case.episode_id)
            for camera in cameras:
                seen = _png_shape(keyframes.path(rows[0].frames[camera]))
                known, known_in = camera_shapes.setdefault(camera, (seen, case.episode_id))
                if known != seen:
                    raise IncompatibleEpisodes(
                        f"camera {camera} frames of different sizes ({known} in episode {known_in}, {seen} in "
                        f"episode {case.episode_id}); a LeRobot video feature has one shape")
            if not cameras:
                keyframe_shape = _check_keyframe_shape(rows, keyframes, case.episode_id, keyframe_shape)
    if not usable:
        raise NothingToExport(f"{len(cases)} episodes matched ({filters.describe()}) but none has its steps (and "
                              "camera frames) stored completely; the JSONL export still carries them")
    if len(shapes) > 1:
        found = "; ".join(f"{j} joints / {a}-d action: {len(ids)} episodes (e.g. {ids[0]})"
                          for (j, a), ids in shapes.items())
        raise IncompatibleEpisodes(f"the episodes do not share one state and action size ({found}); "
                                   "a LeRobot dataset has one shape per feature, export them separately")
    if len(camera_sets) > 1:
        (one, one_ids), (other, other_ids) = sorted(camera_sets.items())[:2]
        raise IncompatibleEpisodes(
            f"episode {one_ids[0]} has {_cameras_text(one)} but episode {other_ids[0]} has {_cameras_text(other)}; "
            "every episode of a LeRobot dataset has the same video features, export them separately")
    ((joints, action),) = shapes
    ((cameras, _),) = camera_sets.items()
    for camera in cameras:
        if "/" in camera:  # LeRobot's _validate_feature_names refuses '/' in a feature name
            raise IncompatibleEpisodes(f"camera name {camera!r} has a '/', which a LeRobot feature name cannot")
    image_shape = keyframe_shape[0] if keyframe_shape is not None and not cameras else None
    return usable, _Layout(joints, action, every_frame_has_object, image_shape,
                           tuple((camera, camera_shapes[camera][0]) for camera in cameras))


def _cameras_text(cameras: tuple[str, ...]) -> str:
    return "camera frames of " + ", ".join(cameras) if cameras else "no camera frames"


def _missing_frames(rows: list[StepRow], keyframes: Keyframes) -> str | None:
    """Why an episode's camera frames cannot become videos (a camera missing at a step, a file not on disk)."""
    cameras = set(rows[0].frames)
    absent: list[tuple[int, str, str]] = []
    for row in rows:
        if set(row.frames) != cameras:
            return (f"step {row.t} has camera frames of {sorted(row.frames)} but step 0 of {sorted(cameras)}; "
                    "a video needs every frame")
        absent += [(row.t, camera, sha) for camera, sha in row.frames.items() if keyframes.path(sha) is None]
    if absent:
        t, camera, sha = absent[0]
        return (f"{len(absent)} camera frames are not in the keyframe store (e.g. {camera} at step {t}, {sha}; "
                "pruned, another machine's, or no keyframe root given); a video needs every frame")
    return None


def _check_keyframe_shape(rows: list[StepRow], keyframes: Keyframes, episode_id: str,
                          first: tuple[tuple[int, int, int], str] | None) -> tuple[tuple[int, int, int], str] | None:
    for row in rows:
        path = keyframes.path(row.keyframe_sha256)
        if path is not None:
            shape = _image(path).shape
            if first is not None and shape != first[0]:
                raise IncompatibleEpisodes(
                    f"keyframes of different sizes ({first[0]} and {shape} in episode {episode_id}); "
                    "a LeRobot image feature has one shape")
            return first or (shape, episode_id)
    return first


# --- frames ---------------------------------------------------------------------------------------

@dataclass
class _ImageCount:
    found: int = 0
    missing: int = 0


def _write_data(store: EvidenceStore, output: Path, usable: list[HardCase], layout: _Layout,
                features: dict[str, dict], keyframes: Keyframes, videos: dict[str, CameraVideos], fps: int,
                summary: ExportSummary) -> tuple[list[dict], dict[str, lerobot_stats.Stats], dict[str, int]]:
    """The data parquet and the videos, episode by episode; returns the episode rows, the dataset's
    stats and the tasks."""
    tasks: dict[str, int] = {}
    episode_rows: list[dict] = []
    dataset_stats: dict[str, lerobot_stats.Stats] | None = None
    data_path = output / DATA_PATH.format(chunk_index=0, file_index=0)
    data_path.parent.mkdir(parents=True, exist_ok=True)
    schema = _data_schema(features)
    with pq.ParquetWriter(data_path, schema, compression="snappy", use_dictionary=True) as writer:
        for page in _pages(usable):
            steps = episode_steps(store, [c.episode_id for c in page])
            for case in page:
                rows = steps[case.episode_id]
                task = case.instruction or case.scenario.get("env_name") or case.scenario_id
                task_index = tasks.setdefault(task, len(tasks))
                episode_index = len(episode_rows)
                columns, stats, images = _episode_columns(rows, layout, keyframes, fps, episode_index,
                                                          summary.frames, task_index)
                summary.keyframes += images.found
                summary.keyframes_missing += images.missing
                video_columns = {}
                summary.cameras = tuple(videos)
                for key, camera_videos in videos.items():
                    columns_of_camera, stats[key] = _episode_video(case, rows, key, camera_videos, keyframes)
                    video_columns.update(columns_of_camera)
                # One call, one row group: LeRobot's one-row-group-per-episode layout.
                writer.write_table(pa.table(columns, schema=schema))
                stats = {key: stats[key] for key in features}  # compute_episode_stats' order: the features'
                episode_rows.append(_episode_row(case, episode_index, task, len(rows), summary.frames,
                                                 video_columns, stats))
                dataset_stats = lerobot_stats.fold_episode(dataset_stats, stats)
                summary.frames += len(rows)
                summary.episodes += 1
                summary.failed += case.kind == "failed"
                summary.recovered += case.kind == "recovered"
                summary.succeeded += case.kind == "success"
    return episode_rows, dataset_stats, tasks


def _episode_video(case: HardCase, rows: list[StepRow], key: str, videos: CameraVideos,
                   keyframes: Keyframes) -> tuple[dict, lerobot_stats.Stats]:
    """Encodes one camera of one episode: its episodes-parquet columns and its stats."""
    camera = key.removeprefix(CAMERA_KEY.format(camera=""))
    paths = [keyframes.path(row.frames[camera]) for row in rows]
    if None in paths:
        raise FileNotFoundError(f"a {camera} frame of episode {case.episode_id} left the keyframe store during "
                                f"the export (step {paths.index(None)}, {rows[paths.index(None)].frames[camera]})")
    try:
        columns = videos.add_episode(paths)
    except ValueError as exc:
        raise IncompatibleEpisodes(f"episode {case.episode_id}, camera {camera}: {exc}") from exc
    # LeRobot's stats of a video come from the frames it encoded, not from the decoded video.
    return columns, lerobot_stats.image_stats(len(paths), lambda i: _image(paths[i]))


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
    # LeRobot's writer stacks the timestamps it computed in Python (float64) for the stats and stores
    # them as float32; every other feature's stats see the stored dtype.
    stats = {key: lerobot_stats.vector_stats(frame_index / fps if key == "timestamp" else value)
             for key, value in values.items()}
    columns: dict[str, pa.Array] = {}
    for key, value in values.items():
        if value.ndim == 1:
            columns[key] = pa.array(value)
        else:
            columns[key] = pa.FixedSizeListArray.from_arrays(pa.array(value.reshape(-1)), value.shape[1])
    count = _ImageCount()
    if layout.image_shape is not None:
        cells, held = _held_keyframes(rows, keyframes, layout.image_shape, count)
        columns[IMAGE_KEY] = pa.array(cells, type=_IMAGE_TYPE)
        stats[IMAGE_KEY] = lerobot_stats.image_stats(n, held.__getitem__)
    return columns, stats, count


def _held_keyframes(rows: list[StepRow], keyframes: Keyframes, shape: tuple[int, int, int],
                    count: _ImageCount) -> tuple[list[dict], list[np.ndarray]]:
    """Per frame the latest keyframe at or before it (the first one before that): as PNG bytes, and as pixels."""
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
        return [{"bytes": buffer.getvalue(), "path": None}] * len(rows), [black] * len(rows)
    cells, pixels = [], []
    position, held = 0, found[0]
    for row in rows:
        while position < len(found) and found[position][0] <= row.t:
            held = found[position]
            position += 1
        cells.append(held[1])
        pixels.append(held[2])
    return cells, pixels


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
    stored = {key: ft for key, ft in features.items() if ft["dtype"] != "video"}  # videos hold their frames
    fields = [pa.field(key, _arrow_type(ft)) for key, ft in stored.items()]
    hf = {"info": {"features": {key: _hf_feature(ft) for key, ft in stored.items()}}}
    return pa.schema(fields, metadata={"huggingface": json.dumps(hf)})


def _episode_row(case: HardCase, episode_index: int, task: str, length: int, first_index: int, video_columns: dict,
                 stats: dict[str, dict[str, np.ndarray]]) -> dict:
    row = {
        "episode_index": episode_index, "tasks": [task], "length": length,
        "data/chunk_index": 0, "data/file_index": 0,
        "dataset_from_index": first_index, "dataset_to_index": first_index + length,
        **video_columns,
    }
    for key, feature_stats in stats.items():
        for name, value in feature_stats.items():
            row[f"stats/{key}/{name}"] = value.tolist()
    row.update({
        "meta/episodes/chunk_index": 0, "meta/episodes/file_index": 0,
        "episode_id": case.episode_id, "scenario_id": case.scenario_id, "model_id": case.model_id,
        "kind": case.kind, "failure_types": case.failure_types, "success": case.success,
        "termination": case.termination,
    })
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
