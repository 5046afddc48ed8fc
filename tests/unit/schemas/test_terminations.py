"""The episode ends the producers know are the schema's: one list in code, checked against the contract."""

from producers.episode import HARNESS_TERMINATIONS, TERMINATIONS
from schemas import loader


def test_terminations_are_the_episode_ended_schemas_symbols():
    [field] = [f for f in loader.expanded_schema("EpisodeEnded")["fields"] if f["name"] == "termination"]
    assert tuple(field["type"]["symbols"]) == TERMINATIONS
    assert set(HARNESS_TERMINATIONS) < set(TERMINATIONS)
