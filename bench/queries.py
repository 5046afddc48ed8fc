"""Read-side benchmark: report, diff and status over 1,000,000 step events in a chDB store.

Loads a whole evolving-loop history (registered models, one of them in two versions, 1,000,000
Step events over 2,000 episodes with their starts, ends, analyses and moments (some recovered),
failure clusters, candidates, critic verdicts and decisions over several benchmark versions) into a
fresh chDB store, inserting Avro object containers through the store as the sink does. Then, in one
process, times each read against a plain ``SELECT count()`` over the steps table in the same run,
and prints the HTML report's size:

  report    consumers.report.write_report (report.md + report.html), or today's markdown report
  diff      consumers.diff.compare_models for two models, or today's scores per model
  versions  consumers.diff.compare_with_previous: the two-version model's latest against its previous
  status    consumers.state.memory_figures, or today's table_counts

Each time is the best of three runs. ``SELECT count()`` alone is answered from part metadata,
so the bench also prints the ratio to ``SELECT count() ... FINAL``, which reads every row's key
(each row says which implementation ran: the bench picks up the read side's newer functions when
they exist). Finally it runs the same three as ``sepa-eval`` processes on that memory dir, so the
figures include start-up and opening the store, as a person would see them.

Targets (issue 11): each under 5 s, report.html under 5 MB. The load average is printed before
and after: on a shared machine the wall-clock times move with it.

Usage:
    nice -n 10 python bench/queries.py                 # 1,000,000 steps
    python bench/queries.py --steps 200000 --keep DIR  # smaller, and keep the memory dir
"""

from __future__ import annotations

import argparse
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastavro  # noqa: E402
import numpy as np  # noqa: E402

from consumers.evidence.store import ClickHouseStore, migrate  # noqa: E402
from schemas.catalog import topic_for  # noqa: E402
from schemas.events import stable_id  # noqa: E402
from schemas.manifest import current_manifest  # noqa: E402

# The v2 ScenarioSpec record defaults that ClickHouse's Avro reader refuses (reported); the
# bodies are the same either way.
from tests.store_events import _blank  # noqa: E402

TARGET_S = 5.0
TARGET_HTML_BYTES = 5 * 1024 * 1024
MODELS = ("oracle", "scripted-expert", "scripted-novice", "scripted-clumsy", "vla-small")
SKILL = (0.95, 0.85, 0.6, 0.4, 0.7)
# (model, version) arms that run: every model at version 1, and the last one's version 2 as well
ARMS = tuple((m, "1", k) for m, k in zip(MODELS, SKILL, strict=True)) + ((MODELS[-1], "2", 0.8),)
# share of the moments a failed episode later recovers from, and of successes that recovered from one
RECOVERED_SHARE = 0.3
SEEDS = 10
STEPS_PER_EPISODE = 500
VERSIONS = 4
BASE_SCENARIOS = 10
PROMOTED_PER_VERSION = 10
BATCH = 50_000
CLI = [sys.executable, "-m", "infra.cli"]


# --- the history ----------------------------------------------------------------------------------

class Events:
    """Events by type, written as Avro object containers (fastavro's C writer) into the store."""

    def __init__(self, store: ClickHouseStore):
        self.store = store
        self.pending: dict[str, list[dict]] = {}
        self.counts: dict[str, int] = {}
        self.blanks: dict[str, tuple[dict, int]] = {}

    def add(self, event_type: str, key: tuple, at: datetime, **fields) -> dict:
        if event_type not in self.blanks:
            blank = _blank(_schema(event_type))
            blank.pop("envelope")
            self.blanks[event_type] = (blank, current_manifest().latest(event_type).version)
        blank, version = self.blanks[event_type]
        envelope = {"event_id": stable_id(event_type, *key), "event_type": event_type, "event_time": at,
                    "producer": "bench", "run_id": "bench-queries", "schema_version": version}
        event = {"envelope": envelope, **blank, **fields}
        self.pending.setdefault(event_type, []).append(event)
        if len(self.pending[event_type]) >= BATCH:
            self.flush(event_type)
        return event

    def flush(self, event_type: str | None = None) -> None:
        for name in [event_type] if event_type else list(self.pending):
            records = self.pending.pop(name, [])
            if not records:
                continue
            buffer = io.BytesIO()
            fastavro.writer(buffer, _parsed(name), records, codec="null")
            self.store.insert_container(topic_for(name).table, buffer.getvalue())
            self.counts[name] = self.counts.get(name, 0) + len(records)


