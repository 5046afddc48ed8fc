"""Fixtures of the integration tests that need the LIBERO venv."""

from __future__ import annotations

import os

import pytest

from infra.lerobot_venv import LeRobotVenv
from infra.libero_venv import LiberoVenv


@pytest.fixture(scope="session")
def libero_venv() -> LiberoVenv:
    """The LIBERO venv `sepa-eval libero setup` built. Missing: the test is skipped, or fails when
    SEPA_TEST_REQUIRE_LIBERO=1 (CI builds the venv first)."""
    venv = LiberoVenv.at()
    if not venv.ready():
        if os.environ.get("SEPA_TEST_REQUIRE_LIBERO") == "1":
            pytest.fail(f"LIBERO is not set up at {venv.root} and SEPA_TEST_REQUIRE_LIBERO=1")
        pytest.skip("LIBERO is not set up (sepa-eval libero setup)")
    return venv


@pytest.fixture(scope="session")
def lerobot_venv() -> LeRobotVenv:
    """The LeRobot venv `sepa-eval lerobot setup` built. Missing: the test is skipped, or fails when
    SEPA_TEST_REQUIRE_LEROBOT=1 (CI builds the venv first)."""
    venv = LeRobotVenv.at()
    if not venv.ready():
        if os.environ.get("SEPA_TEST_REQUIRE_LEROBOT") == "1":
            pytest.fail(f"LeRobot is not set up at {venv.root} and SEPA_TEST_REQUIRE_LEROBOT=1")
        pytest.skip("LeRobot is not set up (sepa-eval lerobot setup)")
    return venv
