"""The simulation core of the rollout producer: scenarios, robosuite envs, scripted policies,
per-step signals and execution quality. Plain Python and numpy; no broker, no database.

Importing this package sets ``MUJOCO_GL=egl`` as a default (``setdefault``: an explicit choice
wins) because MuJoCo picks its GL backend once, when ``mujoco`` is first imported, and headless
keyframes need EGL. Import ``producers.sim`` before anything that imports ``mujoco``.
"""

import os as _os

_os.environ.setdefault("MUJOCO_GL", "egl")
