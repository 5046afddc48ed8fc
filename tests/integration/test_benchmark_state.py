"""The typed queries against a real chDB store holding a small evolved benchmark (read_world),
its events encoded with the real codec and inserted as the sink inserts them."""

from datetime import timedelta

import pytest
import read_world as world
from evidence_factory import EvidenceLog, spec, store_events

from consumers import state as bs


@pytest.fixture
def log(store):
    built = world.build()
    store_events(store, built.events)
    return built


def test_benchmark_versions_follow_promotions_and_retirements(store, log):
    versions = bs.benchmark_versions(store)
    assert [(v.version, v.scenario_ids, v.promoted, v.retired) for v in versions] == [
        (1, ("scn-base",), ("scn-base",), ()),
        (2, ("scn-base", "scn-slip"), ("scn-slip",), ()),
        (3, ("scn-slip",), (), ("scn-base",))]
    slip = versions[1].scenarios[1]
    assert slip.spec["object_friction"] == 0.1 and slip.parent_scenario_id == "scn-base"
    assert (slip.factor, slip.source_cluster_id, slip.promoted_in) == ("friction", "c1", 2)
    assert bs.current_version(store) == 3 and bs.active_scenarios(store) == ["scn-slip"]
    assert bs.next_version(store) == 4
    # as of just before the second promotion, only version 1 exists
    before = versions[1].created_at - timedelta(microseconds=1)
    assert [v.version for v in bs.benchmark_versions(store, as_of=before)] == [1]
    assert bs.active_benchmark(store, version=2).scenario_ids == ("scn-base", "scn-slip")
    assert bs.active_benchmark(store, version=7) is None
    with pytest.raises(bs.UnknownVersion, match="version 7 does not exist.*1, 2, 3"):
        bs.scores(store, version=7)


def test_scores_count_one_trial_per_seed_with_wilson_intervals(store, log):
    table = {(s.model_id, s.scenario_id): s for s in bs.scores(store)}
    strong = table[("strong", "scn-slip")]
    assert (strong.episodes, strong.successes, strong.invalid) == (20, 16, 0)
    assert strong.interval == pytest.approx((0.584, 0.919), abs=1e-3)
    assert table[("weak", "scn-base")].successes == 19
    assert {s.scenario_id for s in bs.scores(store, version=3)} == {"scn-slip"}
    # The same seed again (a re-run under another request) is the same trial; an env_error is no evidence.
    more = EvidenceLog(start=log.clock + timedelta(seconds=10))
    request = more.request(world.SLIP, "strong", [0, 1], purpose="adhoc")
    more.episode("strong", world.SLIP, 0, True, request_id=request)
    more.episode("strong", world.SLIP, 1, True, request_id=request)
    more.episode("strong", world.SLIP, 99, False, termination="env_error", request_id=request)
    store_events(store, more.events)
    strong = next(s for s in bs.scores(store, model_ids=["strong"]) if s.scenario_id == "scn-slip")
    assert (strong.episodes, strong.successes, strong.invalid) == (20, 16, 1)


def test_every_event_counts_once_whatever_the_merges(store, log):
    before = bs.derived_state(store)
    store_events(store, log.events)  # the whole log delivered a second time
    raw = store.query("SELECT count() FROM {database}.rollout_episodes")[0][0]
    assert raw == 2 * before["tables"]["rollout_episodes"][0]  # the duplicates are really there
    assert bs.derived_state(store) == before
    assert bs.funnel(store)[-1].proposed == 5 and len(bs.verdicts(store)) == 4


def test_run_and_as_of_scope_the_queries(store, log):
    other = EvidenceLog(run_id="run-2", start=log.clock + timedelta(minutes=5))
    other.episode("strong", world.BASE, 100, False)
    store_events(store, other.events)
    assert {s.model_id for s in bs.scores(store, run_id="run-2")} == {"strong"}
    assert next(s for s in bs.scores(store, run_id="run-1") if s.model_id == "strong"
                and s.scenario_id == "scn-base").episodes == 20
    assert sum(s.episodes for s in bs.scores(store, as_of=log.clock)) == 160
    assert sum(s.episodes for s in bs.scores(store)) == 161


