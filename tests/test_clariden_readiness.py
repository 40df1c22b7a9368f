"""The shipped study configs warm every cell up at its concurrency, and the Clariden study's pre-flight reads
what a login node holds (the bad inputs themselves: tests/test_bad_input_table.py, rows ``warmup-*`` and
``clariden-*``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from specstudy.study.config import _warmup_problems, load_config
from specstudy.study.plan import request_counts

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted(p for p in (ROOT / "config").glob("*.yaml")
                 if "study" in yaml.safe_load(p.read_text()) and "mechanics" not in p.name)


@pytest.mark.parametrize("path", STUDIES, ids=[p.name for p in STUDIES])
def test_shipped_studies_warm_up_at_least_the_concurrency(path: Path):
    cfg = load_config(path)  # the check runs inside: a shipped config it refuses fails here
    from specstudy.study.prereg import load_prereg

    levels = set(cfg["screen"]["concurrency"]) | set(load_prereg(cfg)["confirmation"]["concurrency"])
    assert all(request_counts(cfg["cells"], c)[1] >= c for c in levels), levels


def test_the_clariden_warm_up_at_c32_is_32_requests():
    cfg = load_config(ROOT / "config/clariden-70b.yaml")
    assert [request_counts(cfg["cells"], c)[1] for c in (1, 8, 32)] == [8, 8, 32]
    cfg["cells"].pop("warmup_per_slot")  # the constant warm-up of 8 it had: refused at c 32 only
    (problem,) = _warmup_problems(cfg)
    assert "'cells.warmup_requests': 8 warm-up request(s) at concurrency 32" in problem
    assert "preregistration-clariden-70b.yaml" in problem and "warmup_per_slot: 1" in problem


def test_an_extension_phase_warm_up_is_named_by_its_own_field():
    cfg = load_config(ROOT / "config/config.yaml")
    cfg["cells"]["warmup_per_slot"] = 0
    cfg["cells"]["warmup_requests"] = 8  # core cells (c <= 8) are fine ...
    cfg["extensions"]["ignore_eos"].update(concurrency=[1, 4], warmup_requests=2)  # ... this phase is not
    problems = _warmup_problems(cfg)
    assert len(problems) == 1 and problems[0].startswith("field 'extensions.ignore_eos.warmup_requests': 2 warm-up")


def test_clariden_confirms_over_five_deployment_repeats_before_any_adaptive_stop():
    from specstudy.inference import decision
    from specstudy.study import plan
    from specstudy.study.prereg import load_prereg

    cfg = load_config(ROOT / "config/clariden-70b.yaml")
    rule = decision.rule_from(cfg, load_prereg(cfg))
    assert (rule["initial_repeats"], rule["max_repeats"], rule["correction"]) == (5, 10, "obrien_fleming")
    assert sorted(rule["look_confidences"]) == list(range(5, 11))  # the first look is after round 5
    design = plan.make_plan(cfg, "confirm", arms=["baseline", "ngram-k3"])["design"]
    assert (design["repeats"], design["max_repeats"]) == (5, 10)
