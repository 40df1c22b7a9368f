"""`snakemake --report` of the real workflow bundles the report, the recommendation and every plot
with its caption (report/*.rst, rules/report.smk), and the plot captions agree with the HTML report's.

The workflow is a copy (tests/test_workflow_dag.py's ``workdir``); screening is faked there, the
selection runs for real, the confirmation outputs are faked the same way and the report files are
built by specstudy.report.document from the constructed results tree of tests/test_report.py. Nothing is left
for Snakemake to run, so ``--report`` only collects what the rules flag with ``report()``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import zipfile
from pathlib import Path

import jinja2

from specstudy.report import document as report
from specstudy.report.files import from_root
from specstudy.report.plots import PLOT_CAPTIONS, plot_caption
from test_report import LAUNCH, _build
from test_workflow_dag import ROOT, fake_screening, sm, workdir  # noqa: F401  (fixture)


def test_plot_captions_of_snakemake_report_match_the_html_report():
    tmpl = jinja2.Environment().from_string((ROOT / "report" / "plot.rst").read_text())
    for name, caption in PLOT_CAPTIONS.items():
        fname = "capacity-baseline" if name == "capacity" else name
        rendered = tmpl.render(snakemake=type("S", (), {"wildcards": type("W", (), {"name": fname})}))
        assert caption in rendered, (name, rendered)


def _fake_confirmation(wd: Path) -> None:
    """Confirmation as the workflow would leave it: the real plan and round checkpoint over faked cells
    (a clear result, so the initial rounds end it), then gates and tables newer than every cell."""
    from test_workflow_dag import CLEAR, _fake_confirm_rounds, json_writer

    sm(wd, "results/plan/confirm.json")
    _fake_confirm_rounds(wd, CLEAR, {1, 2, 3})
    sm(wd, "results/confirm/rounds/round3.json")
    arms = json.loads((wd / "results/selection/selection.json").read_text())["confirmation_arms"]
    write = json_writer(wd, time.time(), 0.01)  # after every faked cell, before the report built below

    for arm in arms:
        if arm != "baseline":
            write(f"results/gates/confirm/{arm}.json", {})
    write("results/tables/cells.parquet", {})
    for name in ("requests", "deployments", "gates"):
        write(f"results/tables/{name}.parquet", {})


def test_snakemake_report_zip_has_plots_with_captions(workdir, tmp_path):  # noqa: F811
    shutil.copytree(ROOT / "report", workdir / "report")
    cfg = workdir / "config" / "config.yaml"
    cfg.write_text(cfg.read_text().replace("capacity:\n  enabled: true", "capacity:\n  enabled: false"))
    fake_screening(workdir)
    sm(workdir, "results/selection/selection.json")
    _fake_confirmation(workdir)
    res = _build(tmp_path / "tree")
    report.build(from_root(res, res / "tables"), {"recommendation": {"launch_args": LAUNCH}}, workdir / "results" / "report")
    now = time.time()
    for f in (workdir / "results" / "report").rglob("*"):
        os.utime(f, (now, now))
    assert "Nothing to be done" in sm(workdir, "-n", "results/report/report.md").stdout + \
        sm(workdir, "-n", "results/report/report.md").stderr
    sm(workdir, "--report", "report.zip", "results/report/report.md")
    if os.environ.get("SPECSTUDY_ARTIFACTS"):
        shutil.copy(workdir / "report.zip", Path(os.environ["SPECSTUDY_ARTIFACTS"]) / "snakemake-report.zip")
    with zipfile.ZipFile(workdir / "report.zip") as z:
        names = z.namelist()
        text = "\n".join(z.read(n).decode("utf-8", "replace") for n in names if n.endswith((".html", ".js")))
    plots = sorted(p.name for p in (workdir / "results/report/plots").glob("*.png"))
    base = {Path(n).name for n in names}
    assert plots and set(plots) <= base, (plots, names)
    assert {"report.md", "recommendation.json"} <= base
    for p in plots:  # every plot carries its caption (JSON-escaped inside report.html)
        assert json.dumps(plot_caption(p))[1:-1] in text, p
    assert "Plots" in text and "embedded-default" in text
