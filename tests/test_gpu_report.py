"""GPU telemetry, start-up phases and memory/KV cost in the tables and the report (#14)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from specstudy.analysis import tables
from specstudy.deployment import launchlog
from specstudy.measure import telemetry
from specstudy.report import document as report
from specstudy.report.files import from_root
from test_nvml import add_gpm, fake_pynvml
from test_tables import make_results_tree

CUDA = Path(__file__).parent / "fixtures" / "launch-logs" / "cuda"
LAUNCH, READY = "2026-12-01T10:11:51.800Z", "2026-12-01T10:13:17.000Z"  # draft k=2: ready 85.2 s after launch


def _unix(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def gpu_telemetry(samples: int = 4) -> dict:
    """A cell's telemetry block as the sampler writes it, sampled from a fake 4-GPU NVML with GPM but no NVLink
    (GPM figure of GPU i over the interval ending with sample n: base + i + n², n = 2..4)."""
    fake = fake_pynvml(4)
    add_gpm(fake, nvlink=False)
    gpus = telemetry.NvmlGpus(fake)
    rows = [dict(t=i, unix=i, **gpus.sample()) for i in range(samples)]
    s = telemetry.summarize(rows, interval_s=1.0, errors={}, source="nvml+psutil")
    s["gpu"] = {"source": "nvml", "note": None, "devices": sorted(gpus.handles)}
    s["gpm"] = gpus.gpm_summary(s["series"])
    return s


def make_gpu_tree(tmp_path: Path) -> Path:
    """The CPU results tree of test_tables, with the draft-k3-tp4 screen deployments turned into GPU ones:
    confounds and start-up from the real compiled draft launch log, NVML telemetry in every cell."""
    res = make_results_tree(tmp_path, confirm=False)
    text = (CUDA / "vllm-0.23.0-cuda-compiled-draft-k2.log").read_text()
    conf = launchlog.parse_launch_log(text)
    for dep_path in sorted((res / "screen" / "draft-k3-tp4").glob("rep*/deployment.json")):
        dep = json.loads(dep_path.read_text())
        dep["confounds"] = {**dep["confounds"], **conf}
        dep["startup"] = launchlog.startup_steps(text, launch=LAUNCH, ready=READY, cache="cold", confounds=conf,
                                               utc_offsets_s=(0.0,))
        dep["tensor_parallel_size"] = {"target": 4, "draft": 4}
        dep["times"] = {"start": _unix(LAUNCH) - 0.5, "ready": _unix(READY), "stop": _unix(LAUNCH) + 399.5}
        dep_path.write_text(json.dumps(dep))
        for cell in dep["cells"]:
            p = Path(cell["summary"])
            s = json.loads(p.read_text())
            s["telemetry"] = gpu_telemetry()
            s["keys"]["tensor_parallel_size"] = 4
            p.write_text(json.dumps(s))
    tables.build_tables(res, res / "tables")
    return res


def test_cells_and_deployments_tables_carry_nvml_startup_and_memory(tmp_path):
    res = make_gpu_tree(tmp_path)
    t = tables.read_tables(res / "tables")
    cells, deps = t["cells"], t["deployments"]
    gpu = cells[cells["arm"] == "draft-k3-tp4"]
    assert len(gpu) > 0 and set(gpu["gpu_count"]) == {4} and set(gpu["gpu_telemetry_source"]) == {"nvml"}
    row = gpu.iloc[0]
    # per GPU: mean over the 4 GPUs of each GPU's mean; max over GPUs of each GPU's max (fake NVML values)
    assert row["gpu_memory_used_mib_mean"] == 11500.0 and row["gpu_memory_used_mib_max"] == 13000.0
    assert row["gpu_utilization_pct_mean"] == 51.5 and row["gpu_utilization_pct_max"] == 53.0
    assert row["gpu_power_w_mean"] == 415.0 and row["gpu_power_w_max"] == 430.0
    assert row["gpu_sm_clock_mhz_mean"] == 1980.0 and row["gpu_temperature_c_max"] == 43.0
    assert row["tensor_parallel_size"] == 4
    # GPM: per GPU mean of (4, 9, 16) + base + i, p50 9 + base + i; averaged over GPUs 0..3 (i: 1.5 on average)
    assert row["gpu_sm_activity_pct_mean"] == pytest.approx(50 + 1.5 + 29 / 3) and row["gpu_sm_activity_pct_p50"] == 60.5
    assert row["gpu_tensor_activity_pct_mean"] == pytest.approx(40 + 1.5 + 29 / 3)
    assert row["gpu_dram_bw_util_pct_p50"] == 30.5
    assert row["gpu_nvlink_rx_mib_s_mean"] is None or row["gpu_nvlink_rx_mib_s_mean"] != row["gpu_nvlink_rx_mib_s_mean"]
    assert row["gpu_gpm_unavailable"] == ("nvlink_rx_mib_s: nvmlGpmMetricsGet: NVML_ERROR_NOT_SUPPORTED (gpu0, gpu1, "
                                          "gpu2, gpu3); nvlink_tx_mib_s: nvmlGpmMetricsGet: NVML_ERROR_NOT_SUPPORTED "
                                          "(gpu0, gpu1, gpu2, gpu3)")
    cpu = cells[cells["arm"] == "baseline"]
    assert cpu["gpu_count"].isna().all() and cpu["gpu_memory_used_mib_mean"].isna().all()
    assert cpu["gpu_sm_activity_pct_mean"].isna().all() and cpu["gpu_gpm_unavailable"].isna().all()

    d = deps[(deps["arm"] == "draft-k3-tp4") & (deps["source"] == "deployment.json")].iloc[0]
    assert d["startup_total_s"] == 85.2 and d["startup_cache"] == "cold" and d["startup_log_clock"] == "utc"
    assert (d["startup_import_s"], d["startup_api_server_s"], d["startup_compile_s"], d["startup_graph_capture_s"],
            d["startup_engine_init_s"], d["startup_ready_s"]) == (20.2, 22.0, 20.62, 3.0, 12.38, 2.0)
    assert d["startup_weights_s"] == 0.542308 and d["compile_cache"] == "miss"
    assert (d["model_loading_gib"], d["kv_available_gib"], d["tensor_parallel_size"]) == (0.01, 41.37, 4)
    assert d["kv_log_tokens"] == 8_675_792
    assert d["deployment_seconds"] == pytest.approx(400.0)
    assert d["startup_share"] == pytest.approx(85.2 / 400.0)
    measured = cells[cells["deployment_id"] == d["deployment_id"]]["wall_seconds"].sum()
    assert d["measuring_seconds"] == pytest.approx(measured) and d["measuring_share"] == pytest.approx(measured / 400.0)
    failed = deps[deps["source"] == "failure_record"].iloc[0]
    assert failed["measuring_seconds"] is None or failed["measuring_seconds"] != failed["measuring_seconds"]


def test_report_section_with_gpu_and_on_a_cpu_run(tmp_path):
    res = make_gpu_tree(tmp_path / "gpu")
    report.build(from_root(res, res / "tables"), {}, res / "report")
    md = (res / "report" / "report.md").read_text()
    html = (res / "report" / "report.html").read_text()
    assert "## GPU, start-up and memory" in md and "<h2>GPU, start-up and memory</h2>" in html
    assert "| screen | draft-k3-tp4 | 18 | nvml | 4 | 11,500 | 13,000 | 51.5 | 415 | 430 | 1980 | 43 |" in md
    assert "| screen | draft-k3-tp4 | 18 | 61.2 (60.5) | 51.2 (50.5) | 31.2 (30.5) | – (–) | – (–) |" in md
    assert "Unavailable: nvlink_rx_mib_s: nvmlGpmMetricsGet: NVML_ERROR_NOT_SUPPORTED (gpu0, gpu1, gpu2, gpu3);" in md
    dep_id = "screen-draft-k3-tp4-rep0-a1"
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {dep_id} |"))
    assert line.startswith(f"| {dep_id} | draft-k3-tp4 | 0 | cold | miss | 85.2 | 20.2 | 22.0 | 4.5 | 0.5 | 20.6 | 3.0 | "
                           "12.4 | 2.0 | 21% |"), line
    assert "| draft-k3-tp4 | 4 | 0.01 | 41.37 | 8,675,792 | 300,000 | 13,000 |" in md  # log KV; the tree's /metrics KV
    assert "| baseline | – | – | – | – | 400,000 | no GPU telemetry |" in md
    assert "no GPU telemetry" in next(ln for ln in md.splitlines() if ln.startswith("| baseline | – |"))

    cpu = make_results_tree(tmp_path / "cpu", confirm=False)
    tables.build_tables(cpu, cpu / "tables")
    report.build(from_root(cpu, cpu / "tables"), {}, cpu / "report")
    md = (cpu / "report" / "report.md").read_text()
    assert "No GPU telemetry (CPU run): no cell recorded NVML or nvidia-smi series." in md
    assert "No start-up phases recorded" in md
    assert "No GPU telemetry (CPU run)" in (cpu / "report" / "report.html").read_text()


def test_gpm_columns_never_average_part_of_the_gpus_and_say_what_is_missing():
    figures = {n: {"count": 3, "mean": 10.0, "p50": 9.0} for n in telemetry.GPM_SERIES}
    one_without = {"gpu0": "unavailable: GPM not supported on this GPU (nvmlGpmQueryDeviceSupport)", "gpu1": figures}
    f = tables.gpm_fields(one_without, ["gpu0", "gpu1"])
    assert all(f[f"gpu_{n}_{s}"] is None for n in telemetry.GPM_SERIES for s in ("mean", "p50"))  # not gpu1 alone
    assert f["gpu_gpm_unavailable"] == "all figures: GPM not supported on this GPU (nvmlGpmQueryDeviceSupport) (gpu0)"
    both = tables.gpm_fields({"gpu0": figures, "gpu1": figures}, ["gpu0", "gpu1"])
    assert both["gpu_dram_bw_util_pct_mean"] == 10.0 and both["gpu_dram_bw_util_pct_p50"] == 9.0
    assert both["gpu_gpm_unavailable"] is None
    assert tables.gpm_fields(None, ["gpu0"])["gpu_gpm_unavailable"] == ("not recorded (a summary written before GPM "
                                                                        "was sampled)")
    assert tables.gpm_fields("unavailable: NVML is not usable here (nvidia-smi has no GPM figures)",
                             ["gpu0"])["gpu_gpm_unavailable"] == "NVML is not usable here (nvidia-smi has no GPM figures)"
    assert tables.gpm_fields(None, [])["gpu_gpm_unavailable"] is None  # no GPU: nothing to explain
