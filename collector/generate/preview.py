"""A static preview of a generated dashboard: each panel's query results plotted where the panel
sits in the dashboard's grid, as one PNG (Grafana itself is not needed to see what the on-call
engineer would see). Time series panels are drawn as lines, heatmaps as stacked bucket counts,
stat and table panels as the latest value of each series."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# one query's result: (legend, [(unix, value), ...]) per series
Series = list[tuple[str, list[tuple[float, float]]]]
UNITS = {"s": "s", "percentunit": "ratio", "reqps": "req/s", "currencyUSD": "USD"}


def legend_of(template: str, labels: dict[str, str]) -> str:
    out = template
    for key, value in labels.items():
        out = out.replace("{{" + key + "}}", value)
    return out if "{{" not in out else out.split("{{")[0].strip() or str(labels)


def render(board: dict[str, Any], results: dict[str, list[Series]]) -> bytes:
    """`results[panel title]` holds one Series per query of the panel."""
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in board["panels"])
    scale, header = 0.32, 0.5  # inches per grid row, above the grid; 24 columns across 12 inches
    height = rows * scale + header
    fig = plt.figure(figsize=(12, height))
    fig.suptitle(board["title"], x=0.01, y=1 - 0.12 / height, ha="left", fontsize=12)

    def top(row: float) -> float:  # figure coordinate of a grid row's top edge
        return float(1 - (header + row * scale) / height)

    for p in board["panels"]:
        g = p["gridPos"]
        if p["type"] == "row":
            fig.text(0.005, top(g["y"]) - 0.22 / height, p["title"], fontsize=10, weight="bold")
            continue
        box = (
            g["x"] / 24 + 0.03,
            top(g["y"] + g["h"]) + 0.3 / height,
            g["w"] / 24 - 0.045,
            (g["h"] * scale - 0.62) / height,
        )
        ax = fig.add_axes(box)
        ax.set_title(p["title"], fontsize=8, loc="left")
        ax.tick_params(labelsize=6)
        if not _draw(ax, p, results.get(p["title"], [])):
            ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=9, color="#888", transform=ax.transAxes)
            ax.set_xticks([])
            ax.set_yticks([])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def _draw(ax: Any, panel: dict[str, Any], per_query: list[Series]) -> bool:
    everything = [s for series in per_query for s in series if s[1]]
    if not everything:
        return False
    unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
    if panel["type"] in ("stat", "table"):
        ax.axis("off")
        lines = [f"{name}: {_fmt(points[-1][1], unit)}" for name, points in everything[:8]]
        ax.text(0.02, 0.95, "\n".join(lines), va="top", fontsize=7, family="monospace", transform=ax.transAxes)
        return True
    t0 = min(points[0][0] for _, points in everything)
    for name, points in everything[:12]:
        xs = [(t - t0) / 60 for t, _ in points]
        ys = [v if math.isfinite(v) else float("nan") for _, v in points]
        dashed = name.endswith((" SLO", " objective", " threshold"))
        ax.plot(xs, ys, linewidth=0.9, linestyle="--" if dashed else "-", label=name[:40])
    ax.set_xlabel("minutes", fontsize=6)
    if unit in UNITS:
        ax.set_ylabel(UNITS[unit], fontsize=6)
    ax.legend(fontsize=5, loc="upper left", ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    return True


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return str(value)
    if unit == "percentunit":
        return f"{value * 100:.1f} %"
    if unit == "s":
        return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"
    return f"{value:.3g}"
