"""Fixtures of the integration tests that need a side venv (LIBERO's, LeRobot's)."""

from __future__ import annotations

import os

import pytest

from infra.lerobot_venv import LeRobotVenv
from infra.libero_venv import LiberoVenv


def _ready(venv, what: str, require: str):
    """The venv `sepa-eval <what> setup` built. Missing: the test is skipped, or fails when the
    ``require`` variable is 1 (CI builds the venvs first)."""
    if not venv.ready():
        if os.environ.get(require) == "1":
            pytest.fail(f"{what} is not set up at {venv.root} and {require}=1")
        pytest.skip(f"{what} is not set up (sepa-eval {what.lower()} setup)")
    return venv


@pytest.fixture(scope="session")
def libero_venv() -> LiberoVenv:
    return _ready(LiberoVenv.at(), "LIBERO", "SEPA_TEST_REQUIRE_LIBERO")


@pytest.fixture(scope="session")
def lerobot_venv() -> LeRobotVenv:
    return _ready(LeRobotVenv.at(), "LeRobot", "SEPA_TEST_REQUIRE_LEROBOT")
