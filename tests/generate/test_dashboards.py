"""The generated dashboards: decoded by Grafana's SDK, stable uids, every panel placed without
overlap, described, on the datasource variable, over the selected range, and linked together."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from collector.generate.dashboards import tidy

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
    again = tidy(json.loads(JSONEncoder(sort_keys=True).encode(Dashboard.from_json(board))))
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


GRAFANA_SCHEMA = "11.6.0"  # @grafana/schema of the Grafana release the SDK targets
TYPECHECK = """import type {{ AnnotationQuery, Dashboard }} from '@grafana/schema';
// Prometheus annotations carry their query in `expr`, which Grafana reads and the schema's
// AnnotationQuery (typed for Grafana's built-in annotations) does not list: allowed here, and
// every other field checked.
const annotations: Array<AnnotationQuery & {{ expr: string }}> = {annotations};
export const board: Dashboard = {rest};
"""


def test_dashboards_typecheck_against_grafanas_schema(tmp_path: Path) -> None:
    """Each dashboard as a TypeScript object literal of @grafana/schema's Dashboard type, checked
    by tsc (strict; object literals also fail on keys the schema does not know)."""
    import os
    import shutil
    import subprocess

    npm = shutil.which("npm")
    if npm is None:
        if os.environ.get("CI") == "true":
            pytest.fail("npm is not installed (Node.js is needed for the dashboards' schema check)")
        pytest.skip("npm not installed")
    cache = Path.home() / ".cache" / "llmslo" / f"grafana-schema-{GRAFANA_SCHEMA}"
    tsc = cache / "node_modules" / ".bin" / "tsc"
    if not tsc.exists():
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "package.json").write_text('{"private": true}')
        done = subprocess.run(
            [npm, "install", "--no-audit", "--no-fund", f"@grafana/schema@{GRAFANA_SCHEMA}", "typescript@5"],
            cwd=cache, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    files = []
    for path in FILES:
        board = json.loads(path.read_text())
        annotations = board["annotations"]["list"]
        board["annotations"] = "__ANNOTATIONS__"  # the typed list above, in the literal itself
        rest = json.dumps(board, indent=1).replace('"__ANNOTATIONS__"', "{ list: annotations }")
        ts = cache / f"{path.stem}.ts"
        ts.write_text(TYPECHECK.format(annotations=json.dumps(annotations), rest=rest))
        files.append(ts.name)
    flags = ["--noEmit", "--strict", "--target", "es2020", "--moduleResolution", "node", "--skipLibCheck"]
    done = subprocess.run([str(tsc), *flags, *files], cwd=cache, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:]
    # and the check can fail: a key the schema does not know
    bad = cache / "misspelt.ts"
    bad.write_text((cache / files[0]).read_text().replace('"title":', '"titel": "x",\n "title":', 1))
    done = subprocess.run([str(tsc), *flags, bad.name], cwd=cache, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "titel" in done.stdout
