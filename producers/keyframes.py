"""Keyframes stored by content: frames never travel through Kafka, events carry their sha256.

Layout: ``<root>/<first two hex>/<sha256>.png``. The hash is of the PNG bytes, so the same frame
stored twice (a retried episode, a replay) is one file.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
from PIL import Image


class KeyframeStore:
    def __init__(self, root: Path):
        self.root = root

    def path_for(self, sha256: str) -> Path:
        return self.root / sha256[:2] / f"{sha256}.png"

    def put(self, frame: np.ndarray) -> str:
        if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
            raise ValueError(f"a keyframe is uint8 HxWx3, got {frame.dtype} {frame.shape}")
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG", optimize=False)
        data = buf.getvalue()
        sha256 = hashlib.sha256(data).hexdigest()
        path = self.path_for(sha256)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            tmp.replace(path)  # atomic: a reader never sees half a file
        return sha256

    def get(self, sha256: str) -> np.ndarray:
        return np.asarray(Image.open(self.path_for(sha256)).convert("RGB"))
