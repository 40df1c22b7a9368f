"""The recorded run of two engine builds on one H100 (docs/runs/2026-12-07-engine-builds-h100.md): its launch
logs read by the project's own parser give the confounds the record states, and its records give the table's
ratios, each arm against the baseline of its own build."""

from __future__ import annotations

import importlib.util
import io
import json
import lzma
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "docs" / "gpu-results" / "2026-12-07-engine-builds-h100" / "engines.tar.xz"
_spec = importlib.util.spec_from_file_location("engine_builds", ROOT / "benchmarks" / "engine_builds.py")
eb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(eb)


@pytest.fixture(scope="module")
def pack() -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(PACK.read_bytes()))) as tar:
        return {m.name.removeprefix("./"): tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def _records(pack, rnd):
    return sorted((json.loads(v) for k, v in pack.items() if k.startswith(f"{rnd}/") and k.count("/") == 2
                   and k.endswith(".json")), key=lambda r: r["started_at"])


def test_each_build_reported_itself_and_both_ran_every_arm(pack):
    eng = json.loads(pack["round1/engines.json"])
    assert {b: r["version"] for b, r in eng["reported"].items()} == {"0.23.0": "0.23.0", "0.26.0": "0.26.0"}
    runs = {(r["build"], r["arm"]) for r in _records(pack, "round1")}
    assert runs == {(b, a) for b in ("0.23.0", "0.26.0")
                    for a in ("baseline", "draft-k3-tp1", "draft-k3-tp1+async", "ngram-k5")}


def test_the_launch_logs_give_the_confounds_the_record_states(pack):
    from specstudy.deployment.launchlog import parse_launch_log

    for build in ("0.23.0", "0.26.0"):
        conf = {arm: parse_launch_log(pack[f"round1/{build}/{arm}.attempt/launch.log"].decode())
                for arm in ("baseline", "draft-k3-tp1", "draft-k3-tp1+async", "ngram-k5")}
        assert conf["baseline"]["vllm_version"] == build
        assert conf["baseline"]["async_scheduling"]["enabled"] is True and conf["baseline"]["model_runner"] == "V2"
        assert conf["draft-k3-tp1"]["async_scheduling"]["enabled"] is False
        assert conf["draft-k3-tp1+async"]["async_scheduling"]["enabled"] is True  # accepted by both builds
        assert conf["ngram-k5"]["async_scheduling"]["enabled"] is False
        for arm in ("draft-k3-tp1", "draft-k3-tp1+async", "ngram-k5"):
            assert conf[arm]["model_runner"].startswith("V1")
        assert conf["draft-k3-tp1"]["max_num_scheduled_tokens"] == 8064


def test_acceptance_is_identical_on_both_builds_and_only_the_draft_arms_speedup_moves(pack):
    recs = {(r["build"], r["arm"]): r for r in _records(pack, "round1")}
    for arm in ("draft-k3-tp1", "ngram-k5"):
        old, new = ([c["speculative"] for c in recs[(b, arm)]["cells"]] for b in ("0.23.0", "0.26.0"))
        assert [(s["draft_tokens"], s["accepted_tokens"]) for s in old] == \
               [(s["draft_tokens"], s["accepted_tokens"]) for s in new]
    rows = eb.summary_table(list(recs.values())).splitlines()[2:]
    ratio = {(r.split("|")[1].strip(), r.split("|")[2].strip(), r.split("|")[3].strip()): float(r.split("|")[6])
             for r in rows}
    for c in ("1", "8", "32"):
        assert ratio[("0.26.0", "draft-k3-tp1", c)] > 1.1 and ratio[("0.23.0", "draft-k3-tp1", c)] < 1.0
        assert ratio[("0.26.0", "baseline", c)] == ratio[("0.23.0", "baseline", c)] == 1.0
    base = {b: [c["output_tokens_per_s"] for c in recs[(b, "baseline")]["cells"]] for b in ("0.23.0", "0.26.0")}
    assert all(0.95 < n / o < 1.05 for o, n in zip(base["0.23.0"], base["0.26.0"], strict=True))
