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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from collector.config import TargetConfig
from collector.slo.spec import SloRules
from collector.traces.normalize import Source
from collector.traces.otlp import AttrValue

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
        self._by_service = {t.service_name: t.name for t in targets if t.service_name}
        self._sources: dict[tuple[object, ...], str | None] = {}

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

    def target_of_resource(self, resource: Mapping[str, AttrValue]) -> str | None:
        """The configured target a span's resource names: `llmslo.target`, `service.instance.id`
        (= target name), or `service.name` (= a target's `service_name`, or its name)."""
        key = (resource.get("llmslo.target"), resource.get("service.instance.id"), resource.get("service.name"))
        if key in self._sources:
            return self._sources[key]
        explicit, instance, service = key
        found = None
        for candidate in (explicit, instance):
            if isinstance(candidate, str) and candidate in self.targets:
                found = candidate
                break
        if found is None and isinstance(service, str):
            found = self._by_service.get(service) or (service if service in self.targets else None)
        if len(self._sources) < 10_000:  # resources are few; a sender inventing them is not remembered
            self._sources[key] = found
        return found

    def source_of(
        self,
        resource: Mapping[str, AttrValue],
        models_seen: Callable[[str], Sequence[str]],
        track_label: str = "track",
    ) -> Source | None:
        """What a span's source target adds to it: the model the target serves (its
        `default_model`, or the one model its scrapes show), the business-type mapping and the
        target's track label."""
        target = self.target_of_resource(resource) if resource else None
        if target is None:
            return None
        cfg = self.targets[target]
        seen = models_seen(target)
        model = cfg.default_model if cfg.default_model != "unknown" else (seen[0] if len(seen) == 1 else None)
        return Source(target, model, lambda m: self.business_type_of(target, m), cfg.labels.get(track_label))

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
