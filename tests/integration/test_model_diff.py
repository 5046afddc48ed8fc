"""diff between two versions of one model, and a version against its previous one (what a CI check
of a new model version runs), from a real chDB store."""

import pytest
from evidence_factory import EvidenceLog, spec, store_events

from consumers.diff import DiffInputError, ModelRef, as_dict, compare_models, compare_with_previous

X, Y = spec("x"), spec("y")


@pytest.fixture
def versions(store):
    """m@1 passes 2 of 10 seeds on x, m@2 9 of 10 (the same seeds); both pass y; n has one version."""
    log = EvidenceLog()
    log.register("m", version="1")
    log.register("n")
    log.promoted(X, 1)
    log.promoted(Y, 1)
    for seed in range(10):
        log.episode("m", X, seed, seed < 2, model_version="1")
        log.episode("m", Y, seed, True, model_version="1")
        log.episode("n", X, seed, seed < 5)
    log.register("m", version="2")
    for seed in range(10):
        log.episode("m", X, seed, seed < 9, model_version="2")
        log.episode("m", Y, seed, True, model_version="2")
    store_events(store, log.events)
    return log


def test_two_versions_of_one_model_pair_on_their_seeds(store, versions):
    diff = compare_models(store, ModelRef.parse("m@1"), ModelRef.parse("m@2"))
    assert (diff.label_a, diff.label_b, diff.version) == ("m@1", "m@2", 1)
    x, y = diff.scenarios
    assert (x.test, x.pairs.pairs, x.pairs.only_1, x.pairs.only_2) == ("mcnemar", 10, 0, 7)
    assert x.p_value == pytest.approx(2 / 2 ** 7) and x.verdict == "improvement"
    assert (y.verdict, y.difference) == ("no significant difference", 0.0)
    assert (diff.overall_a.successes, diff.overall_b.successes) == (12, 19)
    assert as_dict(diff)["model_version_a"] == "1"
    # a model named alone is at its latest version
    assert compare_models(store, "n", "m").label_b == "m@2"


def test_a_version_against_its_previous_one(store, versions):
    diff = compare_with_previous(store, "m")
    assert (diff.label_a, diff.label_b, diff.improvements, diff.regressions) == ("m@1", "m@2", ("scn-x",), ())
    backwards = compare_with_previous(store, "m", model_version="1")
    assert backwards is None  # the first version has nothing before it
    assert compare_with_previous(store, "n") is None


def test_bad_version_input_is_named(store, versions):
    with pytest.raises(DiffInputError, match="are both m@2"):
        compare_models(store, "m", "m@2")
    with pytest.raises(DiffInputError, match="version '7' has no episodes.*versions with episodes: 1, 2"):
        compare_models(store, "m@7", "m")
    with pytest.raises(DiffInputError, match="got 'm@1' twice"):
        compare_models(store, ModelRef("m", "1"), ModelRef("m", "1"))
    with pytest.raises(DiffInputError, match="no version '7'"):
        compare_with_previous(store, "m", model_version="7")
    more = EvidenceLog(start=versions.clock)
    more.register("m", version="3")  # registered, not yet run
    store_events(store, more.events)
    with pytest.raises(DiffInputError, match="latest version '3' has no episodes.*name one as m@VERSION"):
        compare_models(store, "m@1", "m")


@pytest.mark.parametrize("text,ref", [("m", ModelRef("m")), ("m@2", ModelRef("m", "2")),
                                      ("org/vla@1.0@rc1", ModelRef("org/vla@1.0", "rc1"))])
def test_model_refs_parse(text, ref):
    assert ModelRef.parse(text) == ref and str(ref) == text


@pytest.mark.parametrize("text", ["m@", "@2", "", " @ "])
def test_a_model_ref_without_a_name_or_version_is_refused(text):
    with pytest.raises(DiffInputError, match="MODEL or MODEL@VERSION"):
        ModelRef.parse(text)
