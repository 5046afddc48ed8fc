"""One GL context per LIBERO env, for every frame size it renders.

    frames = Frames(model)                       # the GL context and MuJoCo's render context
    frames.render(data, camera_id, 256, option)  # upright uint8 (256, 256, 3)
    frames.close()

mujoco.Renderer makes a GL context per image size, and each context holds the scene's textures
in host memory when EGL renders on the CPU: about 500 MB for a LIBERO scene, measured. An env
that records keyframes (128 px) for a pixel policy that sees 256 px held two. MuJoCo renders into
the model's offscreen buffer (``vis.global_.offwidth`` x ``offheight``) whatever the image size,
and reads back the rectangle asked for, so one context serves every size up to the buffer's, with
the same calls mujoco.Renderer (3.3) makes, and the same pixels (tests/integration/test_libero.py).
Imported through env.py, which sets MUJOCO_GL before mujoco is first imported.
"""

from __future__ import annotations

import mujoco
import numpy as np
from mujoco import gl_context


class Frames:
    def __init__(self, model: mujoco.MjModel):
        self.model = model
        self.max_size = min(model.vis.global_.offwidth, model.vis.global_.offheight)
        self._gl = gl_context.GLContext(self.max_size, self.max_size)
        self._gl.make_current()
        self._context = mujoco.MjrContext(model, mujoco.mjtFontScale.mjFONTSCALE_150.value)
        mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN.value, self._context)
        self._scene = mujoco.MjvScene(model, maxgeom=10000)
        self._camera = mujoco.MjvCamera()
        self._camera.type = mujoco.mjtCamera.mjCAMERA_FIXED

    def render(self, data: mujoco.MjData, camera_id: int, size: int, option: mujoco.MjvOption) -> np.ndarray:
        """The camera's image, ``size`` x ``size``, upright (OpenGL reads rows bottom-up)."""
        if size > self.max_size:
            raise ValueError(f"frame size {size} exceeds the model's offscreen buffer ({self.max_size} px)")
        self._gl.make_current()
        self._camera.fixedcamid = camera_id
        mujoco.mjv_updateScene(self.model, data, option, None, self._camera, mujoco.mjtCatBit.mjCAT_ALL.value,
                               self._scene)
        rect = mujoco.MjrRect(0, 0, size, size)
        mujoco.mjr_render(rect, self._scene, self._context)
        out = np.empty((size, size, 3), dtype=np.uint8)
        mujoco.mjr_readPixels(out, None, rect, self._context)
        return np.flipud(out).copy()

    def close(self) -> None:
        if self._gl is not None:
            self._gl.free()
            self._gl = None
        if self._context is not None:
            self._context.free()
            self._context = None