def test_paired_effect_of_a_promotion_against_its_parent(store, log):
    effects = {e.model_id: e for e in bs.paired_effects(store)}
    assert set(effects) == set(world.MODELS)
    strong = effects["strong"]
    assert (strong.scenario_id, strong.parent_scenario_id, strong.factor) == ("scn-slip", "scn-base", "friction")
    assert (strong.effect.pairs, strong.effect.only_1, strong.effect.only_2) == (20, 4, 0)
    assert strong.effect.difference == pytest.approx(-0.2)
    assert strong.effect.p_value == pytest.approx(0.125)
    weak = effects["weak"].effect
    assert (weak.both, weak.only_1, weak.neither) == (4, 15, 1)
    assert weak.interval[1] < 0  # significantly harder for the weak model
    assert effects["oracle"].effect.difference == 0.0
    assert bs.paired_effects(store, version=1) == []  # the base has no parent


def test_saturation_and_discrimination_per_version(store, log):
    v1 = bs.saturation(store, version=1)
    assert [(s.scenario_id, s.saturated, s.weakest_model, s.models) for s in v1] == [("scn-base", True, "weak", 3)]
    assert v1[0].min_rate == pytest.approx(0.95)
    assert not any(s.saturated for s in bs.saturation(store))  # v3: only the slippery child
    assert bs.saturation(store, version=1, threshold=0.99)[0].saturated is False
    d = bs.discrimination(store, ranking=["strong", "medium", "weak"])
    assert d.version == 3 and [m.model_id for m in d.model_scores] == ["strong", "medium", "weak"]
    assert d.spread == pytest.approx(0.6) and d.spearman == pytest.approx(1.0)
    assert (d.separated_pairs, d.pairs) == (1, 3)
    assert bs.discrimination(store, ranking=["weak", "medium", "strong"]).spearman == pytest.approx(-1.0)
    frontier = bs.discrimination_by_version(store)
    assert [f.version for f in frontier] == [1, 2, 3]
    assert [round(f.spread, 3) for f in frontier] == [0.05, 0.325, 0.6]


def test_failures_clusters_and_noise(store, log):
    types = {f.failure_type: f for f in bs.failure_types(store)}
    assert (types["slip"].moments, types["slip"].episodes) == (31, 31)
    assert types["slip"].recovered == 15 and types["grasp_miss"].recovered == 4
    assert {f.failure_type for f in bs.failure_types(store, model_ids=["oracle"])} == {"grasp_miss"}
    timeline = bs.failure_timeline(store, bucket_seconds=3600)
    assert sum(b.moments for b in timeline) == 35 and {b.failure_type for b in timeline} == {"slip", "grasp_miss"}
    live = bs.clusters(store)
    assert [(c.cluster_id, c.size, c.revision) for c in live] == [("c1", 3, 2)]  # c0 retired (size 0)
    assert live[0].summary == "slips off a light cube" and live[0].representative_keyframe_sha256 == world.KEYFRAME
    assert {c.cluster_id for c in bs.clusters(store, include_retired=True)} == {"c0", "c1"}
    assert bs.clusters(store, as_of_position=2)[0].size == 1  # before c1's second revision
    assert bs.noise_episodes(store) == 0


