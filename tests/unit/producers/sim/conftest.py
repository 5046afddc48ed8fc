"""Shared fixtures for the simulation-core tests. Envs are built once per session: an
episode depends only on (spec, seed), which test_sim_envs checks, so sharing them is safe."""

from __future__ import annotations

import pytest

import producers.sim  # noqa: F401  (MUJOCO_GL default before mujoco is imported)
from producers.sim.envs import make_env
from schemas.scenario import ScenarioSpec


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: takes more than a minute on 2 cores")


@pytest.fixture(scope="session")
def lift_spec() -> ScenarioSpec:
    return ScenarioSpec(env_name="Lift", horizon=150, instruction="lift the red cube")


@pytest.fixture(scope="session")
def lift_env(lift_spec):
    env = make_env(lift_spec, keyframes=True)
    yield env
    env.close()


@pytest.fixture(scope="session")
def env_factory():
    """make_env with a per-session cache keyed by scenario_id (and keyframes)."""
    cache = {}

    def make(spec: ScenarioSpec, keyframes: bool = False):
        key = (spec.scenario_id, keyframes)
        if key not in cache:
            cache[key] = make_env(spec, keyframes=keyframes)
        return cache[key]

    yield make
    for env in cache.values():
        env.close()
