"""benchmarks/engine_builds.py's own logic: the counterbalanced order, the arm variants it knows, the build
arguments it refuses, and its table's ratio (each arm against the baseline of its own build, never the other's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("engine_builds", ROOT / "benchmarks" / "engine_builds.py")
eb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eb)


def test_order_alternates_which_build_goes_first_on_every_other_arm():
    assert eb.order(["a", "b"], ["baseline", "draft-k3-tp1", "ngram-k5"]) == [
        ("a", "baseline"), ("b", "baseline"), ("b", "draft-k3-tp1"), ("a", "draft-k3-tp1"), ("a", "ngram-k5"),
        ("b", "ngram-k5")]


def test_the_async_variant_adds_the_flag_and_keeps_the_arm_settings():
    spec = eb.arm_spec("draft-k3-tp1+async")
    assert spec["method"] == "draft_model" and spec["num_speculative_tokens"] == 3
    assert spec["extra_args"] == ["--async-scheduling"] and spec["name"] == "draft-k3-tp1+async"
    with pytest.raises(SystemExit, match="variant 'eager'"):
        eb.arm_spec("draft-k3-tp1+eager")


def test_a_build_site_without_vllm_is_refused_naming_it(tmp_path):
    with pytest.raises(SystemExit, match=r"vllm does not exist"):
        eb.parse_builds([f"x={tmp_path}"])
    with pytest.raises(SystemExit, match="NAME=SITE_DIR"):
        eb.parse_builds(["just-a-path"])
    (tmp_path / "vllm").mkdir()
    assert eb.parse_builds([f"x={tmp_path}", "cpu="]) == {"x": str(tmp_path), "cpu": ""}


def _rec(build, arm, tps, rate=None):
    return {"build": build, "arm": arm, "ready_s": 60.0, "confounds": {"async_scheduling": {"enabled": arm == "baseline"},
                                                                       "model_runner": "V1"},
            "cells": [{"concurrency": 8, "output_tokens_per_s": tps, "tpot_ms_p50": 1.0,
                       "speculative": {"acceptance_rate": rate, "mean_acceptance_length": None if rate is None else 2.5}}]}


def test_the_table_compares_each_arm_with_the_baseline_of_its_own_build():
    table = eb.summary_table([_rec("old", "baseline", 100.0), _rec("new", "baseline", 200.0),
                              _rec("old", "draft-k3-tp1", 50.0, 0.5), _rec("new", "draft-k3-tp1", 300.0, 0.5)])
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line for line in table.splitlines()[2:]}
    assert "| 0.50 |" in rows[("old", "draft-k3-tp1")] and "| 1.50 |" in rows[("new", "draft-k3-tp1")]
    assert "| 0.500 | 2.50 |" in rows[("new", "draft-k3-tp1")]
