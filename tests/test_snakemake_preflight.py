"""specstudy.study.snakemake_preflight reads the command line as Snakemake's own parser does (issue 29):
every spelling of --configfile is checked, and a valid file passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstudy.study.snakemake_preflight import configfile_problem, snakemake_cli

ROOT = Path(__file__).resolve().parents[1]
GOOD = str(ROOT / "tests/data/study-small.yaml")


@pytest.mark.parametrize("argv", [
    ["-n", "screen", "--configfile", "{bad}"],
    ["--configfile={bad}", "screen"],
    ["--configfiles", GOOD, "{bad}", "--", "screen"],  # the second of two files
    ["--config", "cells={{}}", "--configfile", "{bad}"],  # --config is not mistaken for --configfile
])
def test_every_spelling_of_configfile_is_checked(tmp_path, argv):
    bad = tmp_path / "bad.yaml"
    bad.write_text("study:\n  name: a\nstudy:\n  name: b\n")
    problem = configfile_problem([a.format(bad=bad) for a in argv])
    assert problem and str(bad) in problem and "line 3" in problem and "duplicate key 'study'" in problem


def test_a_valid_file_the_default_and_no_file(tmp_path):
    assert configfile_problem(["screen", "--configfile", GOOD]) is None
    # Snakemake's --configfile takes every word after it: a target there is named as such
    assert "'screen' was read as a config file: put the targets before" in configfile_problem(["--configfile", GOOD, "screen"])
    assert configfile_problem(["screen"]) is None
    missing = str(tmp_path / "nope.yaml")
    assert "not found" in configfile_problem(["screen"], default=missing)
    assert configfile_problem(["--configfile", GOOD], default=missing) is None  # the command line wins


def test_targets_after_a_double_dash_and_a_refused_command_line():
    assert snakemake_cli(["-n", "--", "screen", "confirm"]).targets == ["screen", "confirm"]
    assert snakemake_cli(["--cores", "many", "screen"]) is None  # Snakemake itself will say why
