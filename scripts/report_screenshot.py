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

from tests.report.test_weekly_report import simulate_weeks  # noqa: E402


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    with tempfile.TemporaryDirectory() as tmp:
        built = simulate_weeks(f"sqlite:///{tmp}/llmslo.db")[4]
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
