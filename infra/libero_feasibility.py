"""The mutator's feasibility pre-check for every benchmark, built at the edge (the streams worker).

    check = scenario_feasibility(robosuite_check)     # robosuite_check: producers.sim.feasibility.check_feasibility
    result = check(spec)                              # FeasibilityResult: .feasible, .reason, .to_json()

The streams worker runs in the project's venv (robosuite 1.5) and cannot import LIBERO (robosuite
1.4). A robosuite ScenarioSpec goes to ``robosuite_check`` as before; a LiberoScenario is checked by
producers/libero/feasibility.py in the LIBERO venv, one subprocess per candidate
(``<libero python> -m producers.libero.feasibility`` with the scenario on stdin; the venv's python
and environment from infra/libero_venv.py, as the LIBERO worker is started). Its report comes back
as the same FeasibilityResult the robosuite check returns: ``reason`` joins the report's reasons,
``measures`` holds ``seeds_checked`` and ``seeds_passed``.

Never raises: without a LIBERO venv a LIBERO candidate is infeasible with a reason naming
``sepa-eval libero setup``; a check that fails, times out or prints no report is infeasible with
what went wrong. Costs one LIBERO import, one env build and ``seeds`` oracle episodes per
candidate (~20-40 s on 2 cores).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infra.libero_venv import ROOT, LiberoVenv
from infra.side_venv import base_environ
from producers.sim.feasibility import FeasibilityResult
from schemas.libero_scenario import LiberoScenario

# The seeds the LIBERO check runs the oracle on (its stored init states 0..2), all must pass.
LIBERO_FEASIBILITY_SEEDS = (0, 1, 2)
# A LIBERO check (import, env build, three oracle episodes) that takes longer than this is infeasible.
LIBERO_FEASIBILITY_TIMEOUT_S = 300.0
SETUP_HINT = "run `sepa-eval libero setup`"


def _infeasible(spec: LiberoScenario, reason: str, **measures: Any) -> FeasibilityResult:
    return FeasibilityResult(spec.scenario_id, False, reason, dict(measures))


def libero_feasibility(spec: LiberoScenario, venv: LiberoVenv | None = None,
                       seeds: Sequence[int] = LIBERO_FEASIBILITY_SEEDS,
                       timeout_s: float = LIBERO_FEASIBILITY_TIMEOUT_S) -> FeasibilityResult:
    """producers.libero.feasibility.check_feasibility(spec, seeds) in the LIBERO venv."""
    venv = venv or LiberoVenv.at()
    if not venv.ready():
        return _infeasible(spec, f"LIBERO is not set up at {venv.root}: {SETUP_HINT} to check LIBERO candidates")
    cmd = [str(venv.python), "-m", "producers.libero.feasibility", "--seeds", *map(str, seeds)]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, input=json.dumps(spec.to_dict()), capture_output=True, text=True,
                              env={**base_environ(), **venv.environ(ROOT)}, cwd=ROOT, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _infeasible(spec, f"the LIBERO feasibility check took longer than {timeout_s:.0f} s")
    except OSError as exc:
        return _infeasible(spec, f"the LIBERO feasibility check did not start ({exc}): {SETUP_HINT}")
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    except json.JSONDecodeError:
        report = None
    if not isinstance(report, dict) or report.get("scenario_id") != spec.scenario_id:
        return _infeasible(spec, f"the LIBERO feasibility check failed (exit {proc.returncode}): "
                                 f"{(proc.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
    measures = {"seeds_checked": len(report["seeds"]), "seeds_passed": len(report["passed"])}
    cost_s = round(time.perf_counter() - t0, 3)
    if report["feasible"]:
        return FeasibilityResult(spec.scenario_id, True, "", measures, cost_s)
    return FeasibilityResult(spec.scenario_id, False, "; ".join(report["reasons"]) or "too few seeds passed",
                             measures, cost_s)


def scenario_feasibility(robosuite_check: Callable[[Any], FeasibilityResult] | None,
                         venv_root: Path | None = None) -> Callable[[Any], FeasibilityResult]:
    """The mutator's ``check``: LIBERO scenarios through the LIBERO venv, the rest through
    ``robosuite_check`` (None: producers.sim.feasibility.check_feasibility, imported when used)."""
    venv = LiberoVenv(venv_root) if venv_root is not None else None

    def check(spec: Any) -> FeasibilityResult:
        if isinstance(spec, LiberoScenario):
            return libero_feasibility(spec, venv)
        if robosuite_check is None:
            from producers.sim.feasibility import check_feasibility

            return check_feasibility(spec)
        return robosuite_check(spec)

    return check
