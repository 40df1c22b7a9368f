"""The HTML report opened in a real browser (headless Chromium through the DevTools protocol).

Builds a report from a small constructed results tree (tests/test_tables.make_results_tree, as
tests/test_report.py does), opens report.html and checks what a reader sees: every plot loads, the
tables are there, the recommendation comes before the per-workload tables and the plots, each plot
has a one-line caption, and the page logs no console error. The full-page screenshot is kept in
``$SPECSTUDY_ARTIFACTS`` (default: the test's tmp dir).

Chromium is Debian's ``chromium`` package (``make test`` installs it: tests/ensure-chromium.sh).
Without it the tests skip with the reason, except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from browser import find_chromium, inspect_page
from specstudy.report import document as report
from specstudy.report.files import from_root
from test_report import LAUNCH, _build


@pytest.fixture(scope="module")
def chromium():
    path = find_chromium()
    if path is None:
        why = "Chromium not installed (apt-get install -y chromium, or run `make test`, which installs it)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true: the browser test must run: {why}")
        pytest.skip(why)
    return path


PHASES = [("launch", 120), ("smoke", 10), ("smoke", 10), ("warmup", 60), ("measure", 240), ("drain", 10), ("stop", 10)]


def _report(tmp_path) -> Path:
    res = _build(tmp_path)
    for path in res.glob("*/*/*/deployment.json"):  # the phase timeline the deployment job records
        rec = json.loads(path.read_text())
        rec["phases"] = [{"phase": p, "start": "", "end": "", "seconds": s} for p, s in PHASES]
        path.write_text(json.dumps(rec))
    cfg = {"recommendation": {"launch_args": LAUNCH}}
    report.build(from_root(res, res / "tables"), cfg, res / "report")
    return res / "report"


def _artifact(tmp_path, name: str) -> Path:
    d = Path(os.environ.get("SPECSTUDY_ARTIFACTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d / name


def test_report_in_headless_chromium(tmp_path, chromium):
    out = _report(tmp_path)
    shot = _artifact(tmp_path, "report-screenshot.png")
    page = inspect_page(out / "report.html", shot, binary=chromium)
    assert page["console_errors"] == [], page["console_errors"]
    assert page["images"] >= 3, f"expected the report's plots, found {page['images']} images"
    assert page["broken_images"] == [], f"plots that did not load: {page['broken_images']}"
    assert page["tables"] >= 5
    # one caption per plot, one line each
    assert len(page["figcaptions"]) == page["images"]
    assert all(c.strip() and "\n" not in c for c in page["figcaptions"])
    h = page["headings"]
    rec = h.index("Recommendation")
    tables = [i for i, x in enumerate(h) if x.startswith("Results per workload")]
    assert rec == 1 and tables and min(tables) > rec and h.index("Plots") > max(tables), h
    assert "Duty cycle: where the deployment time went" in h
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    (shot.parent / "report-page.json").write_text(json.dumps(page, indent=1))


def test_browser_check_catches_a_broken_plot_and_a_script_error(tmp_path, chromium):
    """The check itself: a missing PNG and a console error must both be reported."""
    out = _report(tmp_path)
    html = (out / "report.html").read_text()
    first = sorted((out / "plots").glob("*.png"))[0]
    shutil.move(first, first.with_suffix(".gone"))
    (out / "report.html").write_text(html.replace("</body>", "<script>console.error('boom')</script></body>"))
    page = inspect_page(out / "report.html", tmp_path / "broken.png", binary=chromium)
    assert page["broken_images"] == [f"plots/{first.name}"]
    assert any("boom" in e for e in page["console_errors"])
    assert any("ERR_FILE_NOT_FOUND" in e for e in page["console_errors"]), page["console_errors"]
