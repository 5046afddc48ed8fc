"""Benchmark state as typed queries over the evidence log: derived, never stored.

Every reader (report, diff, status, the critics and the gate, Grafana's SQL mirrors them) asks
these functions rather than writing SQL of its own. Each returns frozen dataclasses and takes, where
it makes sense:
- ``run_id``: only events whose ``envelope.run_id`` is that run (the run that produced them; a
  sweep episode reused by a later run keeps the run id of the run that made it);
- ``version``: the benchmark version (the scenarios active in it, from Promoted/Retired);
- ``as_of``: the log as it stood at that time (events with ``envelope.event_time <= as_of``).

Every read goes through ``FINAL``, so an event delivered twice counts once whatever merges did.

Success semantics: an episode's ``success`` is the environment's success measured relative to the
episode's own start and *held at the end of the episode* (not "succeeded at any step"). A trial is
one (model, model version, scenario, seed, variant), the version and variant from EpisodeStarted
(variant is empty for simulator workers; an eval farm sets it to tell policy variants or repeated
seeds apart): rollouts are deterministic per seed, so the same seed run twice (a sweep episode and
a validation control arm, a re-sweep) is one trial, counted once (its latest valid copy). Episodes
that ended ``env_error`` or ``aborted`` are not the policy's doing: they are counted as ``invalid``
and left out of success rates.

Model versions are never pooled. Scores, trials and execution quality take ``model_versions``:
``LATEST`` (the default) scores each model at its latest version (its latest ModelRegistered by
event time; a model never registered: the version of its latest started episode), ``ALL_VERSIONS``
keeps every version apart (one row per version), and a mapping ``{model_id: version}`` pins those
models to those versions (the others stay at their latest). An episode whose EpisodeStarted is
missing has no known version: it is a trial of its own under ``ALL_VERSIONS`` (version None) and
belongs to no version otherwise. Paired comparisons pair trials on (seed, variant).

Seeds are split (producers/seeds.py): scores and trials take ``seeds``: ``SELECTION`` (what chose
the benchmark: the gate and the critics read these only), ``HELD_OUT`` (what measures it: every
score a person reads), or None (every seed: the log as a whole).

``content_digest`` hashes what was decided and measured, not when (two runs are compared by it);
``derived_state`` / ``state_digest`` hash the whole derived state (tables, scores, benchmark
versions, promotions, candidate outcomes, clusters, reviews); replaying the topics into an empty
store must reproduce the digest exactly.

One module per read model, each importing only those it builds on (in brackets), never in a
cycle; this package re-exports every public name (``from consumers import state as q``):
- scope: the WHERE conditions ``run_id`` and ``as_of`` make, and the constants every module shares;
- registry (scope): models and model versions (LATEST, ALL_VERSIONS);
- versions (scope): decisions and benchmark versions;
- trial_scores (registry, versions): trials and scores, the seed split (SELECTION, HELD_OUT),
  which versions have trials;
- comparisons (trial_scores): paired effects, saturation, discrimination, adjacent pairs, the
  frontier;
- failure_clusters (scope): failure types and timeline, clusters, what a mutator cycle seeds from;
- loop (versions): candidates, verdicts, the funnel, cycles, open reviews;
- digest (trial_scores, failure_clusters, loop): table counts and fingerprints, derived state and the digests,
  refused requests;
- spend (digest, failure_clusters, loop, trial_scores): rollouts spent, episode seconds, execution quality, the
  figures status shows;
- online (all of them): what the online processors and the orchestrator read (single episodes
  and requests, and the other read models they use): the only module of the package they import.
"""

