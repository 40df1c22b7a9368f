"""Energy per output token (NVML's energy counter over the window) and the throughput–interactivity curves
(issue 27 item 7): the sampler, the cells table, the report's sections, on constructed data with known answers."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from specstudy.analysis import tables
from specstudy.core import atomic
from specstudy.measure import telemetry
from specstudy.report import document as report
from specstudy.report import efficiency, plots
from specstudy.report.files import from_root
from test_nvml import fake_pynvml, fresh  # noqa: F401  (fixture)
from test_tables import make_results_tree


def test_sampler_reads_the_energy_counter_at_both_ends_of_the_window(fresh, monkeypatch, tmp_path):  # noqa: F811
    """Two GPUs; the counter advances only between the window's first sample and stop(): the delta is exact."""
    fake = fake_pynvml(2)
    energy_mj = {0: 5_000_000, 1: 7_000_000}
    first_read = threading.Event()

    def energy(h):
        value = energy_mj[h]
        if h == 1:  # the last GPU of the first sample has been read
            first_read.set()
        return value

    fake.nvmlDeviceGetTotalEnergyConsumption = energy
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = tmp_path / "telemetry.jsonl"
    sampler = telemetry.TelemetrySampler(out, interval_s=3600, root_pid=None).start()
    assert first_read.wait(30)  # the sampler's first sample (the window's start) has read the counters
    energy_mj[0] += 1_234_500  # 1234.5 J on GPU 0, 800 J on GPU 1 during the window
    energy_mj[1] += 800_000
    s = sampler.stop()
    rows = atomic.read_jsonl(out)
    assert len(rows) == 2  # the first sample and the one stop() takes at the window's end
    assert [r["gpu0.energy_j"] for r in rows] == [5000.0, 6234.5]
    assert s["series"]["gpu0.energy_j"]["delta"] == 1234.5 and s["series"]["gpu1.energy_j"]["delta"] == 800.0
    assert "delta" not in s["series"]["gpu0.power_w"]  # a gauge, not a counter
    assert s["window_s"] == pytest.approx(rows[1]["unix"] - rows[0]["unix"], abs=1e-3)
    f = tables.gpu_fields(s)
    assert f["gpu_energy_j"] == 2034.5 and f["gpu_count"] == 2 and f["gpu_energy_window_s"] == s["window_s"]


def test_a_gpu_without_the_counter_gives_no_energy_never_a_partial_sum(fresh, monkeypatch):  # noqa: F811
    fake = fake_pynvml(2)
    fake.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1000  # only GPU 0 answers below
    gpus = telemetry.NvmlGpus(fake)
    assert gpus.sample()["gpu1.energy_j"] == 1.0
    tel = {"window_s": 2.0, "gpu": {"source": "nvml"},
           "series": {"gpu0.energy_j": {"count": 2, "mean": 1.0, "max": 2.0, "delta": 10.0},
                      "gpu0.power_w": {"count": 2, "mean": 5.0, "max": 5.0},
                      "gpu1.power_w": {"count": 2, "mean": 5.0, "max": 5.0}}}
    assert tables.gpu_fields(tel)["gpu_energy_j"] is None
    assert tables.gpu_fields({"series": {"proc.cpu_pct": {"count": 1, "mean": 1, "max": 1}}})["gpu_energy_j"] is None


def _gpu_tree(tmp_path, joules_per_token: dict[str, float]):
    """make_results_tree with NVML series (one GPU) whose energy delta gives a known J/token per arm."""
    res = make_results_tree(tmp_path, invalid=False)
    for p in res.glob("*/*/rep*/*/c*/summary.json"):
        s = json.loads(p.read_text())
        arm, c = s["keys"]["arm"], s["keys"]["concurrency"]
        jpt = joules_per_token[arm] / (1 + 0.1 * c)  # cheaper per token at higher concurrency
        s["telemetry"] = {"window_s": 10.0, "gpu": {"source": "nvml"},
                          "series": {"gpu0.energy_j": {"count": 3, "mean": 1.0, "max": 1.0,
                                                       "delta": jpt * s["tokens"]["completion"]},
                                     "gpu0.power_w": {"count": 3, "mean": 300.0, "max": 320.0}}}
        p.write_text(json.dumps(s))
    tables.build_tables(res, res / "tables")
    return res


