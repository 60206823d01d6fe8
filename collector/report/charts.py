"""The report's charts, drawn with matplotlib (Agg, no display) as PNG bytes.

Each function takes the report (the JSON form) and returns PNG bytes, or None when there is
nothing to draw (a chart of zeros would say something false). Colours are fixed per business
type so the same type looks the same in every chart.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo

import matplotlib

matplotlib.use("Agg")
import matplotlib.dates as mdates
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT, DPI = 8.0, 3.0, 100


def _colour(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(sorted(names))}


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    return buf.getvalue()


def _zone(report: dict[str, Any]) -> ZoneInfo:
    return ZoneInfo(report["period"]["timezone"])


def _figure(title: str, height: float = HEIGHT) -> tuple[Figure, Any]:
    fig, ax = plt.subplots(figsize=(WIDTH, height))
    ax.set_title(title, fontsize=11, loc="left")
    ax.grid(True, alpha=0.3)
    return fig, ax


def latency(report: dict[str, Any], metric: str = "ttft") -> bytes | None:
    """Hourly p95 of one latency per business type, with each type's SLO threshold dashed."""
    types = report["business_types"]
    colours = _colour(list(types))
    tz = _zone(report)
    fig, ax = _figure(f"{metric.upper()} p95 per hour (engine histograms), dashed: SLO threshold")
    drawn = False
    for bt, data in sorted(types.items()):
        points = [(h["start_unix"], h[metric]["p95"]) for h in data["hourly"] if h[metric]["p95"] is not None]
        if not points:
            continue
        drawn = True
        xs = [datetime.fromtimestamp(t, tz) for t, _ in points]
        ax.plot(xs, [v for _, v in points], color=colours[bt], label=bt, linewidth=1.2)
        threshold = data["thresholds"].get(metric)
        if threshold is not None:
            ax.axhline(threshold, color=colours[bt], linestyle="--", linewidth=0.9)
    if not drawn:
        plt.close(fig)
        return None
    ax.set_ylabel("seconds")
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%a", tz=tz))  # type: ignore[no-untyped-call]
    ax.legend(fontsize=8, loc="upper right")
    return _png(fig)


def budget(report: dict[str, Any]) -> bytes | None:
    """Error budget left through the week, per SLO that spent any (1 = untouched, 0 = spent)."""
    slos = [s for s in report["slos"] if s["total"] > 0 and any(d["bad"] > 0 for d in s["days"])]
    if not slos:
        return None
    fig, ax = _figure("Error budget remaining through the week (share of the week's budget)")
    colours = _colour([s["slo"] for s in slos])
    days = [d["day"] for d in slos[0]["days"]]
    xs = list(range(len(days) + 1))
    for s in slos:
        left, ys = 1.0, [1.0]
        for d in s["days"]:
            left -= d["budget_share"] or 0.0
            ys.append(left)
        ax.plot(xs, ys, marker="o", markersize=3, color=colours[s["slo"]], label=s["slo"], linewidth=1.2)
    ax.axhline(0, color="#d62728", linewidth=1)
    ax.set_xticks(xs, ["start", *[d[5:] for d in days]], fontsize=8)
    ax.set_ylabel("budget left")
    lowest = min(min(_remaining(s)) for s in slos)
    ax.set_ylim(min(-0.1, lowest - 0.1), 1.05)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    return _png(fig)


def _remaining(s: dict[str, Any]) -> list[float]:
    left, out = 1.0, [1.0]
    for d in s["days"]:
        left -= d["budget_share"] or 0.0
        out.append(left)
    return out


def cost_by_type(report: dict[str, Any]) -> bytes | None:
    cost = report["cost"]
    if not cost["available"] or not cost["daily"]:
        return None
    daily = cost["daily"]
    types = sorted({bt for d in daily for bt in d["by_business_type"]})
    if not types:
        return None
    colours = _colour(types)
    fig, ax = _figure("Cost per day by business type (USD, busy work + its share of idle)")
    bottom = [0.0] * len(daily)
    labels = [d["day"][5:] for d in daily]
    for bt in types:
        values = [d["by_business_type"].get(bt, 0.0) for d in daily]
        ax.bar(labels, values, bottom=bottom, color=colours[bt], label=bt)
        bottom = [a + b for a, b in zip(bottom, values, strict=True)]
    ax.set_ylabel("USD")
    ax.legend(fontsize=8, loc="upper right")
    return _png(fig)


