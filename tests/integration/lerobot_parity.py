"""Checks SEPA-Eval's LeRobot export against LeRobot 0.6.1 itself, in two halves.

tests/integration/test_lerobot_export.py runs the project side in the test process (``export_both``)
and this file, as a script, in the LeRobot venv (``sepa-eval lerobot setup``) for the other half:

    <LeRobot venv>/bin/python tests/integration/lerobot_parity.py --lerobot-side WORK

Project side (this venv): stores failed episodes in a chDB evidence store and exports them twice with
``consumers.exports.lerobot.export_lerobot``:
  A. episodes recorded with two cameras (tests/unit/consumers/exports/camera_world.py; agentview 240x320,
     big enough for LeRobot's stats to downsample it, and a 48x64 wrist camera; one episode of 130
     steps, so LeRobot's stats sample 100 of its frames) -> video features;
  B. the hard-case world without cameras (hard_case_world.py) -> the keyframe image feature.
It writes, per export, what a recorder would have handed LeRobot (the raw arrays read back from the store
and the raw PNG of every frame) to manifest.json.

LeRobot side (the LeRobot venv, HF_HUB_OFFLINE=1; it imports LeRobot, numpy and pyarrow only):
  1. records the same episodes with LeRobot's own writer (LeRobotDataset.create, add_frame, save_episode)
     and compares: meta/stats.json, every per-episode ``stats/...`` column, the LeRobot columns of the
     episodes parquet (video chunk/file/from/to timestamps included), info.json's features (the video
     ``info`` blocks included), the data parquet's LeRobot columns, and the video files byte for byte;
  2. runs compute_stats.compute_episode_stats over the raw frames and arrays and folds the episodes with
     aggregate_stats as LeRobotDatasetMetadata.save_episode does, and compares with the export's stats;
  3. loads the export with LeRobotDataset(video_backend="pyav") and decodes frames of two episodes
     (first, middle, last), comparing them with the raw PNGs (AV1 is lossy: mean absolute error) and
     with the same frames decoded from LeRobot's own recording.
Prints the measured differences; exits 1 when a check fails.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

STATS_RTOL = 1e-6  # the brief's bar; the port aims at equal bits
FRAME_MAE = 0.03  # in [0, 1]: smooth pictures through AV1 at crf 30 come back within a few levels


# --- project side -----------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def export_both(work: Path, chdb) -> None:
    """The two exports and WORK/manifest.json for the LeRobot side; ``chdb`` is a ClickHouseStore
    (one chDB path per process: the tests' own)."""
    sys.path.insert(0, str(ROOT / "tests" / "unit" / "consumers" / "exports"))
    from camera_world import camera_world_events
    from hard_case_world import world_events

    from consumers.evidence.store import migrate
    from consumers.exports.lerobot import DEFAULT_FPS, export_lerobot
    from consumers.exports.output import ExportFilters, Keyframes
    from consumers.exports.queries import episode_steps, hard_cases
    from tests.store_events import store_events

    manifest = {"fps": DEFAULT_FPS, "exports": {}}
    scenarios = {
        "video": lambda root: camera_world_events(root, [12, 130, 25], {"agentview": (240, 320),
                                                                         "robot0_eye_in_hand": (48, 64)}),
        "keyframe": lambda root: world_events(root),
    }
    for name, make in scenarios.items():
        store = chdb.with_database(f"parity_{name}_{work.name[-8:]}".replace("-", "_"))
        migrate(store)
        keyframe_root = work / name / "keyframes"
        _, events = make(keyframe_root)
        store_events(store, events)
        out = work / name / "export"
        summary = export_lerobot(store, out, keyframe_root, ExportFilters(include_recovered=True))
        print(f"[project] {name}: exported {summary.episodes} episodes, {summary.frames} frames to {out}")
        cases = [c for c in hard_cases(store, include_recovered=True) if c.episode_id not in summary.skipped]
        steps = episode_steps(store, [c.episode_id for c in cases])
        keyframes = Keyframes(keyframe_root)
        episodes = []
        for case in cases:
            rows = steps[case.episode_id]
            episode = {
                "task": case.instruction or case.scenario.get("env_name") or case.scenario_id,
                "observation.state": [s.joint_pos + s.eef_pos + s.eef_quat + [s.gripper_opening] for s in rows],
                "action": [s.action for s in rows],
                "next.reward": [s.reward for s in rows],
                "observation.environment_state": [s.object_poses[0]["pos"] + s.object_poses[0]["quat"]
                                                  if s.object_poses else None for s in rows],
                "cameras": {camera: [str(keyframes.path(s.frames[camera])) for s in rows]
                            for camera in rows[0].frames},
                # the keyframe each frame holds: the latest at or before it, else the first one after
                "keyframes": _held([str(p) if (p := keyframes.path(s.keyframe_sha256)) else None for s in rows]),
            }
            episodes.append(episode)
        manifest["exports"][name] = {"root": str(out), "episodes": episodes}
    (work / "manifest.json").write_text(json.dumps(manifest))


def _held(paths: list[str | None]) -> list[str | None]:
    found = [(t, p) for t, p in enumerate(paths) if p]
    if not found:
        return [None] * len(paths)
    held, position, out = found[0][1], 0, []
    for t in range(len(paths)):
        while position < len(found) and found[position][0] <= t:
            held = found[position][1]
            position += 1
        out.append(held)
    return out


# --- LeRobot side -----------------------------------------------------------------------------------

class Report:
    def __init__(self):
        self.failures: list[str] = []

    def check(self, ok: bool, what: str) -> None:
        print(("  ok    " if ok else "  FAIL  ") + what)
        if not ok:
            self.failures.append(what)


def lerobot_side(work: Path) -> int:
    import logging

    logging.disable(logging.WARNING)  # torchcodec's "cannot load" traceback: pyav decodes here
    manifest = json.loads((work / "manifest.json").read_text())
    report = Report()
    for name, export in manifest["exports"].items():
        print(f"[lerobot] {name} export at {export['root']}")
        root = Path(export["root"])
        reference = work / name / "lerobot-recorded"
        record_with_lerobot(root, reference, export["episodes"], manifest["fps"], name == "video")
        compare_with_recording(root, reference, report)
        compare_with_compute_stats(root, export["episodes"], manifest["fps"], report)
        if name == "video":
            decode_export(root, reference, export["episodes"], report)
    print("all checks passed" if not report.failures else f"{len(report.failures)} checks failed")
    return 1 if report.failures else 0


def _features(root: Path) -> dict:
    return json.loads((root / "meta" / "info.json").read_text())["features"]


def _frame_arrays(episode: dict, key: str, t: int):
    import numpy as np
    from PIL import Image

    if key == "observation.images.keyframe":
        path = episode["keyframes"][t]
        return None if path is None else np.asarray(Image.open(path).convert("RGB"))
    camera = key.removeprefix("observation.images.")
    return np.asarray(Image.open(episode["cameras"][camera][t]).convert("RGB"))


def record_with_lerobot(export_root: Path, reference: Path, episodes: list[dict], fps: int, videos: bool) -> None:
    """The same episodes through LeRobot's writer, with the export's own feature list."""
    import shutil

    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    shutil.rmtree(reference, ignore_errors=True)
    defaults = {"timestamp", "frame_index", "episode_index", "index", "task_index"}
    features = {k: {kk: vv for kk, vv in ft.items() if kk != "info"}
                for k, ft in _features(export_root).items() if k not in defaults}
    info = json.loads((export_root / "meta" / "info.json").read_text())
    dataset = LeRobotDataset.create(repo_id="verify/recorded", fps=fps, features=features, root=reference,
                                    robot_type=info["robot_type"], use_videos=videos)
    for episode in episodes:
        black = None
        for t in range(len(episode["action"])):
            frame = {"task": episode["task"]}
            for key, ft in features.items():
                if ft["dtype"] in ("image", "video"):
                    pixels = _frame_arrays(episode, key, t)
                    if pixels is None:
                        black = black if black is not None else np.zeros(ft["shape"], dtype=np.uint8)
                        pixels = black
                    frame[key] = pixels
                elif key == "next.reward":
                    frame[key] = np.array([episode[key][t]], dtype=np.float32)
                else:
                    frame[key] = np.array(episode[key][t], dtype=np.float32)
            dataset.add_frame(frame)
        dataset.save_episode()
    dataset.finalize()


def _max_diffs(ours, theirs) -> tuple[float, float]:
    import numpy as np

    a, b = np.asarray(ours, dtype=np.float64), np.asarray(theirs, dtype=np.float64)
    if a.shape != b.shape:
        return float("inf"), float("inf")
    diff = np.abs(a - b)
    return float(diff.max(initial=0.0)), float((diff / np.maximum(np.abs(b), 1e-12)).max(initial=0.0))


def _compare_stats(ours: dict, theirs: dict, what: str, report: Report) -> None:
    worst_abs, worst_rel, where, bad = 0.0, 0.0, "", []
    for key in sorted(set(ours) | set(theirs)):
        if key not in ours or key not in theirs:
            bad.append(f"{key} only in {'ours' if key in ours else 'theirs'}")
            continue
        for stat in sorted(set(ours[key]) | set(theirs[key])):
            absolute, relative = _max_diffs(ours[key].get(stat), theirs[key].get(stat))
            if relative > worst_rel:
                worst_abs, worst_rel, where = absolute, relative, f"{key}/{stat}"
            if not relative <= STATS_RTOL:
                bad.append(f"{key}/{stat} rel {relative:.3g}")
    report.check(not bad, f"{what}: max abs diff {worst_abs:.3g}, max rel diff {worst_rel:.3g}"
                 + (f" at {where}" if where else "") + (f"; {bad[:5]}" if bad else ""))


def _episodes(root: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(root / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()


def _episode_stats(row: dict) -> dict:
    stats: dict = {}
    for column, value in row.items():
        if column.startswith("stats/"):
            _, key, stat = column.split("/")
            stats.setdefault(key, {})[stat] = value
    return stats


def compare_with_recording(root: Path, reference: Path, report: Report) -> None:
    import hashlib

    import numpy as np
    import pyarrow.parquet as pq

    ours_info = json.loads((root / "meta" / "info.json").read_text())
    ref_info = json.loads((reference / "meta" / "info.json").read_text())
    report.check(ours_info["features"] == ref_info["features"],
                 "info.json features (video info blocks included) equal LeRobot's")
    same = [k for k in ref_info if k != "features" and ours_info.get(k) == ref_info[k]]
    report.check(set(same) == set(ref_info) - {"features"},
                 f"info.json other fields equal LeRobot's (differ: {sorted(set(ref_info) - set(same) - {'features'})})")
    _compare_stats(json.loads((root / "meta" / "stats.json").read_text()),
                   json.loads((reference / "meta" / "stats.json").read_text()),
                   "stats.json vs LeRobot's recording", report)
    ours_eps, ref_eps = _episodes(root), _episodes(reference)
    report.check(len(ours_eps) == len(ref_eps), f"{len(ours_eps)} episodes, LeRobot recorded {len(ref_eps)}")
    lerobot_columns = [c for c in ref_eps[0] if not c.startswith("stats/")]
    differing = sorted({c for o, r in zip(ours_eps, ref_eps, strict=True) for c in lerobot_columns
                        if o.get(c) != r[c]})
    report.check(not differing, f"episodes parquet LeRobot columns ({len(lerobot_columns)}) equal"
                 + (f"; differ: {differing}" if differing else ""))
    for index, (o, r) in enumerate(zip(ours_eps, ref_eps, strict=True)):
        _compare_stats(_episode_stats(o), _episode_stats(r), f"episode {index} stats/... columns", report)
    ours_data = pq.read_table(root / "data" / "chunk-000" / "file-000.parquet")
    ref_data = pq.read_table(reference / "data" / "chunk-000" / "file-000.parquet")
    report.check(set(ours_data.column_names) == set(ref_data.column_names), "data parquet has LeRobot's columns")
    for column in ref_data.column_names:
        if column.startswith("observation.images."):
            from io import BytesIO

            from PIL import Image

            ours_px = [np.asarray(Image.open(BytesIO(c["bytes"]))) for c in ours_data.column(column).to_pylist()]
            ref_px = [np.asarray(Image.open(BytesIO(c["bytes"]))) for c in ref_data.column(column).to_pylist()]
            report.check(all((a == b).all() for a, b in zip(ours_px, ref_px, strict=True)),
                         f"data {column}: every frame's pixels equal LeRobot's")
        else:
            equal = ours_data.column(column).to_pylist() == ref_data.column(column).to_pylist()
            report.check(equal, f"data {column} equals LeRobot's")
    for video in sorted((reference / "videos").glob("*/chunk-*/file-*.mp4")) if (reference / "videos").exists() else []:
        ours = root / video.relative_to(reference)
        same_bytes = ours.exists() and hashlib.sha256(ours.read_bytes()).digest() == \
            hashlib.sha256(video.read_bytes()).digest()
        report.check(same_bytes, f"{video.relative_to(reference)} byte-identical to LeRobot's "
                     f"({video.stat().st_size} bytes)")


def compare_with_compute_stats(root: Path, episodes: list[dict], fps: int, report: Report) -> None:
    """compute_episode_stats over the raw data, folded with aggregate_stats as save_episode folds them."""
    import numpy as np
    from lerobot.datasets.compute_stats import aggregate_stats, compute_episode_stats

    features = _features(root)
    scratch = Path(tempfile.mkdtemp())
    dataset_stats, total, all_episode_stats = None, 0, []
    for index, episode in enumerate(episodes):
        n = len(episode["action"])
        data = {}
        for key, ft in features.items():
            if ft["dtype"] in ("image", "video"):
                if key == "observation.images.keyframe":
                    paths = []
                    for t, path in enumerate(episode["keyframes"]):
                        if path is None:  # the black frame the export holds: a PNG, as LeRobot would write it
                            from PIL import Image

                            path = str(scratch / f"black-{index}-{t}.png")
                            Image.fromarray(np.zeros(ft["shape"], dtype=np.uint8)).save(path)
                        paths.append(path)
                    data[key] = paths
                else:
                    data[key] = episode["cameras"][key.removeprefix("observation.images.")]
            elif key == "timestamp":
                data[key] = np.stack([t / fps for t in range(n)])
            elif key == "frame_index":
                data[key] = np.stack(list(range(n)))
            elif key == "index":
                data[key] = np.arange(total, total + n)
            elif key == "episode_index":
                data[key] = np.full((n,), index)
            elif key == "task_index":
                data[key] = None  # filled below from the export's own tasks (same order as LeRobot's)
            elif key == "next.reward":
                data[key] = np.stack([np.array([r], dtype=np.float32) for r in episode[key]]).reshape(n)
            else:
                data[key] = np.stack([np.array(v, dtype=np.float32) for v in episode[key]])
        import pandas as pd

        tasks = pd.read_parquet(root / "meta" / "tasks.parquet")
        data["task_index"] = np.array([int(tasks.loc[episode["task"]].task_index)] * n)
        stats = compute_episode_stats(data, features)
        all_episode_stats.append(stats)
        dataset_stats = aggregate_stats([dataset_stats, stats]) if dataset_stats is not None else stats
        total += n
        ours = _episode_stats(_episodes(root)[index])
        _compare_stats(ours, {k: {s: v.tolist() for s, v in st.items()} for k, st in stats.items()},
                       f"episode {index} stats vs compute_episode_stats", report)
    serial = {k: {s: v.tolist() for s, v in st.items()} for k, st in dataset_stats.items()}
    ours = json.loads((root / "meta" / "stats.json").read_text())
    _compare_stats(ours, serial, "stats.json vs compute_episode_stats + aggregate_stats (folded)", report)
    at_once = aggregate_stats(all_episode_stats)
    _compare_stats(ours, {k: {s: v.tolist() for s, v in st.items()} for k, st in at_once.items()},
                   "stats.json vs aggregate_stats over all episodes at once (rounding only)", report)


def decode_export(root: Path, reference: Path, episodes: list[dict], report: Report) -> None:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ours = LeRobotDataset(repo_id="verify/export", root=root, video_backend="pyav")
    theirs = LeRobotDataset(repo_id="verify/recorded", root=reference, video_backend="pyav")
    total = sum(len(e["action"]) for e in episodes)
    report.check(len(ours) == total and ours.num_episodes == len(episodes),
                 f"LeRobotDataset loads the export: {len(ours)} frames, {ours.num_episodes} episodes")
    keys = [k for k, ft in ours.meta.features.items() if ft["dtype"] == "video"]
    start = 0
    for index, episode in enumerate(episodes):
        n = len(episode["action"])
        if index in (1, len(episodes) - 1):  # two episodes, neither of them the first in its video file
            for t in (0, n // 2, n - 1):
                item, ref_item = ours[start + t], theirs[start + t]
                for key in keys:
                    decoded = item[key].numpy()  # (3, H, W) float32 in [0, 1]
                    raw = _frame_arrays(episode, key, t).transpose(2, 0, 1) / 255.0
                    mae = float(np.abs(decoded - raw).mean()) if decoded.shape == raw.shape else float("inf")
                    same = np.array_equal(decoded, ref_item[key].numpy())
                    report.check(decoded.shape == raw.shape and mae < FRAME_MAE and same,
                                 f"episode {index} frame {t} {key}: shape {tuple(decoded.shape)}, mean abs error "
                                 f"{mae:.4f} vs the raw PNG, {'equal to' if same else 'DIFFERENT from'} LeRobot's "
                                 "recording decoded")
                state = item["observation.state"].numpy()
                report.check(np.array_equal(state, np.array(episode["observation.state"][t], dtype=np.float32)),
                             f"episode {index} frame {t} observation.state as stored")
        start += n


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--lerobot-side":
        sys.exit("usage: <LeRobot venv>/bin/python tests/integration/lerobot_parity.py --lerobot-side WORK")
    sys.exit(lerobot_side(Path(sys.argv[2])))