def test_candidate_funnel_reviews_cycles_and_rollouts(store, log):
    by_id = {c.scenario_id: c for c in bs.candidates(store)}
    assert {k: c.status for k, c in by_id.items()} == {
        "scn-base": "retired", "scn-slip": "promoted", "scn-far": "rejected", "scn-late": "deferred",
        "scn-odd": "review"}
    assert [v.critic for v in by_id["scn-slip"].verdicts] == ["robustness", "safety", "semantic"]
    assert by_id["scn-slip"].verdicts[2].ran is False and by_id["scn-slip"].rollouts == 160
    guided = next(f for f in bs.funnel(store) if f.generator == "failure-guided")
    assert (guided.infeasible, guided.proposed, guided.with_verdicts, guided.promoted, guided.rejected,
            guided.deferred, guided.review, guided.pending, guided.rollouts) == (1, 4, 2, 1, 1, 1, 1, 0, 200)
    assert [r.scenario_id for r in bs.open_reviews(store)] == ["scn-odd"]
    cycle = bs.cycles(store)[0]
    assert (cycle.cycle_id, cycle.cycle, cycle.benchmark_version, cycle.infeasible, cycle.answered) == (
        "cyc-1", 1, 1, 1, True)
    assert len(cycle.proposed) == 4
    spent = {r.purpose: r for r in bs.rollouts_spent(store)}
    assert (spent["sweep"].requests, spent["sweep"].requested_episodes, spent["sweep"].ended_episodes) == (4, 80, 80)
    assert spent["validation"].env_steps == 80 * 50
    # A reviewer approves: the review closes and the candidate waits for the gate to promote it.
    more = EvidenceLog(start=log.clock + timedelta(seconds=5))
    more.review_decided("scn-odd", approved=True)
    store_events(store, more.events)
    assert bs.open_reviews(store) == []
    assert next(c for c in bs.candidates(store) if c.scenario_id == "scn-odd").status == "approved"


def test_execution_quality_beside_success(store, log):
    quality = {q.model_id: q for q in bs.execution_quality(store)}
    weak = quality["weak"]
    assert weak.episodes == 40 and weak.success_rate == pytest.approx(23 / 40)
    assert weak.moments == 18 and weak.recovered == 9 and weak.recovery_rate == pytest.approx(0.5)
    assert weak.regrasps == pytest.approx((1 + 16 * 2) / 40)
    assert weak.peak_contact_force == pytest.approx(30.0) and weak.time_to_success == pytest.approx(50.0)
    per_scenario = bs.execution_quality(store, by_scenario=True, version=3)
    assert {(q.model_id, q.scenario_id) for q in per_scenario} == {(m, "scn-slip") for m in world.MODELS}


def test_a_flagged_success_is_a_success_with_an_unrecovered_moment(store):
    log = EvidenceLog()
    log.episode("m", spec("x"), 0, True, moments=[("excessive_force", 5, -1)])
    log.episode("m", spec("x"), 1, True, moments=[("grasp_miss", 5, 9)])
    store_events(store, log.events)
    (q,) = bs.execution_quality(store)
    assert (q.flagged_successes, q.moments, q.recovered) == (1, 2, 1)


def test_memory_figures_and_an_empty_log(store, log):
    figures = bs.memory_figures(store)
    assert (figures.episodes, figures.trials, figures.models, figures.clusters) == (160, 160, 4, 1)
    assert (figures.candidates, figures.promotions, figures.retirements, figures.benchmark_version) == (5, 2, 1, 3)
    assert (figures.open_reviews, figures.cycles, figures.active_scenarios) == (1, 1, 1)
    empty = store.with_database(store.database + "_empty")
    from consumers.evidence.store import migrate

    migrate(empty)
    try:
        nothing = bs.memory_figures(empty)
        assert nothing.episodes == 0 and nothing.benchmark_version is None and nothing.failures == ()
        assert bs.next_version(empty) == 1
        assert bs.scores(empty) == [] and bs.discrimination(empty).model_scores == ()
    finally:
        empty.command("DROP DATABASE IF EXISTS {database}")


def test_the_digest_covers_promotions_and_versions(store, log):
    before = bs.state_digest(bs.derived_state(store))
    state = bs.derived_state(store)
    assert state["benchmark_versions"][-1] == [3, ["scn-slip"], [], ["scn-base"]]
    assert [p[:2] for p in state["promotions"]] == [["scn-base", 1], ["scn-slip", 2], ["scn-base", 3]]
    more = EvidenceLog(start=log.clock + timedelta(seconds=5))
    more.promoted(spec("late", parent="scn-base", horizon=100), 4, parent_id="scn-base", factor="time_budget")
    store_events(store, more.events)
    after = bs.derived_state(store)
    assert bs.state_digest(after) != before
    assert after["benchmark_versions"][-1][:2] == [4, ["scn-late", "scn-slip"]]