def cost_per_token(report: dict[str, Any]) -> bytes | None:
    cost = report["cost"]
    if not cost["available"]:
        return None
    points = [(d["day"][5:], d["usd_per_million_tokens"]) for d in cost["daily"] if d["usd_per_million_tokens"]]
    if not points:
        return None
    fig, ax = _figure("Cost per 1M tokens (prompt + output) per day, dashed: last week's")
    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", color=PALETTE[0])
    previous = (cost["previous"] or {}).get("usd_per_million_tokens")
    if previous:
        ax.axhline(previous, color="#7f7f7f", linestyle="--", linewidth=1)
    ax.set_ylabel("USD per 1M tokens")
    ax.set_ylim(bottom=0)
    return _png(fig)


def concurrency(report: dict[str, Any]) -> bytes | None:
    """Hourly peak of requests running (per replica) per business type, against the concurrency
    that fits each deployment's memory at the p95 context (capacity section)."""
    types = report["business_types"]
    colours = _colour(list(types))
    tz = _zone(report)
    fig, ax = _figure("Peak requests running per replica, per hour; dashed: what fits in memory at p95 context")
    drawn = False
    for bt, data in sorted(types.items()):
        points = [(h["start_unix"], h["peak_running"]) for h in data["hourly"] if h.get("peak_running") is not None]
        if not points:
            continue
        drawn = True
        ax.plot(
            [datetime.fromtimestamp(t, tz) for t, _ in points],
            [v for _, v in points],
            color=colours[bt],
            label=bt,
            linewidth=1.1,
        )
    capacity = report["capacity"]
    if capacity.get("available"):
        for d in capacity["deployments"]:
            fit = d.get("memory_p95") or {}
            if fit.get("max_concurrency"):
                ax.axhline(fit["max_concurrency"], color="#7f7f7f", linestyle="--", linewidth=0.8)
                ax.annotate(
                    d["deployment"],
                    (1.0, fit["max_concurrency"]),
                    xycoords=("axes fraction", "data"),
                    fontsize=7,
                    ha="right",
                    va="bottom",
                )
    if not drawn:
        plt.close(fig)
        return None
    ax.set_yscale("symlog")
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%a", tz=tz))  # type: ignore[no-untyped-call]
    ax.legend(fontsize=8, loc="upper left")
    return _png(fig)


def lengths(report: dict[str, Any]) -> bytes | None:
    """Prompt and generation length distributions, this week against last (shares per bucket)."""
    shifts = [s for s in report["drift"]["length_shifts"] if sum(s["counts"]) > 0]
    if not shifts:
        return None
    cols = 2
    rows = math.ceil(len(shifts) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(WIDTH, 1.9 * rows + 0.4), squeeze=False)
    fig.suptitle("Length distributions: this week (bars) against last week (line), share of requests", fontsize=11)
    for ax, s in zip(axes.flat, shifts, strict=False):
        labels = [_bound(b) for b in s["bounds"]]
        labels += ["+Inf"] * (len(s["counts"]) - len(labels))  # the bucket above the last bound
        total = sum(s["counts"])
        ax.bar(range(len(labels)), [c / total for c in s["counts"]], color=PALETTE[0], alpha=0.7)
        previous = s["previous_counts"]
        if previous and sum(previous) > 0:
            prev_total = sum(previous)
            ax.plot(range(len(labels)), [c / prev_total for c in previous], color="#d62728", marker=".", linewidth=1)
        psi = f", PSI {s['psi']:.2f}" if s["psi"] is not None else ""
        ax.set_title(f"{s['business_type']}: {s['signal'].replace('_', ' ')}{psi}", fontsize=9, loc="left")
        step = max(1, len(labels) // 6)
        ax.set_xticks(range(0, len(labels), step), labels[::step], fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(shifts) :]:
        ax.axis("off")
    return _png(fig)


def _bound(b: float) -> str:
    if math.isinf(b):
        return "+Inf"
    return f"{b / 1000:g}k" if b >= 1000 else f"{b:g}"


CHARTS: dict[str, tuple[str, Callable[[dict[str, Any]], bytes | None]]] = {
    "latency_ttft": ("Time to first token", lambda r: latency(r, "ttft")),
    "latency_tpot": ("Time per output token", lambda r: latency(r, "tpot")),
    "budget": ("Error budget", budget),
    "cost_by_type": ("Cost by business type", cost_by_type),
    "cost_per_token": ("Cost per 1M tokens", cost_per_token),
    "concurrency": ("Utilisation and capacity", concurrency),
    "lengths": ("Length distributions", lengths),
}


def render_all(report: dict[str, Any]) -> dict[str, bytes]:
    """Every chart that has data, by name."""
    out: dict[str, bytes] = {}
    for name, (_title, draw) in CHARTS.items():
        png = draw(report)
        if png is not None:
            out[name] = png
    return out


def timestamp(unix: float, tz: str) -> str:
    return datetime.fromtimestamp(unix, ZoneInfo(tz) if tz else UTC).strftime("%a %Y-%m-%d %H:%M")
