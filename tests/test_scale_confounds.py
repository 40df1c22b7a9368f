"""Per-arm confounds of the scale-model run (issue 27 item 6) on the recorded vLLM 0.23 CUDA logs:
the model runner (V2 vs V1) beside every comparison, and Triton JIT compilations inside a cell's window."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import data_path
from specstudy.analysis import jit, tables
from specstudy.core import schemas
from specstudy.deployment import launchlog
from specstudy.measure import cell
from specstudy.report.sections.candidates import candidates_section
from specstudy.study import prereg
from test_cell import four_rows, summ

# The recorded GPU logs are part of the repository's test data (tests/data/gpu, see its MANIFEST.md).
SCALE = data_path("gpu", "cuda-logs", "scale-model-8b")
MECH = data_path("gpu", "mechanics-2026-12-02")


def log(name: str) -> str:
    return jit.read_log(SCALE / name)


# ------------------------------------------------------------------------------------------ model runner
def test_model_runner_of_each_arm_reaches_the_confound_columns():
    runners = {}
    for arm in ("baseline", "draft-k1", "draft-k3", "ngram-k3"):
        c = launchlog.parse_launch_log(log(f"serve_{arm}.log"))
        schemas.validate(c, "confounds", arm)
        runners[arm] = tables.confound_fields(c)["model_runner"]
    assert runners == {"baseline": "V2", "draft-k1": "V1 (gpu_model_runner)", "draft-k3": "V1 (gpu_model_runner)",
                       "ngram-k3": "V1 (gpu_model_runner)"}
    # the evidence is the engine's own fallback line, per method
    d = launchlog.parse_launch_log(log("serve_draft-k3.log"))["evidence"]["model_runner"]
    n = launchlog.parse_launch_log(log("serve_ngram-k3.log"))["evidence"]["model_runner"]
    assert "Model Runner V2 does not yet support speculative method 'draft_model'" in d
    assert "Model Runner V2 does not yet support ngram/ngram_gpu speculative decoding" in n
    self_draft = launchlog.parse_launch_log(jit.read_log(MECH / "self-draft-k3-launch.log"))
    assert tables.confound_fields(self_draft)["model_runner"] == "V1 (gpu_model_runner)"


def test_report_shows_the_model_runner_beside_every_comparison():
    deps = []
    for arm, name in (("baseline", "baseline"), ("draft-k3-tp1", "draft-k3"), ("ngram-k3", "ngram-k3")):
        deps.append({"phase": "confirm", "arm": arm, "status": "ok",
                     **tables.confound_fields(launchlog.parse_launch_log(log(f"serve_{name}.log")))})
    B: list = []
    rec = {"candidates": [], "phase": "confirm"}
    candidates_section(B, rec, [], [], deps, {}, [])
    table = next(b for b in B if b[0] == "table" and "model runner" in b[1])
    by_arm = {r[1]: r for r in table[2]}
    col = table[1].index("model runner")
    assert by_arm["baseline"][col] == "V2" and by_arm["draft-k3-tp1"][col] == "V1 (gpu_model_runner)"
    diffs = next(b for b in B if b[0] == "ul" and any("vs baseline" in x for x in b[1]))[1]
    assert any(x.startswith("confirm draft-k3-tp1 vs baseline") and "model_runner" in x and "async_scheduling" in x
               for x in diffs), diffs
    assert any(x.startswith("confirm ngram-k3 vs baseline") and "model_runner" in x for x in diffs), diffs


# ------------------------------------------------------------------------------------------ JIT events
def test_jit_events_of_the_recorded_logs():
    counts = {arm: len(jit.jit_events(log(f"serve_{arm}.log"))) for arm in ("baseline", "draft-k1", "draft-k3", "ngram-k3")}
    assert counts == {"baseline": 0, "draft-k1": 5, "draft-k3": 6, "ngram-k3": 2}
    ev = jit.jit_events(log("serve_draft-k3.log"))
    assert [e["kernel"] for e in ev] == ["_compute_slot_mapping_kernel", "eagle_prepare_next_token_padded_kernel",
                                         "copy_and_expand_eagle_inputs_kernel", "eagle_step_slot_mapping_metadata_kernel",
                                         "rejection_greedy_sample_kernel", "eagle_prepare_inputs_padded_kernel"]
    assert [e["log_time"] for e in ev] == ["12-02 03:17:13"] * 3 + ["12-02 03:17:14"] + ["12-02 03:17:15"] * 2
    assert ev[0]["proc"] == "EngineCore" and ev[0]["line"] == 111
    assert "jit_monitor.py" in log("serve_draft-k3.log").split("\n")[ev[0]["line"] - 1]
    ng = jit.jit_events(log("serve_ngram-k3.log"))
    assert [(e["kernel"], e["log_time"]) for e in ng] == [("_compute_slot_mapping_kernel", "12-02 03:20:09"),
                                                          ("rejection_greedy_sample_kernel", "12-02 03:20:12")]
    # the monitor's activation line is not a compilation
    assert all("activated" not in log("serve_baseline.log").split("\n")[e["line"] - 1] for e in ev)


def test_window_overlap_by_log_second_and_clock():
    ev = jit.jit_events(log("serve_draft-k3.log"))
    # window 03:17:13.5 → 03:17:14.2 UTC: the stamps 13 ([13, 14)) and 14 overlap it, 15 does not
    hit = jit.in_window(ev, "2026-12-02T03:17:13.500+00:00", "2026-12-02T03:17:14.200+00:00", "utc")
    assert hit["checked"] and [e["log_time"][-2:] for e in hit["events"]] == ["13", "13", "13", "14"]
    assert hit["events"][0]["utc"] == "2026-12-02T03:17:13.000Z"  # a record's stamp (core.timestamps)
    # the first measurement window opened after the last compilation (first /metrics GET after line 116)
    assert jit.in_window(ev, "2026-12-02T03:17:16+00:00", "2026-12-02T03:17:41+00:00", "utc")["events"] == []
    # a window that ends exactly where the stamp's second begins does not hold it
    assert jit.in_window(ev, "2026-12-02T03:17:10+00:00", "2026-12-02T03:17:13+00:00", "utc")["events"] == []
    # a server whose clock runs one hour ahead of UTC: its 03:17 is 02:17 UTC
    assert len(jit.in_window(ev, "2026-12-02T02:17:12+00:00", "2026-12-02T02:17:20+00:00", "utc+1h")["events"]) == 6
    assert jit.in_window(ev, "2026-12-02T03:17:12+00:00", "2026-12-02T03:17:20+00:00", "utc+1h")["events"] == []
    assert jit.clock_offset_s("utc-5.5h") == -19800.0
    # nothing is claimed when the clock or the window is unknown
    un = jit.in_window(ev, "2026-12-02T03:17:12+00:00", "2026-12-02T03:17:20+00:00", "unaligned")
    assert un == {"checked": False, "events": [],
                  "why": "the launch log's clock is not aligned to ours (log_clock 'unaligned')"}
    assert jit.in_window(ev, None, None, "utc")["checked"] is False


def _windowed(start: str, end: str) -> dict:
    s = summ(four_rows())
    s["times"] = {"started_at": start, "ended_at": end}
    return s


def test_flag_keeps_the_cell_and_notes_the_kernels():
    s = _windowed("2026-12-02T03:17:12+00:00", "2026-12-02T03:17:20+00:00")
    found = jit.apply(s, log("serve_draft-k3.log"), "utc", "flag")
    assert len(found["events"]) == 6
    v = s["validity"]
    assert v["valid"] and v["throughput_valid"] and v["reasons"] == []
    assert [n["code"] for n in v["notes"]] == ["jit_in_window"]
    assert "6 Triton JIT compilation(s)" in v["notes"][0]["detail"]
    assert "rejection_greedy_sample_kernel at 12-02 03:17:15 (log line 115)" in v["notes"][0]["detail"]
    schemas.validate(s, "cell-summary", "flagged")
    row = tables.cell_row(s)
    assert row["validity_notes"] == "jit_in_window" and row["valid"] is True


def test_reject_invalidates_the_cell_and_a_clean_window_is_untouched():
    s = _windowed("2026-12-02T03:20:11+00:00", "2026-12-02T03:20:15+00:00")
    jit.apply(s, log("serve_ngram-k3.log"), "utc", "reject")
    v = s["validity"]
    assert not v["valid"] and not v["throughput_valid"] and [r["code"] for r in v["reasons"]] == ["jit_in_window"]
    assert "rejection_greedy_sample_kernel" in v["reasons"][0]["detail"] and "re-run" in v["reasons"][0]["detail"]
    schemas.validate(s, "cell-summary", "rejected")
    assert tables.cell_row(s)["invalid_reasons"] == "jit_in_window"
    clean = _windowed("2026-12-02T03:20:13+00:00", "2026-12-02T03:20:30+00:00")
    before = copy.deepcopy(clean)
    assert jit.apply(clean, log("serve_ngram-k3.log"), "utc", "reject")["events"] == []
    assert clean == before
    with pytest.raises(ValueError, match="use one of"):
        jit.apply(clean, "", "utc", "warn")


def test_consequence_is_pre_registered(tmp_path):
    from specstudy.study import config

    assert jit.consequence_of(None) == "flag" and jit.consequence_of({"confounds": {}}) == "flag"
    assert jit.consequence_of({"confounds": {"jit_in_window": "reject"}}) == "reject"
    gpu = prereg.read_prereg_file(Path(__file__).resolve().parents[1] / "config" / "preregistration-gpu-h200.yaml")
    assert jit.consequence_of(gpu) == "flag"
    bad = (Path(__file__).resolve().parents[1] / "config" / "preregistration.yaml").read_text() + \
        "confounds:\n  jit_in_window: warn\n"
    (tmp_path / "p.yaml").write_text(bad)
    with pytest.raises(config.ConfigError, match="jit_in_window"):
        prereg.read_prereg_file(tmp_path / "p.yaml")


def test_deployment_job_marks_a_cell_from_its_own_launch_log(tmp_path):
    """The deployment job's hook: the attempt's live launch.log, its clock aligned as the start-up phases do."""
    from specstudy.job import run as deployment_run

    attempt = tmp_path / "attempt"
    attempt.mkdir()
    (attempt / "launch.log").write_bytes(b"# specstudy launch 2026-12-02T03:15:20+00:00: vllm serve /tmp/scale/target\n"
 + (SCALE / "serve_draft-k3.log").read_bytes())
    path = attempt / "open_chat" / "c1" / "summary.json"
    path.parent.mkdir(parents=True)
    s = _windowed("2026-12-02T03:17:14+00:00", "2026-12-02T03:17:30+00:00")
    path.write_text(json.dumps(s))
    logged: list[str] = []
    job = SimpleNamespace(attempt=attempt, times={"ready": "2026-12-02T03:17:13+00:00"},
                          lock={"content": {"confounds": {"jit_in_window": "reject"}}}, log=logged.append)
    deployment_run._mark_jit(job, s, path)
    on_disk = json.loads(path.read_text())
    assert on_disk["validity"]["valid"] is False and cell.REASON_EFFECT["jit_in_window"] == "reject"
    assert [r["code"] for r in on_disk["validity"]["reasons"]] == ["jit_in_window"]
    assert logged and "3 JIT compilation(s)" in logged[0]  # 03:17:14 and the two at 03:17:15


def test_report_lists_the_marked_cells_with_their_consequence():
    flagged = _windowed("2026-12-02T03:17:12+00:00", "2026-12-02T03:17:20+00:00")
    jit.apply(flagged, log("serve_draft-k3.log"), "utc", "flag")
    rejected = _windowed("2026-12-02T03:20:11+00:00", "2026-12-02T03:20:15+00:00")
    jit.apply(rejected, log("serve_ngram-k3.log"), "utc", "reject")
    clean = _windowed("2026-12-02T03:20:13+00:00", "2026-12-02T03:20:30+00:00")
    cells = [tables.cell_row(s) for s in (flagged, rejected, clean)]
    B: list = []
    rows = jit.report_section(B, cells)
    assert [r["consequence"] for r in rows] == ["flag", "reject"]
    table = next(b for b in B if b[0] == "table")
    assert [r[5] for r in table[2]] == ["flag", "reject"] and "6 Triton JIT" in table[2][0][6]
    B2: list = []
    assert jit.report_section(B2, [cells[2]]) == [] and "No cell's window" in B2[-1][1]


def test_deployment_job_says_when_the_log_clock_cannot_be_aligned(tmp_path):
    from specstudy.job import run as deployment_run

    attempt = tmp_path / "attempt"
    attempt.mkdir()
    # launched and ready hours away from every stamp of the log: no alignment puts its first line in between
    (attempt / "launch.log").write_bytes(b"# specstudy launch 2026-12-02T11:15:20+00:00: vllm serve /tmp/scale/target\n"
                                         + (SCALE / "serve_draft-k3.log").read_bytes())
    path = attempt / "summary.json"
    s = _windowed("2026-12-02T03:17:14+00:00", "2026-12-02T03:17:30+00:00")
    path.write_text(json.dumps(s))
    before = copy.deepcopy(s)
    logged: list[str] = []
    job = SimpleNamespace(attempt=attempt, times={"ready": "2026-12-02T11:17:13+00:00"}, lock={}, log=logged.append)
    deployment_run._mark_jit(job, s, path)
    assert s == before and json.loads(path.read_text()) == before
    assert len(logged) == 1 and "could not be checked" in logged[0] and "unaligned" in logged[0]
