"""Table-driven bad input: every case must end in a clear error that names the file/field (and no traceback).

Each case builds its bad input in a temporary directory, runs one ``specstudy`` command (or a
Snakemake dry run on a copy of the workflow) and is classified:

* ``clear``     — non-zero exit, no Python traceback, every expected fragment (file, field, fix) in the output;
* ``weak``      — non-zero exit, no traceback, but a fragment is missing;
* ``traceback`` — a Python traceback reached the user;
* ``silent``    — exit 0 (the bad input was accepted).

``python tests/test_bad_input.py`` prints the classification of every case and the counts (how the
before/after numbers of issue #21 were taken).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from conftest import copy_workflow

ROOT = Path(__file__).resolve().parents[1]
SPECSTUDY = [sys.executable, "-m", "specstudy.cli"]
SNAKEMAKE = [sys.executable, "-m", "snakemake", "--cores", "1"]


def _env() -> dict:
    return dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=str(ROOT / "scripts"))


@dataclass
class Case:
    id: str
    setup: Callable[[Path], list[str]]  # returns the command; runs in the case's directory
    expect: list[str] = field(default_factory=list)  # fragments a clear error contains (case-insensitive)
    snakemake: bool = False
    # Snakemake's own message that we cannot change (it reads --configfile before our code runs): the best
    # reachable result is a weak error; the test asserts exactly that, and the clear path is the case after it.
    known_weak: str | None = None


# A Python exception reaching the user: Snakemake prints parse-time exceptions as "<Type>Error in file …" with
# their frames but without the "Traceback" header; its own WorkflowError (our messages) is the expected form.
_PYTHON_ERROR = re.compile(r'^(?!WorkflowError)[A-Za-z_.]*(Error|Exception)( in file "|: )|^\s*File ".*site-packages', re.M)


def classify(rc: int, out: str, expect: list[str]) -> str:
    if rc == 0:
        return "silent"
    if "Traceback (most recent call last)" in out or _PYTHON_ERROR.search(out):
        return "traceback"
    low = out.lower()
    return "clear" if all(e.lower() in low for e in expect) else "weak"


# ------------------------------------------------------------------ helpers building inputs

def _small_config(d: Path, **edits) -> dict:
    cfg = yaml.safe_load((ROOT / "tests/data/study-small.yaml").read_text())
    cfg["study"]["preregistration"] = str(ROOT / "tests/data/preregistration-small.yaml")
    for w, s in list(cfg["corpora"]["workloads"].items()):
        cfg["corpora"]["workloads"][w] = str(ROOT / s)
    cfg["corpora"]["smoke"] = str(ROOT / cfg["corpora"]["smoke"])
    return cfg


def _write_yaml(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(obj, sort_keys=False))
    return path


def _plan_cmd(cfg_path: Path, d: Path) -> list[str]:
    return [*SPECSTUDY, "plan", "--config", str(cfg_path), "--phase", "screen", "--out", str(d / "plan.json")]


def cfg_case(mutate: Callable[[dict, Path], None]) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        cfg = _small_config(d)
        mutate(cfg, d)
        return _plan_cmd(_write_yaml(d / "study.yaml", cfg), d)
    return setup


def prereg_case(mutate: Callable[[dict], object]) -> Callable[[Path], list[str]]:
    def setup(d: Path) -> list[str]:
        pr = yaml.safe_load((ROOT / "config/preregistration.yaml").read_text())
        res = mutate(pr)
        p = d / "prereg.yaml"
        if isinstance(res, str):
            p.write_text(res)
        else:
            _write_yaml(p, pr)
        cfg = _small_config(d)
        cfg["study"]["preregistration"] = str(p)
        return _plan_cmd(_write_yaml(d / "study.yaml", cfg), d)
    return setup


def workflow_copy(d: Path) -> Path:
    w = d / "wf"
    w.mkdir()
    return copy_workflow(w, test_data=True)


def sm_case(mutate: Callable[[Path], list[str]]) -> Callable[[Path], list[str]]:
    """A Snakemake dry run of a workflow copy after ``mutate`` (which returns extra Snakemake args)."""
    def setup(d: Path) -> list[str]:
        w = workflow_copy(d)
        extra = mutate(w)
        return [*SNAKEMAKE, "-d", str(w), "-s", str(w / "Snakefile"), "-n", *extra]
    return setup


def _spec(d: Path, text: str, name: str = "spec.yaml") -> Path:
    p = d / name
    p.write_text(text)
    return p


def _good_spec_text() -> str:
    return (ROOT / "corpora/embedded/code.yaml").read_text().replace("../data/", str(ROOT / "corpora/data") + "/")


def _json(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def _truncated(path: Path, obj) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(obj, indent=1)
    path.write_text(text[: len(text) // 2])
    return path


def _summary(arm: str = "baseline", workload: str = "code", conc: int = 1, phase: str = "screen") -> dict:
    return {"keys": {"phase": phase, "arm": arm, "method": "baseline" if arm == "baseline" else "ngram", "rep": 1,
                     "workload": workload, "concurrency": conc},
            "validity": {"valid": True, "reasons": []}, "latency_ms": {"tpot": {"p50": 10.0}},
            "tokens": {"output_tokens_per_second": 100.0}}


def _select_cmd(d: Path, summaries: list[Path], lock: Path) -> list[str]:
    cfg = _write_yaml(d / "study.yaml", _small_config(d))
    return [*SPECSTUDY, "select", "--config", str(cfg), "--lock", str(lock), "--summaries", *map(str, summaries),
            "--screen-root", str(d), "--out", str(d / "selection.json")]


def _lock(d: Path) -> Path:
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.study.plan import prereg_lock

    p = d / "prereg-lock.json"
    p.write_text(json.dumps(prereg_lock(path=ROOT / "tests/data/preregistration-small.yaml")))
    return p


class _BadServer:
    """A local HTTP server answering every request with ``status`` and ``body``."""

    def __init__(self, status: int, body: bytes, ctype: str = "application/json"):
        outer = self

        class H(BaseHTTPRequestHandler):
            def _answer(self):
                n = int(self.headers.get("Content-Length") or 0)
                if n:
                    self.rfile.read(n)
                self.send_response(outer.status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(outer.body)))
                self.end_headers()
                self.wfile.write(outer.body)

            do_GET = do_POST = _answer

            def log_message(self, *a):
                pass

        self.status, self.body = status, body
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


_SERVERS: list[_BadServer] = []


@pytest.fixture(autouse=True)
def _close_bad_servers():
    """Every server a test started is shut down after it (none is left listening for the rest of the run)."""
    yield
    while _SERVERS:
        _SERVERS.pop().close()


def _server(status: int, body: bytes) -> str:
    s = _BadServer(status, body)
    _SERVERS.append(s)
    return s.url


def _prompts(d: Path) -> Path:
    p = d / "prompts.jsonl"
    p.write_text(json.dumps({"prompt_id": "p1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                             "stratum": "code"}) + "\n")
    return p


def _upstream_cell(d: Path, summary_text: str | None = None) -> Path:
    c = d / "up" / "results" / "ngram-k3" / "code" / "c8" / "repeat-01"
    c.mkdir(parents=True)
    (c / "summary.json").write_text(summary_text if summary_text is not None else "{}")
    (c / "metadata.json").write_text(json.dumps({"variant": "ngram-k3", "cell": "code/c8/repeat-01",
                                                 "workload_file_sha256": "0" * 64}))
    (c / "requests.jsonl").write_text(json.dumps({"request_index": 0}) + "\n")
    spec = ('vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {0}\n'
            'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="m"}} {0}\n'
            'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="m"}} {0}\n')
    (c / "metrics_before.prom").write_text(spec.format(0.0))  # the importer reads counters before the summary
    (c / "metrics_after.prom").write_text(spec.format(3.0))
    return c


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ the table

def _set(path: str, value):
    def mutate(cfg: dict, d: Path) -> None:
        node = cfg
        keys = path.split(".")
        for k in keys[:-1]:
            node = node[k]
        if value is _DELETE:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value(d) if callable(value) else value
    return mutate


_DELETE = object()


def _broken_yaml(d: Path) -> list[str]:
    p = d / "study.yaml"
    p.write_text("study:\n  name: x\n engine: [unclosed\n")
    return _plan_cmd(p, d)


def _sm_bad_configfile(w: Path) -> list[str]:
    (w / "bad.yaml").write_text("study:\n  name: x\n engine: [unclosed\n")
    return ["--configfile", str(w / "bad.yaml")]


def _sm_missing_spec(w: Path) -> list[str]:
    cfg = yaml.safe_load((w / "tests/data/study-small.yaml").read_text())
    cfg["corpora"]["workloads"]["code"] = "corpora/embedded/nope.yaml"
    _write_yaml(w / "bad.yaml", cfg)
    return ["--configfile", str(w / "bad.yaml")]


def _sm_broken_spec_yaml(w: Path) -> list[str]:
    (w / "corpora/embedded/code.yaml").write_text("name: bundled-code\nversion: [1\n")
    return ["--configfile", str(w / "tests/data/study-small.yaml")]


def _sm_spec_bad_field(w: Path) -> list[str]:
    p = w / "corpora/embedded/code.yaml"
    p.write_text(p.read_text().replace("format: task_jsonl", "format: task_jsonlx"))
    return ["--configfile", str(w / "tests/data/study-small.yaml")]


def _sm_spec_missing_name(w: Path) -> list[str]:
    p = w / "corpora/embedded/code.yaml"
    p.write_text(p.read_text().replace("name: bundled-code\n", ""))
    return ["--configfile", str(w / "tests/data/study-small.yaml")]


def _sm_prereg_edited(w: Path) -> list[str]:
    sys.path.insert(0, str(ROOT / "scripts"))
    from specstudy.study.plan import prereg_lock

    lock = prereg_lock(path=w / "config/preregistration.yaml")
    lock["preregistration"] = "config/preregistration.yaml"
    (w / "results/screen").mkdir(parents=True)
    (w / "results/screen/prereg-lock.json").write_text(json.dumps(lock))
    p = w / "config/preregistration.yaml"
    p.write_text(p.read_text().replace("concurrency: [1, 8]", "concurrency: [1, 16]"))
    return ["screen"]


def _corpus_rows_bad_json(d: Path) -> list[str]:
    rows = d / "tasks.jsonl"
    rows.write_text('{"task_id": "a", "prompt": "def f():"}\n{"task_id": "b", "prompt": \n')
    text = _good_spec_text()
    digest = hashlib.sha256(rows.read_bytes()).hexdigest()
    text = re.sub(r"path: .*tasks.jsonl\n  sha256: \w+", f"path: {rows}\n  sha256: {digest}", text)
    spec = _spec(d, text)
    return [*SPECSTUDY, "corpus", "build", "--spec", str(spec), "--out", str(d / "out"), "--tokenizer", "none"]


def _corpus_rows_sha(d: Path) -> list[str]:
    rows = d / "tasks.jsonl"
    rows.write_text('{"task_id": "a", "prompt": "def f():"}\n')
    text = _good_spec_text()
    text = re.sub(r"path: .*tasks.jsonl", f"path: {rows}", text)
    spec = _spec(d, text)
    return [*SPECSTUDY, "corpus", "build", "--spec", str(spec), "--out", str(d / "out"), "--tokenizer", "none"]


CASES: list[Case] = [
    # --- study config
    Case("config-malformed-yaml", _broken_yaml, ["study.yaml", "line"]),
    Case("config-missing-engine", cfg_case(_set("engine", _DELETE)), ["study.yaml", "engine"]),
    Case("config-concurrency-type", cfg_case(_set("screen", {"concurrency": "many"})), ["study.yaml", "concurrency"]),
    Case("config-no-baseline", cfg_case(lambda c, d: c["arms"].update(methods=["ngram"])),
         ["study.yaml", "arms.methods", "baseline"]),
    Case("config-ngram-min-gt-max", cfg_case(lambda c, d: c["arms"].update(
        methods=["baseline", "ngram"], num_speculative_tokens=[2], ngram={"prompt_lookup_min": 5, "prompt_lookup_max": 2})),
        ["study.yaml", "prompt_lookup_min"]),
    Case("config-capacity-workload", cfg_case(lambda c, d: c.update(capacity={"enabled": True, "workload": "nope"})),
         ["study.yaml", "capacity"]),
    Case("config-prereg-missing", cfg_case(_set("study.preregistration", lambda d: str(d / "nope.yaml"))),
         ["nope.yaml", "not found"]),
    Case("config-empty-file", lambda d: _plan_cmd(_spec(d, "", "study.yaml"), d), ["study.yaml", "mapping"]),
    # --- the same through Snakemake (parse time)
    # read by specstudy before Snakemake (profiles/default), so no longer Snakemake's 'not valid JSON or YAML'
    Case("sm-config-malformed-yaml", sm_case(_sm_bad_configfile), ["bad.yaml", "line", "not valid YAML"], snakemake=True),
    Case("check-config-malformed-yaml", lambda d: [*SPECSTUDY, "check-config", str(_spec(
        d, "study:\n  name: x\n engine: [unclosed\n", "bad.yaml"))], ["bad.yaml", "line 3"]),
    Case("check-config-broken-corpus-spec", lambda d: [*SPECSTUDY, "check-config", str(_write_yaml(
        d / "study.yaml", {**_small_config(d), "corpora": {"workloads": {
            "open_chat": str(ROOT / "corpora/embedded/open_chat.yaml"), "code": str(_spec(d, "name: [\n")),
            "summarization": str(ROOT / "corpora/embedded/summarization.yaml")},
            "smoke": str(ROOT / "corpora/embedded/smoke.yaml")}}))],
         ["spec.yaml", "line"]),
    Case("sm-corpus-spec-missing", sm_case(_sm_missing_spec), ["nope.yaml", "corpora.workloads.code"], snakemake=True),
    Case("sm-corpus-spec-broken-yaml", sm_case(_sm_broken_spec_yaml), ["code.yaml", "line"], snakemake=True),
    Case("sm-corpus-spec-bad-format", sm_case(_sm_spec_bad_field), ["code.yaml", "format"], snakemake=True),
    Case("sm-corpus-spec-no-name", sm_case(_sm_spec_missing_name), ["code.yaml", "name"], snakemake=True),
    Case("sm-prereg-edited-after-lock", sm_case(_sm_prereg_edited),
         ["preregistration.yaml", "confirmation.concurrency", "prereg-lock.json"], snakemake=True),
    # --- pre-registration
    Case("prereg-malformed-yaml", prereg_case(lambda p: "version: 1\nselection: [\n"), ["prereg.yaml", "line"]),
    Case("prereg-missing-confirmation", prereg_case(lambda p: p.pop("confirmation")), ["prereg.yaml", "confirmation"]),
    Case("prereg-concurrency-type", prereg_case(lambda p: p["confirmation"].update(concurrency="1,4")),
         ["prereg.yaml", "concurrency"]),
    Case("prereg-lock-edited", lambda d: [*SPECSTUDY, "prereg-lock", "--prereg", str(_spec(d, (
        ROOT / "config/preregistration.yaml").read_text().replace("[1, 8]", "[1, 16]"), "preregistration.yaml")),
        "--out", str(_lock(d))], ["prereg-lock.json", "preregistration.yaml", "restore"]),
    # --- corpus specs and rows
    Case("corpus-spec-missing", lambda d: [*SPECSTUDY, "corpus", "build", "--spec", str(d / "nope.yaml"), "--out",
                                           str(d / "out")], ["nope.yaml"]),
    Case("corpus-spec-malformed", lambda d: [*SPECSTUDY, "corpus", "build", "--spec", str(_spec(d, "name: [\n")),
                                             "--out", str(d / "out")], ["spec.yaml", "line"]),
    Case("corpus-spec-bad-format", lambda d: [*SPECSTUDY, "corpus", "build", "--spec", str(_spec(
        d, _good_spec_text().replace("format: task_jsonl", "format: nope"))), "--out", str(d / "out")],
        ["spec.yaml", "format"]),
    Case("corpus-rows-bad-json", _corpus_rows_bad_json, ["tasks.jsonl", "line 2"]),
    Case("corpus-rows-sha-mismatch", _corpus_rows_sha, ["tasks.jsonl", "sha256"]),
    Case("corpus-check-missing", lambda d: [*SPECSTUDY, "corpus", "check", "--corpus", str(d / "nope"), "--digest", "x"],
         ["nope"]),
    # --- CLI arguments and result files
    Case("deploy-command-missing-engine", lambda d: [*SPECSTUDY, "deploy-command", "--engine", str(d / "nope.yaml"),
                                                     "--arm", '{"method":"baseline"}'], ["nope.yaml"]),
    Case("deploy-command-arm-not-json", lambda d: [*SPECSTUDY, "deploy-command", "--engine",
                                                   str(ROOT / "config/config.yaml"), "--arm", "ngram-k3"], ["--arm", "json"]),
    Case("deploy-command-arm-bad-method", lambda d: [*SPECSTUDY, "deploy-command", "--engine",
                                                     str(ROOT / "config/config.yaml"), "--arm", '{"method":"magic"}'],
         ["method", "magic"]),
    Case("telemetry-summary-not-json", lambda d: [*SPECSTUDY, "telemetry-summary", str(_spec(d, "not json\n", "t.jsonl"))],
         ["t.jsonl", "line 1"]),
    Case("telemetry-summary-missing", lambda d: [*SPECSTUDY, "telemetry-summary", str(d / "nope.jsonl")], ["nope.jsonl"]),
    Case("tables-results-missing", lambda d: [*SPECSTUDY, "tables", "--results", str(d / "nonexistent"), "--out",
                                              str(d / "t")], ["nonexistent"]),
    Case("select-truncated-summary", lambda d: _select_cmd(d, [_truncated(d / "screen/s.json", _summary())], _lock(d)),
         ["s.json", "truncated"]),
    Case("select-missing-lock", lambda d: _select_cmd(d, [_truncated(d / "screen/s.json", _summary())], d / "nolock.json"),
         ["nolock.json"]),
    Case("final-candidate-truncated-selection", lambda d: [
        *SPECSTUDY, "final-candidate", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))),
        "--summaries", str(_json(d / "s.json", _summary(phase="confirm"))),
        "--selection", str(_truncated(d / "selection.json", {"confirmation_arms": ["baseline", "ngram-k3"]})),
        "--out", str(d / "fc.json")], ["selection.json"]),
    Case("plan-truncated-selection", lambda d: [
        *SPECSTUDY, "plan", "--config", str(_write_yaml(d / "study.yaml", _small_config(d))), "--phase", "confirm",
        "--selection", str(_truncated(d / "selection.json", {"confirmation_arms": ["baseline"]})),
        "--out", str(d / "p.json")], ["selection.json"]),
    Case("gate-compare-not-json", lambda d: [*SPECSTUDY, "gate", "compare", str(_spec(d, "{", "a.json")),
                                             str(_spec(d, "{}", "b.json")), "--out", str(d / "c.json")], ["a.json"]),
    Case("capacity-compare-missing", lambda d: [*SPECSTUDY, "capacity", "compare", str(d / "knee-a.json"),
                                                str(d / "knee-b.json")], ["knee-a.json"]),
    Case("gate-judge-bad-margins", lambda d: [*SPECSTUDY, "gate", "judge", "--baseline", str(_spec(d, "{}", "b.json")),
                                              "--candidate", str(_spec(d, "{}", "c.json")), "--margins", "{oops",
                                              "--out", str(d / "g.json")], ["--margins"]),
    # --- upstream files
    Case("upstream-summary-not-json", lambda d: [*SPECSTUDY, "import-upstream",
                                                 str(_upstream_cell(d, "not json")), str(d / "out")], ["summary.json"]),
    Case("upstream-source-missing", lambda d: [*SPECSTUDY, "import-upstream", str(d / "nope"), str(d / "out")], ["nope"]),
    Case("upstream-no-cells", lambda d: [*SPECSTUDY, "import-upstream", str(d), str(d / "out")], ["no upstream cell"]),
    # --- server answers
    Case("loadgen-no-server", lambda d: [*SPECSTUDY, "loadgen", "--base-url", f"http://127.0.0.1:{_free_port()}",
                                         "--model", "m", "--prompts", str(_prompts(d)), "--concurrency", "1",
                                         "--out", str(d / "lg")], ["127.0.0.1", "connect"]),
    Case("gate-capture-server-garbage", lambda d: [*SPECSTUDY, "gate", "capture", "--base-url",
                                                   _server(200, b"<html>not json</html>"), "--model", "m",
                                                   "--prompts", str(_prompts(d)), "--out", str(d / "cap.json"),
                                                   "--deployment-id", "x", "--arm", "baseline"], ["127.0.0.1", "succeeded", "[DONE]"]),
    Case("gate-capture-server-500", lambda d: [*SPECSTUDY, "gate", "capture", "--base-url",
                                               _server(500, b'{"error": "boom"}'), "--model", "m",
                                               "--prompts", str(_prompts(d)), "--out", str(d / "cap.json"),
                                               "--deployment-id", "x", "--arm", "baseline"], ["500", "boom"]),
]


def run_case(case: Case, d: Path) -> tuple[str, int, str]:
    cmd = case.setup(d)
    proc = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=240, env=_env())
    out = proc.stdout + proc.stderr
    return classify(proc.returncode, out, case.expect), proc.returncode, out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gives_a_clear_error(case: Case, tmp_path: Path):
    verdict, rc, out = run_case(case, tmp_path)
    want = "weak" if case.known_weak else "clear"
    assert verdict == want, f"{case.id}: {verdict} (rc {rc}); expected {case.expect} in:\n{out[-3000:]}"


def test_table_is_large_enough():
    assert len(CASES) >= 30


if __name__ == "__main__":
    import tempfile

    counts: dict[str, int] = {}
    only = sys.argv[1:]
    for case in CASES:
        if only and case.id not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:
                verdict, rc, out = run_case(case, Path(tmp))
            except Exception as exc:  # the harness itself failed: show it
                verdict, rc, out = "harness-error", -1, repr(exc)
        counts[verdict] = counts.get(verdict, 0) + 1
        last = [line for line in out.strip().splitlines() if line.strip()][-1:] or [""]
        print(f"{verdict:<10} rc={rc:<4} {case.id:<40} {last[0][:150]}", flush=True)
    print(json.dumps(counts, sort_keys=True))
