"""Benchmark adapters: one protocol between a benchmark's tasks and the rollout machinery.

An adapter turns a ScenarioSpec record into an environment with the small surface the rollout
loop (producers/episode.py Episode) and the recorder need: reset(seed), step(action),
signals() with the Step schema's signal fields, success_relative(), render_keyframe(size, camera),
camera_names (what render_keyframe and RolloutRequested.cameras may name), action_dim, spec,
keyframes, close(). robosuite is built in. LIBERO needs robosuite 1.4 and so
its own Python environment: a LIBERO worker there implements this protocol and publishes through
producers.recorder (which needs only schemas/, confluent-kafka and fastavro), so its events are
the same as ours. RoboCasa's assets are not obtainable here, so no adapter is shipped for it.
"""

from __future__ import annotations

from typing import Any, Protocol


class BenchmarkEnv(Protocol):
    spec: Any
    keyframes: bool

    @property
    def action_dim(self) -> int: ...
    def reset(self, seed: int) -> dict: ...
    def step(self, action) -> tuple[dict, float, bool, dict]: ...
    def signals(self) -> dict: ...
    def success_relative(self) -> bool: ...
    @property
    def camera_names(self) -> tuple[str, ...]: ...
    def render_keyframe(self, size: int = 128, camera: str = ...): ...
    def close(self) -> None: ...


class BenchmarkAdapter(Protocol):
    name: str

    def tasks(self) -> list[str]: ...
    def base_scenario(self, task: str, horizon: int) -> dict: ...
    def make_env(self, scenario: dict, keyframes: bool = False) -> BenchmarkEnv: ...


class RobosuiteAdapter:
    name = "robosuite"
    INSTRUCTIONS = {"Lift": "lift the cube", "Stack": "stack the red cube on the green cube",
                    "PickPlaceCan": "put the can in its bin"}

    def tasks(self) -> list[str]:
        return list(self.INSTRUCTIONS)

    def base_scenario(self, task: str, horizon: int = 200) -> dict:
        from schemas.scenario import ScenarioSpec

        if task not in self.INSTRUCTIONS:
            raise ValueError(f"robosuite task must be one of {self.tasks()}, got {task!r}")
        return ScenarioSpec(env_name=task, horizon=horizon, instruction=self.INSTRUCTIONS[task]).to_dict()

    def make_env(self, scenario: dict, keyframes: bool = False) -> BenchmarkEnv:
        from producers.sim.envs import make_env
        from schemas.scenario import ScenarioSpec

        return make_env(ScenarioSpec.from_dict(scenario), keyframes=keyframes)


ADAPTERS: dict[str, BenchmarkAdapter] = {"robosuite": RobosuiteAdapter()}


def adapter_for(benchmark: str) -> BenchmarkAdapter:
    try:
        return ADAPTERS[benchmark]
    except KeyError:
        raise ValueError(f"no adapter for benchmark {benchmark!r}; this worker serves {sorted(ADAPTERS)}") from None
