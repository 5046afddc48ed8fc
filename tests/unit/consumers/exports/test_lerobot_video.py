"""Camera frames in the LeRobot export: the video encoding (consumers.exports.lerobot_video) decoded back
with PyAV, and the export of episodes recorded with cameras on a real chDB store, read back and checked
against LeRobot 0.6.1's layout (videos/<key>/chunk-*/file-*.mp4, the episodes parquet's videos/ columns,
the video feature's info block) and stats rules."""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
import pytest
from camera_world import CAMERAS, camera_world_events, picture
from PIL import Image
from test_hard_case_exports import check_lerobot_v3

from consumers.exports import lerobot_video
from consumers.exports.exceptions import IncompatibleEpisodes
from consumers.exports.lerobot import export_lerobot
from tests.store_events import store_events

FPS = 20
MAX_MEAN_ABS_ERROR = 6.0  # of 255: smooth pictures come back from AV1 at crf 30 within a few levels


def _pngs(directory: Path, count: int, height: int = 48, width: int = 64, seed: int = 0) -> list[Path]:
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for t in range(count):
        path = directory / f"frame-{t:06d}.png"
        Image.fromarray(picture(rng, height, width, t)).save(path)
        paths.append(path)
    return paths


def _decode(path: Path, start_s: float = 0.0, end_s: float = float("inf")) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(stream)
                if start_s - 1e-4 <= float(frame.pts * stream.time_base) < end_s - 1e-4]


def _mean_abs_error(decoded: list[np.ndarray], raw: list[np.ndarray]) -> float:
    return float(np.mean([np.abs(d.astype(np.int16) - r.astype(np.int16)).mean() for d, r in zip(decoded, raw,
                                                                                                strict=True)]))


# --- encoding -----------------------------------------------------------------------------------------

def test_encoded_frames_decode_back_close_with_lerobot_settings(tmp_path):
    frames = _pngs(tmp_path / "frames", 9)
    video = tmp_path / "episode.mp4"
    lerobot_video.encode_frames(frames, video, FPS)
    decoded = _decode(video)
    assert len(decoded) == 9 and decoded[0].shape == (48, 64, 3)
    assert _mean_abs_error(decoded, [np.asarray(Image.open(p)) for p in frames]) < MAX_MEAN_ABS_ERROR
    with av.open(str(video)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name in ("libdav1d", "libaom-av1", "av1")
                and stream.codec.canonical_name == "av1" and stream.pix_fmt == "yuv420p")
        keyframes = [packet.is_keyframe for packet in container.demux(stream) if packet.size]
    assert keyframes == [t % 2 == 0 for t in range(9)]  # g=2: a keyframe every other frame
    assert lerobot_video.duration_s(video) == pytest.approx(9 / FPS)


def test_video_info_is_lerobots_info_block(tmp_path):
    video = tmp_path / "v.mp4"
    lerobot_video.encode_frames(_pngs(tmp_path / "f", 3, height=32, width=48), video, 15)
    assert lerobot_video.video_info(video) == {
        "video.height": 32, "video.width": 48, "video.codec": "av1", "video.pix_fmt": "yuv420p", "video.fps": 15,
        "video.channels": 3, "has_audio": False, "video.g": 2, "video.crf": 30, "video.preset": 12,
        "video.fast_decode": 0, "video.video_backend": "pyav", "video.extra_options": {}, "is_depth_map": False}


def test_a_frame_of_another_size_is_refused(tmp_path):
    frames = _pngs(tmp_path / "a", 2) + _pngs(tmp_path / "b", 1, height=32, width=32)
    with pytest.raises(ValueError, match=r"frame-000000\.png is 32x32.*64x48"):
        lerobot_video.encode_frames(frames, tmp_path / "v.mp4", FPS)


def test_episodes_share_a_file_with_running_timestamps(tmp_path):
    lengths = [5, 8, 3]
    episodes = [_pngs(tmp_path / f"ep{i}", n, seed=i) for i, n in enumerate(lengths)]
    (tmp_path / "scratch").mkdir()
    videos = lerobot_video.CameraVideos(tmp_path / "out", "observation.images.cam", FPS, tmp_path / "scratch")
    columns = [videos.add_episode(frames) for frames in episodes]
    videos.close()
    prefix = "videos/observation.images.cam/"
    assert [(c[prefix + "chunk_index"], c[prefix + "file_index"]) for c in columns] == [(0, 0)] * 3
    bounds = [(c[prefix + "from_timestamp"], c[prefix + "to_timestamp"]) for c in columns]
    assert np.allclose(bounds, [(0.0, 0.25), (0.25, 0.65), (0.65, 0.8)], atol=1e-9)
    path = tmp_path / "out" / "videos" / "observation.images.cam" / "chunk-000" / "file-000.mp4"
    assert len(_decode(path)) == sum(lengths) and not list((tmp_path / "scratch").iterdir())
    # Each episode's frames sit between its timestamps, in order.
    for frames, (start, end) in zip(episodes, bounds, strict=True):
        decoded = _decode(path, start, end)
        assert len(decoded) == len(frames)
        assert _mean_abs_error(decoded, [np.asarray(Image.open(p)) for p in frames]) < MAX_MEAN_ABS_ERROR
    assert videos.info["video.width"] == 64 and videos.info["video.height"] == 48


