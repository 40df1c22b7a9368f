"""The one table of subcommands: every subcommand listed once, `specstudy --help` shows each, and the names the
workflow calls are there."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from specstudy import cli

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_every_subcommand_of_the_table_in_its_order():
    out = subprocess.run([sys.executable, "-m", "specstudy.cli", "--help"], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout
    names = [name for name, _ in cli.SUBCOMMANDS]
    assert len(names) == len(set(names))
    listed = re.findall(r"^    (\S+)", out, re.M)
    assert listed == names


def test_every_subcommand_the_rules_and_the_makefile_call_is_in_the_table():
    names = {name for name, _ in cli.SUBCOMMANDS}
    texts = [p.read_text() for p in [*sorted((ROOT / "rules").glob("*.smk")), ROOT / "Snakefile", ROOT / "Makefile"]
             if p.exists()]
    called = {m for t in texts for m in re.findall(r"specstudy ([a-z][a-z-]+)", t)}
    assert called and called <= names, called - names


def test_a_module_registering_a_command_the_table_does_not_list_is_refused(monkeypatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", tuple(e for e in cli.SUBCOMMANDS if e[0] != "prereg-lock"))
    with pytest.raises(RuntimeError, match="prereg-lock"):
        cli.build_parser()
