"""The robosuite task classes a SimEnv runs (Lift, Stack, PickPlaceCan), each answering for itself:
the scenario is applied in robosuite's own _load_model hook, and every task has its own goal and
success hooks, as robosuite gives each task its own _check_success, so SimEnv
(producers/sim/envs.py) never asks which task it runs.

The goal and success hooks take the SimEnv (``sim``) and read its MuJoCo data, object refs and
helpers; they are measured against the episode's own start (``sim._start_pos``).
"""

from __future__ import annotations

from typing import Any

# producers/sim/__init__.py, which runs before this module, has set the MUJOCO_GL default.
import numpy as np
from robosuite.environments.manipulation.lift import Lift
from robosuite.environments.manipulation.pick_place import PickPlaceCan
from robosuite.environments.manipulation.stack import Stack
from robosuite.models.objects import BallObject, BoxObject, CylinderObject
from robosuite.utils.placement_samplers import SequentialCompositeSampler

from producers import robosuite_arithmetic
from producers.fixed_order import norm
from producers.sim.exceptions import EnvError
from producers.sim.lean_step import _LeanControlStep
from schemas.scenario import Distractor, ScenarioSpec

# robosuite's BLAS arithmetic replaced by fixed-order arithmetic, as producers/sim/envs.py does
# (idempotent), so an env built from these classes runs it.
robosuite_arithmetic.install()

# Lift succeeds when the cube is this far above its own start height.
LIFT_SUCCESS_HEIGHT_M = 0.04
# Lift then place (ScenarioSpec.place_target_xy): after the cube has been lifted by
# LIFT_SUCCESS_HEIGHT_M, it must rest with its centre within PLACE_XY_TOL_M (horizontally) of
# the place target, within PLACE_Z_TOL_M of its start height (on the table, not hovering),
# slower than PLACE_REST_SPEED_M_S and untouched by the fingers (released).
PLACE_XY_TOL_M = 0.015
PLACE_Z_TOL_M = 0.01
PLACE_REST_SPEED_M_S = 0.05
# Stack: cubeA's bottom within this of cubeB's top, its centre within cubeB's half-size
# (times this factor) horizontally, touching cubeB and not touched by the fingers.
STACK_Z_TOL_M = 0.01
STACK_XY_FRACTION = 1.0
# PickPlaceCan: the can resting in its target bin quadrant, below this height above the bin
# base (robosuite's own bound) and not touched by the fingers.
BIN_MAX_HEIGHT_M = 0.1
BIN_FLOOR_HALF_THICKNESS_M = 0.02  # robosuite's bins_arena.xml floor box
# Distractors: density (kg/m^3, light wood) and colour, dropped from this height.
DISTRACTOR_DENSITY = 500.0
DISTRACTOR_RGBA = (0.35, 0.45, 0.9, 1.0)
DISTRACTOR_DROP_M = 0.002


def _walk_samplers(sampler: Any):
    yield sampler
    if isinstance(sampler, SequentialCompositeSampler):
        for child in sampler.samplers.values():
            yield from _walk_samplers(child)


