"""Workload drift in Prometheus: recording rules for the token histograms' bucket shares over the
current window and over the reference before it, their PSI, and the `LLMSLOWorkloadDrift` ticket,
the same statistic llmslo's own evaluator uses (collector/drift), with its defaults: a 5-minute
window against the day before it, PSI above 0.25 (the uncalibrated threshold: Prometheus cannot
calibrate on the reference's chunks), at least 100 requests in the window.

vLLM's token histograms share one 1-2-5 series of bounds, cut at max_model_len; each bin is the
difference of two consecutive `le` buckets. Bins a server's layout does not reach have no series
and drop out of the sum; the mass above its top bound (the +Inf bucket) is not compared.
"""

from __future__ import annotations

import itertools
from typing import Any

from collector.generate.promql import engine, le_matcher, num
from collector.slo.spec import BusinessType, SloRules
from collector.sources.vllm_buckets import request_token_buckets

WINDOW = "5m"
# the hour before the window: an `increase` over a day of every bucket, every minute, would cost
# Prometheus (and promtool's tests) far more than the drift it adds; llmslo's evaluator keeps the
# day-long (or pinned) reference
REFERENCE = "1h"
PSI_THRESHOLD = 0.25
MIN_REQUESTS = 100
EPSILON = 1e-4
SIGNALS = {"prompt_length": "vllm:request_prompt_tokens", "generation_length": "vllm:request_generation_tokens"}
BOUNDS = request_token_buckets(100_000)


def share_record(signal: str, side: str) -> str:
    return f"llmslo:drift_{signal}_share:{side}{WINDOW}"


def psi_record(signal: str) -> str:
    return f"llmslo:drift_{signal}_psi:{WINDOW}"


def requests_record(signal: str) -> str:
    return f"llmslo:drift_{signal}_requests:increase{WINDOW}"


def _bins() -> list[tuple[float | None, float]]:
    """(lower, upper) bucket bounds of each bin; lower None for the first bucket."""
    return [(None, BOUNDS[0]), *itertools.pairwise(BOUNDS)]


def _bucket(bt: BusinessType, family: str, bound: float, window: str, offset: str) -> str:
    le = f'le=~"{le_matcher(bound)}"'
    return f"sum({engine(bt, family + '_bucket', le, 'increase', window, offset)})"


def _bin_label(lo: float | None, hi: float) -> str:
    return f"{num(lo) if lo is not None else 0}-{num(hi)}"


def recording(rules: SloRules) -> list[dict[str, Any]]:
    groups = []
    for bt in rules.business_types:
        out: list[dict[str, Any]] = []
        for signal, family in SIGNALS.items():
            for side, offset, window in (("current", "", WINDOW), ("reference", WINDOW, REFERENCE)):
                total = f"sum({engine(bt, family + '_count', fn='increase', window_text=window, offset=offset)})"
                for lo, hi in _bins():
                    upper = _bucket(bt, family, hi, window, offset)
                    count = upper if lo is None else f"({upper} - {_bucket(bt, family, lo, window, offset)})"
                    out.append(
                        {
                            "record": share_record(signal, side),
                            "expr": f"{count} / {total}",
                            "labels": {"business_type": bt.name, "bin": _bin_label(lo, hi)},
                        }
                    )
            cur = f'{share_record(signal, "current")}{{business_type="{bt.name}"}}'
            ref = f'{share_record(signal, "reference")}{{business_type="{bt.name}"}}'
            eps = num(EPSILON)
            out.append(
                {
                    "record": psi_record(signal),
                    "expr": f"sum(({cur} - {ref}) * ln(clamp_min({cur}, {eps}) / clamp_min({ref}, {eps})))",
                    "labels": {"business_type": bt.name},
                }
            )
            out.append(
                {
                    "record": requests_record(signal),
                    "expr": f"sum({engine(bt, family + '_count', fn='increase', window_text=WINDOW)})",
                    "labels": {"business_type": bt.name},
                }
            )
        groups.append({"name": f"llmslo-drift-{bt.name}", "interval": "1m", "rules": out})
    return groups


def alerts(rules: SloRules) -> list[dict[str, Any]]:
    out = []
    for bt in rules.business_types:
        for signal in SIGNALS:
            words = signal.replace("_", " ")
            out.append(
                {
                    "alert": "LLMSLOWorkloadDrift",
                    "expr": f'{psi_record(signal)}{{business_type="{bt.name}"}} > {num(PSI_THRESHOLD)} '
                    f'and on(business_type) {requests_record(signal)}{{business_type="{bt.name}"}} >= {MIN_REQUESTS}',
                    "for": "1m",
                    "labels": {"severity": "ticket", "business_type": bt.name, "signal": signal},
                    "annotations": {
                        "summary": f"{bt.name}: {words} drifted",
                        "description": f"The {words} distribution of the last {WINDOW} differs from the "
                        f"{REFERENCE} before it: PSI over vLLM's token buckets above {num(PSI_THRESHOLD)} "
                        f"({psi_record(signal)} has the value). llmslo's /api/v1/drift says what moved and since when.",
                        "runbook_url": rules.runbook("llmsloworkloaddrift"),
                        "dashboard_url": rules.dashboard(bt.name),
                    },
                }
            )
    return out
