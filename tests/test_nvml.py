"""GPU telemetry through NVML: a fake ``pynvml`` (errors, no devices, 4 devices) and, on a GPU, the real one."""

from __future__ import annotations

import json
import statistics
import sys
import types

import jsonschema
import pytest

from conftest import wait_for_rows
from specstudy.core import atomic, schemas
from specstudy.deployment import provenance
from specstudy.measure import telemetry

MIB = 2**20


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 - pynvml's own class names
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    pass


class NVMLError_FunctionNotFound(NVMLError):  # noqa: N801
    pass


GPM_IDS = {"NVML_GPM_METRIC_SM_UTIL": 2, "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5, "NVML_GPM_METRIC_HMMA_TENSOR_UTIL": 7,
           "NVML_GPM_METRIC_DRAM_BW_UTIL": 10, "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC": 60,
           "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC": 61}
#: the fake's GPM value of metric id on device i over the interval ending with its n-th sample: base + i + n²
#: (not linear in n: a mean is not a median)
GPM_BASE = {2: 50.0, 5: 40.0, 7: 30.0, 10: 20.0, 60: 1000.0, 61: 2000.0}


def add_gpm(m: types.ModuleType, *, unsupported: tuple[int, ...] = (), nvlink: bool = True,
            sample_error: Exception | None = None, query_error: Exception | None = None) -> None:
    """NVML GPM on the fake: samples count per device; metrics are ``GPM_BASE[id] + device + n**2``.
    ``unsupported``: devices whose nvmlGpmQueryDeviceSupport says no; ``nvlink``: False answers the NVLink
    metrics NVML_ERROR_NOT_SUPPORTED (a one-GPU machine); ``sample_error`` / ``query_error``: raised by
    nvmlGpmSampleGet / nvmlGpmQueryDeviceSupport. ``m.gpm_live``: samples allocated and not yet freed."""
    for name, value in GPM_IDS.items():
        setattr(m, name, value)
    m.NVML_GPM_METRICS_GET_VERSION = 1
    m.gpm_live, m.gpm_taken = set(), {}

    def query(h):
        if query_error is not None:
            raise query_error
        return types.SimpleNamespace(version=1, isSupportedDevice=0 if h in unsupported else 1)

    def alloc():
        s = types.SimpleNamespace(dev=None, n=None)
        m.gpm_live.add(id(s))
        return s

    def free(s):
        m.gpm_live.remove(id(s))  # a double free raises

    def get(h, s):
        if sample_error is not None:
            raise sample_error
        m.gpm_taken[h] = m.gpm_taken.get(h, 0) + 1
        s.dev, s.n = h, m.gpm_taken[h]
        return s

    class MetricsGet:
        def __init__(self):
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(16)]

    def metrics_get(g):
        s1, s2 = g.sample1, g.sample2
        assert g.version == 1 and id(s1) in m.gpm_live and id(s2) in m.gpm_live
        assert s1.dev == s2.dev and s2.n == s1.n + 1, "metrics between one GPU's consecutive samples"
        for k in range(g.numMetrics):
            x = g.metrics[k]
            if x.metricId in (60, 61) and not nvlink:
                x.nvmlReturn = 3
            else:
                x.nvmlReturn, x.value = 0, GPM_BASE[x.metricId] + s2.dev + s2.n ** 2
        return g

    m.nvmlGpmQueryDeviceSupport, m.nvmlGpmSampleAlloc, m.nvmlGpmSampleFree = query, alloc, free
    m.nvmlGpmSampleGet, m.nvmlGpmMetricsGet, m.c_nvmlGpmMetricsGet_t = get, metrics_get, MetricsGet