def test_a_full_file_moves_on_to_the_next_file_and_chunk(tmp_path):
    (tmp_path / "scratch").mkdir()
    videos = lerobot_video.CameraVideos(tmp_path / "out", "k", FPS, tmp_path / "scratch", files_size_in_mb=1e-9,
                                        chunks_size=2)
    columns = [videos.add_episode(_pngs(tmp_path / f"ep{i}", 2, seed=i)) for i in range(3)]
    videos.close()
    assert [(c["videos/k/chunk_index"], c["videos/k/file_index"], c["videos/k/from_timestamp"]) for c in columns] \
        == [(0, 0, 0.0), (0, 1, 0.0), (1, 0, 0.0)]
    files = sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.mp4"))
    assert files == ["videos/k/chunk-000/file-000.mp4", "videos/k/chunk-000/file-001.mp4",
                     "videos/k/chunk-001/file-000.mp4"]


# --- the export -----------------------------------------------------------------------------------------

def test_episodes_with_camera_frames_export_as_lerobot_videos(store, tmp_path):
    world, events = camera_world_events(tmp_path / "keyframes", [6, 11, 4])
    store_events(store, events)
    out = tmp_path / "lerobot"
    summary = export_lerobot(store, out, world.keyframes, fps=FPS)
    assert summary.episodes == 3 and summary.frames == 21 and not summary.skipped
    info = check_lerobot_v3(out)
    assert info["video_path"] == "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
    videos = {k: ft for k, ft in info["features"].items() if ft["dtype"] == "video"}
    assert set(videos) == {f"observation.images.{camera}" for camera in CAMERAS}
    assert "observation.images.keyframe" not in info["features"]  # frames win over keyframes
    for camera, (height, width) in CAMERAS.items():
        feature = videos[f"observation.images.{camera}"]
        assert feature["shape"] == [height, width, 3] and feature["names"] == ["height", "width", "channels"]
        assert feature["info"]["video.codec"] == "av1" and feature["info"]["video.fps"] == FPS
        assert (feature["info"]["video.height"], feature["info"]["video.width"]) == (height, width)
        assert feature["info"]["video.g"] == 2 and feature["info"]["video.crf"] == 30
        assert feature["info"]["is_depth_map"] is False
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # the scratch videos are gone

    episodes = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pylist()
    stats = json.loads((out / "meta" / "stats.json").read_text())
    for camera in CAMERAS:
        key = f"observation.images.{camera}"
        path = out / info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        assert len(_decode(path)) == 21
        for episode in episodes:
            assert (episode[f"videos/{key}/chunk_index"], episode[f"videos/{key}/file_index"]) == (0, 0)
            start, end = episode[f"videos/{key}/from_timestamp"], episode[f"videos/{key}/to_timestamp"]
            assert end - start == pytest.approx(episode["length"] / FPS)
            raw = [np.asarray(Image.open(world.keyframes / sha[:2] / f"{sha}.png"))
                   for sha in world.frames[episode["episode_id"]][camera]]
            decoded = _decode(path, start, end)
            assert len(decoded) == episode["length"]
            assert _mean_abs_error(decoded, raw) < MAX_MEAN_ABS_ERROR
            # Stats of the raw frames (every frame sampled below 100), per channel in [0, 1].
            pixels = np.stack(raw).reshape(-1, 3) / 255.0
            assert np.allclose(np.ravel(episode[f"stats/{key}/mean"]), pixels.mean(axis=0), atol=1e-5)
            assert np.allclose(np.ravel(episode[f"stats/{key}/max"]), pixels.max(axis=0), atol=1e-6)
            assert episode[f"stats/{key}/count"] == [episode["length"]]
        # The dataset's quantiles: the count-weighted mean of the episodes' (LeRobot 0.6.1).
        counts = np.array([e[f"stats/{key}/count"][0] for e in episodes], dtype=np.float64)
        for q in ("q01", "q50", "q99"):
            per_episode = np.array([np.ravel(e[f"stats/{key}/{q}"]) for e in episodes])
            assert np.allclose(np.ravel(stats[key][q]), counts @ per_episode / counts.sum(), rtol=1e-9)


def test_episodes_with_and_without_frames_are_refused_together(store, tmp_path):
    filmed, filmed_events = camera_world_events(tmp_path / "keyframes", [4], seed=21)
    blind, blind_events = camera_world_events(tmp_path / "keyframes", [4], cameras={}, seed=22)
    store_events(store, filmed_events + blind_events)
    with pytest.raises(IncompatibleEpisodes) as raised:
        export_lerobot(store, tmp_path / "out", tmp_path / "keyframes")
    assert filmed.episode_ids[0] in str(raised.value) and blind.episode_ids[0] in str(raised.value)
    assert "no camera frames" in str(raised.value)


def test_different_cameras_are_refused_together(store, tmp_path):
    _, first = camera_world_events(tmp_path / "keyframes", [3], cameras={"agentview": (32, 32)}, seed=31)
    _, second = camera_world_events(tmp_path / "keyframes", [3], cameras={"frontview": (32, 32)}, seed=32)
    store_events(store, first + second)
    with pytest.raises(IncompatibleEpisodes, match="agentview.*frontview|frontview.*agentview"):
        export_lerobot(store, tmp_path / "out", tmp_path / "keyframes")


def test_an_episode_missing_a_frame_file_is_left_out_and_reported(store, tmp_path):
    world, events = camera_world_events(tmp_path / "keyframes", [5, 5])
    store_events(store, events)
    pruned_episode = world.episode_ids[0]
    pruned = world.frames[pruned_episode]["agentview"][3]
    (world.keyframes / pruned[:2] / f"{pruned}.png").unlink()
    summary = export_lerobot(store, tmp_path / "out", world.keyframes)
    assert set(summary.skipped) == {pruned_episode} and pruned in summary.skipped[pruned_episode]
    assert "not in the keyframe store" in summary.skipped[pruned_episode]
    info = check_lerobot_v3(tmp_path / "out")
    assert info["total_episodes"] == 1 and info["total_frames"] == 5
