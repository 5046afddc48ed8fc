"""Physical perturbations for failure injection: external pushes through MuJoCo's xfrc_applied.

    push = Push(target="hand", force_xyz=(0.0, 1.0, 0.0), start_step=20, duration_steps=15)
    for t in range(horizon):
        apply_perturbations(env, [push], t)      # before env.step(...) of step t
        env.step(policy.act(obs, signals))

A push is a world-frame force at the body's centre of mass, held for whole control steps
(every physics substep of a step). Targets: "object" (the manipulated object), "hand" (the
gripper's root body) or a distractor name ("distractor0", ...). Every reset clears all forces.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from producers.sim.envs import SimEnv

PUSH_TARGETS = ("object", "hand")
MAX_PUSH_FORCE_N = 200.0


@dataclass(frozen=True, kw_only=True)
class Push:
    """``force_xyz`` newtons (world frame) on ``target`` during steps
    [start_step, start_step + duration_steps)."""

    target: str
    force_xyz: tuple[float, float, float]
    start_step: int
    duration_steps: int

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not (self.target in PUSH_TARGETS
                                                     or self.target.startswith("distractor")):
            raise ValueError(f"push target must be one of {PUSH_TARGETS} or a distractor name, got {self.target!r}")
        f = tuple(self.force_xyz)
        if len(f) != 3 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  for v in f):
            raise ValueError(f"push force_xyz must be 3 finite numbers, got {self.force_xyz!r}")
        if math.sqrt(sum(v * v for v in f)) > MAX_PUSH_FORCE_N:
            raise ValueError(f"push force must be at most {MAX_PUSH_FORCE_N} N, got {self.force_xyz!r}")
        object.__setattr__(self, "force_xyz", tuple(float(v) for v in f))
        for name in ("start_step", "duration_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "start_step" else 1):
                raise ValueError(f"push {name} must be a non-negative integer (duration >= 1), got {v!r}")

    def active(self, t: int) -> bool:
        return self.start_step <= t < self.start_step + self.duration_steps

    def to_dict(self) -> dict:
        return {"target": self.target, "force_xyz": list(self.force_xyz),
                "start_step": self.start_step, "duration_steps": self.duration_steps}


def apply_perturbations(env: SimEnv, perturbations: Sequence[Push], t: int) -> list[Push]:
    """Sets the external forces for control step ``t`` (call before ``env.step``): the sum of
    the pushes active at ``t`` on each body, zero on every other pushed body. Returns the
    active pushes."""
    forces: dict[int, np.ndarray] = {}
    active = []
    for p in perturbations:
        body = env.body_for(p.target)
        total = forces.setdefault(body, np.zeros(3))
        if p.active(t):
            total += p.force_xyz
            active.append(p)
    for body, force in forces.items():
        env.set_external_force(body, force)
    return active