def test_naive_times_are_refused(store):
    from datetime import datetime

    with pytest.raises(ValueError, match="timezone-aware"):
        bs.scores(store, as_of=datetime(2026, 1, 1))


def test_recoveries_beside_success(store):
    """Per model: trials with a recovered moment, successes that recovered, and successes flagged
    only by a moment never recovered from."""
    log = EvidenceLog()
    x = spec("x")
    log.episode("r", x, 0, True, moments=[("grasp_miss", 5, 9)])  # re-grasped, then succeeded: not flagged
    log.episode("r", x, 1, True, moments=[("stall", 5, 20, "progressed"), ("excessive_force", 30, -1)])  # flagged
    log.episode("r", x, 2, False, moments=[("slip", 5, 12), ("drop", 40, -1)])
    log.episode("r", x, 3, True)  # clean
    log.episode("r", x, 4, False, analysed=False)  # the detector has not analysed it
    log.episode("r", x, 5, False, termination="env_error", moments=[("slip", 5, 9)])  # not a trial that counts
    store_events(store, log.events)
    (q,) = bs.execution_quality(store)
    assert (q.episodes, q.successes, q.analysed, q.clean_successes) == (5, 3, 4, 1)
    assert (q.episodes_recovered, q.successes_recovered, q.flagged_successes) == (3, 2, 1)
    assert (q.moments, q.recovered, q.recovered_only_successes) == (5, 3, 1)
    assert q.recovered_share == pytest.approx(3 / 5) and q.recovery_rate == pytest.approx(3 / 5)
    recovered = {f.failure_type: f.recovered for f in bs.failure_types(store)}
    assert recovered == {"grasp_miss": 1, "stall": 1, "excessive_force": 0, "slip": 2, "drop": 0}


def test_the_world_execution_quality_counts_its_recoveries(store, log):
    weak = next(q for q in bs.execution_quality(store) if q.model_id == "weak")
    # base seed 0: a grasp_miss re-grasped then a success; the child's failures on odd seeds recovered a slip
    assert (weak.episodes_recovered, weak.successes_recovered, weak.flagged_successes) == (9, 1, 0)
    assert (weak.clean_successes, weak.analysed, weak.model_version) == (22, 40, "1")


def test_model_versions_are_never_pooled(store):
    log = EvidenceLog()
    x, y = spec("x"), spec("y")
    log.register("m", version="1")
    for seed in range(10):
        log.episode("m", x, seed, seed < 2, model_version="1")
        log.episode("m", y, seed, True, model_version="1")
    log.register("m", version="2")
    for seed in range(10):
        log.episode("m", x, seed, seed < 9, model_version="2")
    for version in ("a", "b"):  # never registered: its latest episode's version is its latest
        log.episode("u", x, 0, version == "b", model_version=version)
    store_events(store, log.events)
    assert bs.latest_model_versions(store) == {"m": "2", "u": "b"}
    latest = {(s.model_id, s.scenario_id): s for s in bs.scores(store)}
    assert set(latest) == {("m", "scn-x"), ("u", "scn-x")}  # v2 was not run on y: y is not scored for m
    assert (latest[("m", "scn-x")].successes, latest[("m", "scn-x")].model_version) == (9, "2")
    every = {(s.model_id, s.model_version, s.scenario_id): s.successes
             for s in bs.scores(store, model_versions=bs.ALL_VERSIONS)}
    assert every == {("m", "1", "scn-x"): 2, ("m", "1", "scn-y"): 10, ("m", "2", "scn-x"): 9,
                     ("u", "a", "scn-x"): 0, ("u", "b", "scn-x"): 1}
    pinned = {s.scenario_id: s.successes for s in bs.scores(store, model_ids=["m"], model_versions={"m": "1"})}
    assert pinned == {"scn-x": 2, "scn-y": 10}
    assert [(t.model_version, t.seed) for t in bs.trials(store, model_ids=["m"], scenario_ids=["scn-x"])][:2] == [
        ("2", 0), ("2", 1)]
    (q,) = [q for q in bs.execution_quality(store) if q.model_id == "m"]
    assert (q.model_version, q.episodes) == ("2", 10)
    with pytest.raises(ValueError, match="model_versions must be"):
        bs.scores(store, model_versions="newest")


