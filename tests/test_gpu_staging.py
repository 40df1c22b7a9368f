"""envs/gpu/stage.py and envs/gpu/install_offline.py on small synthetic wheels: no network, no GPU."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
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

REQUIRES = {"python": "3.12", "torch": "2.11.0", "cuda_major": 13}


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


def build_stage(tmp: Path, limit: int = 12000, reserve: int = 6000) -> tuple[Path, dict]:
    """A stage like `make gpu-stage` makes, with an engine wheel split over parts and three small wheels."""
    src = tmp / "src"
    src.mkdir()
    engine = make_wheel(src, "demoengine", "0.23.0", {"demoengine/__init__.py": b"X = 1\n",
                                                      "demoengine/blob.bin": os.urandom(15000)})
    wheels = [make_wheel(src, f"dep{i}", "1.0", {f"dep{i}/__init__.py": f"N = {i}\n".encode()}) for i in range(3)]
    pieces = stage.plan_parts(engine, "engine.whl.part", wheels, limit=limit, reserve=reserve)
    slim = {"path": engine, "filename": engine.name, "requirement": "demoengine==0.23.0", "sha256": sha(engine),
            "size": engine.stat().st_size, "source_sha256": "0" * 64, "removed": []}
    wl = [{"filename": w.name, "requirement": f"{w.name.split('-')[0]}==1.0", "list": "engine", "sha256": sha(w),
           "size": w.stat().st_size} for w in wheels]
    manifest = stage.build_manifest(pieces, slim, wl, {"requires": REQUIRES, "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"}},
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


def test_real_lists_are_pinned_and_disjoint():
    seen = {}
    for kind in ("engine", "harness", "build"):
        for p in stage.parse_pins(ROOT / "envs" / "gpu" / f"{kind}.txt", kind):
            assert p.name not in seen, f"{p.name} in {kind}.txt and {seen[p.name]}.txt"
            seen[p.name] = kind
    assert seen["vllm"] == "engine" and seen["snakemake"] == "harness"
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
    engine = tmp_path / "src" / manifest["slim_wheel"]["filename"]
    chunks = b"".join((out / c["part"] / c["file"]).read_bytes() for c in manifest["slim_wheel"]["chunks"])
    assert len(manifest["slim_wheel"]["chunks"]) >= 2 and chunks == engine.read_bytes()
    assert [w["part"] for w in manifest["wheels"]] == sorted(w["part"] for w in manifest["wheels"])


def test_write_stage_is_idempotent_and_repairs_a_damaged_part(tmp_path):
    out, manifest = build_stage(tmp_path)
    src = tmp_path / "src"
    engine = src / manifest["slim_wheel"]["filename"]
    wheels = [src / w["filename"] for w in manifest["wheels"]]
    pieces = stage.plan_parts(engine, "engine.whl.part", wheels, limit=12000, reserve=6000)
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
        stage.plan_parts(None, "x", [big], limit=12000, reserve=6000)


@pytest.mark.skipif(shutil.which("zip") is None, reason="needs zip")
def test_slim_wheel_drops_members_and_their_record_lines(tmp_path):
    w = make_wheel(tmp_path, "vllm", "0.23.0", {"vllm/__init__.py": b"", "vllm/_moe_C.abi3.so": b"m" * 100,
                                               "vllm/vllm-rs": b"r", "vllm/_C.abi3.so": b"c"})
    dest = tmp_path / "slim" / w.name
    dest.parent.mkdir()
    gone = stage.slim_wheel(w, dest)
    assert sorted(gone) == ["vllm/_moe_C.abi3.so", "vllm/vllm-rs"]
    with zipfile.ZipFile(dest) as z:
        assert set(z.namelist()) >= {"vllm/__init__.py", "vllm/_C.abi3.so"}
        assert not set(gone) & set(z.namelist())
        record = z.read("vllm-0.23.0.dist-info/RECORD").decode()
    assert "_moe_C" not in record and "vllm-rs" not in record and "vllm/_C.abi3.so" in record
    assert stage.wheel_requires(dest, "torch") == "2.11.0"
    first = sha(dest)
    stage.slim_wheel(w, dest)
    assert sha(dest) == first  # deterministic: the recorded sha256 is reproducible


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


def test_install_puts_every_wheel_in_the_site_and_writes_the_env(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    site = tmp_path / "site"
    env_file = inst.install(tree_stage, holding, site, fake_python(tmp_path), project=None, import_check=False)
    for pkg in ("demoengine", "dep0", "dep1", "dep2"):
        assert (site / pkg / "__init__.py").is_file()
    assert (site / "demoengine" / "blob.bin").stat().st_size == 15000
    text = env_file.read_text()
    assert f'export PYTHONPATH="{site}' in text and f'export PATH="{site}/bin:$PATH"' in text
    assert "export VLLM_USE_FLASHINFER_SAMPLER=0" in text
    r = subprocess.run([sys.executable, "-c", "import demoengine, dep2; print(demoengine.X + dep2.N)"],
                       env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True, text=True)
    assert r.stdout.strip() == "3"
    assert not Path(str(site) + ".wheels").exists() and not Path(str(site) + ".new").exists()


def test_install_names_a_missing_part_and_how_to_hold_it(tmp_path):
    out, manifest = build_stage(tmp_path)
    last = manifest["parts"][-1]["name"]
    tree_stage = carry(out, tmp_path / "last", last)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, tmp_path / "hold", tmp_path / "site", fake_python(tmp_path), None, False)
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
        inst.install(tree_stage, holding, tmp_path / "site", fake_python(tmp_path), None, False)
    assert f"{victim}: sha256" in str(e.value) and "make gpu-stage" in str(e.value)
    assert not (tmp_path / "site").exists()


def test_install_refuses_parts_of_another_staging(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    other = dict(manifest, made_by="an earlier run")
    (holding / "p1" / "manifest.json").write_text(json.dumps(other))
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", fake_python(tmp_path), None, False)
    assert f"{holding / 'p1' / 'manifest.json'}: from another" in str(e.value) and f"rm -rf {holding}" in str(e.value)


@pytest.mark.parametrize(
    ("py", "torch", "cuda", "expect"),
    [
        ("3.12.3", "2.10.0+cu130", "13.0", "has torch 2.10.0+cu130; demoengine-0.23.0-py3-none-any.whl pins torch==2.11.0"),
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
        inst.install(tree_stage, holding, tmp_path / "site", python, None, False)
    assert expect in str(e.value) and python in str(e.value) and "Fix:" in str(e.value)
    assert not (tmp_path / "site").exists() and not (tmp_path / "site.wheels").exists()


def test_cli_exits_nonzero_with_the_message(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage = carry(out, tmp_path / "last", manifest["parts"][-1]["name"])
    r = subprocess.run([sys.executable, str(ROOT / "envs/gpu/install_offline.py"), "install", "--stage", str(tree_stage),
                        "--holding", str(tmp_path / "hold"), "--site", str(tmp_path / "site"), "--no-project"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "install_offline install: error:" in r.stderr and "part p1 is missing" in r.stderr


def test_install_of_the_project_needs_setuptools_and_says_so_before_installing(tmp_path):
    out, manifest = build_stage(tmp_path)
    tree_stage, holding = hold_all_but_last(out, manifest, tmp_path)
    python = fake_python(tmp_path, setuptools=None)
    with pytest.raises(inst.InstallError) as e:
        inst.install(tree_stage, holding, tmp_path / "site", python, ROOT, False)
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
    lines = inst.env_lines(site, {"env": {}}, ROOT)
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
    assert "working tree 0.0 MB; room for a 45 MB part" in capsys.readouterr().out
