"""The ages and times export-hard-cases and prune accept (infra/cli/read.py)."""

from datetime import UTC, datetime, timedelta

import pytest
import typer

from infra.cli.read import _age, _since


@pytest.mark.parametrize(("text", "expected"), [
    ("30d", timedelta(days=30)), ("12h", timedelta(hours=12)), ("2w", timedelta(weeks=2)),
    ("90m", timedelta(minutes=90)), ("1d12h", timedelta(days=1, hours=12)), ("45s", timedelta(seconds=45))])
def test_ages(text, expected):
    assert _age(text) == expected


@pytest.mark.parametrize("text", ["30", "d", "30 days", "-1d", "1.5d", "1y", ""])
def test_bad_ages_are_refused_by_name(text):
    with pytest.raises(typer.BadParameter, match="not an age"):
        _age(text)


def test_since_takes_iso_times_utc_by_default_or_an_age():
    assert _since("2026-05-01T00:00Z") == datetime(2026, 5, 1, tzinfo=UTC)
    assert _since("2026-05-01T02:00+02:00") == datetime(2026, 5, 1, tzinfo=UTC)
    assert _since("2026-05-01") == datetime(2026, 5, 1, tzinfo=UTC)
    assert abs(_since("7d") - (datetime.now(UTC) - timedelta(days=7))) < timedelta(seconds=5)
    assert _since(None) is None
    with pytest.raises(typer.BadParameter, match="neither an ISO time"):
        _since("last tuesday")
