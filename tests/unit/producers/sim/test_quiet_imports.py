"""robosuite logs five warnings about optional parts on every import (each simulator process
imports it): producers.sim drops exactly those, and every other warning still shows."""

import subprocess
import sys
from pathlib import Path

from producers.sim import ROBOSUITE_IMPORT_NOISE

ROOT = Path(__file__).resolve().parents[4]


def test_robosuite_import_noise_is_dropped_and_other_warnings_show():
    code = ("import logging, warnings\n"
            "import producers.sim.envs\n"
            "from robosuite.utils.log_utils import ROBOSUITE_DEFAULT_LOGGER\n"
            "ROBOSUITE_DEFAULT_LOGGER.warning('a robosuite warning we did not silence')\n"
            "logging.basicConfig()\n"
            "logging.getLogger('sepa').warning('one of ours')\n"
            "warnings.warn('a python warning')\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for noise in ROBOSUITE_IMPORT_NOISE:
        assert noise not in result.stderr
    for kept in ("a robosuite warning we did not silence", "one of ours", "a python warning"):
        assert kept in result.stderr


def test_the_noise_is_what_robosuite_prints_without_the_filter():
    """The prefixes match robosuite's messages (a robosuite upgrade that rewords them shows here;
    a machine with a private macro file or robosuite_models prints fewer of them)."""
    code = ("import logging\n"
            "import robosuite\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert any(noise in result.stderr for noise in ROBOSUITE_IMPORT_NOISE), result.stderr
