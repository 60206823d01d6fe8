"""The generated dashboards: decoded by Grafana's SDK, stable uids, every panel placed without
overlap, described, on the datasource variable, over the selected range, and linked together."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "dashboards").glob("*.json"))
EXPECTED = {
    "llmslo-overview",
    "llmslo-slo",
    "llmslo-latency",
    "llmslo-cost",
    "llmslo-drift",
    "llmslo-capacity",
    "llmslo-fleet",
}


def panels(board: dict) -> list[dict]:  # type: ignore[type-arg]
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_set_of_dashboards() -> None:
    uids = {json.loads(f.read_text())["uid"] for f in FILES}
    assert uids == EXPECTED
    assert all(f.stem == json.loads(f.read_text())["uid"] for f in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_a_dashboard(path: Path) -> None:
    board = json.loads(path.read_text())
    # Grafana's SDK decodes it and encodes it back unchanged
    again = json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(board)))
    assert again == board
    # variables and links
    names = [v["name"] for v in board["templating"]["list"]]
    assert names[:4] == ["datasource", "business_type", "model", "instance"]
    assert (
        board["links"][0]["tags"] == ["llmslo"] and board["links"][0]["keepTime"] and board["links"][0]["includeVars"]
    )
    assert {a["name"] for a in board["annotations"]["list"]} >= {"Alerts", "Engine restarts"}
    # layout: inside 24 columns, no two panels overlap, ids unique
    cells: set[tuple[int, int]] = set()
    ids = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert p["id"] not in ids
        ids.add(p["id"])
    for p in panels(board):
        assert p["description"], p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert len(set(refs)) == len(refs) and all(refs)
        for t in p["targets"]:
            expr = t["expr"]
            # rates over the selected range's interval, never a fixed window (annotations aside)
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", (p["title"], expr)
            if "vllm:" in expr:  # engine series: filtered by the dashboard's variables
                assert "$business_type" in expr and "$model" in expr and "$instance" in expr, expr
