"""When a cycle's candidate is done with its critics: the gate may promote before the semantic
verdict lands (it is not required without a judge), and a run that ended on the decision alone
held two or three verdicts per candidate depending on timing (CI saw two runs of one seed differ)."""

from datetime import UTC, datetime

from consumers.state import Verdict
from infra.orchestrator import critics_finished

AT = datetime(2026, 1, 1, tzinfo=UTC)


def verdict(critic: str, passed: bool | None) -> Verdict:
    return Verdict(f"ev-{critic}", AT, "scn-1", critic, "1", True, None, passed, "", "", 0, "{}")


def test_a_candidate_is_finished_after_a_rejection_or_all_three_verdicts():
    assert not critics_finished([])
    assert critics_finished([verdict("robustness", False)])  # rejected: nothing more comes
    assert not critics_finished([verdict("robustness", True)])
    assert not critics_finished([verdict("robustness", True), verdict("safety", True)])  # semantic still to come
    assert critics_finished([verdict("robustness", True), verdict("safety", False), verdict("semantic", None)])
    assert not critics_finished([verdict("robustness", None), verdict("safety", True)])  # borderline: all three
    assert critics_finished([verdict("robustness", None), verdict("safety", True), verdict("semantic", None)])
