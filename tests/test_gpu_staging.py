"""envs/gpu/stage.py and envs/gpu/install_offline.py on small synthetic wheels: no network, no GPU."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "envs" / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


stage = _load("stage")
inst = _load("install_offline")

REQUIRES = {"python": "3.12", "cuda_major": 13}
VERSIONS = ("0.23.0", "0.26.0")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_wheel(folder: Path, name: str, version: str, payload: dict[str, bytes]) -> Path:
    """A minimal valid py3-none-any wheel (pip installs it)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        **payload,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nRequires-Dist: torch==2.11.0\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for n, data in files.items():
            z.writestr(n, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def engine_wheel(folder: Path, version: str, dep1: str) -> Path:
    """A fake engine build: importing it needs dep0 and dep1 of exactly `dep1`'s version (its own site's)."""
    init = f"import dep0, dep1\nassert dep1.V == {dep1!r}, dep1.V\nX = {version!r}\n".encode()
    return make_wheel(folder, "demoengine", version, {"demoengine/__init__.py": init,
                                                      "demoengine/kernels.py": b"K = 1\n",
                                                      "demoengine/blob.bin": os.urandom(15000)})


def build_stage(tmp: Path, limit: int = 12000, reserve: int = 6000, versions=VERSIONS) -> tuple[Path, dict]:
    """A stage like `make gpu-stage` makes: one engine wheel per build, split over parts; dep0 pinned by both
    engine lists (staged once), dep1 1.0 for 0.23.0 and 2.0 for 0.26.0, and the harness' snakemake."""
    src = tmp / "src"
    src.mkdir()
    dep0 = make_wheel(src, "dep0", "1.0", {"dep0/__init__.py": b"N = 0\n"})
    dep1 = {v: make_wheel(src, "dep1", d, {"dep1/__init__.py": f"V = {d!r}\n".encode()})
            for v, d in zip(VERSIONS, ("1.0", "2.0"), strict=True)}
    harness = make_wheel(src, "snakemake", "9.0", {"snakemake/__init__.py": b"S = 9\n"})
    builds, splits = [], []
    for v in versions:
        engine = engine_wheel(src, v, {"0.23.0": "1.0", "0.26.0": "2.0"}[v])
        builds.append({"version": v, "list": f"engine-{v}", "imports": ["demoengine", "demoengine.kernels"],
                       "requires": {"torch": "2.11.0"}, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                       "slim_wheel": {"path": engine, "filename": engine.name, "requirement": f"demoengine=={v}",
                                      "sha256": sha(engine), "size": engine.stat().st_size,
                                      "source_sha256": "0" * 64, "removed": []}})
        splits.append((engine, f"demoengine-{v}-slim.whl.part"))
    entries = [(dep0, [f"engine-{v}" for v in versions])] + [(dep1[v], [f"engine-{v}"]) for v in versions] + \
        [(harness, ["harness"])]
    wl = [{"filename": w.name, "requirement": "==".join(w.name.split("-")[:2]), "sha256": sha(w),
           "size": w.stat().st_size, "lists": lists} for w, lists in entries]
    pieces = stage.plan_parts(splits, [w for w, _ in entries], limit=limit, reserve=reserve)
    manifest = stage.build_manifest(pieces, builds, wl, {"requires": REQUIRES, "default_build": versions[0]},
                                    limit=limit)
    out = tmp / "repo" / ".stage"
    assert stage.write_stage(out, pieces, manifest) is True
    return out, manifest


def fake_python(tmp: Path, py: str = "3.12.3", torch: str | None = "2.11.0+cu130", cuda: str | None = "13.0",
                setuptools: str | None = "80.0") -> str:
    """An interpreter that answers the install's version probe as given and runs anything else for real."""
    probe = {"python": py, "torch": torch, "cuda": cuda, "setuptools": setuptools}
    path = tmp / f"python-{py}-{torch}-{cuda}-{setuptools}"
    path.write_text("#!/bin/bash\n"
                    'if [ "$1" = "-c" ] && [[ "$2" == *SPECSTUDY-PROBE* ]]; then\n'
                    f"  echo 'SPECSTUDY-PROBE {json.dumps(probe)}'; exit 0\nfi\n"
                    f'exec "{sys.executable}" "$@"\n')
    path.chmod(0o755)
    return str(path)


# --------------------------------------------------------------------------------------------- stage.py


def test_parse_pins_reads_hashes_and_rejects_unhashed_lines(tmp_path):
    good = tmp_path / "l.txt"
    good.write_text("# comment\n\nFoo_Bar==1.2 --hash=sha256:" + "a" * 64 + "\n")
    assert stage.parse_pins(good, "engine") == [stage.Pin("foo-bar", "1.2", "a" * 64, "engine")]
    bad = tmp_path / "b.txt"
    bad.write_text("foo>=1.2\n")
    with pytest.raises(stage.StageError, match=r"b\.txt:1: expected 'name==version --hash=sha256"):
        stage.parse_pins(bad, "engine")


def test_real_lists_are_pinned_and_consistent():
    available = stage.engine_lists()
    assert list(available)[:2] == ["0.23.0", "0.26.0"] and stage.parse_builds(None, available) == list(available)
    lists = {f"engine-{v}": f for v, f in available.items()} | {k: ROOT / "envs" / "gpu" / f"{k}.txt"
                                                               for k in ("harness", "build")}
    pins = {k: stage.parse_pins(f, k) for k, f in lists.items()}
    stage.check_lists(pins, lists)  # own vllm per engine list; harness/build disjoint from the rest; one hash a pin
    for v in available:
        assert v in stage.SLIM_REMOVE, f"no SLIM_REMOVE entry for {v}"
    assert "pydantic" in stage.engine_provided(lists["harness"])
    seen = {p.name: k for k in ("harness", "build") for p in pins[k]}
    assert seen["snakemake"] == "harness"
    pyproject = (ROOT / "pyproject.toml").read_text()
    snakemake = next(p for p in stage.parse_pins(ROOT / "envs/gpu/harness.txt", "harness") if p.name == "snakemake")
    assert f'"snakemake=={snakemake.version}"' in pyproject


def test_parts_respect_the_limit_and_reassemble_to_the_original(tmp_path):
    out, manifest = build_stage(tmp_path)
    names = [p["name"] for p in manifest["parts"]]
    assert len(names) >= 3 and names == [f"p{i}" for i in range(1, len(names) + 1)]
    for p in manifest["parts"]:
        size = sum(f.stat().st_size for f in (out / p["name"]).iterdir())
        assert size <= 12000 and p["size"] <= 6000
        assert json.loads((out / p["name"] / "manifest.json").read_text()) == manifest
        assert p["sha256"] == stage.part_digest(p["files"])
    for b in manifest["builds"]:
        engine = tmp_path / "src" / b["slim_wheel"]["filename"]
        chunks = b"".join((out / c["part"] / c["file"]).read_bytes() for c in b["slim_wheel"]["chunks"])
        assert len(b["slim_wheel"]["chunks"]) >= 2 and chunks == engine.read_bytes()
    assert [w["part"] for w in manifest["wheels"]] == sorted(w["part"] for w in manifest["wheels"])
    # dep0, pinned by both engine lists, is one file in one part
    staged = [f["file"] for p in manifest["parts"] for f in p["files"]]
    assert staged.count("dep0-1.0-py3-none-any.whl") == 1


def test_write_stage_is_idempotent_and_repairs_a_damaged_part(tmp_path):
    out, manifest = build_stage(tmp_path)
    src = tmp_path / "src"
    splits = [(src / b["slim_wheel"]["filename"], f"demoengine-{b['version']}-slim.whl.part") for b in manifest["builds"]]
    wheels = [src / w["filename"] for w in manifest["wheels"]]
    pieces = stage.plan_parts(splits, wheels, limit=12000, reserve=6000)
    before = {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()}
    assert stage.write_stage(out, pieces, manifest) is False
    assert {f: f.stat().st_mtime_ns for f in out.rglob("*") if f.is_file()} == before
    victim = out / "p1" / manifest["parts"][0]["files"][0]["file"]
    victim.write_bytes(b"garbage")
    (out / "p9").mkdir()  # a part of an earlier, larger stage
    assert stage.write_stage(out, pieces, manifest) is True
    assert not (out / "p9").exists()
    assert all(not stage.verify_part_dir(out / p["name"], manifest, p["name"]) for p in manifest["parts"])


def test_a_wheel_larger_than_a_part_is_refused(tmp_path):
    big = tmp_path / "big-1.0-py3-none-any.whl"
    big.write_bytes(b"x" * 7000)
    with pytest.raises(stage.StageError, match="big-1.0-py3-none-any.whl .* larger than a part"):
        stage.plan_parts([], [big], limit=12000, reserve=6000)


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs zip")
def test_slim_wheel_drops_members_and_their_record_lines(tmp_path):
    w = make_wheel(tmp_path, "vllm", "0.23.0", {"vllm/__init__.py": b"", "vllm/_moe_C.abi3.so": b"m" * 100,
                                               "vllm/vllm-rs": b"r", "vllm/_C.abi3.so": b"c"})
    dest = tmp_path / "slim" / w.name
    dest.parent.mkdir()
    remove = ("vllm/_moe_C.abi3.so", "vllm/vllm-rs")
    gone = stage.slim_wheel(w, dest, remove)
    assert sorted(gone) == ["vllm/_moe_C.abi3.so", "vllm/vllm-rs"]
    with zipfile.ZipFile(dest) as z:
        assert set(z.namelist()) >= {"vllm/__init__.py", "vllm/_C.abi3.so"}
        assert not set(gone) & set(z.namelist())
        record = z.read("vllm-0.23.0.dist-info/RECORD").decode()
    assert "_moe_C" not in record and "vllm-rs" not in record and "vllm/_C.abi3.so" in record
    assert stage.wheel_requires(dest, "torch") == "2.11.0"
    first = sha(dest)
    stage.slim_wheel(w, dest, remove)
    assert sha(dest) == first  # deterministic: the recorded sha256 is reproducible
    assert stage.kernel_module(dest) == "vllm._C"


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs zip")
def test_slim_of_0_26_0_drops_its_own_members_and_refuses_a_list_that_names_an_absent_one(tmp_path):
    """0.26.0's kernels are the stable-ABI _C_stable_libtorch / _moe_C_stable_libtorch (no _C, no _moe_C):
    its own SLIM_REMOVE entry applies, and 0.23.0's names one member it lacks."""
    members = ["vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
               "vllm/_C_stable_libtorch.abi3.so", "vllm/_moe_C_stable_libtorch.abi3.so", "vllm/vllm-rs"] + \
        [f"vllm/third_party/deep_gemm/_C.cpython-3{v}-x86_64-linux-gnu.so" for v in (10, 11, 12, 13, 14)]
    w = make_wheel(tmp_path, "vllm", "0.26.0", {"vllm/__init__.py": b"", **{m: b"k" * 50 for m in members}})
    dest = tmp_path / "slim.whl"
    gone = stage.slim_wheel(w, dest, stage.slim_remove_for("0.26.0"))
    with zipfile.ZipFile(dest) as z:
        left = set(z.namelist())
    assert set(gone) == set(stage.SLIM_REMOVE["0.26.0"])
    assert {"vllm/_C_stable_libtorch.abi3.so", "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",
            "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so"} <= left
    assert stage.kernel_module(dest) == "vllm._C_stable_libtorch"
    with pytest.raises(stage.StageError, match=r"no member matches \['vllm/_moe_C.abi3.so'\].*SLIM_REMOVE"):
        stage.slim_wheel(w, tmp_path / "other.whl", stage.slim_remove_for("0.23.0"))
    with pytest.raises(stage.StageError, match="no SLIM_REMOVE entry for vLLM 9.9.9"):
        stage.slim_remove_for("9.9.9")


def test_ensure_ignored_adds_the_stage_once(tmp_path):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    stage.ensure_ignored(tmp_path)
    stage.ensure_ignored(tmp_path)
    assert (tmp_path / ".git" / "info" / "exclude").read_text().count("/.stage/") == 1
    assert subprocess.run(["git", "-C", str(tmp_path), "check-ignore", "-q", ".stage/p1/a"]).returncode == 0


# --------------------------------------------------------------------------------------- install_offline.py


def carry(out: Path, tree: Path, name: str) -> Path:
    """What a device call carrying `.stage/<name>` finds: a tree with only that part."""
    dest = tree / ".stage" / name
    if dest.parent.exists():
        shutil.rmtree(dest.parent)
    shutil.copytree(out / name, dest)
    return tree / ".stage"


def test_hold_moves_a_verified_part_and_is_idempotent(tmp_path, capsys):
    out, manifest = build_stage(tmp_path)
    holding = tmp_path / "hold"
    tree_stage = carry(out, tmp_path / "call1", "p1")
    assert inst.hold(tree_stage, holding) == ["p1"]
    assert not (tree_stage / "p1").exists()
    assert not inst.verify_part(holding / "p1", manifest)
    stamp = {f: f.stat().st_mtime_ns for f in (holding / "p1").iterdir()}
    tree_stage = carry(out, tmp_path / "call2", "p1")  # the same part carried again
    assert inst.hold(tree_stage, holding) == ["p1"]
    assert "already held" in capsys.readouterr().out
    assert {f: f.stat().st_mtime_ns for f in (holding / "p1").iterdir()} == stamp


def test_hold_refuses_a_damaged_part_naming_the_file(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage = carry(out, tmp_path / "call", "p1")
    victim = tree_stage / "p1" / manifest["parts"][0]["files"][0]["file"]
    victim.write_bytes(b"truncated")
    with pytest.raises(inst.InstallError) as e:
        inst.hold(tree_stage, tmp_path / "hold")
    assert str(victim) in str(e.value) and "make gpu-stage" in str(e.value)
    assert not (tmp_path / "hold" / "p1").exists()


def hold_all_but_last(out: Path, manifest: dict, tmp: Path) -> tuple[Path, Path]:
    holding = tmp / "hold"
    names = [p["name"] for p in manifest["parts"]]
    for n in names[:-1]:
        inst.hold(carry(out, tmp / f"call-{n}", n), holding)
    return carry(out, tmp / "last", names[-1]), holding


def in_env(*sources: Path, code: str) -> subprocess.CompletedProcess:
    """Run python -c code in bash after `source`-ing each env.sh, as a lease shell does."""
    script = "".join(f"source {f} && " for f in sources) + f'"{sys.executable}" -c "{code}"'
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)


def test_install_puts_the_harness_and_each_build_in_its_own_site_and_writes_the_envs(tmp_path, capsys):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    site, engines = tmp_path / "site", tmp_path / "engines"
    env_file = inst.install(tree_stage, holding, site, fake_python(tmp_path), project=None, engines=engines)
    log = capsys.readouterr().out
    # the import checks ran: each build alone (as a server naming it sees it), then the harness with the default
    assert "import check (vLLM 0.23.0 alone): demoengine 0.23.0" in log
    assert "import check (vLLM 0.26.0 alone): demoengine 0.26.0" in log
    assert "import check (harness + vLLM 0.23.0): snakemake 9.0" in log
    assert (site / "snakemake" / "__init__.py").is_file()
    assert not any((site / pkg).exists() for pkg in ("demoengine", "dep0", "dep1"))  # no engine in the harness site
    for v, dep1 in zip(VERSIONS, ("1.0", "2.0"), strict=True):
        b = engines / f"vllm-{v}"
        assert (b / "demoengine" / "blob.bin").stat().st_size == 15000 and (b / "dep0" / "__init__.py").is_file()
        assert f"V = {dep1!r}" in (b / "dep1" / "__init__.py").read_text() and not (b / "snakemake").exists()
        text = (b / "env.sh").read_text()
        assert f'export PYTHONPATH="{b}${{PYTHONPATH:+:$PYTHONPATH}}"' in text
        assert "export VLLM_USE_FLASHINFER_SAMPLER=0" in text
    text = env_file.read_text()
    assert f'export PYTHONPATH="{site}:{engines}/vllm-0.23.0$' in text
    assert f'export PATH="{site}/bin:{engines}/vllm-0.23.0/bin:$PATH"' in text
    assert "export VLLM_USE_FLASHINFER_SAMPLER=0" in text
    code = "import demoengine, dep1, snakemake; print(demoengine.X, dep1.V, snakemake.S)"
    # the lease shell: harness + the default build
    assert in_env(env_file, code=code).stdout.split() == ["0.23.0", "1.0", "9"]
    # a build's env.sh after it: that build first, its own dep1, the harness still there
    r = in_env(env_file, engines / "vllm-0.26.0" / "env.sh", code=code)
    assert r.stdout.split() == ["0.26.0", "2.0", "9"], r.stderr
    assert not Path(str(site) + ".wheels").exists() and not Path(str(site) + ".new").exists()
    assert not list(engines.glob("*.new"))


def test_install_import_check_fails_for_a_build_whose_site_lacks_a_dependency(tmp_path):
    out, manifest = build_stage(tmp_path)
    for folder in out.glob("p*"):  # stage 0.26.0 without its dep1 2.0 (a pin missing from its engine list)
        m = json.loads((folder / "manifest.json").read_text())
        for w in m["wheels"]:
            if w["filename"] == "dep1-2.0-py3-none-any.whl":
                w["lists"] = []
        (folder / "manifest.json").write_text(json.dumps(m))
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", fake_python(tmp_path), None, engines=tmp_path / "engines")
    msg = str(e.value)
    assert "importing demoengine, demoengine.kernels" in msg and f"PYTHONPATH={tmp_path / 'engines' / 'vllm-0.26.0'}" in msg
    assert "No module named 'dep1'" in msg


def test_install_with_one_build_staged_serves_the_harness_with_it(tmp_path):
    out, manifest = build_stage(tmp_path, versions=("0.26.0",))
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    site, engines = tmp_path / "site", tmp_path / "engines"
    env_file = inst.install(tree_stage, holding, site, fake_python(tmp_path), None, engines=engines)
    assert [d.name for d in engines.iterdir()] == ["vllm-0.26.0"]
    assert in_env(env_file, code="import demoengine; print(demoengine.X)").stdout.strip() == "0.26.0"


def test_install_names_a_missing_part_and_how_to_hold_it(tmp_path):
    out, manifest = build_stage(tmp_path)
    last = manifest["parts"][-1]["name"]
    tree_stage = carry(out, tmp_path / "last", last)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, tmp_path / "hold", tmp_path / "site", fake_python(tmp_path), None, False, tmp_path / "engines")
    msg = str(e.value)
    assert "part p1 is missing" in msg and ".stage/p1" in msg and "install_offline.sh hold" in msg
    assert not (tmp_path / "site").exists()


