"""Hard cases as JSON Lines: ``<output>/hard_cases.jsonl``, one episode per line, and the keyframe
files its steps refer to under ``<output>/keyframes/<sha256>.png`` (self-contained: the export can
be moved or shared without the evidence store).

Each line holds the episode (id, kind: failed or recovered, scenario spec, model and version, seed,
instruction, outcome, termination, end time, execution quality), the detector's analysis (moments
with their recovery, failure types) and every stored step in order. ``steps_complete`` is false
when fewer steps are stored than the episode had (a prune removed them, or they have not landed).
Float32 signals are written at float32 precision (shortest round-trip form), not widened.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np

from consumers.evidence.store import EvidenceStore
from consumers.exports.output import ExportFilters, ExportSummary, Keyframes, fresh_output, select
from consumers.exports.queries import HardCase, StepRow, episode_steps

FILE_NAME = "hard_cases.jsonl"
KEYFRAME_DIR = "keyframes"
EPISODES_PER_QUERY = 100


def export_jsonl(store: EvidenceStore, output: Path, keyframe_root: Path | None,
                 filters: ExportFilters = ExportFilters()) -> ExportSummary:
    cases = select(store, filters)
    fresh_output(output)
    keyframes = Keyframes(keyframe_root)
    summary = ExportSummary("jsonl", output)
    copied: set[str] = set()
    tmp = output / f".{FILE_NAME}.tmp"
    with tmp.open("w") as out:
        for start in range(0, len(cases), EPISODES_PER_QUERY):
            page = cases[start:start + EPISODES_PER_QUERY]
            steps = episode_steps(store, [c.episode_id for c in page])
            for case in page:
                line = episode_line(case, steps[case.episode_id], keyframes, output, copied, summary)
                out.write(json.dumps(line, separators=(",", ":")) + "\n")
                summary.episodes += 1
                summary.frames += len(steps[case.episode_id])
                summary.failed += case.kind == "failed"
                summary.recovered += case.kind == "recovered"
                summary.succeeded += case.kind == "success"
    tmp.replace(output / FILE_NAME)
    summary.keyframes = len(copied)
    return summary


def episode_line(case: HardCase, steps: list[StepRow], keyframes: Keyframes, output: Path, copied: set[str],
                 summary: ExportSummary) -> dict:
    def keyframe(sha256: str | None) -> str | None:
        if not sha256:
            return None
        source = keyframes.path(sha256)
        if source is None:
            summary.keyframes_missing += 1
            return None
        relative = f"{KEYFRAME_DIR}/{sha256}.png"
        if sha256 not in copied:
            (output / KEYFRAME_DIR).mkdir(exist_ok=True)
            shutil.copyfile(source, output / relative)
            copied.add(sha256)
        return relative

    return {
        "episode_id": case.episode_id, "kind": case.kind, "scenario_id": case.scenario_id,
        "scenario": case.scenario, "model_id": case.model_id, "model_version": case.model_version,
        "seed": case.seed, "benchmark": case.benchmark, "instruction": case.instruction,
        "success": case.success, "termination": case.termination, "ended_at": case.ended_at.isoformat(),
        "num_steps": case.steps, "total_reward": case.total_reward, "quality": case.quality,
        "analysed": case.analysed, "analysis_reason": case.analysis_reason,
        "failure_types": case.failure_types,
        "moments": [{**asdict(m), "recovered": m.recovered} for m in case.moments],
        "final_keyframe": {"sha256": case.final_keyframe_sha256, "file": keyframe(case.final_keyframe_sha256)},
        "steps_stored": len(steps),
        "steps_complete": [s.t for s in steps] == list(range(case.steps)),
        "steps": [_step(s, keyframe(s.keyframe_sha256), {camera: keyframe(sha) for camera, sha in s.frames.items()})
                  for s in steps],
    }


def _f32(values: list[float]) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float32).astype(str)]


def _step(step: StepRow, keyframe_file: str | None, frame_files: dict[str, str | None]) -> dict:
    (gripper_opening, gripper_force) = _f32([step.gripper_opening, step.gripper_force])
    return {
        "t": step.t, "action": _f32(step.action), "eef_pos": _f32(step.eef_pos), "eef_quat": _f32(step.eef_quat),
        "gripper_opening": gripper_opening, "gripper_force": gripper_force,
        "object_poses": [{"name": p["name"], "pos": _f32(p["pos"]), "quat": _f32(p["quat"])}
                         for p in step.object_poses],
        "contacts": [{"a": c["a"], "b": c["b"], "normal_force": _f32([c["normal_force"]])[0]}
                     for c in step.contacts],
        "joint_torques": _f32(step.joint_torques), "joint_pos": _f32(step.joint_pos), "reward": step.reward,
        "goal_distance": step.goal_distance, "object_lift": step.object_lift,
        "keyframe_sha256": step.keyframe_sha256, "keyframe": keyframe_file,
        # camera -> file of what it saw before this step's action (requests with cameras only)
        "frames": frame_files,
        "event_time": step.event_time.isoformat(),
    }
