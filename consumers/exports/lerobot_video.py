"""Camera frames as LeRobot v3.0 videos, encoded as LeRobot 0.6.1's own writer encodes them.

Followed from huggingface/lerobot v0.6.1 (``src/lerobot/``):
- ``configs/video.py``: ``rgb_encoder_defaults()`` = ``RGBEncoderConfig()`` (libsvtav1, yuv420p, g=2,
  crf=30, preset ``LIBSVTAV1_DEFAULT_PRESET`` = 12, fast_decode=0, backend pyav, no extra options) and
  ``VideoEncoderConfig.get_codec_options(None, as_strings=True)`` -> ``CODEC_OPTIONS``.
- ``datasets/video_utils.py``: ``encode_video_frames`` (each PNG opened with PIL, ``convert("RGB")``,
  ``av.VideoFrame.from_image``, one stream at the integer fps, flushed at the end) -> ``encode_frames``;
  ``get_video_duration_in_s`` -> ``duration_s``; ``concatenate_video_files`` (the concat demuxer, packets
  remuxed without re-encoding, ``movflags=faststart``) -> ``concatenate``; ``get_video_info`` with the
  RGB encoder config -> ``video_info``.
- ``datasets/dataset_writer.py`` ``_save_episode_video``: each episode is encoded on its own; the first
  episode of a file is moved there as is, later ones are appended while the file plus the episode stay
  under ``video_files_size_in_mb``; ``from_timestamp`` is the previous episode's ``to_timestamp`` (0 in a
  new file) and ``to_timestamp`` adds the episode video's own duration -> ``CameraVideos``.

One difference, on purpose: LeRobot appends each episode to the file right away (re-muxing the whole
file every episode); ``CameraVideos`` keeps a file's episodes apart and concatenates them once, when the
file is full or the export ends, so it decides "full" on the sum of the episode files' sizes, which
is a few hundred bytes per episode above the concatenated file's size.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import av
from PIL import Image

VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"  # DEFAULT_VIDEO_PATH
VIDEO_FILES_SIZE_IN_MB = 200  # DEFAULT_VIDEO_FILE_SIZE_IN_MB
CHUNKS_SIZE = 1000  # DEFAULT_CHUNK_SIZE

VCODEC = "libsvtav1"
PIX_FMT = "yuv420p"
# RGBEncoderConfig() as LeRobot 0.6.1 builds it; the order is asdict()'s, which get_video_info keeps.
ENCODER_FIELDS = {"g": 2, "crf": 30, "preset": 12, "fast_decode": 0, "video_backend": "pyav", "extra_options": {}}
# get_codec_options(encoder_threads=None, as_strings=True) for libsvtav1: no "lp", so SVT picks its threads.
CODEC_OPTIONS = {"g": "2", "crf": "30", "preset": "12", "svtav1-params": "fast-decode=0"}


@contextmanager
def own_scheduling() -> Iterator[None]:
    """Keeps the calling thread's scheduling policy across an SVT-AV1 encoder's life. Run as root,
    SVT-AV1 asks for real-time threads and leaves the thread that opened the encoder at SCHED_FIFO,
    priority 99; every process started from it afterwards (a broker, a worker pool, a policy
    server) inherited that and starved the machine's other processes."""
    if not hasattr(os, "sched_getscheduler"):  # not Linux: nothing of the kind to undo
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority) != (policy, param.sched_priority):
            os.sched_setscheduler(0, policy, param)


def encode_frames(frames: Sequence[Path], path: Path, fps: int) -> None:
    """encode_video_frames: the PNGs, in order, as one AV1 stream in an MP4 at ``fps``."""
    if not frames:
        raise ValueError(f"no frames to encode into {path}")
    with Image.open(frames[0]) as first:
        width, height = first.size
    path.parent.mkdir(parents=True, exist_ok=True)
    with own_scheduling(), av.open(str(path), "w") as output:
        stream = output.add_stream(VCODEC, fps, options=CODEC_OPTIONS)
        stream.pix_fmt = PIX_FMT
        stream.width = width
        stream.height = height
        for frame_path in frames:
            with Image.open(frame_path) as image:
                if image.size != (width, height):
                    # LeRobot's validate_frame would refuse it: a video feature has one shape.
                    raise ValueError(f"frame {frame_path} is {image.size[0]}x{image.size[1]}, the video's first "
                                     f"frame {frames[0]} is {width}x{height}")
                frame = av.VideoFrame.from_image(image.convert("RGB"))
            for packet in stream.encode(frame):
                output.mux(packet)
        for packet in stream.encode():
            output.mux(packet)