def test_install_names_a_part_file_with_a_wrong_hash(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    victim = holding / "p1" / manifest["parts"][0]["files"][0]["file"]
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", fake_python(tmp_path), None, False, tmp_path / "engines")
    assert f"{victim}: sha256" in str(e.value) and "make gpu-stage" in str(e.value)
    assert not (tmp_path / "site").exists()


def test_install_refuses_parts_of_another_staging(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    other = dict(manifest, made_by="an earlier run")
    (holding / "p1" / "manifest.json").write_text(json.dumps(other))
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", fake_python(tmp_path), None, False, tmp_path / "engines")
    assert f"{holding / 'p1' / 'manifest.json'}: from another" in str(e.value) and f"rm -rf {holding}" in str(e.value)


@pytest.mark.parametrize(
    ("py", "torch", "cuda", "expect"),
    [
        ("3.12.3", "2.10.0+cu130", "13.0", "has torch 2.10.0+cu130; demoengine-0.26.0-py3-none-any.whl (vLLM 0.26.0) pins torch==2.11.0"),
        ("3.12.3", "2.11.0+cu128", "12.8", "built for CUDA 12.8"),
        ("3.11.7", "2.11.0+cu130", "13.0", "is Python 3.11.7; the staged wheels are for Python 3.12"),
        ("3.12.3", None, None, "cannot import torch"),
    ],
)
def test_install_refuses_a_mismatched_python_or_torch_before_installing(tmp_path, py, torch, cuda, expect):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    python = fake_python(tmp_path, py, torch, cuda)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", python, None, False, tmp_path / "engines")
    assert expect in str(e.value) and python in str(e.value) and "Fix:" in str(e.value)
    assert not (tmp_path / "site").exists() and not (tmp_path / "site.wheels").exists()
    assert not (tmp_path / "engines").exists()


def test_cli_exits_nonzero_with_the_message(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage = carry(out, tmp_path / "last", manifest["parts"][-1]["name"])
    r = subprocess.run([sys.executable, str(ROOT / "envs/gpu/install_offline.py"), "install", "--stage", str(tree_stage),
                        "--holding", str(tmp_path / "hold"), "--site", str(tmp_path / "site"), "--engines", str(tmp_path / "engines"), "--no-project"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "install_offline install: error:" in r.stderr and "part p1 is missing" in r.stderr


def test_install_of_the_project_needs_setuptools_and_says_so_before_installing(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    python = fake_python(tmp_path, setuptools=None)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", python, ROOT, False, tmp_path / "engines")
    assert f"{python} has no setuptools" in str(e.value) and "--no-project" in str(e.value)
    assert not (tmp_path / "site").exists()


def test_fetch_uses_cached_wheels_by_hash_without_pip(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    w = make_wheel(cache / "wheels", "dep0", "1.0", {"dep0/__init__.py": b""})
    req = tmp_path / "engine.txt"
    req.write_text(f"dep0==1.0 --hash=sha256:{sha(w)}\n")
    monkeypatch.setattr(stage, "_pip", lambda *a: pytest.fail(f"pip called: {a}"))
    pins = stage.parse_pins(req, "engine")
    assert stage.fetch_wheels(pins, req, cache) == {pins[0]: w}
    req.write_text(f"dep0==2.0 --hash=sha256:{sha(w)}\n")  # the hash of another version's wheel
    with pytest.raises(stage.StageError, match=r"dep0==2.0's hash is dep0-1.0-py3-none-any.whl"):
        stage.fetch_wheels(stage.parse_pins(req, "engine"), req, cache)


def test_env_puts_the_checkouts_package_before_the_installed_copy(tmp_path):
    """First H200 run: the installed copy of specstudy looked for config/schemas beside the site
    (/tmp/config/schemas) and every rule failed; env.sh must put the checkout's scripts/ first."""
    site = tmp_path / "site"
    lines = inst.env_lines(site, {"builds": [{"version": "0.23.0", "env": {}}], "default_build": "0.23.0"}, ROOT,
                           tmp_path / "engines" / "vllm-0.23.0")
    pythonpath = next(line for line in lines if line.startswith("export PYTHONPATH="))
    first, second = pythonpath.split('"')[1].split("$")[0].rstrip(":").split(":")[:2]
    assert first == str(ROOT.resolve() / "scripts") and second == str(site)
    # and that package finds the checkout's schemas
    code = "from specstudy.core import schemas; schemas.load_schema('corpus-spec'); print('ok')"
    r = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": first, "PATH": "/usr/bin:/bin"},
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.strip() == "ok", r.stderr


def _git_repo(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def test_check_carry_refuses_a_tree_that_leaves_no_room_for_a_part(tmp_path):
    repo = _git_repo(tmp_path / "repo")
    (repo / "big.bin").write_bytes(b"\0" * 3_000_000)  # untracked, not ignored: the device call sends it too
    (repo / ".gitignore").write_text("/ignored/\n")
    (repo / "ignored").mkdir()
    (repo / "ignored" / "huge.bin").write_bytes(b"\0" * 5_000_000)  # ignored: never sent
    assert stage.tree_bytes(repo) == 3_000_000 + len("/ignored/\n")
    assert stage.check_carry(repo, limit=1_000_000, reserve=1_000_000, carry=6_000_000) == stage.tree_bytes(repo)
    with pytest.raises(stage.StageError, match=r"working tree .* 3\.0 MB.*Fix: move large tracked files"):
        stage.check_carry(repo, limit=2_000_000, reserve=1_000_000, carry=6_000_000)


def test_this_checkout_leaves_room_for_a_part_and_a_resume_pack():
    """The device call that carries a part sends the whole tree with it: a tree grown by committed results
    packs made the first part of a lease too large (2026-12-03). Fails here before a lease is refused."""
    tree = stage.check_carry(ROOT)
    assert tree + stage.PART_LIMIT + stage.RESUME_RESERVE <= stage.CARRY_LIMIT


def test_cli_check_carry_prints_the_room(tmp_path, capsys):
    repo = _git_repo(tmp_path / "repo")
    (repo / "a.txt").write_text("x")
    assert stage.main(["--repo", str(repo), "--check-carry"]) == 0
    assert "working tree 0.0 MB; room for a 40 MB part" in capsys.readouterr().out


# ------------------------------------------------------------------------------------ stage() end to end


def fake_lists(tmp: Path) -> tuple[Path, Path]:
    """envs/gpu-like pin lists for two builds and a wheel cache that already holds every pinned wheel (no pip)."""
    lists, cache = tmp / "lists", tmp / "cache"
    (cache / "wheels").mkdir(parents=True)
    (cache / "built").mkdir()
    lists.mkdir()
    w = cache / "wheels"
    vllm = {v: make_wheel(w, "vllm", v, {"vllm/__init__.py": f"V = {v!r}\n".encode(), "vllm/_C.abi3.so": b"c",
                                         "vllm/vllm-rs": os.urandom(4000), "vllm/blob.bin": os.urandom(9000)})
            for v in VERSIONS}
    shared = make_wheel(w, "pydantic", "2.0", {"pydantic/__init__.py": b""})
    only = {v: make_wheel(w, "gguf" if v == "0.23.0" else "nvtx", "1.0", {"x/__init__.py": v.encode()}) for v in VERSIONS}
    harness = make_wheel(w, "snakemake", "9.0", {"snakemake/__init__.py": b""})
    make_wheel(cache / "built", "connpool", "0.1", {"connpool/__init__.py": b""})
    sdist_sha = "5" * 64
    (cache / "built" / "connpool-0.1.from-sdist-sha256").write_text(sdist_sha + "\n")

    def line(path: Path) -> str:
        name, version = path.name.split("-")[:2]
        return f"{name}=={version} --hash=sha256:{sha(path)}\n"

    for v in VERSIONS:
        (lists / f"engine-{v}.txt").write_text(f"# build {v}\n" + line(vllm[v]) + line(shared) + line(only[v]))
    (lists / "harness.txt").write_text("# engine-provided: pydantic\n" + line(harness))
    (lists / "build.txt").write_text(f"connpool==0.1 --hash=sha256:{sdist_sha}\n")
    return lists, cache


@pytest.fixture()
def fake_stage_env(tmp_path, monkeypatch):
    lists, cache = fake_lists(tmp_path)
    repo = _git_repo(tmp_path / "repo")
    monkeypatch.setattr(stage, "HERE", lists)
    monkeypatch.setattr(stage, "SLIM_REMOVE", {v: ("vllm/vllm-rs",) for v in VERSIONS})
    monkeypatch.setattr(stage, "PART_LIMIT", 20000)
    monkeypatch.setattr(stage, "MANIFEST_RESERVE", 8000)
    monkeypatch.setattr(stage, "_pip", lambda *a: pytest.fail(f"pip called: {a}"))
    return repo, cache


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs zip")
def test_stage_of_both_builds_shares_identical_wheels_and_slims_each(fake_stage_env, capsys):
    repo, cache = fake_stage_env
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 0
    log = capsys.readouterr().out
    manifest = json.loads((repo / ".stage" / "manifest.json").read_text())
    assert [b["version"] for b in manifest["builds"]] == list(VERSIONS) and manifest["default_build"] == "0.23.0"
    by_file = {w["filename"]: w["lists"] for w in manifest["wheels"]}
    assert by_file == {"pydantic-2.0-py3-none-any.whl": ["engine-0.23.0", "engine-0.26.0"],
                       "gguf-1.0-py3-none-any.whl": ["engine-0.23.0"], "nvtx-1.0-py3-none-any.whl": ["engine-0.26.0"],
                       "snakemake-9.0-py3-none-any.whl": ["harness"], "connpool-0.1-py3-none-any.whl": ["build"]}
    staged = [f["file"] for p in manifest["parts"] for f in p["files"]]
    assert staged.count("pydantic-2.0-py3-none-any.whl") == 1 and "1 used by more than one list, staged once" in log
    for b in manifest["builds"]:
        assert b["slim_wheel"]["removed"] == ["vllm/vllm-rs"] and b["imports"][:2] == ["vllm", "vllm._C"]
        assert b["requires"] == {"torch": "2.11.0"}
        whole = b"".join((repo / ".stage" / c["part"] / c["file"]).read_bytes() for c in b["slim_wheel"]["chunks"])
        assert hashlib.sha256(whole).hexdigest() == b["slim_wheel"]["sha256"]
        with zipfile.ZipFile(io.BytesIO(whole)) as z:
            assert "vllm/vllm-rs" not in z.namelist() and z.read("vllm/__init__.py") == f"V = {b['version']!r}\n".encode()
    for p in manifest["parts"]:
        assert not stage.verify_part_dir(repo / ".stage" / p["name"], manifest, p["name"])
        assert sum(f.stat().st_size for f in (repo / ".stage" / p["name"]).iterdir()) <= 20000
    assert re.search(r"\.stage/p1: .*vLLM 0\.23\.0 chunk 1", log)
    # a second run changes nothing; the slim wheels come out identical
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 0
    assert "already up to date" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs zip")
def test_stage_of_one_build_carries_only_its_wheels(fake_stage_env, capsys):
    repo, cache = fake_stage_env
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 0
    assert stage.main(["--repo", str(repo), "--cache", str(cache), "--builds", "0.26.0"]) == 0
    manifest = json.loads((repo / ".stage" / "manifest.json").read_text())
    assert [b["version"] for b in manifest["builds"]] == ["0.26.0"] and manifest["default_build"] == "0.26.0"
    files = {f["file"] for p in manifest["parts"] for f in p["files"]}
    assert "gguf-1.0-py3-none-any.whl" not in files and "nvtx-1.0-py3-none-any.whl" in files
    assert not any("0.23.0" in f for f in files)
    assert {d.name for d in (repo / ".stage").glob("p*")} == {p["name"] for p in manifest["parts"]}


def test_stage_refuses_an_unknown_build_and_inconsistent_lists(fake_stage_env, capsys):
    repo, cache = fake_stage_env
    assert stage.main(["--repo", str(repo), "--cache", str(cache), "--builds", "0.24.0"]) == 2
    err = capsys.readouterr().err
    assert "--builds 0.24.0: no pin list for 0.24.0; the builds are 0.23.0, 0.26.0" in err
    lists = stage.HERE
    text = (lists / "engine-0.26.0.txt").read_text()
    (lists / "engine-0.26.0.txt").write_text(text.replace("vllm==0.26.0", "vllm==0.25.0"))
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 2
    assert "engine-0.26.0.txt: must pin vllm==0.26.0 (its name says so), pins ['0.25.0']" in capsys.readouterr().err
    (lists / "engine-0.26.0.txt").write_text(re.sub(r"pydantic==2.0 --hash=sha256:\w+", "pydantic==2.0 --hash=sha256:"
                                                    + "f" * 64, text))  # same pin, another hash
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 2
    assert "pydantic==2.0 has sha256" in capsys.readouterr().err
    (lists / "engine-0.26.0.txt").write_text("\n".join(ln for ln in text.splitlines() if "pydantic" not in ln) + "\n")
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 2
    assert "engine-0.26.0.txt does not pin pydantic, which" in capsys.readouterr().err
    (lists / "engine-0.26.0.txt").write_text(text + (lists / "harness.txt").read_text().splitlines()[1] + "\n")
    assert stage.main(["--repo", str(repo), "--cache", str(cache)]) == 2
    err = capsys.readouterr().err
    assert "pinned in both" in err and "harness.txt and" in err and ": snakemake" in err
