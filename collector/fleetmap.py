"""The one fleet map: which business type an engine series (target, model) belongs to.

The serving view, the SLO evaluator, the SLO counters on /metrics and the checks all ask this
map. It has two views of the same fact, checked against each other:

- the configuration's targets: `models: {name: business_type}` (explicit, wins), then the
  target's `business_type` (every other model it serves);
- the SLO rules' `models` regexes (full match), used when the target says nothing.

A (target, model) that both views place, differently, is a conflict: the target's word wins
and the conflict is reported (`check-config --rules`, `/api/v1/targets`, a warning once). A
series that neither view places is unassigned: reported, never silently left out.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collector.config import TargetConfig
from collector.slo.spec import SloRules

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one (target, model) belongs, and what the two views said."""

    business_type: str | None
    by_target: str | None  # what the target configuration says
    by_rules: str | None  # what the rules' model regexes say

    @property
    def conflict(self) -> bool:
        return self.by_target is not None and self.by_rules is not None and self.by_target != self.by_rules


class FleetMap:
    """Answers `business_type_of(target, model)`; remembers what it could not place."""

    def __init__(self, targets: Sequence[TargetConfig], rules: SloRules | None) -> None:
        self.targets = {t.name: t for t in targets}
        self.rules = rules
        self._placed: dict[tuple[str, str], Placement] = {}
        self._lock = threading.Lock()  # placements are memoised from worker threads too

    def place(self, target: str, model: str) -> Placement:
        key = (target, model)
        found = self._placed.get(key)
        if found is not None:
            return found
        cfg = self.targets.get(target)
        by_target = cfg.business_type_of(model) if cfg is not None else None
        by_rules = self.rules.business_type_of(model) if self.rules is not None else None
        placement = Placement(by_target or by_rules, by_target, by_rules)
        with self._lock:
            if key not in self._placed:
                self._placed[key] = placement
                if placement.conflict:
                    log.warning(
                        "model %r of target %s: the target configuration says business type %r, the SLO "
                        "rules' models say %r; using %r (make them agree)",
                        model,
                        target,
                        by_target,
                        by_rules,
                        by_target,
                    )
                elif placement.business_type is None:
                    log.warning(
                        "model %r of target %s belongs to no business type: no SLO evaluates it; set the "
                        "target's business_type or models, or list the model in the rules",
                        model,
                        target,
                    )
        return placement

    def business_type_of(self, target: str, model: str) -> str | None:
        return self.place(target, model).business_type

    def unassigned(self, target: str | None = None) -> list[tuple[str, str]]:
        """(target, model) pairs seen that no view places."""
        return sorted(k for k, p in list(self._placed.items()) if p.business_type is None and target in (None, k[0]))

    def conflicts(self, target: str | None = None) -> list[tuple[str, str, Placement]]:
        return sorted((k[0], k[1], p) for k, p in list(self._placed.items()) if p.conflict and target in (None, k[0]))


def static_conflicts(targets: Iterable[TargetConfig], rules: SloRules) -> list[str]:
    """Conflicts visible without scraping: a target's explicit `models` entry that the rules
    put under another business type."""
    problems = []
    for i, t in enumerate(targets):
        for model, business_type in t.models.items():
            by_rules = rules.business_type_of(model)
            if by_rules is not None and by_rules != business_type:
                problems.append(
                    f"targets[{i}].models.{model}: business type {business_type!r}, but the SLO rules' "
                    f"models put {model!r} under {by_rules!r}; one model belongs to one business type"
                )
    return problems
