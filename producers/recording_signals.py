"""The recorder's checks of a step's signals (producers/recorder.py documents what each signal
means): each becomes plain lists and floats, or a SignalError naming the field. Separate from the
recorder so its event publishing and conflict bookkeeping read apart from this per-step validation;
EpisodeRecorder takes the checks as the SignalChecks mixin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from producers.exceptions import SignalError

SIGNAL_FIELDS = ("eef_pos", "eef_quat", "gripper_opening", "gripper_force", "object_poses", "contacts",
                 "joint_torques", "joint_pos", "goal_distance", "object_lift")
FIXED_GROUPS = ("gripper", "robot", "table")  # contact groups besides the objects' names
QUAT_NORM_TOLERANCE = 0.01  # |norm - 1| a quaternion may be off by
MAX_GRIPPER_OPENING_M = 0.5  # an opening above this is not in metres
LIFT_TOLERANCE_M = 0.005  # object_lift may stray this far from the target's z change since step 0
_SIGNAL_SET = frozenset(SIGNAL_FIELDS)
_POSE_KEYS = frozenset(("name", "pos", "quat"))
_CONTACT_KEYS = frozenset(("a", "b", "normal_force"))


def _numbers(value: Any, where: str, length: int | None = None, min_length: int = 0) -> list[float]:
    """``value`` (a list, tuple or array of numbers) as a new list of finite floats, or
    SignalError naming ``where``."""
    if type(value) is list:
        value = list(value)  # the caller may reuse its list
    elif isinstance(value, tuple):
        value = list(value)
    elif value is None or isinstance(value, (str, bytes, dict)):
        raise SignalError(f"{where} must be a list of numbers, got {_show(value)}")
    else:
        try:
            value = np.asarray(value, dtype=float).ravel().tolist()
        except (TypeError, ValueError):
            raise SignalError(f"{where} must be a list of numbers, got {_show(value)}") from None
    if length is not None and len(value) != length:
        raise SignalError(f"{where} must hold {length} numbers, got {len(value)}: {_show(value)}")
    if len(value) < min_length:
        raise SignalError(f"{where} must hold at least {min_length} numbers, got {_show(value)}")
    try:
        finite = math.isfinite(sum(value))  # one C-level pass over the numbers
    except TypeError:
        finite = False
    if not finite:  # say which element; numbers other than floats (ints, numpy scalars) are fine
        for i, v in enumerate(value):
            value[i] = _number(v, f"{where}[{i}]")
    return value


def _number(value: Any, where: str, low: float | None = None) -> float:
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise SignalError(f"{where} must be a number, got {_show(value)}")
        value = float(value)
    if not math.isfinite(value):
        raise SignalError(f"{where} must be finite, got {value}")
    if low is not None and value < low:
        raise SignalError(f"{where} must be >= {low:g}, got {value}")
    return value


def _quat(value: Any, where: str) -> list[float]:
    q = _numbers(value, where, 4)
    norm = math.sqrt(q[0] * q[0] + q[1] * q[1] + q[2] * q[2] + q[3] * q[3])
    if abs(norm - 1.0) > QUAT_NORM_TOLERANCE:
        raise SignalError(f"{where} must be a unit quaternion (x, y, z, w), got {q} (norm {norm:.4f})")
    return q


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


@dataclass
class _Shape:
    """What the first step fixed for the rest of the episode."""

    names: tuple[str, ...]  # object pose names, target first
    groups: frozenset[str]  # valid contact group names
    joints: int
    target_z0: float
    lift0: float



class SignalChecks:
    """EpisodeRecorder's signal checks; the recorder holds ``identity`` and ``_shape`` (what the
    first step fixed, None before it)."""

    _shape: _Shape | None

    def _check(self, t: int, signals: Any) -> dict:
        """The signals as a new dict of plain lists and floats, or SignalError naming the field."""
        if self._shape is not None and type(signals) is dict:
            clean = self._fast(signals, self._shape)
            if clean is not None:
                return clean
        try:
            return self._clean(signals)
        except SignalError as exc:  # messages are built on failure only: this runs at every step
            raise SignalError(f"episode {self.identity.episode_id} step {t}: signals{exc}") from None

    def _fast(self, s: dict, shape: _Shape) -> dict | None:
        """``_clean`` for the common case (lists of floats, as SimEnv gives them) in few, mostly
        C-level operations; None when anything is unusual or wrong: ``_clean`` then takes it,
        or names what is wrong. It accepts nothing ``_clean`` refuses."""
        try:
            eef_pos, eef_quat, torques, joints = s["eef_pos"], s["eef_quat"], s["joint_torques"], s["joint_pos"]
            opening, force, goal, lift = s["gripper_opening"], s["gripper_force"], s["goal_distance"], s["object_lift"]
            poses, contacts = s["object_poses"], s["contacts"]
        except KeyError:
            return None
        n = shape.joints
        if not (type(eef_pos) is list and len(eef_pos) == 3 and type(eef_quat) is list and len(eef_quat) == 4
                and type(torques) is list and len(torques) == n and type(joints) is list and len(joints) == n
                and type(opening) is float and type(force) is float and type(goal) is float and type(lift) is float
                and type(poses) is list and len(poses) == len(shape.names) and type(contacts) is list):
            return None
        try:
            total = sum(eef_pos) + sum(eef_quat) + sum(torques) + sum(joints) + opening + force + goal + lift
            q0, q1, q2, q3 = eef_quat
            unit = abs(math.sqrt(q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3) - 1.0) <= QUAT_NORM_TOLERANCE
            clean_poses = []
            for p, name in zip(poses, shape.names, strict=True):
                if type(p) is not dict:
                    return None
                pos, quat = p.get("pos"), p.get("quat")
                if p.get("name") != name or type(pos) is not list or len(pos) != 3 or type(quat) is not list \
                        or len(quat) != 4:
                    return None
                total += sum(pos) + sum(quat)
                q0, q1, q2, q3 = quat
                unit = unit and abs(math.sqrt(q0 * q0 + q1 * q1 + q2 * q2 + q3 * q3) - 1.0) <= QUAT_NORM_TOLERANCE
                clean_poses.append({"name": name, "pos": list(pos), "quat": list(quat)})
            groups = shape.groups
            clean_contacts = []
            for c in contacts:
                if type(c) is not dict:
                    return None
                a, b, f = c.get("a"), c.get("b"), c.get("normal_force")
                if type(a) is not str or type(b) is not str or a == b or a not in groups or b not in groups \
                        or type(f) is not float or not f >= 0.0:
                    return None
                total += f
                clean_contacts.append({"a": a, "b": b, "normal_force": f})
        except TypeError:  # a value that is not a number
            return None
        if not (unit and math.isfinite(total) and 0.0 <= opening <= MAX_GRIPPER_OPENING_M and force >= 0.0
                and goal >= 0.0 and abs(lift - shape.lift0 - (clean_poses[0]["pos"][2] - shape.target_z0))
                <= LIFT_TOLERANCE_M):
            return None
        return {"eef_pos": list(eef_pos), "eef_quat": list(eef_quat), "gripper_opening": opening,
                "gripper_force": force, "object_poses": clean_poses, "contacts": clean_contacts,
                "joint_torques": list(torques), "joint_pos": list(joints), "goal_distance": goal, "object_lift": lift}

    def _clean(self, signals: Any) -> dict:
        if not isinstance(signals, dict):
            raise SignalError(f" must be a dict with {', '.join(SIGNAL_FIELDS)}, got {_show(signals)}")
        if not signals.keys() >= _SIGNAL_SET:
            missing = [name for name in SIGNAL_FIELDS if name not in signals]
            raise SignalError(f" lack {', '.join(missing)} (see producers/recorder.py for what each means)")
        poses = signals["object_poses"]
        if not isinstance(poses, (list, tuple)) or not poses:
            raise SignalError(f"['object_poses'] must be a non-empty list of {{name, pos, quat}}, the target first; "
                              f"got {_show(poses)}")
        clean_poses = []
        for i, p in enumerate(poses):
            try:
                if not isinstance(p, dict) or not p.keys() >= _POSE_KEYS:
                    raise SignalError(f" must be a dict with name, pos, quat; got {_show(p)}")
                name = p["name"]
                if type(name) is not str or not name:
                    raise SignalError(f"['name'] must be a non-empty string, got {_show(name)}")
                clean_poses.append({"name": name, "pos": _numbers(p["pos"], "['pos']", 3),
                                    "quat": _quat(p["quat"], "['quat']")})
            except SignalError as exc:
                raise SignalError(f"['object_poses'][{i}]{exc}") from None
        clean = {
            "eef_pos": _numbers(signals["eef_pos"], "['eef_pos']", 3),
            "eef_quat": _quat(signals["eef_quat"], "['eef_quat']"),
            "gripper_opening": _number(signals["gripper_opening"], "['gripper_opening'] (m)", 0.0),
            "gripper_force": _number(signals["gripper_force"], "['gripper_force'] (N)", 0.0),
            "object_poses": clean_poses,
            "contacts": None,
            "joint_torques": _numbers(signals["joint_torques"], "['joint_torques']", min_length=1),
            "joint_pos": _numbers(signals["joint_pos"], "['joint_pos']", min_length=1),
            "goal_distance": _number(signals["goal_distance"], "['goal_distance'] (m)", 0.0),
            "object_lift": _number(signals["object_lift"], "['object_lift'] (m)"),
        }
        if clean["gripper_opening"] > MAX_GRIPPER_OPENING_M:
            raise SignalError(f"['gripper_opening'] must be in metres (<= {MAX_GRIPPER_OPENING_M:g}), "
                              f"got {clean['gripper_opening']}")
        shape = self._shape
        if shape is None:
            names = tuple(p["name"] for p in clean_poses)
            if len(set(names)) != len(names) or set(names) & set(FIXED_GROUPS):
                raise SignalError(f"['object_poses'] names must be unique and not {FIXED_GROUPS}, got {names}")
            shape = _Shape(names, frozenset(FIXED_GROUPS + names), len(clean["joint_pos"]),
                           clean_poses[0]["pos"][2], clean["object_lift"])
        elif len(clean_poses) != len(shape.names) or any(
                p["name"] != name for p, name in zip(clean_poses, shape.names, strict=False)):
            raise SignalError(f"['object_poses'] must name {shape.names} in that order (the target first) at every "
                              f"step, got {tuple(p['name'] for p in clean_poses)}")
        if len(clean["joint_pos"]) != shape.joints or len(clean["joint_torques"]) != shape.joints:
            raise SignalError(f": joint_pos and joint_torques must both hold {shape.joints} numbers at every step, "
                              f"got {len(clean['joint_pos'])} and {len(clean['joint_torques'])}")
        rise = clean_poses[0]["pos"][2] - shape.target_z0
        if abs(clean["object_lift"] - shape.lift0 - rise) > LIFT_TOLERANCE_M:
            raise SignalError(
                f"['object_lift'] must follow the target's height: object_poses[0] ({shape.names[0]!r}) rose "
                f"{rise:+.4f} m since step 0 but object_lift changed {clean['object_lift'] - shape.lift0:+.4f} m "
                "(is the target the first object pose?)")
        contacts = signals["contacts"]
        if not isinstance(contacts, (list, tuple)):
            raise SignalError(f"['contacts'] must be a list of {{a, b, normal_force}}, got {_show(contacts)}")
        clean_contacts = []
        groups = shape.groups
        for i, c in enumerate(contacts):
            if not isinstance(c, dict) or not c.keys() >= _CONTACT_KEYS:
                raise SignalError(f"['contacts'][{i}] must be a dict with a, b, normal_force; got {_show(c)}")
            a, b, force = c["a"], c["b"], c["normal_force"]
            if type(a) is not str or type(b) is not str or a not in groups or b not in groups or a == b:
                raise SignalError(f"['contacts'][{i}] must join two different groups of {sorted(groups)}, "
                                  f"got {a!r} and {b!r}")
            if type(force) is not float or not 0.0 <= force < math.inf:
                force = _number(force, f"['contacts'][{i}]['normal_force'] (N)", 0.0)
            clean_contacts.append({"a": a, "b": b, "normal_force": force})
        clean["contacts"] = clean_contacts
        self._shape = shape
        return clean
