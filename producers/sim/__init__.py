"""The simulation core of the rollout producer: scenarios, robosuite envs, scripted policies,
per-step signals and execution quality. Plain Python and numpy; no broker, no database.

Importing this package sets ``MUJOCO_GL=egl`` as a default (``setdefault``: an explicit choice
wins) because MuJoCo picks its GL backend once, when ``mujoco`` is first imported, and headless
keyframes need EGL. Import ``producers.sim`` before anything that imports ``mujoco``.

It also silences the warnings robosuite logs on every import about optional parts we do not use
(no private macro file, no robosuite_models, no mink IK): each simulator process imports
robosuite, and a run printed them 20+ times. Only those messages are dropped; robosuite's other
warnings and every warning of ours still show.
"""

import logging as _logging
import os as _os

_os.environ.setdefault("MUJOCO_GL", "egl")

# The log records robosuite 1.5.2 emits at import (robosuite/macros.py, robosuite/__init__.py), by prefix.
ROBOSUITE_IMPORT_NOISE = (
    "No private macro file found!",
    "It is recommended to use a private macro file",
    "To setup, run: python ",
    "Could not import robosuite_models.",
    "Could not load the mink-based whole-body IK.",
)


class _DropRobosuiteImportNoise(_logging.Filter):
    def filter(self, record: _logging.LogRecord) -> bool:
        return not str(record.msg).startswith(ROBOSUITE_IMPORT_NOISE)


# robosuite's logger (robosuite.utils.log_utils.DefaultLogger); a logger filter set now still
# applies once robosuite adds its console handler at import.
_logging.getLogger("robosuite_logs").addFilter(_DropRobosuiteImportNoise())