_SCHEMAS: dict[str, dict] = {}


def _schema(event_type: str) -> dict:
    if event_type not in _SCHEMAS:
        _SCHEMAS[event_type] = current_manifest().latest(event_type).schema
    return _SCHEMAS[event_type]


_PARSED: dict[str, dict] = {}


def _parsed(event_type: str) -> dict:
    if event_type not in _PARSED:
        _PARSED[event_type] = fastavro.parse_schema(_schema(event_type))
    return _PARSED[event_type]


def spec(scenario_id: str, parent: str | None, friction: float | None) -> dict:
    return {**_blank(_schema("EpisodeStarted"))["scenario"], "scenario_id": scenario_id, "parent_id": parent,
            "benchmark": "robosuite", "env_name": "Lift", "robot": "Panda", "horizon": STEPS_PER_EPISODE,
            "instruction": "lift the red cube", "object_friction": friction, "object_size_scale": 1.0}


def load(store: ClickHouseStore, total_steps: int, seed: int = 7) -> dict:
    rng = np.random.default_rng(seed)
    events = Events(store)
    t0 = datetime.now(UTC) - timedelta(days=3)
    for i, (model, version, _) in enumerate(ARMS):
        events.add("ModelRegistered", (model, version), t0 + timedelta(minutes=i), model_id=model, version=version,
                   kind="scripted", description=f"bench model {model} {version}")

    # Benchmark versions: the base scenarios, then each version promotes more, retires a few.
    scenarios: list[tuple[str, float]] = []  # (scenario_id, difficulty)
    at = t0
    for b in range(BASE_SCENARIOS):
        sid = f"base-{b:02d}"
        events.add("CandidateProposed", (sid,), at, scenario_id=sid, scenario=spec(sid, None, None),
                   generator="base", factor="base", operator="base")
        events.add("Promoted", (sid, 1), at, scenario_id=sid, benchmark_version=1, scenario=spec(sid, None, None),
                   factor="base", reason="base benchmark", gate_version="bench")
        scenarios.append((sid, 0.0))
    candidate_index = 0
    for version in range(2, VERSIONS + 1):
        cycle = f"cycle-{version - 1}"
        at = t0 + timedelta(hours=version * 6)
        events.add("CycleStarted", (cycle,), at, cycle_id=cycle, cycle=version - 1, benchmark_version=version - 1,
                   models=list(MODELS), max_candidates=40)
        for c in range(PROMOTED_PER_VERSION * 3):
            sid = f"cand-{candidate_index:04d}"
            candidate_index += 1
            parent = scenarios[int(rng.integers(len(scenarios)))][0]
            friction = float(rng.uniform(0.1, 1.0))
            events.add("CandidateProposed", (sid,), at, scenario_id=sid, parent_scenario_id=parent,
                       scenario=spec(sid, parent, friction), generator="mutator", factor="friction",
                       operator="friction", cycle_id=cycle, params={"friction": f"{friction:.3f}"})
            for critic in ("safety", "robustness", "semantic"):
                events.add("CriticVerdict", (sid, critic), at + timedelta(minutes=5), scenario_id=sid, critic=critic,
                           critic_version="1", ran=critic != "semantic", score=float(rng.random()),
                           passed=bool(c < PROMOTED_PER_VERSION) if critic != "semantic" else None,
                           backend="bench", rollouts=40)
            kind = "Promoted" if c < PROMOTED_PER_VERSION else ("Rejected" if c % 2 else "Deferred")
            fields = {"scenario_id": sid, "reason": "bench", "gate_version": "bench"}
            if kind == "Promoted":
                fields.update(benchmark_version=version, scenario=spec(sid, parent, friction),
                              parent_scenario_id=parent, factor="friction", source_cluster_id="cluster-0")
                scenarios.append((sid, 1.0 - friction))
            events.add(kind, (sid, version) if kind == "Promoted" else (sid,), at + timedelta(minutes=10), **fields)
        retired = scenarios[version - 2][0]
        events.add("Retired", (retired, version), at + timedelta(minutes=11), scenario_id=retired,
                   benchmark_version=version, reason="saturated", gate_version="bench")

    # Episodes: every model on every scenario, seeds 0..SEEDS-1, until the step budget is spent.
    n_episodes = total_steps // STEPS_PER_EPISODE
    quality = _blank(_schema("EpisodeEnded"))["quality"]
    episode = 0
    step_time = t0
    steps_written = 0
    while episode < n_episodes:
        for sid, difficulty in scenarios:
            for model, version, skill in ARMS:
                for seed_ in range(SEEDS):
                    if episode >= n_episodes:
                        break
                    eid = f"ep-{episode:06d}"
                    success = bool(rng.random() < skill * (1 - 0.5 * difficulty))
                    started = step_time
                    events.add("EpisodeStarted", (eid,), started, episode_id=eid, benchmark="robosuite", task="Lift",
                               scenario_id=sid, scenario=spec(sid, None, None), instruction="lift the red cube",
                               model_id=model, model_version=version, seed=seed_)
                    steps_written += _steps(events, rng, eid, started)
                    ended = started + timedelta(seconds=STEPS_PER_EPISODE / 20)
                    events.add("EpisodeEnded", (eid,), ended, episode_id=eid, scenario_id=sid, model_id=model,
                               success=success, termination="success" if success else "timeout",
                               steps=STEPS_PER_EPISODE, total_reward=float(success),
                               quality={**quality, "smoothness_jerk": float(rng.gamma(2.0)),
                                        "path_efficiency": float(rng.random()),
                                        "peak_contact_force": float(rng.gamma(3.0, 5.0)),
                                        "regrasp_count": int(rng.integers(3))})
                    recovered = bool(rng.random() < RECOVERED_SHARE)
                    moments = [] if success and not recovered else [{
                        "moment_id": f"fm-{eid}", "failure_type": ("grasp_miss", "slip", "drop")[episode % 3],
                        "step": int(rng.integers(STEPS_PER_EPISODE // 2)), "severity": float(rng.random()),
                        "features": {"eef_x": 0.1, "object_z": 0.82},
                        "recovered_step": STEPS_PER_EPISODE - 1 if recovered else -1,
                        "recovery": "regrasped" if recovered else ""}]
                    for mo in moments:
                        events.add("FailureMoment", (eid, mo["failure_type"], mo["step"]), ended, episode_id=eid,
                                   scenario_id=sid, model_id=model, failure_type=mo["failure_type"], step=mo["step"],
                                   severity=mo["severity"], features=mo["features"], detector_version="bench")
                    events.add("EpisodeAnalysed", (eid,), ended, episode_id=eid, scenario_id=sid, model_id=model,
                               scenario=spec(sid, None, None), success=success,
                               termination="success" if success else "timeout", steps=STEPS_PER_EPISODE,
                               quality=quality, analysed=True, moments=moments, detector_version="bench")
                    if not success:
                        events.add("ClusterAssigned", (eid, 0), ended, cluster_id=f"cluster-{episode % 12}",
                                   episode_id=eid, scenario_id=sid, model_id=model, intake=True,
                                   embedding=[float(x) for x in rng.normal(size=8)], clusterer_version="bench")
                    step_time = ended
                    episode += 1
    for c in range(12):
        events.add("ClusterUpdated", (f"cluster-{c}", 1), step_time, cluster_id=f"cluster-{c}", size=50 + c,
                   representative_episode_id="ep-000001", representative_scenario_id="base-00",
                   dominant_failure_type="grasp_miss", summary="misses the cube", summary_source="features",
                   clusterer_version="bench", revision=1, position=c, failure_types={"grasp_miss": 1.0})
    events.flush()
    return {"episodes": episode, "steps": steps_written, "events": dict(sorted(events.counts.items())),
            "scenarios": len(scenarios)}


def _steps(events: Events, rng: np.random.Generator, episode_id: str, started: datetime) -> int:
    n = STEPS_PER_EPISODE
    eef = (np.cumsum(rng.normal(0, 0.005, size=(n, 3)), axis=0) + [0.0, 0.0, 1.0]).round(4).tolist()
    actions = rng.normal(0, 0.3, size=(n, 7)).round(4).tolist()
    joints = rng.normal(0, 1.0, size=(n, 7)).round(4).tolist()
    torques = rng.normal(0, 5.0, size=(n, 7)).round(3).tolist()
    forces = rng.gamma(2.0, 2.0, size=n).round(3).tolist()
    for t in range(n):
        events.add("Step", (episode_id, t), started + timedelta(milliseconds=50 * t), episode_id=episode_id, t=t,
                   action=actions[t], eef_pos=eef[t], eef_quat=[0.0, 1.0, 0.0, 0.0], gripper_opening=0.04,
                   gripper_force=forces[t],
                   object_poses=[{"name": "cube", "pos": eef[t], "quat": [0.0, 0.0, 0.0, 1.0]}],
                   contacts=[{"a": "gripper", "b": "cube", "normal_force": forces[t]}], joint_torques=torques[t],
                   joint_pos=joints[t], reward=0.0, goal_distance=0.04, object_lift=0.0, keyframe_sha256=None)
    return n


# --- the reads ------------------------------------------------------------------------------------

def _has(module: str, name: str) -> bool:
    try:
        return hasattr(importlib.import_module(module), name)
    except ImportError:
        return False


def report_probe(store, out: Path, keyframes: Path):
    if _has("consumers.report", "write_report"):
        from consumers.report import write_report

        def run():
            files = write_report(store, out, keyframes)
            return (out / "report.html").stat().st_size if (out / "report.html").exists() else files
        return "consumers.report.write_report (report.md + report.html)", run

    from consumers.report import render_markdown
    from consumers.state import derived_state, scores

    def today():
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(render_markdown(derived_state(store), scores(store)))
        return None
    return "today's consumers.report.render_markdown (no HTML yet)", today


def diff_probe(store, model_a: str, model_b: str):
    if _has("consumers.diff", "compare_models"):
        from consumers.diff import compare_models
        return "consumers.diff.compare_models", lambda: compare_models(store, model_a, model_b)
    from consumers.state import scores
    return "today's stand-in: state.scores (no diff yet)", lambda: [
        s for s in scores(store) if s.model_id in (model_a, model_b)]


def versions_probe(store, model_id: str):
    if _has("consumers.diff", "compare_with_previous"):
        from consumers.diff import compare_with_previous
        return "consumers.diff.compare_with_previous", lambda: compare_with_previous(store, model_id)
    return "not there yet: consumers.diff.compare_with_previous", lambda: None


def status_probe(store):
    if _has("consumers.state", "memory_figures"):
        from consumers.state import memory_figures
        return "consumers.state.memory_figures", lambda: memory_figures(store)
    from consumers.state import table_counts
    return "today's consumers.state.table_counts", lambda: table_counts(store)


def _timed(fn, repeats: int = 3) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - started)
    return best, result


def in_process(memory_dir: Path, total_steps: int) -> dict:
    store = ClickHouseStore.connect(None, memory_dir / "evidence", "sepa")
    migrate(store)
    started = time.perf_counter()
    loaded = load(store, total_steps)
    load_s = time.perf_counter() - started
    (stored,), = store.query("SELECT count() FROM {database}.rollout_steps")
    baseline_s, _ = _timed(lambda: store.query("SELECT count() FROM {database}.rollout_steps"), repeats=5)
    # count() alone is answered from part metadata; with FINAL it reads the sort key of every row.
    final_s, _ = _timed(lambda: store.query("SELECT count() FROM {database}.rollout_steps FINAL"), repeats=5)
    out = memory_dir / "bench-report"
    rows = []
    for name, (impl, fn) in {"report": report_probe(store, out, memory_dir / "keyframes"),
                             "diff": diff_probe(store, MODELS[0], MODELS[2]),
                             "versions": versions_probe(store, MODELS[-1]),
                             "status": status_probe(store)}.items():
        seconds, _ = _timed(fn)
        rows.append({"read": name, "implementation": impl, "seconds": seconds, "ratio": seconds / baseline_s,
                     "ratio_final": seconds / final_s})
    html = out / "report.html"
    return {"loaded": loaded, "stored_steps": int(stored), "load_seconds": load_s, "baseline_seconds": baseline_s,
            "final_seconds": final_s,
            "reads": rows, "html_bytes": html.stat().st_size if html.exists() else None}


def as_processes(memory_dir: Path) -> list[dict]:
    from typer.main import get_command

    from infra.cli import app

    commands = get_command(app).commands
    env = {**os.environ, "SEPA_MEMORY_DIR": str(memory_dir)}
    runs = [("report", ["report", "--output", str(memory_dir / "cli-report")]),
            ("diff", ["diff", MODELS[0], MODELS[2]]),
            ("versions", ["diff", f"{MODELS[-1]}@1", MODELS[-1]]),
            ("status", ["status", "--json"])]
    out = []
    for name, args in runs:
        if args[0] not in commands:
            out.append({"command": name, "seconds": None, "note": f"`sepa-eval {args[0]}` is not a command yet"})
            continue
        started = time.perf_counter()
        done = subprocess.run(CLI + args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        out.append({"command": name, "seconds": time.perf_counter() - started, "exit": done.returncode,
                    "note": "" if done.returncode == 0 else done.stderr.strip().splitlines()[-1][:200]})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--keep", type=Path, help="memory dir to load into and keep (default: a temporary one)")
    parser.add_argument("--phase", choices=["all", "in-process"], default="all", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "in-process":  # the child: owns the chDB directory while it loads and times
        print(json.dumps(in_process(args.keep, args.steps), default=str))
        return

    memory_dir = args.keep or Path(tempfile.mkdtemp(prefix="sepa-bench-queries-"))
    load_before = os.getloadavg()
    try:
        child = subprocess.run([sys.executable, __file__, "--phase", "in-process", "--steps", str(args.steps),
                                "--keep", str(memory_dir)], capture_output=True, text=True, cwd=ROOT)
        if child.returncode != 0:
            sys.exit(f"loading and timing failed:\n{child.stderr[-4000:]}")
        figures = json.loads(child.stdout.strip().splitlines()[-1])
        processes = as_processes(memory_dir)
    finally:
        if args.keep is None:
            shutil.rmtree(memory_dir, ignore_errors=True)

    load_after = os.getloadavg()
    loaded = figures["loaded"]
    print(f"load average (1, 5, 15 min) before {_load(load_before)}, after {_load(load_after)} "
          f"on {os.cpu_count()} cores")
    print(f"loaded {figures['stored_steps']:,} step events ({loaded['episodes']:,} episodes, "
          f"{loaded['scenarios']} scenarios in {VERSIONS} benchmark versions; "
          f"{sum(loaded['events'].values()):,} events in all) in {figures['load_seconds']:.1f} s")
    print(f"baseline: SELECT count() FROM rollout_steps  {figures['baseline_seconds'] * 1000:.1f} ms "
          f"(answered from part metadata); with FINAL {figures['final_seconds'] * 1000:.1f} ms")
    print(f"{'read':9} {'seconds':>8} {'x count()':>10} {'x FINAL':>8}  {'target':7} implementation")
    for row in figures["reads"]:
        verdict = "ok" if row["seconds"] < TARGET_S else "OVER"
        print(f"{row['read']:9} {row['seconds']:8.3f} {row['ratio']:10.0f} {row['ratio_final']:8.1f}  {verdict:7} "
              f"{row['implementation']}")
    html = figures["html_bytes"]
    if html is None:
        print("report.html: not written by this report implementation")
    else:
        print(f"report.html: {html / 1024 / 1024:.2f} MB ({'ok' if html < TARGET_HTML_BYTES else 'OVER'} 5 MB)")
    print("as sepa-eval processes (start-up and opening the store included):")
    for run in processes:
        if run["seconds"] is None:
            print(f"  {run['command']:9}        -  {run['note']}")
        else:
            verdict = ("FAILED" if run["exit"] != 0 else "ok" if run["seconds"] < TARGET_S else "OVER")
            print(f"  {run['command']:9} {run['seconds']:7.2f} s  {verdict} {run['note']}")


def _load(figures: tuple[float, float, float]) -> str:
    return ", ".join(f"{x:.2f}" for x in figures)


if __name__ == "__main__":
    main()
