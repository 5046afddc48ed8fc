"""Encoding a LeRobot video leaves the process's scheduling as it was: SVT-AV1, run as root, left the
encoding thread at SCHED_FIFO 99, and every process started from it after inherited a real-time
policy (a bench's whole stack starved the machine). Run in a child process, so that a regression
does not leave the test worker real-time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
PROBE = """
import json, os, tempfile
from pathlib import Path
import numpy as np
from PIL import Image
from consumers.exports.lerobot_video import encode_frames
work = Path(tempfile.mkdtemp())
frames = []
for i in range(4):
    frames.append(work / f"{i}.png")
    Image.fromarray(np.full((32, 32, 3), 40 * i, np.uint8)).save(frames[-1])
before = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
encode_frames(frames, work / "v.mp4", 20)
after = (os.sched_getscheduler(0), os.sched_getparam(0).sched_priority)
print(json.dumps({"before": before, "after": after, "bytes": (work / "v.mp4").stat().st_size}))
"""


@pytest.mark.skipif(not hasattr(os, "sched_getscheduler"), reason="Linux scheduling policies")
def test_encoding_a_video_keeps_the_process_scheduling_policy():
    env = {**os.environ, "SVT_LOG": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["bytes"] > 0
    assert seen["after"] == seen["before"], f"(policy, priority) before and after encoding: {seen}"
