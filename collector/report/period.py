"""Report periods: ISO calendar weeks (and their days) in a configured time zone."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from zoneinfo import ZoneInfo

WEEK_RE = re.compile(r"^(\d{4})-W(\d{2})$")


class PeriodError(ValueError):
    """A week or period the user gave that does not name a period."""


@dataclass(frozen=True)
class Period:
    start: int  # unix seconds, inclusive
    end: int  # exclusive
    label: str  # 2026-W48, or the dates
    timezone: str

    @property
    def seconds(self) -> int:
        return self.end - self.start

    def previous(self) -> Period:
        """The period just before, as long (for a week: the week before, DST included)."""
        tz = ZoneInfo(self.timezone)
        if WEEK_RE.match(self.label):
            start = datetime.fromtimestamp(self.start, tz)
            monday = (start - timedelta(days=7)).date()
            return week_of(monday, self.timezone)
        return Period(self.start - self.seconds, self.start, f"{self.label} (before)", self.timezone)

    def days(self) -> list[tuple[str, int, int]]:
        """(YYYY-MM-DD, start, end) of each local day in the period (23 or 25 hours on DST days)."""
        tz = ZoneInfo(self.timezone)
        out = []
        day = datetime.fromtimestamp(self.start, tz).date()
        while True:
            lo = max(self.start, _midnight(day, tz))
            hi = min(self.end, _midnight(day + timedelta(days=1), tz))
            if lo >= self.end:
                break
            out.append((day.isoformat(), lo, hi))
            day += timedelta(days=1)
        return out


def _midnight(d: date, tz: ZoneInfo) -> int:
    return int(datetime(d.year, d.month, d.day, tzinfo=tz).timestamp())


def week_of(monday: date, timezone: str) -> Period:
    tz = ZoneInfo(timezone)
    iso = monday.isocalendar()
    start = _midnight(monday, tz)
    end = _midnight(monday + timedelta(days=7), tz)
    return Period(start, end, f"{iso.year}-W{iso.week:02d}", timezone)


def parse_week(spec: str, timezone: str, now_unix: float) -> Period:
    """`last` (the last complete week), `this` (the running one, to its end) or `YYYY-Www`."""
    tz = ZoneInfo(timezone)
    today = datetime.fromtimestamp(now_unix, tz).date()
    this_monday = today - timedelta(days=today.weekday())
    if spec == "last":
        return week_of(this_monday - timedelta(days=7), timezone)
    if spec == "this":
        return week_of(this_monday, timezone)
    m = WEEK_RE.match(spec)
    if m is None:
        raise PeriodError(f"week {spec!r}: expected last, this or an ISO week such as 2026-W48")
    year, week = int(m.group(1)), int(m.group(2))
    try:
        monday = date.fromisocalendar(year, week, 1)
    except ValueError:
        raise PeriodError(f"week {spec!r}: {year} has no ISO week {week}") from None
    return week_of(monday, timezone)


def parse_instant(text: str, timezone: str) -> int:
    """Unix seconds from unix digits, an RFC 3339 time, or a date (midnight in `timezone`)."""
    text = text.strip()
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return int(float(text))
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            return _midnight(date.fromisoformat(text), ZoneInfo(timezone))
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise PeriodError(f"{text!r}: expected unix seconds, a date (YYYY-MM-DD) or RFC 3339") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=ZoneInfo(timezone))
    return int(moment.timestamp())


def between(start: int, end: int, timezone: str) -> Period:
    if end <= start:
        raise PeriodError(f"the period ends ({end}) at or before it starts ({start})")
    tz = ZoneInfo(timezone)
    lo = datetime.fromtimestamp(start, tz)
    hi = datetime.fromtimestamp(end, tz)
    fmt = "%Y-%m-%d" if lo.time() == hi.time() == datetime.min.time() else "%Y-%m-%dT%H:%M"
    return Period(start, end, f"{lo.strftime(fmt)} to {hi.strftime(fmt)}", timezone)