def test_cells_table_and_report_give_joules_per_token_per_arm(tmp_path):
    jpt = {"baseline": 2.0, "draft-k3-tp4": 1.5, "draft-k5-tp4": 3.0, "ngram-k3": 1.0}
    res = _gpu_tree(tmp_path, jpt)
    cells = tables.read_tables(res / "tables")["cells"]
    one = cells[(cells.arm == "draft-k3-tp4") & (cells.concurrency == 8) & (cells.phase == "confirm")].iloc[0]
    assert one.energy_j_per_output_token == pytest.approx(1.5 / 1.8, rel=1e-12)
    assert one.gpu_energy_j == pytest.approx(1.5 / 1.8 * 384, rel=1e-12) and one.gpu_energy_window_s == 10.0
    out = report.build(from_root(res, res / "tables"), {}, tmp_path / "report")
    rows = {(r["phase"], r["workload"], r["concurrency"], r["arm"]): r for r in out["energy"]}
    r = rows[("confirm", "chat", 8, "draft-k3-tp4")]
    assert r["j_per_token"] == pytest.approx(1.5 / 1.8) and r["ratio_to_baseline"] == pytest.approx(0.75)
    assert r["n"] == 3 and r["power_w"] == pytest.approx(1.5 / 1.8 * 384 / 10.0)
    assert rows[("confirm", "chat", 8, "baseline")]["ratio_to_baseline"] is None
    md = (tmp_path / "report" / "report.md").read_text()
    assert "## Energy per output token (NVML)" in md and "| confirm | draft-k3-tp4 |" in md
    # the throughput-interactivity curves of the confirmation: one GPU per job (NVML's count)
    pts = {(p["arm"], p["workload"], p["concurrency"]): p for p in out["interactivity"]}
    assert {p["phase"] for p in out["interactivity"]} == {"confirm"} and len(pts) == 2 * 3 * 2
    assert pts[("baseline", "chat", 8)]["gpus"] == 1 and pts[("baseline", "chat", 8)]["gpu_source"] == "nvml"
    assert (tmp_path / "report" / "plots" / "throughput_interactivity.png").exists()
    assert "](plots/throughput_interactivity.png)" in md


def test_cpu_run_says_energy_is_absent_not_zero(tmp_path):
    res = make_results_tree(tmp_path)
    tables.build_tables(res, res / "tables")
    cells = tables.read_tables(res / "tables")["cells"]
    assert cells["energy_j_per_output_token"].isna().all() and cells["gpu_energy_j"].isna().all()
    out = report.build(from_root(res, res / "tables"), {}, tmp_path / "report")
    assert out["energy"] == []
    md = (tmp_path / "report" / "report.md").read_text()
    assert "energy per output token is absent, not zero" in md


def test_interactivity_points_and_plot(tmp_path):
    cells = []
    for arm, scale in (("baseline", 1.0), ("ngram-k3", 1.5)):
        for c in (1, 8):
            for rep, tpot in enumerate((4.0, 5.0, 6.0)):
                cells.append({"phase": "confirm", "arm": arm, "workload": "chat", "concurrency": c, "rep": rep,
                              "kind": "repeat", "throughput_valid": True, "gpu_count": None,
                              "tensor_parallel_size": 2, "output_tokens_per_second": 100.0 * c * scale,
                              "tpot_p50_ms": tpot * c / scale})
    cells.append(dict(cells[0], throughput_valid=False, output_tokens_per_second=1e9))  # excluded
    cells.append(dict(cells[0], kind="drift", output_tokens_per_second=1e9))  # a drift baseline: not a point
    # the GPU count from the cell's deployment when neither NVML nor the cell's keys name it
    dep = [{"deployment_id": "d-4", "tensor_parallel_size": 4}]
    only = efficiency.interactivity_points([dict(cells[0], tensor_parallel_size=None, deployment_id="d-4")], dep)
    assert only[0]["gpus"] == 4 and only[0]["tok_s_per_gpu"] == 25.0
    assert efficiency.interactivity_points([dict(cells[0], tensor_parallel_size=None)]) == []
    pts = {(p["arm"], p["concurrency"]): p for p in efficiency.interactivity_points(cells)}
    b1, n8 = pts[("baseline", 1)], pts[("ngram-k3", 8)]
    assert b1["tok_s_per_gpu"] == 50.0 and b1["tok_s_per_user"] == 200.0 and b1["n"] == 3 and b1["gpus"] == 2
    assert b1["gpu_source"] == "tensor_parallel_size"
    assert n8["tok_s_per_gpu"] == 600.0 and n8["tok_s_per_user"] == pytest.approx(1000 / (5.0 * 8 / 1.5))
    B: list = []
    efficiency.interactivity_section(B, cells, tmp_path)
    assert (tmp_path / "throughput_interactivity.png").stat().st_size > 1000
    img = next(b for b in B if b[0] == "img")
    assert img[1] == "plots/throughput_interactivity.png" and img[2].startswith(
        plots.PLOT_CAPTIONS["throughput_interactivity"])
    assert "per engine" in next(b for b in B if b[0] == "p")[1]
    B2: list = []
    assert efficiency.interactivity_section(B2, [], tmp_path / "none") == []
    assert "no data" in B2[-1][1]


@pytest.mark.gpu
def test_real_nvml_energy_counter(tmp_path):
    """Needs an NVIDIA GPU (skipped with the reason otherwise): every GPU has the counter; it never runs backwards."""
    gpus = telemetry.NvmlGpus()
    assert gpus.available, gpus.error
    errors: dict = {}
    first, second = gpus.sample(errors), gpus.sample(errors)
    seen = sorted(gpus.handles)
    gpus.close()
    assert seen and not any("energy" in k for k in errors), errors
    for i in seen:
        assert second[f"gpu{i}.energy_j"] >= first[f"gpu{i}.energy_j"] > 0