def duration_s(path: Path) -> float:
    """get_video_duration_in_s: the video stream's duration, else the container's."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        if stream.duration is not None:
            return float(stream.duration * stream.time_base)
        return float(container.duration / av.time_base)


def concatenate(inputs: Sequence[Path], output: Path) -> None:
    """concatenate_video_files: the inputs' packets, in order, in one MP4 (no re-encoding)."""
    if not inputs:
        raise ValueError(f"no videos to concatenate into {output}")
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        listing = Path(scratch) / "inputs.ffconcat"
        # ffconcat quotes with '...': a quote inside a path is closed, escaped and reopened.
        lines = ["ffconcat version 1.0"] + [
            "file '" + str(Path(p).resolve()).replace("'", "'\\''") + "'" for p in inputs]
        listing.write_text("\n".join(lines) + "\n")
        joined = Path(scratch) / "joined.mp4"
        with av.open(str(listing), "r", format="concat", options={"safe": "0"}) as source, \
                av.open(str(joined), "w", options={"movflags": "faststart"}) as target:
            streams = {}
            for stream in source.streams:
                if stream.type in ("video", "audio", "subtitle"):
                    streams[stream.index] = target.add_stream_from_template(template=stream, opaque=True)
                    # The codec context has no time base; without it the packets' timestamps are misread.
                    streams[stream.index].time_base = stream.time_base
            for packet in source.demux():
                if packet.stream.index not in streams or packet.dts is None:  # dts None: a flushing packet
                    continue
                packet.stream = streams[packet.stream.index]
                target.mux(packet)
        shutil.move(joined, output)


def video_info(path: Path) -> dict:
    """get_video_info(path, rgb_encoder_defaults()): the ``info`` block of a video feature in info.json."""
    with av.open(str(path), "r") as container:
        stream = container.streams.video[0]
        info = {"video.height": stream.height, "video.width": stream.width,
                "video.codec": stream.codec.canonical_name, "video.pix_fmt": stream.pix_fmt,
                "video.fps": int(stream.base_rate), "video.channels": len(av.VideoFormat(stream.pix_fmt).components)}
    info["has_audio"] = False  # get_audio_info: encode_frames writes no audio stream
    for name, value in ENCODER_FIELDS.items():
        info.setdefault(f"video.{name}", value)
    info["is_depth_map"] = False
    return info


class CameraVideos:
    """One camera's episodes in ``videos/<key>/chunk-*/file-*.mp4``, as ``_save_episode_video`` lays them out."""

    def __init__(self, root: Path, key: str, fps: int, scratch: Path,
                 files_size_in_mb: float = VIDEO_FILES_SIZE_IN_MB, chunks_size: int = CHUNKS_SIZE):
        self.root, self.key, self.fps, self.scratch = root, key, fps, scratch
        self.files_size_in_mb, self.chunks_size = files_size_in_mb, chunks_size
        self.info: dict | None = None  # video_info of the first episode, as LeRobot probes it
        self._episodes = 0
        self._file: tuple[int, int] | None = None  # (chunk_index, file_index) being filled
        self._pending: list[Path] = []  # that file's episode videos, not concatenated yet
        self._pending_mb = 0.0
        self._to_timestamp = 0.0

    def add_episode(self, frames: Sequence[Path]) -> dict:
        """Encodes one episode; returns its ``videos/<key>/...`` columns of the episodes parquet."""
        episode = self.scratch / f"{self.key}_{self._episodes:06d}.mp4"
        encode_frames(frames, episode, self.fps)
        if self.info is None:
            self.info = video_info(episode)
        size_mb = episode.stat().st_size / (1024**2)
        duration = duration_s(episode)
        if self._file is None:
            self._file, self._to_timestamp = (0, 0), 0.0
        elif self._pending_mb + size_mb >= self.files_size_in_mb:
            self._flush()
            self._file, self._to_timestamp = _next_file(*self._file, self.chunks_size), 0.0
        from_timestamp = self._to_timestamp
        self._to_timestamp = from_timestamp + duration
        self._pending.append(episode)
        self._pending_mb += size_mb
        self._episodes += 1
        chunk_index, file_index = self._file
        return {f"videos/{self.key}/chunk_index": chunk_index, f"videos/{self.key}/file_index": file_index,
                f"videos/{self.key}/from_timestamp": from_timestamp,
                f"videos/{self.key}/to_timestamp": self._to_timestamp}

    def close(self) -> None:
        self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        chunk_index, file_index = self._file
        path = self.root / VIDEO_PATH.format(video_key=self.key, chunk_index=chunk_index, file_index=file_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        if len(self._pending) == 1:
            shutil.move(self._pending[0], path)  # LeRobot moves a file's first episode there unchanged
        else:
            concatenate(self._pending, path)
            for episode in self._pending:
                episode.unlink()
        self._pending, self._pending_mb = [], 0.0


def _next_file(chunk_index: int, file_index: int, chunks_size: int) -> tuple[int, int]:
    """update_chunk_file_indices (datasets/utils.py)."""
    return (chunk_index + 1, 0) if file_index == chunks_size - 1 else (chunk_index, file_index + 1)