def fake_pynvml(devices: int = 4, init_error: Exception | None = None, no_power: tuple[int, ...] = (),
                lost: tuple[int, ...] = ()) -> types.ModuleType:
    """A ``pynvml`` stand-in: device i uses (10000 + 1000 i) MiB of 143771 MiB, util 50+i %, SM clock 1980 MHz,
    memory clock 3201 MHz, power (400 + 10 i) W, 40+i °C; ``no_power``: devices without power readings."""
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_CLOCK_SM, m.NVML_CLOCK_MEM, m.NVML_TEMPERATURE_GPU = 1, 2, 0
    m.calls = {"init": 0, "shutdown": 0}

    def init():
        m.calls["init"] += 1
        if init_error is not None:
            raise init_error

    def shutdown():
        m.calls["shutdown"] += 1

    def dev(h):
        if h in lost:
            raise NVMLError_GpuIsLost("GPU is lost")
        return h

    m.nvmlInit, m.nvmlShutdown = init, shutdown
    m.nvmlDeviceGetCount = lambda: devices
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h:04d}-fake"
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # old bindings return bytes
    m.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=(10000 + 1000 * dev(h)) * MIB, total=143771 * MIB,
                                                                free=0)
    m.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=50 + dev(h), memory=20 + dev(h))
    m.nvmlDeviceGetClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind] if dev(h) is not None else None

    def power(h):
        if h in no_power:
            raise NVMLError_NotSupported("Not Supported")
        return (400 + 10 * dev(h)) * 1000  # milliwatts

    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetTemperature = lambda h, sensor: 40 + dev(h)
    m.nvmlSystemGetDriverVersion = lambda: "580.95.05"
    m.nvmlSystemGetNVMLVersion = lambda: "13.580.95.05"
    m.nvmlSystemGetCudaDriverVersion = lambda: 13000
    m.nvmlDeviceGetPowerManagementLimit = lambda h: 700000
    m.nvmlDeviceGetPowerManagementDefaultLimit = lambda h: 700000
    m.nvmlDeviceGetEnforcedPowerLimit = lambda h: 700000
    m.nvmlDeviceGetApplicationsClock = lambda h, kind: {1: 1980, 2: 3201}[kind]

    def not_supported(*a):
        raise NVMLError_NotSupported("Not Supported")

    m.nvmlDeviceGetDefaultApplicationsClock = not_supported
    m.nvmlDeviceGetMaxClockInfo = lambda h, kind: {1: 1980, 2: 3201}[kind]
    m.nvmlDeviceGetPersistenceMode = lambda h: 1
    m.nvmlDeviceGetComputeMode = lambda h: 0
    m.nvmlDeviceGetMigMode = lambda h: (0, 0)
    m.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=f"00000000:{h + 0x18:02X}:00.0")
    return m


@pytest.fixture
def fresh(monkeypatch):
    """Forget what was already said once, hide CUDA_VISIBLE_DEVICES and any real nvidia-smi."""
    monkeypatch.setattr(telemetry, "_SAID", set())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(telemetry, "query_nvidia_smi", lambda *a, **k: None)
    monkeypatch.setattr(telemetry, "query_nvidia_smi_inventory", lambda *a, **k: None)


def test_four_gpus_every_series_per_index(fresh, monkeypatch, tmp_path):
    fake = fake_pynvml(4, no_power=(3,))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = tmp_path / "telemetry.jsonl"
    with telemetry.TelemetrySampler(out, interval_s=0.05, root_pid=None) as sampler:
        wait_for_rows(out, 3)
    rows = atomic.read_jsonl(out)
    assert len(rows) >= 3
    first = rows[0]
    for i in range(4):
        assert first[f"gpu{i}.memory_used_mib"] == 10000 + 1000 * i
        assert first[f"gpu{i}.utilization_pct"] == 50 + i and first[f"gpu{i}.memory_utilization_pct"] == 20 + i
        assert first[f"gpu{i}.sm_clock_mhz"] == 1980 and first[f"gpu{i}.memory_clock_mhz"] == 3201
        assert first[f"gpu{i}.temperature_c"] == 40 + i
    assert [first.get(f"gpu{i}.power_w") for i in range(4)] == [400.0, 410.0, 420.0, None]
    s = sampler.summary()
    assert s["hardware_source"] == "nvml" and s["gpu"] == {"source": "nvml", "note": None, "devices": [0, 1, 2, 3]}
    assert s["series"]["gpu2.memory_used_mib"] == {"count": len(rows), "mean": 12000.0, "max": 12000.0}
    assert s["errors"] == {"nvml gpu3.power_w: NVMLError_NotSupported": 1}  # said once, then not asked again
    assert fake.calls == {"init": 1, "shutdown": 1}
    json.dumps(s)


