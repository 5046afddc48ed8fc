"""The LeRobot virtual environment: LeRobot's own code, to read and train on our exports.

LeRobot 0.6.1 needs Python >= 3.12 and torch, and the project runs on 3.11 with numpy < 2
(robosuite 1.5.2), so LeRobot lives in a venv of its own under the cache dir,
``~/.cache/sepa-eval/lerobot-<version>/``, built from the package registries only:

    python -m infra.lerobot_venv build [--cache-root DIR] [--force]   # or: sepa-eval lerobot setup
    python -m infra.lerobot_venv check                                  # exit 1 when not set up
    python -m infra.lerobot_venv path                                   # the venv's python

What goes in: ``lerobot[dataset]`` at LEROBOT_VERSION with torch and PyAV pinned (PINS), and what
the learned policies' openpi servers speak with (websockets, msgpack, openpi-client's msgpack-numpy). PyPI's
torch for Linux is the CUDA build (~3 GB with its nvidia wheels); it runs on the CPU. torchcodec
installs but cannot load here (no system FFmpeg), so readers pass ``video_backend="pyav"``.
Nothing of this project is installed in it: the parity check (tests/integration/lerobot_parity.py)
imports LeRobot only and reads our files, as a LeRobot user would; the learned policies
(producers/learned/) run there with this checkout on PYTHONPATH (``environ(project_root)``).

The interpreter: the first Python 3.12 found (``python3.12`` on PATH that runs, else pyenv's
``~/.pyenv/versions/3.12.*``). A stamp records the pins; a changed pin rebuilds.
"""

from __future__ import annotations

import glob
import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra import side_venv
from infra.exceptions import LeRobotSetupError
from infra.side_venv import base_environ, default_cache_root, run

LEROBOT_VERSION = "0.6.1"
# torch 2.11.0 is what lerobot 0.6.1 resolved to when this was written; av is LeRobot's own pin range
# and the version the project's exporter encodes with (pyproject.toml).
PINS = (f"lerobot[dataset]=={LEROBOT_VERSION}", "torch==2.11.0", "av==15.1.0", "websockets==17.4", "msgpack==1.2.4")
# openpi's wire format (msgpack-numpy) for the learned policies' servers; its declared numpy < 2 is
# for its image tools, which the servers do not use, so it goes in without its dependencies.
NO_DEPS_PINS = ("openpi-client==0.1.2",)
STAMP = "sepa-lerobot-venv.json"
PYTHON = "3.12"


@dataclass(frozen=True)
class LeRobotVenv:
    root: Path

    @classmethod
    def at(cls, cache_root: Path | None = None) -> LeRobotVenv:
        return cls((cache_root or default_cache_root()) / f"lerobot-{LEROBOT_VERSION}")

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def stamp_path(self) -> Path:
        return self.root / STAMP

    def ready(self) -> bool:
        stamp = json.loads(self.stamp_path.read_text()) if self.stamp_path.exists() else {}
        return stamp.get("pins") == pins_digest() and self.python.exists()

    def environ(self, project_root: Path | None = None) -> dict[str, str]:
        """A process in this venv: no hub downloads, ever (datasets are local directories); with
        ``project_root``, this checkout's code on the path (producers/learned/)."""
        env = {**base_environ(), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        if project_root is not None:
            env["PYTHONPATH"] = str(project_root)
        return env


def pins_digest() -> str:
    return hashlib.sha256(json.dumps([PINS, NO_DEPS_PINS]).encode()).hexdigest()[:16]


def find_python() -> Path:
    """A Python 3.12 interpreter that runs (pyenv's shim on PATH may not, when 3.12 is not global)."""
    candidates = [shutil.which(f"python{PYTHON}")] + sorted(
        glob.glob(str(Path.home() / ".pyenv" / "versions" / f"{PYTHON}.*" / "bin" / f"python{PYTHON}")), reverse=True)
    for candidate in filter(None, candidates):
        proc = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                              text=True)
        if proc.returncode == 0 and proc.stdout.strip() == f"({PYTHON.replace('.', ', ')})":
            return Path(candidate)
    raise LeRobotSetupError(f"no working Python {PYTHON} found (tried python{PYTHON} on PATH and "
                            f"~/.pyenv/versions/{PYTHON}.*); LeRobot {LEROBOT_VERSION} needs it")


def build(cache_root: Path | None = None, force: bool = False, log=print) -> LeRobotVenv:
    """Builds the venv (1-2 min with a fast registry; ~5 GB); idempotent."""
    venv = LeRobotVenv.at(cache_root)
    if force and venv.root.exists():
        shutil.rmtree(venv.root)
    if venv.ready():
        log(f"LeRobot venv ready at {venv.root}")
        return venv
    if not venv.python.exists():
        venv.root.parent.mkdir(parents=True, exist_ok=True)
        run([str(find_python()), "-m", "venv", str(venv.root)], "create the venv", log, LeRobotSetupError)
    pip = [str(venv.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    run([*pip, *PINS], f"install LeRobot {LEROBOT_VERSION}", log, LeRobotSetupError)
    run([*pip, "--no-deps", *NO_DEPS_PINS], "install openpi's client without its dependencies", log, LeRobotSetupError)
    report = check(venv)
    venv.stamp_path.write_text(json.dumps({"pins": pins_digest(), "packages": PINS, **report}, indent=1))
    log(f"LeRobot venv ready at {venv.root}")
    return venv


CHECK_SCRIPT = """
import json
import av, lerobot, torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset
from lerobot.datasets.compute_stats import aggregate_stats, compute_episode_stats
import websockets
from openpi_client import msgpack_numpy
print(json.dumps({"lerobot": lerobot.__version__, "torch": torch.__version__, "av": av.__version__,
                  "libsvtav1": "libsvtav1" in av.codecs_available}))
"""


def check(venv: LeRobotVenv) -> dict:
    """Imports LeRobot's dataset and stats code in the venv; raises LeRobotSetupError on anything wrong."""
    if not venv.python.exists():
        raise LeRobotSetupError(f"no LeRobot venv at {venv.root}: run `sepa-eval lerobot setup`")
    proc = subprocess.run([str(venv.python), "-c", CHECK_SCRIPT], capture_output=True, text=True,
                          env=venv.environ(), stdin=subprocess.DEVNULL, timeout=300)
    if proc.returncode != 0:
        raise LeRobotSetupError(f"the LeRobot venv at {venv.root} does not import: {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["lerobot"] != LEROBOT_VERSION or not report["libsvtav1"]:
        raise LeRobotSetupError(f"the LeRobot venv runs lerobot {report['lerobot']} (libsvtav1: "
                                f"{report['libsvtav1']}), expected {LEROBOT_VERSION} with libsvtav1")
    return report


def main(argv: list[str] | None = None) -> int:
    return side_venv.main(argv, "python -m infra.lerobot_venv", LeRobotVenv.at, build, check, LeRobotSetupError)


if __name__ == "__main__":
    sys.exit(main())