from consumers.state.comparisons import (
    AdjacentPair,
    Discrimination,
    PairedEffect,
    SaturationSignal,
    adjacent_pairs,
    discrimination,
    discrimination_by_version,
    discrimination_of,
    frontier_of,
    outcomes_by_pair,
    paired_effects,
    saturation,
    saturation_of,
)
from consumers.state.digest import (
    content_digest,
    content_state,
    derived_state,
    refused_requests,
    state_digest,
    table_counts,
    table_fingerprints,
)
from consumers.state.failure_clusters import (
    ClusterSummary,
    FailureBucket,
    FailureTypeCount,
    cluster_assignments,
    cluster_events,
    cluster_log_length,
    clusters,
    failure_timeline,
    failure_types,
    noise_episodes,
)
from consumers.state.loop import (
    Candidate,
    Cycle,
    Funnel,
    OpenReview,
    Verdict,
    candidates,
    cycles,
    funnel,
    open_reviews,
    verdicts,
)
from consumers.state.online import (
    analysed_episodes,
    episode_keyframes,
    in_flight_seeds,
    requested,
    scenario_spec,
)
from consumers.state.registry import (
    ALL_VERSIONS,
    LATEST,
    ModelVersion,
    ModelVersions,
    RegisteredModel,
    UnknownModelVersion,
    latest_model_versions,
    model_versions,
    models,
    ranked_model_ids,
    ranked_of,
)
from consumers.state.scope import (
    DECISION_STATUS,
    ENDED,
    INVALID_TERMINATIONS,
    ORACLE_KIND,
    SATURATION_RATE,
    STARTED,
)
from consumers.state.spend import (
    ExecutionQuality,
    MemoryFigures,
    RolloutSpend,
    episode_seconds,
    execution_quality,
    memory_figures,
    rollouts_spent,
)
from consumers.state.trial_scores import (
    HELD_OUT,
    SELECTION,
    ModelScenarioScore,
    ModelScore,
    Seeds,
    Trial,
    evaluated_versions,
    pooled_scores,
    previous_model_version,
    scores,
    trials,
)
from consumers.state.versions import (
    ActiveScenario,
    BenchmarkVersion,
    Decision,
    UnknownVersion,
    active_benchmark,
    active_scenarios,
    benchmark_versions,
    current_version,
    decisions,
    next_version,
    version_scenarios,
    versions_of,
)

__all__ = [
    "SATURATION_RATE",
    "INVALID_TERMINATIONS",
    "ORACLE_KIND",
    "DECISION_STATUS",
    "ENDED",
    "STARTED",
    "table_counts",
    "table_fingerprints",
    "RegisteredModel",
    "models",
    "ranked_model_ids",
    "ranked_of",
    "LATEST",
    "ALL_VERSIONS",
    "ModelVersions",
    "SELECTION",
    "HELD_OUT",
    "Seeds",
    "UnknownModelVersion",
    "latest_model_versions",
    "ModelVersion",
    "model_versions",
    "evaluated_versions",
    "previous_model_version",
    "Decision",
    "decisions",
    "ActiveScenario",
    "BenchmarkVersion",
    "benchmark_versions",
    "versions_of",
    "active_benchmark",
    "current_version",
    "next_version",
    "active_scenarios",
    "UnknownVersion",
    "version_scenarios",
    "Trial",
    "trials",
    "ModelScenarioScore",
    "scores",
    "ModelScore",
    "pooled_scores",
    "PairedEffect",
    "outcomes_by_pair",
    "paired_effects",
    "SaturationSignal",
    "saturation",
    "saturation_of",
    "Discrimination",
    "discrimination",
    "AdjacentPair",
    "adjacent_pairs",
    "discrimination_of",
    "discrimination_by_version",
    "frontier_of",
    "FailureTypeCount",
    "failure_types",
    "FailureBucket",
    "failure_timeline",
    "ClusterSummary",
    "clusters",
    "cluster_assignments",
    "cluster_events",
    "cluster_log_length",
    "noise_episodes",
    "requested",
    "in_flight_seeds",
    "scenario_spec",
    "analysed_episodes",
    "episode_keyframes",
    "Verdict",
    "verdicts",
    "Candidate",
    "candidates",
    "Funnel",
    "funnel",
    "Cycle",
    "cycles",
    "OpenReview",
    "open_reviews",
    "RolloutSpend",
    "rollouts_spent",
    "episode_seconds",
    "ExecutionQuality",
    "execution_quality",
    "MemoryFigures",
    "memory_figures",
    "refused_requests",
    "derived_state",
    "state_digest",
    "content_state",
    "content_digest",
]