def test_cuda_visible_devices_selects_gpus(fresh, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,GPU-0003")
    gpus = telemetry.NvmlGpus(fake_pynvml(4))
    assert sorted(gpus.handles) == [1, 3]
    assert sorted({k.split(".")[0] for k in gpus.sample()}) == ["gpu1", "gpu3"]


def test_transient_nvml_errors_are_counted_not_fatal(fresh, monkeypatch):
    gpus = telemetry.NvmlGpus(fake_pynvml(2, lost=(1,)))
    errors: dict = {}
    for _ in range(3):
        vals = gpus.sample(errors)
    assert vals["gpu0.memory_used_mib"] == 10000 and not any(k.startswith("gpu1.") for k in vals)
    assert errors["nvml gpu1.memory_used_mib: NVMLError_GpuIsLost"] == 3  # counted every time: not "unsupported"


@pytest.mark.parametrize("make, reason", [
    (lambda: fake_pynvml(0), "NVML found no GPU (devices: 0, CUDA_VISIBLE_DEVICES=unset)"),
    (lambda: fake_pynvml(4, init_error=NVMLError_LibraryNotFound("NVML Shared Library Not Found")),
     "NVML unavailable: NVMLError_LibraryNotFound: NVML Shared Library Not Found"),
    (lambda: None, "NVML unavailable: nvidia-ml-py (import pynvml) is not installed"),
])
def test_no_gpu_says_so_once_and_keeps_sampling_processes(fresh, monkeypatch, tmp_path, capsys, make, reason):
    monkeypatch.setitem(sys.modules, "pynvml", make())  # None: `import pynvml` raises ImportError
    for n in range(2):  # two cells of one deployment job
        out = tmp_path / f"c{n}.jsonl"
        with telemetry.TelemetrySampler(out, interval_s=0.05, root_pid=telemetry.os.getpid()) as sampler:
            wait_for_rows(out, 2)  # it keeps sampling
        rows = atomic.read_jsonl(out)
        assert rows and all(not k.startswith("gpu") for r in rows for k in r)
        assert all(r["proc.count"] >= 1 for r in rows)  # the CPU side goes on
        s = sampler.summary()
        assert s["hardware_source"] == "psutil" and s["gpu"]["source"] is None
        assert s["gpu"]["note"].startswith(f"no GPU telemetry ({reason}")
    err = capsys.readouterr().err
    assert err.count("no GPU telemetry") == 1 and reason in err


def test_inventory_for_provenance(fresh, monkeypatch):
    inv = telemetry.gpu_inventory(fake_pynvml(4))
    assert (inv["source"], inv["count"], inv["driver_version"], inv["cuda_driver_version"]) == ("nvml", 4, "580.95.05", "13.0")
    d3 = inv["devices"][3]
    assert d3["name"] == "NVIDIA H200" and d3["uuid"] == "GPU-0003-fake" and d3["pci_bus_id"] == "00000000:1B:00.0"
    assert d3["memory_total_mib"] == 143771 and d3["power_limit_w"] == 700.0 and d3["power_enforced_limit_w"] == 700.0
    assert d3["clocks_mhz"] == {"sm_application": 1980, "memory_application": 3201, "sm_default_application": None,
                                "sm_max": 1980, "memory_max": 3201}
    assert (d3["persistence_mode"], d3["compute_mode"], d3["mig_mode"]) == (True, 0, 0)
    none = telemetry.gpu_inventory(fake_pynvml(4, init_error=NVMLError_LibraryNotFound("not found")))
    assert none["devices"] == [] and none["error"] == "NVML unavailable: NVMLError_LibraryNotFound: not found"


def test_provenance_hardware_with_and_without_gpus(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(4))
    hw = provenance.hardware_info()
    assert len(hw["gpus"]) == 4 and hw["gpu"]["count"] == 4 and hw["gpu"]["driver_version"] == "580.95.05"
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0))
    hw = provenance.hardware_info()
    assert hw["gpus"] is None and hw["gpu"]["count"] == 0 and "no GPU" in hw["gpu"]["error"]
    engine = {"version": None, "version_tuple": None, "commit": None, "commit_source": None}
    prov = {"schema": provenance.PROVENANCE_SCHEMA, "deployment_id": "d", "arm": {"name": "baseline", "method": "baseline"},
            "project": {"revision": None, "dirty": None}, "backend": "local", "container": None, "bind_mounts": [],
            "command": None, "slurm": None, "models": {"target": None}, "hashes": {"cache": None, "read": 0}, "hardware": hw,
            "software": {"vllm": None, "torch": None, "engine": engine}, "corpus": None,
            "times": {"start": None, "ready": None, "stop": None}}
    schemas.validate(prov, "provenance", "no-GPU hardware")


