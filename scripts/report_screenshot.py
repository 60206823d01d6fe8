"""Regenerate docs/report.png, the README's picture of a weekly report: the report of the tests'
second simulated week (an error burst, a replica down for three hours, a prompt-length shift),
rendered by headless Chromium and reduced.

  .venv/bin/python scripts/report_screenshot.py   (needs Debian's chromium)
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.report.test_weekly_report import BURST, DAY, HERE, STEP, settings_for  # noqa: E402

from collector.report.period import parse_week  # noqa: E402
from collector.report.service import ReportService  # noqa: E402
from collector.runtime import Runtime  # noqa: E402
from collector.sim.fastclock import run_into_store, store_spans, targets_for  # noqa: E402
from collector.sim.scenario import load_scenario  # noqa: E402
from collector.store.repository import Store  # noqa: E402


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    with tempfile.TemporaryDirectory() as tmp:
        scenario = load_scenario(str(HERE / "scenario-two-weeks.yaml"))
        t0 = int(scenario.start_unix)
        settings = settings_for(targets_for(scenario))
        store = Store(f"sqlite:///{tmp}/llmslo.db")
        run = run_into_store(scenario, store, 14 * DAY, STEP, settings=settings)
        store_spans(run, store, t0)
        rt = Runtime(settings, store)
        rt.evaluate_slos(t0 + BURST[1] + 120)
        rt.evaluate_slos(t0 + BURST[1] + 120 + 6000)
        rt.compact(t0 + 14 * DAY + 8 * 3600)
        built = ReportService(rt).generate(parse_week("2026-W48", "UTC", t0 + 14 * DAY))
        page = Path(tmp) / "report.html"
        page.write_text(built.html)
        shot = Path(tmp) / "full.png"
        subprocess.run(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=900,2600", "--force-device-scale-factor=0.7", f"--screenshot={shot}", page.as_uri()],
            check=True,
            capture_output=True,
        )  # fmt: skip
        out = ROOT / "docs" / "report.png"
        out.write_bytes(shot.read_bytes())
        height, width = mpimg.imread(out).shape[:2]
        print(f"wrote {out} ({width}x{height})")


if __name__ == "__main__":
    main()