class _ScenarioMixin:
    """Builds the scenario's geometry: object size, distractors, placement ranges.

    Subclasses name the manipulated object, the task objects reported in signals, the sampler
    that places the manipulated object and the placement reference point, and answer for the
    task's goal and success (the task hooks, given the SimEnv).
    """

    _scenario: ScenarioSpec

    # step() runs _LeanControlStep when the configuration allows it; False: robosuite's stock step.
    lean_step = True

    def __init__(self, *, scenario: ScenarioSpec, **kwargs: Any):
        self._scenario = scenario
        self.distractor_objects: list[Any] = []
        self._lean: _LeanControlStep | None = None
        super().__init__(**kwargs)

    def step(self, action):
        if not self.lean_step:
            return super().step(action)
        lean = self._lean
        if lean is None or lean.controller is not self.robots[0].composite_controller:
            # robosuite builds new controllers on every reset
            lean = self._lean = _LeanControlStep(self) if _LeanControlStep.supports(self) else None
        if lean is None:
            return super().step(action)
        return lean.step(action)

    # hooks ----------------------------------------------------------------------------
    def manipulated_object(self) -> Any:
        raise NotImplementedError

    def _set_manipulated_object(self, obj: Any) -> None:
        raise NotImplementedError

    def task_objects(self) -> list[Any]:
        raise NotImplementedError

    def _manipulated_sampler(self) -> Any:
        return self.placement_initializer

    def placement_reference(self) -> np.ndarray:
        return np.array(self.table_offset, dtype=float)

    def surface_z(self) -> float:
        return float(self.table_offset[2])

    # task hooks: goal and success, read off the SimEnv ``sim`` ---------------------------
    def index_goal(self, sim: Any) -> None:
        """Indexes what the goal needs once the model is built (the compiled model never changes:
        resets are soft); nothing for most tasks."""

    def goal_pos(self, sim: Any) -> np.ndarray:
        """Where the manipulated object's centre should end up (world, m); also obs["goal_pos"]."""
        raise NotImplementedError

    def goal_distance(self, sim: Any) -> float:
        """Distance to the goal, m, 0 when reached: here from the manipulated object's centre to
        goal_pos()."""
        return float(norm(sim.data.xpos[sim._manip.body_id] - sim.goal_pos()))

    def success_relative(self, sim: Any) -> bool:
        """Task success measured against the episode's own start, not absolute heights (called
        only once the episode has started)."""
        raise NotImplementedError

    # robosuite hook -------------------------------------------------------------------
    def _load_model(self) -> None:
        super()._load_model()
        spec = self._scenario
        if spec.object_size_scale != 1.0:
            self._rescale_manipulated(spec.object_size_scale)
        sampler = self._manipulated_sampler()
        if spec.placement_x_range is not None or spec.placement_y_range is not None:
            if spec.placement_x_range is not None:
                sampler.x_range = spec.placement_x_range
            if spec.placement_y_range is not None:
                sampler.y_range = spec.placement_y_range
            sampler.ensure_object_boundary_in_range = False  # ranges are for the object's centre
        self.distractor_objects = []
        if spec.distractors:
            self._add_distractors(spec.distractors)

    def _rescale_manipulated(self, scale: float) -> None:
        old = self.manipulated_object()
        new = BoxObject(name=old.name, size=np.array(old.size) * scale, rgba=old.rgba, material=old.material,
                        density=old.density, friction=old.friction, solref=old.solref, solimp=old.solimp)
        self.model.worldbody.remove(old.get_obj())
        self.model.merge_objects([new])
        objs = self.model.mujoco_objects
        objs[objs.index(old)] = new
        for s in _walk_samplers(self.placement_initializer):
            s.mujoco_objects = [new if o is old else o for o in s.mujoco_objects]
        self._set_manipulated_object(new)

    def _add_distractors(self, distractors: tuple[Distractor, ...]) -> None:
        ref = self.placement_reference()
        surface = self.surface_z()
        distractor_fixtures = {}
        for i, d in enumerate(distractors):
            name = f"distractor{i}"
            if d.kind == "box":
                obj = BoxObject(name=name, size=[d.size] * 3, rgba=DISTRACTOR_RGBA, density=DISTRACTOR_DENSITY)
            elif d.kind == "cylinder":
                obj = CylinderObject(name=name, size=[d.size, d.size], rgba=DISTRACTOR_RGBA,
                                     density=DISTRACTOR_DENSITY)
            else:
                obj = BallObject(name=name, size=[d.size], rgba=DISTRACTOR_RGBA, density=DISTRACTOR_DENSITY)
            self.distractor_objects.append(obj)
            pos = (ref[0] + d.x, ref[1] + d.y, surface - obj.bottom_offset[2] + DISTRACTOR_DROP_M)
            distractor_fixtures[obj.name] = (pos, np.array([1.0, 0.0, 0.0, 0.0]), obj)
        self.model.merge_objects(self.distractor_objects)
        self.model.mujoco_objects.extend(self.distractor_objects)
        # The samplers place task objects clear of the distractors and return the distractors'
        # fixed placements with theirs, so robosuite's own _reset_internal puts them down.
        original = self.placement_initializer.sample

        def sample(fixtures=None, reference=None, on_top=True):
            merged = dict(distractor_fixtures)
            merged.update(fixtures or {})
            return original(fixtures=merged, reference=reference, on_top=on_top)

        self.placement_initializer.sample = sample


class _Lift(_ScenarioMixin, Lift):
    def manipulated_object(self):
        return self.cube

    def _set_manipulated_object(self, obj):
        self.cube = obj

    def task_objects(self):
        return [self.cube]

    def goal_pos(self, sim):
        """Lift: LIFT_SUCCESS_HEIGHT_M above its start position; lift then place: the place target
        (placement reference + place_target_xy) at the object's start height."""
        start = sim._start_pos[sim.manipulated_name]
        if sim._place_target is not None:
            return np.array([sim._place_target[0], sim._place_target[1], start[2]])
        return start + np.array([0.0, 0.0, LIFT_SUCCESS_HEIGHT_M])

    def goal_distance(self, sim):
        """Lift: max(0, LIFT_SUCCESS_HEIGHT_M - object_lift) (height still to gain).
        Lift then place: the path still to go along lift, carry, put down: before the lift
        (LIFT_SUCCESS_HEIGHT_M - lift) + LIFT_SUCCESS_HEIGHT_M + horizontal distance to the target;
        after it |lift| + horizontal distance. Continuous where the lift completes, and shrinking
        along a lift, a carry and a descent.
        """
        if sim._place_target is not None:
            pos = sim.data.xpos[sim._manip.body_id]
            xy = float(norm(pos[:2] - sim._place_target))
            lift = sim.object_lift()
            if sim._lifted:
                return abs(lift) + xy
            return max(0.0, LIFT_SUCCESS_HEIGHT_M - lift) + LIFT_SUCCESS_HEIGHT_M + xy
        return max(0.0, LIFT_SUCCESS_HEIGHT_M - sim.object_lift())

    def success_relative(self, sim):
        """Lift: the cube is >= LIFT_SUCCESS_HEIGHT_M above its own start height (robosuite's check
        is "above table + 4 cm", which a cube scaled up 2x passes while lying on the table).
        Lift then place: the cube was lifted (see SimEnv.lifted) and now rests at the place target:
        centre within PLACE_XY_TOL_M of it horizontally, within PLACE_Z_TOL_M of its start height,
        slower than PLACE_REST_SPEED_M_S, no finger touching it (SimEnv._placed).
        """
        if sim._place_target is not None:
            return sim._placed()
        return sim.object_lift() >= LIFT_SUCCESS_HEIGHT_M