# ------------------------------------------------------------------------------------------ GPM
GPM_NAMES = ("sm_activity_pct", "tensor_activity_pct", "dram_bw_util_pct", "nvlink_rx_mib_s", "nvlink_tx_mib_s")


def test_gpm_supported_values_flow_to_the_summary(fresh, monkeypatch, tmp_path):
    fake = fake_pynvml(2)
    add_gpm(fake, nvlink=False)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    out = tmp_path / "telemetry.jsonl"
    with telemetry.TelemetrySampler(out, interval_s=0.05, root_pid=None) as sampler:
        wait_for_rows(out, 4)
    rows = atomic.read_jsonl(out)
    assert "gpu0.sm_activity_pct" not in rows[0]  # one sample: no interval yet
    for n, row in enumerate(rows[1:], start=2):  # the interval ending with sample n
        for i in range(2):
            assert row[f"gpu{i}.sm_activity_pct"] == 50 + i + n * n
            assert row[f"gpu{i}.tensor_activity_pct"] == 40 + i + n * n  # ANY_TENSOR_UTIL, not HMMA
            assert row[f"gpu{i}.dram_bw_util_pct"] == 20 + i + n * n
            assert f"gpu{i}.nvlink_rx_mib_s" not in row
    s = sampler.summary()
    vals = [r["gpu1.sm_activity_pct"] for r in rows[1:]]
    assert statistics.median(vals) != sum(vals) / len(vals)
    assert s["gpm"]["gpu1"]["sm_activity_pct"] == {"count": len(vals), "mean": round(sum(vals) / len(vals), 6),
                                                   "p50": statistics.median(vals)}
    assert s["gpm"]["gpu0"]["nvlink_tx_mib_s"] == "unavailable: nvmlGpmMetricsGet: NVML_ERROR_NOT_SUPPORTED"
    assert s["errors"]["nvml gpu0.nvlink_rx_mib_s: NVML_ERROR_NOT_SUPPORTED"] == len(rows) - 1
    assert fake.gpm_live == set()  # every sample freed
    jsonschema.validate(s, schemas.load_schema("cell-summary")["properties"]["telemetry"])
    bad = {**s, "gpm": {"gpu0": {"sm_activity_pct": 0.0}}}  # a bare number (a silent zero) is refused
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schemas.load_schema("cell-summary")["properties"]["telemetry"])


def test_gpm_nvlink_and_hmma_fallback(fresh, monkeypatch):
    fake = fake_pynvml(1)
    add_gpm(fake)
    del fake.NVML_GPM_METRIC_ANY_TENSOR_UTIL  # an older module: HMMA only
    gpus = telemetry.NvmlGpus(fake)
    gpus.sample()
    vals = gpus.sample()
    assert (vals["gpu0.tensor_activity_pct"], vals["gpu0.nvlink_rx_mib_s"], vals["gpu0.nvlink_tx_mib_s"]) == (34, 1004, 2004)
    gpus.close()
    assert fake.gpm_live == set()


