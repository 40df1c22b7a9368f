#!/usr/bin/env python3
"""Install the harness and each staged vLLM build on the offline GPU machine from envs/gpu/stage.py's parts.

Each device call carries one part folder (.stage/pN). Every call but the last runs `hold`: the part is
verified against its manifest and moved to a holding folder outside the tree (default /tmp/specstudy-parts;
the machine keeps /tmp between calls only while it stays warm). The last call runs `install`: it collects
the parts (in the tree and held), verifies every file's sha256, checks Python and torch against what each
vLLM build needs, reassembles each slim vLLM wheel and checks its sha256, and only then installs, each with
`pip install --no-index --no-deps --target`: the harness wheels and this project into SITE (default
/tmp/specstudy-site), and each build (vllm + its engine wheels) into its own site ENGINES/vllm-<version>
(default /tmp/specstudy-engines). SITE/env.sh (`source` it) puts the checkout's scripts/, SITE and the default
build's site on PYTHONPATH; ENGINES/vllm-<version>/env.sh puts that build's site first. A study serves with a
build by `engine.server.env.PYTHONPATH: /tmp/specstudy-engines/vllm-<version>` (the server then sees that
build and the image only); a server without one inherits the default build from SITE/env.sh.

Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(REPO / "scripts"))
from specstudy.core.atomic import sha256_file  # noqa: E402  (stdlib only: usable before anything is installed)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 2  # what stage.py writes and this file reads (2: several vLLM builds)
DEFAULT_HOLD = Path("/tmp/specstudy-parts")
DEFAULT_SITE = Path("/tmp/specstudy-site")
DEFAULT_ENGINES = Path("/tmp/specstudy-engines")
PROBE = (
    "import json, sys\n"
    "out = {'python': '%d.%d.%d' % sys.version_info[:3], 'torch': None, 'cuda': None}\n"
    "try:\n"
    "    import torch\n"
    "    out['torch'] = torch.__version__\n"
    "    out['cuda'] = torch.version.cuda\n"
    "except Exception as e:\n"
    "    out['torch_error'] = repr(e)\n"
    "try:\n"
    "    import setuptools\n"
    "    out['setuptools'] = setuptools.__version__\n"
    "except Exception:\n"
    "    out['setuptools'] = None\n"
    "print('SPECSTUDY-PROBE ' + json.dumps(out))\n"
)
ENV_EXTRA = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
             "PYTHONUNBUFFERED": "1"}  # fmt: skip


class InstallError(Exception):
    pass


def load_manifest(folder: Path) -> dict:
    path = folder / MANIFEST
    if not path.is_file():
        raise InstallError(f"{path}: missing. Fix: carry the whole part folder made by `make gpu-stage` (envs/gpu/stage.py)")
    try:
        manifest = json.loads(path.read_text())
    except ValueError as e:
        raise InstallError(f"{path}: not JSON ({e}). Fix: run `make gpu-stage` again and carry the new part") from e
    if manifest.get("format") != MANIFEST_FORMAT:
        raise InstallError(f"{path}: manifest format {manifest.get('format')}, this installer reads format "
                           f"{MANIFEST_FORMAT}. Fix: run `make gpu-stage` with this checkout and carry the new parts")
    return manifest


def part_entry(manifest: dict, name: str, where: Path) -> dict:
    for p in manifest["parts"]:
        if p["name"] == name:
            return p
    raise InstallError(f"{where}: its manifest has no part {name!r}. Fix: carry part folders of one `make gpu-stage` run")


def verify_part(folder: Path, manifest: dict, name: str | None = None) -> list[str]:
    """Problems of one part folder (part `name`, default: the folder's name) against the manifest."""
    entry = part_entry(manifest, name or folder.name, folder)
    problems = []
    for f in entry["files"]:
        path = folder / f["file"]
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.stat().st_size != f["size"]:
            problems.append(f"{path}: {path.stat().st_size} bytes, the manifest says {f['size']}")
        elif sha256_file(path) != f["sha256"]:
            problems.append(f"{path}: sha256 {sha256_file(path)} differs from the manifest's {f['sha256']}")
    return problems


def part_folders(parent: Path) -> dict[str, Path]:
    if not parent.is_dir():
        return {}
    return {d.name: d for d in sorted(parent.iterdir()) if d.is_dir() and d.name.startswith("p") and d.name[1:].isdigit()}


def hold(stage: Path, holding: Path, log=print) -> list[str]:
    """Verify each part in stage/ and move it to holding/ (idempotent: a part already held and verified is
    kept). Returns the names of the parts now held from this call."""
    found = part_folders(stage)
    if not found:
        raise InstallError(f"{stage}: no part folder (p1, p2, ...). Fix: name one part in the device call's carry, "
                           f"e.g. carry=[\".stage/p1\"], after `make gpu-stage`")  # fmt: skip
    holding.mkdir(parents=True, exist_ok=True)
    done = []
    for name, folder in found.items():
        manifest = load_manifest(folder)
        problems = verify_part(folder, manifest)
        if problems:
            raise InstallError("; ".join(problems) + f". Fix: run `make gpu-stage` again and carry {folder.name} anew")
        dest = holding / name
        if dest.is_dir():
            try:
                same = load_manifest(dest) == manifest and not verify_part(dest, manifest)
            except InstallError:
                same = False
            if same:
                log(f"hold: {name} already held in {dest} and verified; nothing to do")
                done.append(name)
                continue
            shutil.rmtree(dest)
        tmp = holding / f".{name}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        shutil.copytree(folder, tmp)
        problems = verify_part(tmp, manifest, name)
        if problems:
            shutil.rmtree(tmp)
            raise InstallError("; ".join(problems) + f". Fix: check free space in {holding} and hold {name} again")
        tmp.rename(dest)
        shutil.rmtree(folder)
        size = sum(f["size"] for f in part_entry(manifest, name, folder)["files"])
        log(f"hold: {name} verified and held in {dest} ({size / 1e6:.1f} MB); parts held: "
            f"{', '.join(sorted(part_folders(holding), key=lambda n: int(n[1:])))}")
        done.append(name)
    return done


def collect(stage: Path, holding: Path) -> tuple[dict, dict[str, Path]]:
    """The manifest and the folder of each of its parts (the tree's copy first, else the held one), all
    verified. Raises with every problem found, each naming the file or part and the fix."""
    in_tree, held = part_folders(stage), part_folders(holding)
    if not in_tree and not held:
        raise InstallError(f"no staged parts in {stage} nor in {holding}. Fix: `make gpu-stage` here, then one device "
                           f"call per part: `envs/gpu/install_offline.sh hold` carrying .stage/pN, the last one "
                           f"`install` carrying the last part")  # fmt: skip
    ref_folder = next(iter(in_tree.values())) if in_tree else next(iter(held.values()))
    manifest = load_manifest(ref_folder)
    chosen, problems = {}, []
    for p in manifest["parts"]:
        name = p["name"]
        folder = in_tree.get(name) or held.get(name)
        if folder is None:
            problems.append(f"part {name} is missing: neither {stage / name} nor {holding / name} exists. Fix: run a "
                            f"device call carrying .stage/{name} with `envs/gpu/install_offline.sh hold` first, in the "
                            f"same warm machine session (/tmp is lost when the machine is given back)")  # fmt: skip
            continue
        other = load_manifest(folder)
        if other != manifest:
            problems.append(f"{folder / MANIFEST}: from another `make gpu-stage` run than {ref_folder / MANIFEST}. "
                            f"Fix: `rm -rf {holding}` and hold every part of the current stage again")  # fmt: skip
            continue
        bad = verify_part(folder, manifest)
        if bad:
            problems.extend(b + f". Fix: run `make gpu-stage` again and carry/hold {name} anew" for b in bad)
        chosen[name] = folder
    if problems:
        raise InstallError("\n  ".join(["the staged parts do not verify:", *problems]))
    return manifest, chosen


def probe_python(python: str) -> dict:
    try:
        r = subprocess.run([python, "-c", PROBE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=600)  # fmt: skip
    except OSError as e:
        raise InstallError(f"{python}: cannot run ({e}). Fix: pass --python PATH to the image's python3") from e
    for line in r.stdout.splitlines():
        if line.startswith("SPECSTUDY-PROBE "):
            return json.loads(line[len("SPECSTUDY-PROBE "):])
    raise InstallError(f"{python}: the version probe printed nothing usable (exit {r.returncode}):\n{r.stdout[-2000:]}")


def check_python(python: str, manifest: dict, project: Path | None = None) -> dict:
    need = manifest["requires"]
    info = probe_python(python)
    problems = []
    if project is not None and not info.get("setuptools"):
        problems.append(f"{python} has no setuptools, which builds {project} (pyproject.toml). Fix: use the image's "
                        f"python3, or pass --no-project and put {project / 'scripts'} on PYTHONPATH")
    if ".".join(info["python"].split(".")[:2]) != need["python"]:
        problems.append(f"{python} is Python {info['python']}; the staged wheels are for Python {need['python']}. "
                        f"Fix: run with --python pointing at a Python {need['python']} (on the GPU image: python3)")
    for b in manifest["builds"]:
        torch, slim = b["requires"]["torch"], b["slim_wheel"]
        if info.get("torch") is None:
            problems.append(f"{python} cannot import torch ({info.get('torch_error')}); {slim['requirement']} needs "
                            f"torch=={torch} with CUDA {need['cuda_major']}. Fix: use the image's python3")
            continue
        base = info["torch"].split("+")[0]
        cuda = info.get("cuda")
        if base != torch:
            problems.append(f"{python} has torch {info['torch']}; {slim['filename']} (vLLM {b['version']}) pins "
                            f"torch=={torch}. Fix: use an image with torch {torch}, or pin the vLLM release built "
                            f"for torch {base} in envs/gpu/engine-<version>.txt and run `make gpu-stage` again")
        elif cuda is None or str(cuda).split(".")[0] != str(need["cuda_major"]):
            problems.append(f"{python}'s torch {info['torch']} is built for CUDA {cuda}; {slim['filename']} links "
                            f"CUDA {need['cuda_major']} libraries. Fix: use a torch {torch}+cu{need['cuda_major']}0 image")
    if problems:
        raise InstallError("\n  ".join(["this machine's Python does not fit the staged wheels:", *dict.fromkeys(problems)]))
    return info


def reassemble(slim: dict, folders: dict[str, Path], dest_dir: Path) -> Path:
    dest_dir.mkdir(parents=True, exist_ok=True)
    out = dest_dir / slim["filename"]
    h = hashlib.sha256()
    with open(out, "wb") as fo:
        for c in slim["chunks"]:
            with open(folders[c["part"]] / c["file"], "rb") as fi:
                for block in iter(lambda: fi.read(1 << 20), b""):  # noqa: B023
                    h.update(block)
                    fo.write(block)
    if h.hexdigest() != slim["sha256"]:
        out.unlink()
        raise InstallError(f"{out}: reassembled sha256 {h.hexdigest()} is not the manifest's {slim['sha256']}. "
                           f"Fix: run `make gpu-stage` again and carry every part anew")  # fmt: skip
    return out


def build_site(engines: Path, version: str) -> Path:
    return engines / f"vllm-{version}"


def default_build(manifest: dict) -> dict:
    return next(b for b in manifest["builds"] if b["version"] == manifest["default_build"])


def env_lines(site: Path, manifest: dict, project: Path | None = None, engine_site: Path | None = None) -> list[str]:
    """The exports of SITE/env.sh: the checkout's ``scripts/`` first (the installed copy provides the
    ``specstudy`` command, but the package must be the checkout's own, which finds the checkout's
    ``config/schemas``; an installed copy looks for them beside itself, under the site's parent; seen on the
    first H200 run: "no schema 'corpus-spec': expected /tmp/config/schemas/..."), then the harness site, then
    the default build's site (vLLM for servers that name no build, and the packages harness.txt leaves to the
    engine lists)."""
    env = {**default_build(manifest).get("env", {}), **ENV_EXTRA}
    paths = ([str(project.resolve() / "scripts")] if project is not None else []) + [str(site)]
    paths += [str(engine_site)] if engine_site is not None else []
    bins = [f"{site}/bin"] + ([f"{engine_site}/bin"] if engine_site is not None else [])
    lines = [f'export PYTHONPATH="{":".join(paths)}${{PYTHONPATH:+:$PYTHONPATH}}"', f'export PATH="{":".join(bins)}:$PATH"']
    lines += [f"export {k}={v}" for k, v in sorted(env.items())]
    return lines


def build_env_lines(engine_site: Path, build: dict) -> list[str]:
    """The exports of ENGINES/vllm-<version>/env.sh: that build's site first on PYTHONPATH (and its bin on PATH)."""
    env = {**build.get("env", {}), **ENV_EXTRA}
    lines = [f'export PYTHONPATH="{engine_site}${{PYTHONPATH:+:$PYTHONPATH}}"', f'export PATH="{engine_site}/bin:$PATH"']
    lines += [f"export {k}={v}" for k, v in sorted(env.items())]
    return lines


def pip_target(python: str, target: Path, items: list[str]) -> None:
    """pip install --no-index --no-deps into target.new, then swap it in for target (never half a site)."""
    new = Path(str(target) + ".new")
    if new.exists():
        shutil.rmtree(new)
    cmd = [python, "-m", "pip", "install", "--no-index", "--no-deps", "--no-compile", "--disable-pip-version-check",
           "--no-build-isolation", "--target", str(new), *items]  # fmt: skip
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        shutil.rmtree(new, ignore_errors=True)
        raise InstallError(f"pip install into {new} failed (exit {r.returncode}):\n{r.stdout[-4000:]}")
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    new.rename(target)


def import_check(python: str, pythonpath: list[Path], env_extra: dict, mods: list[str], dist: str, where: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, pythonpath)), **env_extra)
    code = ("import importlib, importlib.metadata as md\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            f"print('import check ({where}): {dist}', md.version({dist!r}))\n")  # fmt: skip
    r = subprocess.run([python, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise InstallError(f"installed {where}, but importing {', '.join(mods)} with PYTHONPATH="
                           f"{env['PYTHONPATH']} failed:\n{r.stdout[-4000:]}")
    return r.stdout.strip().splitlines()[-1]


def install(stage: Path, holding: Path, site: Path, python: str, project: Path | None, import_check_on: bool = True,
            engines: Path = DEFAULT_ENGINES, log=print) -> Path:  # fmt: skip
    t0 = time.monotonic()

    def ts(msg):
        log(f"[{time.monotonic() - t0:6.1f}s] {msg}")

    manifest, folders = collect(stage, holding)
    ts(f"{len(folders)} parts verified ({', '.join(f'{n}: {p}' for n, p in folders.items())})")
    info = check_python(python, manifest, project)
    ts(f"python {info['python']}, torch {info['torch']} (CUDA {info['cuda']}) fit "
       f"{', '.join(b['slim_wheel']['requirement'] for b in manifest['builds'])}")
    if project is not None and not (project / "pyproject.toml").is_file():
        raise InstallError(f"{project}: no pyproject.toml. Fix: run from the repository root or pass --project")
    work = Path(str(site) + ".wheels")
    if work.exists():
        shutil.rmtree(work)
    slims = {}
    for b in manifest["builds"]:
        slims[b["version"]] = reassemble(b["slim_wheel"], folders, work / b["version"])
        ts(f"{b['slim_wheel']['filename']} (vLLM {b['version']}) reassembled, sha256 "
           f"{b['slim_wheel']['sha256'][:16]}... verified")
    def wheels_of(lst: str) -> list[str]:
        return [str(folders[w["part"]] / w["filename"]) for w in manifest["wheels"] if lst in w["lists"]]

    harness = wheels_of("harness") + wheels_of("build")
    build_sites = {b["version"]: build_site(engines, b["version"]) for b in manifest["builds"]}
    jobs = {"harness": (site, harness + ([str(project)] if project is not None else []))}
    jobs |= {b["version"]: (build_sites[b["version"]], [str(slims[b["version"]])] + wheels_of(b["list"]))
             for b in manifest["builds"]}
    with ThreadPoolExecutor(len(jobs)) as pool:  # independent sites: one pip each, side by side
        futures = {pool.submit(pip_target, python, dest, items): key for key, (dest, items) in jobs.items()}
        for fut in as_completed(futures):
            fut.result()
            key = futures[fut]
            dest, items = jobs[key]
            if key == "harness":
                ts(f"{len(harness)} harness wheels{' + ' + str(project) if project else ''} installed into {site}")
            else:
                ts(f"vLLM {key}: {len(items)} wheels installed into {dest}")
    for b in manifest["builds"]:
        dest = build_sites[b["version"]]
        (dest / "env.sh").write_text("# written by envs/gpu/install_offline.py; `source` it after "
                                     f"{site / 'env.sh'} to serve with vLLM {b['version']}\n"
                                     + "\n".join(build_env_lines(dest, b)) + "\n")  # fmt: skip
    shutil.rmtree(work)
    default_site = build_sites[manifest["default_build"]]
    lines = env_lines(site, manifest, project, default_site)
    env_file = site / "env.sh"
    env_file.write_text("# written by envs/gpu/install_offline.py; `source` it\n" + "\n".join(lines) + "\n")
    if import_check_on:
        checks = {f"vLLM {b['version']} alone": (  # as a server naming this build sees it: its site and the image
            [build_sites[b["version"]]], {**b.get("env", {}), **ENV_EXTRA}, b["imports"],
            b["slim_wheel"]["requirement"].split("==")[0]) for b in manifest["builds"]}
        checks[f"harness + vLLM {manifest['default_build']}"] = (
            ([project.resolve() / "scripts"] if project is not None else []) + [site, default_site],
            {**default_build(manifest).get("env", {}), **ENV_EXTRA},
            ["snakemake", default_build(manifest)["imports"][0]] + (["specstudy.cli"] if project else []), "snakemake")
        with ThreadPoolExecutor(len(checks)) as pool:
            futures = [pool.submit(import_check, python, *args, where) for where, args in checks.items()]
            for fut in futures:  # in order: the first failure named is the first build's
                ts(fut.result())
    log(f"environment ({env_file}; `source {env_file}`; vLLM {manifest['default_build']} unless a server's "
        f"PYTHONPATH names a build: {', '.join(str(v) for v in build_sites.values())}):")
    for line in lines:
        log(line)
    return env_file


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=["hold", "install", "verify"],
                    help="hold: verify and move this call's part(s) out of the tree; install: verify all parts, "
                         "check, install; verify: only verify the parts present and check Python/torch")  # fmt: skip
    ap.add_argument("--stage", type=Path, default=REPO / ".stage", help="the carried stage folder (default: REPO/.stage)")
    ap.add_argument("--holding", type=Path, default=Path(os.environ.get("SPECSTUDY_PARTS", DEFAULT_HOLD)))
    ap.add_argument("--site", type=Path, default=Path(os.environ.get("SPECSTUDY_SITE", DEFAULT_SITE)))
    ap.add_argument("--engines", type=Path, default=Path(os.environ.get("SPECSTUDY_ENGINES", DEFAULT_ENGINES)),
                    help="parent of the build sites vllm-<version> (default /tmp/specstudy-engines)")
    ap.add_argument("--python", default=sys.executable, help="the interpreter to install for (default: this one)")
    ap.add_argument("--project", type=Path, default=REPO, help="project to install too (default: this checkout)")
    ap.add_argument("--no-project", action="store_true", help="install the staged wheels only")
    ap.add_argument("--no-import-check", action="store_true")
    args = ap.parse_args(argv)
    try:
        if args.mode == "hold":
            hold(args.stage, args.holding)
        elif args.mode == "verify":
            manifest, folders = collect(args.stage, args.holding)
            info = check_python(args.python, manifest)
            print(f"verify: parts {', '.join(folders)} verified; python {info['python']}, torch {info['torch']} fit")
        else:
            install(args.stage, args.holding, args.site, args.python, None if args.no_project else args.project,
                    import_check_on=not args.no_import_check, engines=args.engines)  # fmt: skip
    except InstallError as e:
        print(f"install_offline {args.mode}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
