"""Bounded trace cardinality: spans may name any business type, model, tenant or track; llmslo
keeps a bounded number of each per minute (in memory, rollups and /metrics) and folds the rest into
`unassigned` (business types no configuration knows) or `other` (tenants, models and tracks past
the per-minute limit), counting what it folded."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

from collector.conventions import OTHER_TENANTS
from collector.rollup import MINUTE_SECONDS
from collector.traces.normalize import RequestRecord

UNASSIGNED = "unassigned"
KEEP_MINUTES = 15  # minutes whose seen values are remembered (late spans of older ones start afresh)


class CardinalityGuard:
    def __init__(self, business_types: Iterable[str], max_tenants: int, max_models: int, max_tracks: int = 20) -> None:
        self.business_types = frozenset(business_types) | {UNASSIGNED}
        self.max_tenants = max_tenants
        self.max_models = max_models
        self.max_tracks = max_tracks
        # minute -> business type -> tenants (models, tracks) seen in it
        self._tenants: dict[int, dict[str, set[str]]] = {}
        self._models: dict[int, dict[str, set[str]]] = {}
        self._tracks: dict[int, dict[str, set[str]]] = {}
        self.folded = Counter[str]()  # by field: business_type, tenant, model, track

    def apply(self, records: Sequence[RequestRecord]) -> None:
        """Fold, in place, the values past the limits."""
        for r in records:
            if r.business_type not in self.business_types:
                r.business_type = UNASSIGNED
                self.folded["business_type"] += 1
            minute = int(r.end_unix // MINUTE_SECONDS) * MINUTE_SECONDS
            if not self._admit(self._tenants, minute, r.business_type, r.tenant, self.max_tenants):
                r.tenant = OTHER_TENANTS
                self.folded["tenant"] += 1
            if not self._admit(self._models, minute, r.business_type, r.model, self.max_models):
                r.model = OTHER_TENANTS
                self.folded["model"] += 1
            if r.track and not self._admit(self._tracks, minute, r.business_type, r.track, self.max_tracks):
                r.track = OTHER_TENANTS
                self.folded["track"] += 1

    @staticmethod
    def _admit(seen: dict[int, dict[str, set[str]]], minute: int, business_type: str, value: str, limit: int) -> bool:
        per_minute = seen.get(minute)
        if per_minute is None:
            per_minute = seen[minute] = {}
            if len(seen) > KEEP_MINUTES:
                for old in sorted(seen)[: len(seen) - KEEP_MINUTES]:
                    del seen[old]
        values = per_minute.setdefault(business_type, set())
        if value in values:
            return True
        if len(values) >= limit:
            return False
        values.add(value)
        return True