@pytest.mark.parametrize("setup, gpu0", [
    (lambda m: add_gpm(m, unsupported=(0,)), "unavailable: GPM not supported on this GPU (nvmlGpmQueryDeviceSupport)"),
    (lambda m: add_gpm(m, query_error=NVMLError_FunctionNotFound("Function Not Found")),
     "unavailable: nvmlGpmQueryDeviceSupport: NVMLError_FunctionNotFound: Function Not Found"),
    (lambda m: add_gpm(m, sample_error=NVMLError_NotSupported("Not Supported")),
     "unavailable: nvmlGpmSampleGet: NVMLError_NotSupported: Not Supported"),
    (lambda m: None, "unavailable: this nvidia-ml-py has no GPM API (nvmlGpmQueryDeviceSupport, nvmlGpmSampleAlloc, "
                     "nvmlGpmSampleGet, nvmlGpmSampleFree, nvmlGpmMetricsGet, c_nvmlGpmMetricsGet_t)"),
])
def test_gpm_unsupported_is_unavailable_with_the_reason(fresh, monkeypatch, setup, gpu0):
    fake = fake_pynvml(2)
    setup(fake)
    gpus = telemetry.NvmlGpus(fake)
    errors: dict = {}
    rows = [gpus.sample(errors) for _ in range(3)]
    gpus.close()
    assert not any(k.startswith("gpu0.") and k.split(".")[1] in GPM_NAMES for r in rows for k in r)  # never a zero
    s = telemetry.summarize(rows, errors=errors)
    gpm = gpus.gpm_summary(s["series"])
    assert gpm["gpu0"] == gpu0
    if "unsupported" in gpu0 or "QueryDevice" in gpu0 or "no GPM API" in gpu0:
        assert errors == {}  # asked once, not an error per sample
    if "not supported on this GPU" in gpu0:  # device 1 still has GPM
        assert gpm["gpu1"]["sm_activity_pct"]["count"] == 2
    assert getattr(fake, "gpm_live", set()) == set()


def test_gpm_erroring_gpu_is_unavailable_with_the_reason(fresh, monkeypatch):
    fake = fake_pynvml(1)
    add_gpm(fake, sample_error=NVMLError_GpuIsLost("GPU is lost"))
    gpus = telemetry.NvmlGpus(fake)
    errors: dict = {}
    rows = [gpus.sample(errors) for _ in range(3)]
    gpm = gpus.gpm_summary(telemetry.summarize(rows)["series"])
    assert gpm["gpu0"] == {n: "unavailable: nvmlGpmSampleGet: NVMLError_GpuIsLost: GPU is lost" for n in GPM_NAMES}
    assert errors == {"nvml gpu0.gpm: nvmlGpmSampleGet: NVMLError_GpuIsLost": 3}  # transient: asked every time


def test_gpm_without_nvml_is_unavailable(fresh, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(0))
    out = tmp_path / "t.jsonl"
    with telemetry.TelemetrySampler(out, interval_s=0.05, root_pid=None) as sampler:
        wait_for_rows(out, 1)
    assert sampler.summary()["gpm"] == ("unavailable: no GPU telemetry (NVML found no GPU (devices: 0, "
                                        "CUDA_VISIBLE_DEVICES=unset); no usable nvidia-smi): sampling the server's "
                                        "processes only")


# ------------------------------------------------------------------------------------------ real GPU
@pytest.mark.gpu
def test_real_nvml_sampler_on_this_gpu(tmp_path):
    """Needs an NVIDIA GPU (skipped with the reason otherwise) and nvidia-ml-py installed."""
    gpus = telemetry.NvmlGpus()
    assert gpus.available, gpus.error
    inv = gpus.inventory()
    gpus.close()
    assert inv["driver_version"] and inv["cuda_driver_version"] and inv["devices"][0]["name"]
    assert inv["devices"][0]["memory_total_mib"] > 1000
    out = tmp_path / "telemetry.jsonl"
    with telemetry.TelemetrySampler(out, interval_s=0.2, root_pid=telemetry.os.getpid()) as sampler:
        wait_for_rows(out, 3)
    s = sampler.summary()
    i = inv["devices"][0]["index"]
    assert s["gpu"]["source"] == "nvml" and s["hardware_source"] == "nvml+psutil"
    for name in ("memory_used_mib", "utilization_pct", "sm_clock_mhz", "temperature_c"):
        assert s["series"][f"gpu{i}.{name}"]["count"] >= 3, (name, s)
    gpm = s["gpm"][f"gpu{i}"]  # Hopper and later: figures (NVLink unavailable on a one-GPU machine); else why not
    if isinstance(gpm, dict):
        assert gpm["sm_activity_pct"]["count"] >= 2 and 0 <= gpm["sm_activity_pct"]["mean"] <= 100, gpm
    else:
        assert gpm.startswith("unavailable: ") and len(gpm) > len("unavailable: "), gpm
    print(json.dumps({"inventory": inv, "summary": s}, indent=1))