def test_model_versions_and_the_previous_one_with_trials(store):
    log = EvidenceLog()
    x, y = spec("x"), spec("y")
    log.register("m", version="1")
    log.episode("m", y, 0, True, model_version="1")
    log.register("m", version="2")
    log.episode("m", x, 0, True, model_version="2")
    log.register("m", version="3")
    log.episode("m", x, 0, True, model_version="3")
    log.episode("m", y, 0, True, model_version="3")
    store_events(store, log.events)
    versions = bs.model_versions(store, model_id="m")
    assert [(v.version, v.latest, v.kind) for v in versions] == [("1", False, "scripted"), ("2", False, "scripted"),
                                                                  ("3", True, "scripted")]
    assert versions[0].registered_at < versions[1].registered_at and versions[2].first_episode_at is not None
    assert bs.previous_model_version(store, "m").version == "2"
    assert bs.previous_model_version(store, "m", scenario_ids=["scn-y"]).version == "1"  # v2 never ran y
    assert bs.previous_model_version(store, "m", version="2", scenario_ids=["scn-x"]) is None
    assert bs.previous_model_version(store, "m", version="1") is None
    assert bs.evaluated_versions(store) == {"m": "3"}
    more = EvidenceLog(start=log.clock)
    more.register("m", version="4")  # not run yet: the newest version with trials stays 3
    store_events(store, more.events)
    assert bs.evaluated_versions(store) == {"m": "3"} and bs.latest_model_versions(store) == {"m": "4"}
    with pytest.raises(bs.UnknownModelVersion, match="no version '9'.*1, 2, 3"):
        bs.previous_model_version(store, "m", version="9")
    with pytest.raises(bs.UnknownModelVersion, match="'nobody' is neither registered"):
        bs.previous_model_version(store, "nobody")


def test_variants_are_trials_of_their_own_and_pair_by_seed_and_variant(store):
    log = EvidenceLog()
    x = spec("x")
    for variant, ok in (("", True), ("temperature=0.7", False)):
        log.episode("m", x, 0, ok, variant=variant)
    log.episode("m", x, 1, True, started=False)  # its start is missing: no seed, no version
    store_events(store, log.events)
    (score,) = bs.scores(store)
    assert (score.episodes, score.successes) == (2, 1)  # the start-less episode belongs to no version
    every = bs.trials(store, model_versions=bs.ALL_VERSIONS)
    assert [(t.model_version, t.seed, t.variant) for t in every] == [  # no version sorts last
        ("1", 0, ""), ("1", 0, "temperature=0.7"), (None, None, "")]
    assert bs.outcomes_by_pair(every)[("m", "1", "scn-x")] == {(0, ""): True, (0, "temperature=0.7"): False}
    assert bs.memory_figures(store).trials == 3


def test_episode_seconds_run_from_each_start_to_its_end_once_per_episode(store):
    log = EvidenceLog(run_id="timed")
    log.episode("m", spec("x"), 0, True)  # started, then ended a second later (the factory's clock)
    since = log.clock
    log.episode("m", spec("x"), 1, False)
    log.episode("m", spec("x"), 2, False)
    log.episode("m", spec("x"), 3, False, started=False)  # no start: no time to count
    store_events(store, log.events)
    store_events(store, log.events)  # delivered twice: each episode counts once
    assert bs.episode_seconds(store) == pytest.approx(3.0)
    assert bs.episode_seconds(store, since=since) == pytest.approx(2.0)  # the first started before
    assert bs.episode_seconds(store, since=log.clock + timedelta(seconds=1)) == 0.0
    with pytest.raises(ValueError, match="timezone-aware"):
        bs.episode_seconds(store, since=since.replace(tzinfo=None))
