"""Which fleet views (/api/v1/serving without a selector, per window and business type) a derive
pass encodes as it ends, so that their readers get a recent body at once instead of waiting for
the encode (1,000 (target, model) groups derived and 9.3 MB of JSON: 1-4 s under load).

A view read once is encoded at the end of every pass that follows a read, and kept at most two
passes old, for `horizon` seconds (READ_AHEAD_SECONDS) after the read.

A view read twice or more is polled: its period is the gap between its last two reads (a
dashboard refreshing every minute, a script every five). When that period is longer than two
passes, the view is encoded once per poll, at the last pass before the next read is due, and not
in between: a reader polling every 5 minutes gets a fresh body at once (before, each of its reads
came after the read-ahead had lapsed and waited for the encode), and one polling every minute
costs one encode per poll instead of two. A reader that is late keeps its view renewed until
`late_for(period)` after the read was due; then it counts as gone, and its next read is encoded
on request and gives its period afresh.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

READ_AHEAD_SECONDS = 120.0
MIN_PERIOD_SECONDS = 1.0  # reads closer than this are one read (two panels of one dashboard)
MAX_KEYS = 256  # views remembered; the least recently read go first
EARLY_SECONDS = 2.0  # a pass this close to a pass before the read still counts as before it


def late_for(period: float) -> float:
    """How long after its due time a polled view is still kept encoded."""
    return max(READ_AHEAD_SECONDS / 2, period / 4)


class ReadAhead(Generic[K]):
    """The readers' pattern per view key, and the views a pass ending now should encode.
    Times are one monotonic clock's seconds (the caller's)."""

    def __init__(self, pass_seconds: float, horizon: float = READ_AHEAD_SECONDS) -> None:
        self.pass_seconds = pass_seconds
        self.horizon = horizon
        self.last: dict[K, float] = {}  # key -> its last read
        self.period: dict[K, float] = {}  # key -> the gap between its last two reads
        self.read_since_pass: set[K] = set()
        self.ahead_for: dict[K, float] = {}  # key -> the due read it was last encoded for

    def read(self, key: K, now: float) -> None:
        """A read of `key` at `now`. The keys read are remembered (up to MAX_KEYS, the least
        recently read forgotten first), so that a reader's next read, however late, gives its period."""
        last = self.last.get(key)
        if last is not None and now - last >= MIN_PERIOD_SECONDS:
            self.period[key] = now - last
        if last is None or now - last >= MIN_PERIOD_SECONDS:
            self.last[key] = now
        self.read_since_pass.add(key)
        if len(self.last) > MAX_KEYS:  # a client asking for ever new windows or business types
            for old in sorted(self.last, key=self.last.__getitem__)[: len(self.last) - MAX_KEYS]:
                for held in (self.last, self.period, self.ahead_for):
                    held.pop(old, None)

    def due(self, now: float, age: Callable[[K], float | None]) -> list[K]:
        """At the end of a pass: the views to encode now. `age(key)`: how many seconds of derive
        passes older than this one the view's held body is (None: no body held)."""
        d = self.pass_seconds
        renew = 2 * d - 5  # a body two passes old is renewed
        out: list[K] = []
        for key, read_at in list(self.last.items()):
            read_since = key in self.read_since_pass
            self.read_since_pass.discard(key)  # a read from now on counts for the next pass (readers' thread)
            period = self.period.get(key)
            held = age(key)
            stale = held is None or held >= renew
            if period is None or period <= 2 * d:  # read once, or polled within two passes
                if now - read_at <= self.horizon and (read_since or stale):
                    out.append(key)
                continue
            due_at = read_at + period
            if now > due_at + late_for(period):
                continue  # gone: its next read is encoded on request (and gives the new period)
            if now >= due_at - d - EARLY_SECONDS and (self.ahead_for.get(key) != due_at or stale):
                self.ahead_for[key] = due_at  # the last pass before the read (or a late reader's renewal)
                out.append(key)
        return out