@pytest.mark.gpu
def test_real_cuda_launch_is_parsed(fixture_models, tmp_path, monkeypatch):
    """A real vLLM CUDA deployment of the fixture target (eager, small memory share): confounds, start-up, NVML.

    The server's interpreter is ``$SPECSTUDY_VLLM_PYTHON`` (default: this one); it must import a CUDA vLLM.
    """
    import os
    import subprocess

    py = os.environ.get("SPECSTUDY_VLLM_PYTHON") or sys.executable
    probe = subprocess.run([py, "-c", "import torch, vllm; assert torch.cuda.is_available(), 'no CUDA device'; "
                            "print(vllm.__version__, torch.__version__)"], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.fail(f"{py} cannot run a CUDA vLLM ({probe.stderr.strip().splitlines()[-1:]}); set SPECSTUDY_VLLM_PYTHON "
                    "to an interpreter that imports vllm with CUDA torch")
    engine = {"model": fixture_models["target"], "draft_model": fixture_models["draft"], "python": py,
              "max_model_len": 512, "gpu_memory_utilization": 0.2, "enforce_eager": True, "readiness_timeout_s": 600,
              "stop_grace_s": 20, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"},
              "cache_root": str(tmp_path / "vllm-cache")}
    arm = {"name": "draft-k2-tp1", "method": "draft_model", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}
    from specstudy.job.run import run_deployment
    from specstudy.measure import cell as cellmod
    from test_deploy import fake_captures, job_spec

    monkeypatch.chdir(tmp_path)
    fake_captures(monkeypatch)
    telemetry_seen = []

    def run_cell(base_url, served, reqs, warm, conc, cdir, *, keys, sampler, **k):  # telemetry only
        sampler.start()
        wait_for_rows(cdir / "telemetry.jsonl", 1)  # sampled during the cell, not only at its stop
        sampler.stop()
        telemetry_seen.append(sampler.summary())
        summary = {"keys": keys, "validity": {"valid": True, "reasons": []}}
        atomic.write_json(cdir / "summary.json", summary)
        return summary

    monkeypatch.setattr(cellmod, "run_cell", run_cell)
    engine = {"backend": "local", "python": py,
              "target": {"path": fixture_models["target"], "served_model_name": "tiny", "tensor_parallel_size": 1,
                         "max_model_len": 512},
              "draft": {"path": fixture_models["draft"]},
              "server": {"gpu_memory_utilization": 0.2, "extra_args": ["--enforce-eager"], "ready_timeout_s": 600,
                         "stop_grace_s": 20, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1"},
                         "cache_root": str(tmp_path / "vllm-cache")}}
    out = tmp_path / "results" / "screen" / arm["name"] / "rep1"
    assert run_deployment(job_spec(tmp_path, arm, engine), out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok", rec["failure"]
    c, prov = rec["confounds"], rec["provenance"]
    assert c["device"] == "cuda" and c["kv_cache"]["device"] == "GPU" and c["kv_cache"]["tokens"] > 0
    assert c["speculative_method"] == "draft_model" and c["model_loading"]["includes_draft"] is True
    assert c["attention_backend"]["name"] and c["engine_init_seconds"] > 0
    assert prov["compile_cache"]["state"] == "cold"
    assert prov["launcher_env"]["NCCL_NVLS_ENABLE"] == "0"
    assert prov["hardware"]["gpu"]["source"] == "nvml"
    assert telemetry_seen[0]["gpu"]["source"] == "nvml"
    startup = rec["startup"]
    assert startup["cache"] == "cold" and startup["log_clock"] not in (None, "unaligned"), startup
    assert startup["phases"]["weights"] is not None and startup["total_s"] > 0
    print(json.dumps({"probe": probe.stdout.strip(), "confounds": c, "startup": startup,
                      "provenance_hardware": prov["hardware"]}, indent=1, default=str))
    assert (out / "attempts" / rec["deployment_id"] / "launch.log").exists()