class _Stack(_ScenarioMixin, Stack):
    def manipulated_object(self):
        return self.cubeA

    def _set_manipulated_object(self, obj):
        self.cubeA = obj

    def task_objects(self):
        return [self.cubeA, self.cubeB]

    def goal_pos(self, sim):
        """Stack: resting centred on cubeB, cubeB as it is now."""
        return sim._stack_target()

    def success_relative(self, sim):
        """Stack: cubeA rests on cubeB: touching it, its bottom within STACK_Z_TOL_M of cubeB's top,
        its centre within cubeB's half-size horizontally, and no finger touching cubeA (released)."""
        d = sim.data
        a, b = sim._task_refs
        pa, pb = d.xpos[a.body_id], d.xpos[b.body_id]
        half_a, half_b = float(self.cubeA.size[2]), float(self.cubeB.size[2])
        on_top = abs((pa[2] - half_a) - (pb[2] + half_b)) <= STACK_Z_TOL_M
        centred = bool(np.all(np.abs(pa[:2] - pb[:2]) <= STACK_XY_FRACTION * float(self.cubeB.size[0])))
        return bool(on_top and centred and sim._touching(a.body_id, b.body_id)
                    and not sim._fingers_touch(a.body_id))


class _PickPlaceCan(_ScenarioMixin, PickPlaceCan):
    def manipulated_object(self):
        return self.objects[self.object_id]

    def _set_manipulated_object(self, obj):  # never called: scaling is refused for this env
        raise EnvError("PickPlaceCan's can cannot be rescaled")

    def task_objects(self):
        return [self.manipulated_object()]

    def _manipulated_sampler(self):
        sampler = self.placement_initializer.samplers["CollisionObjectSampler"]
        # Only the can is sampled: the other objects are moved out of the scene anyway, and a
        # narrow placement range could not fit all four.
        sampler.mujoco_objects = [self.manipulated_object()]
        return sampler

    def placement_reference(self):
        return np.array(self.bin1_pos, dtype=float)

    def surface_z(self):
        return float(self.bin1_pos[2]) + BIN_FLOOR_HALF_THICKNESS_M

    def index_goal(self, sim):
        """The can's target bin quadrant: its centre, its x/y bounds and the bin base's height."""
        env_obj_id = self.object_id
        self._bin_target = np.array(self.target_bin_placements[env_obj_id], dtype=float)
        bin_low = np.array(self.bin2_pos[:2], dtype=float)
        if env_obj_id in (0, 2):
            bin_low[0] -= self.bin_size[0] / 2
        if env_obj_id < 2:
            bin_low[1] -= self.bin_size[1] / 2
        self._bin_low = bin_low
        self._bin_high = bin_low + np.array(self.bin_size[:2], dtype=float) / 2
        self._bin_z = float(self.bin2_pos[2])

    def goal_pos(self, sim):
        """PickPlaceCan: the centre of the can's target bin quadrant, at the height the can rested
        at in the start bin (both bins' floors are at the same height)."""
        start = sim._start_pos[sim.manipulated_name]
        return np.array([self._bin_target[0], self._bin_target[1],
                         start[2] - float(self.bin1_pos[2]) + self._bin_z])

    def success_relative(self, sim):
        """PickPlaceCan: the can is inside its target bin quadrant (x, y), below BIN_MAX_HEIGHT_M
        above the bin base (resting, not hovering), and no finger touches it (released)."""
        pos = sim.data.xpos[sim._manip.body_id]
        inside = bool(np.all(pos[:2] > self._bin_low) and np.all(pos[:2] < self._bin_high))
        low = self._bin_z < pos[2] < self._bin_z + BIN_MAX_HEIGHT_M
        return bool(inside and low and not sim._fingers_touch(sim._manip.body_id))


_ENV_CLASSES = {"Lift": _Lift, "Stack": _Stack, "PickPlaceCan": _PickPlaceCan}
