"""Report periods: ISO weeks in a time zone, DST weeks, the week before, bad input named."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from collector.config import ConfigError, load_settings
from collector.report.period import PeriodError, between, parse_instant, parse_week


def unix(*args: int, tz: str = "UTC") -> int:
    return int(datetime(*args, tzinfo=ZoneInfo(tz)).timestamp())  # type: ignore[misc]


def test_last_week_is_the_last_complete_iso_week_in_the_zone() -> None:
    # Monday 2026-11-30 00:30 in Berlin is still Sunday 23:30 UTC: the zones disagree on "last"
    now = unix(2026, 11, 30, 0, 30, tz="Europe/Berlin")
    berlin = parse_week("last", "Europe/Berlin", now)
    assert berlin.label == "2026-W48"
    assert berlin.start == unix(2026, 11, 23, tz="Europe/Berlin") and berlin.seconds == 7 * 86400
    assert parse_week("last", "UTC", now).label == "2026-W47"
    assert parse_week("this", "Europe/Berlin", now).label == "2026-W49"
    assert berlin.previous().label == "2026-W47" and berlin.previous().end == berlin.start


def test_a_week_with_a_clock_change_has_its_true_length_and_local_days() -> None:
    week = parse_week("2026-W13", "Europe/Berlin", 0)  # summer time starts Sunday 2026-03-29
    assert week.seconds == 7 * 86400 - 3600
    days = week.days()
    assert [d[0] for d in days][:2] == ["2026-03-23", "2026-03-24"] and len(days) == 7
    assert [hi - lo for _, lo, hi in days] == [86400] * 6 + [82800]
    assert days[0][1] == week.start and days[-1][2] == week.end
    autumn = parse_week("2026-W43", "Europe/Berlin", 0)  # winter time starts Sunday 2026-10-25
    assert autumn.seconds == 7 * 86400 + 3600
    assert autumn.previous().label == "2026-W42" and autumn.previous().seconds == 7 * 86400


def test_bad_weeks_and_times_are_named() -> None:
    with pytest.raises(PeriodError, match="2025 has no ISO week 53"):
        parse_week("2025-W53", "UTC", 0)
    with pytest.raises(PeriodError, match="expected last, this or an ISO week"):
        parse_week("week 48", "UTC", 0)
    with pytest.raises(PeriodError, match="expected unix seconds"):
        parse_instant("yesterday", "UTC")
    with pytest.raises(PeriodError, match="ends"):
        between(100, 100, "UTC")
    assert parse_instant("2026-11-23", "Europe/Berlin") == unix(2026, 11, 23, tz="Europe/Berlin")
    assert parse_instant("2026-11-23T08:00:00Z", "Europe/Berlin") == int(
        datetime(2026, 11, 23, 8, tzinfo=UTC).timestamp()
    )
    assert between(unix(2026, 11, 1), unix(2026, 12, 1), "UTC").label == "2026-11-01 to 2026-12-01"


def test_report_configuration_is_checked_where_it_is_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "llmslo.yaml"
    path.write_text("report:\n  timezone: Mars/Olympus\n  schedule_time: '8:00'\n  webhook_url: ftp://x\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path, environ={})
    text = "\n".join(err.value.problems)
    assert "report.timezone" in text and "Mars/Olympus" in text
    assert "report.schedule_time" in text and "report.webhook_url" in text
    assert f"{path}:2" in text  # the line it is on
    path.write_text("report:\n  smtp: {host: mail.example.test, from: llmslo@example.test, to: [a@example.test]}\n")
    smtp = load_settings(path, environ={"LLMSLO_REPORT__SMTP__PASSWORD": "s3cret"}).report.smtp
    assert smtp is not None and smtp.sender == "llmslo@example.test" and smtp.password == "s3cret"
