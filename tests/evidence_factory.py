"""Schema-valid evidence for read-side tests: episodes, failures, clusters, candidates, verdicts,
decisions and cycles, built from the Avro schemas with stable ids and a deterministic clock.

`store_events` encodes each event with the real codec and inserts the Avro bodies through the
store's insert API, the path the evidence sink takes after it has read a batch off Kafka; `events`
can equally be published to a broker and drained by the sink.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from consumers.evidence.store import EvidenceStore
from schemas.events import make_event, stable_id

START = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
QUALITY = {"smoothness_jerk": 1.0, "path_efficiency": 0.8, "peak_contact_force": 20.0, "mean_contact_force": 5.0,
           "time_to_success": None, "regrasp_count": 0, "idle_steps": 0}


def spec(name: str, parent: str | None = None, **changes) -> dict:
    """A ScenarioSpec; its id is ``scn-<name>``."""
    base = {"scenario_id": f"scn-{name}", "parent_id": parent, "benchmark": "robosuite", "env_name": "Lift",
            "robot": "Panda", "horizon": 200, "instruction": "lift the cube", "placement_x_range": [],
            "placement_y_range": [], "pose_offset_xyz": [0.0, 0.0, 0.0], "object_friction": None,
            "object_mass": None, "object_rgba": [], "object_size_scale": 1.0, "distractors": [], "seed": 0,
            "success_hold_steps": 0, "place_target_xy": [], "suite": "", "init_state_index": 0,
            "perturbations": {}}
    return {**base, **changes}


class EvidenceLog:
    """Accumulates events; each one a second after the previous unless given a time."""

    def __init__(self, run_id: str = "run-1", start: datetime = START):
        self.run_id = run_id
        self.clock = start
        self.events: list[dict] = []
        self.positions = 0  # the clusterer's output position

    def _at(self, at: datetime | None) -> datetime:
        if at is not None:
            return at
        self.clock += timedelta(seconds=1)
        return self.clock

    def _emit(self, event_type: str, key: tuple, producer: str, at: datetime | None = None, run_id: str | None = None,
              **fields) -> dict:
        event = make_event(event_type, key, producer, run_id or self.run_id, event_time=self._at(at), **fields)
        self.events.append(event)
        return event

    def register(self, model_id: str, kind: str = "scripted", version: str = "1") -> None:
        self._emit("ModelRegistered", (model_id, version), "test", model_id=model_id, version=version, kind=kind,
                   description=f"{model_id} for tests", params={})

    def request(self, scenario: dict, model_id: str, seeds: list[int], purpose: str = "sweep") -> str:
        request_id = "req-" + stable_id(scenario["scenario_id"], model_id, tuple(seeds), purpose)[:20]
        self._emit("RolloutRequested", (request_id,), "test", request_id=request_id,
                   scenario_id=scenario["scenario_id"], scenario=scenario, model_id=model_id, seeds=seeds,
                   purpose=purpose, keyframe_every=0)
        return request_id

    def episode(self, model_id: str, scenario: dict, seed: int, success: bool, *, termination: str | None = None,
                request_id: str | None = None, quality: dict | None = None, keyframe: str | None = None,
                moments: Iterable[tuple] = (), steps: int = 50, run_id: str | None = None,
                analysed: bool = True, model_version: str = "1", variant: str = "", started: bool = True) -> str:
        """EpisodeStarted, EpisodeEnded, a FailureMoment per (type, step, recovered_step[, recovery])
        and the EpisodeAnalysed (its moments with their recovery: "regrasped" unless named, "" when
        recovered_step < 0). ``started=False`` leaves the EpisodeStarted out. Returns the episode id."""
        scenario_id = scenario["scenario_id"]
        identity = (model_version,) if model_version != "1" else ()
        identity += (variant,) if variant else ()
        episode_id = "ep-" + stable_id(scenario_id, model_id, seed, request_id or run_id or self.run_id,
                                       *identity)[:24]
        if started:
            self._emit("EpisodeStarted", (episode_id,), "recorder", run_id=run_id, episode_id=episode_id,
                       request_id=request_id, benchmark="robosuite", task=scenario["env_name"],
                       scenario_id=scenario_id, scenario=scenario, instruction=scenario["instruction"],
                       model_id=model_id, model_version=model_version, seed=seed, variant=variant,
                       simulator="mujoco-3.9.0")
        quality = {**QUALITY, "time_to_success": steps if success else None, **(quality or {})}
        termination = termination or ("success" if success else "timeout")
        ended = self._emit("EpisodeEnded", (episode_id,), "recorder", run_id=run_id, episode_id=episode_id,
                           scenario_id=scenario_id, model_id=model_id, success=success, termination=termination,
                           steps=steps, total_reward=float(success), quality=quality, error=None,
                           final_keyframe_sha256=keyframe)
        outcomes = []
        for failure_type, step, recovered_step, *named in moments:
            moment = self._emit("FailureMoment", (episode_id, failure_type, step), "detector", at=ended["envelope"]
                                ["event_time"], run_id=run_id, episode_id=episode_id, scenario_id=scenario_id,
                                model_id=model_id, failure_type=failure_type, step=step, severity=0.5,
                                features={"eef_x": 0.1}, detector_version="test")
            recovery = (named[0] if named else "regrasped") if recovered_step >= 0 else ""
            outcomes.append({"moment_id": moment["envelope"]["event_id"], "failure_type": failure_type, "step": step,
                             "severity": 0.5, "features": {"eef_x": 0.1}, "recovered_step": recovered_step,
                             "recovery": recovery})
        if analysed:
            self._emit("EpisodeAnalysed", (episode_id,), "detector", at=ended["envelope"]["event_time"],
                       run_id=run_id, episode_id=episode_id, scenario_id=scenario_id, model_id=model_id,
                       scenario=scenario, success=success, termination=termination, steps=steps, quality=quality,
                       analysed=True, reason="", moments=outcomes, detector_version="test")
        return episode_id

    def cluster_updated(self, cluster_id: str, size: int, representative_episode_id: str, dominant: str,
                        scenario: dict, revision: int = 1, summary: str = "", failure_types: dict | None = None,
                        model_counts: dict | None = None) -> int:
        position = self.positions
        self.positions += 1
        self._emit("ClusterUpdated", (cluster_id, revision, position), "clusterer", cluster_id=cluster_id,
                   centroid=[0.0, 1.0], size=size, representative_episode_id=representative_episode_id,
                   representative_scenario_id=scenario["scenario_id"], dominant_failure_type=dominant,
                   summary=summary or f"{size} episodes failing by {dominant}", summary_source="features",
                   clusterer_version="test", revision=revision, position=position,
                   failure_types=failure_types or {dominant: 1.0}, root_types={dominant: 1.0},
                   model_counts=model_counts or {}, scenario_counts={scenario["scenario_id"]: size},
                   site={"eef_x": 0.1, "force_n": 3.0}, representative_scenario=scenario)
        return position

    def cluster_assigned(self, cluster_id: str, episode_id: str, scenario_id: str, model_id: str,
                         revision: int = 1, intake: bool = True) -> None:
        position = self.positions
        self.positions += 1
        self._emit("ClusterAssigned", (episode_id, revision, position), "clusterer", cluster_id=cluster_id,
                   episode_id=episode_id, scenario_id=scenario_id, distance=0.1, embedding=[0.0, 1.0],
                   clusterer_version="test", model_id=model_id, intake=intake, revision=revision, position=position)

    def cycle(self, cycle_id: str, number: int, version: int, proposed: list[str], infeasible: dict | None = None,
              generator: str = "failure-guided", models: list[str] | None = None) -> None:
        self._emit("CycleStarted", (cycle_id,), "orchestrator", cycle_id=cycle_id, cycle=number,
                   benchmark_version=version, clusters_position=self.positions, generator=generator,
                   max_candidates=4, seed=0, models=models or [])
        self._emit("CandidatesGenerated", (cycle_id, "answer"), "mutator", cycle_id=cycle_id, generator=generator,
                   seeds=[], proposed=proposed, infeasible=infeasible or {}, mutator_version="test")

    def candidate(self, scenario: dict, parent_id: str, factor: str, generator: str = "failure-guided",
                  cycle_id: str = "", source_cluster_id: str | None = None, operator: str | None = None) -> None:
        self._emit("CandidateProposed", (scenario["scenario_id"],), "mutator", scenario_id=scenario["scenario_id"],
                   parent_scenario_id=parent_id, operator=operator or factor, params={"factor": factor},
                   source_cluster_id=source_cluster_id, scenario=scenario, mutator_version="test", factor=factor,
                   generator=generator, cycle_id=cycle_id, feasibility_json="{}")

    def verdict(self, scenario_id: str, critic: str, passed: bool | None, rollouts: int = 0, ran: bool = True,
                score: float | None = None, reason: str = "") -> str:
        event = self._emit("CriticVerdict", (scenario_id, critic), critic, scenario_id=scenario_id, critic=critic,
                           critic_version="test", ran=ran, score=score, passed=passed,
                           backend="test" if ran else "none", reason=reason or f"{critic} says {passed}",
                           evidence_json=json.dumps({"rollouts": rollouts}), rollouts=rollouts)
        return event["envelope"]["event_id"]

    def promoted(self, scenario: dict, version: int, parent_id: str = "", factor: str = "base",
                 source_cluster_id: str = "", evidence: list[str] | None = None, reason: str = "admitted") -> str:
        event = self._emit("Promoted", (scenario["scenario_id"], version), "gate", scenario_id=scenario["scenario_id"],
                           reason=reason, evidence_event_ids=evidence or [], gate_version="test",
                           checks_json=json.dumps({"solvable": True}), benchmark_version=version, scenario=scenario,
                           parent_scenario_id=parent_id, source_cluster_id=source_cluster_id, factor=factor)
        return event["envelope"]["event_id"]

    def retired(self, scenario_id: str, version: int, reason: str = "saturated") -> None:
        self._emit("Retired", (scenario_id, version), "gate", scenario_id=scenario_id, reason=reason,
                   evidence_event_ids=[], gate_version="test", checks_json="{}", benchmark_version=version)

    def decision(self, event_type: str, scenario_id: str, reason: str = "") -> None:
        """Rejected, Deferred or ReviewRequested."""
        self._emit(event_type, (scenario_id, len(self.events)), "gate", scenario_id=scenario_id,
                   reason=reason or event_type.lower(), evidence_event_ids=[], gate_version="test", checks_json="{}")

    def review_decided(self, scenario_id: str, approved: bool) -> None:
        self._emit("ReviewDecided", (scenario_id, len(self.events)), "review", scenario_id=scenario_id,
                   approved=approved, reviewer="tester", note="looked at it")


def store_events(store: EvidenceStore, events: Iterable[dict]) -> int:
    """Insert the events as the evidence sink does (tests/store_events.py)."""
    from store_events import store_events as insert

    return insert(store, events)
