"""Multi-window, multi-burn-rate alert windows, kept as data (Google SRE Workbook, ch. 5).

A pair fires when the error budget burns faster than `factor` times the sustainable rate over
both its long and its short window (the short one, 1/12 of the long, makes it reset quickly).
The factors are the Workbook's (budget fraction x 30 days / long window): 2 % of the budget in
1 h = 14.4x, 5 % in 6 h = 6x, 10 % in 1 d = 3x, 10 % in 3 d = 1x.
"""

from __future__ import annotations

from dataclasses import dataclass

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class BurnPair:
    severity: str  # "page" or "ticket"
    long_seconds: float
    short_seconds: float
    factor: float

    def scaled(self, scale: float) -> BurnPair:
        """The same pair with both windows scaled alike (tests shorten every window; whole seconds)."""
        if scale == 1.0:
            return self
        return BurnPair(
            self.severity,
            float(max(1, round(self.long_seconds * scale))),
            float(max(1, round(self.short_seconds * scale))),
            self.factor,
        )


WORKBOOK = (
    BurnPair("page", 1 * HOUR, 5 * 60.0, 14.4),
    BurnPair("page", 6 * HOUR, 30 * 60.0, 6.0),
    BurnPair("ticket", 24 * HOUR, 2 * HOUR, 3.0),
    BurnPair("ticket", 72 * HOUR, 6 * HOUR, 1.0),
)
