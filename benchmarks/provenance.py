"""What a deployment's provenance costs against a large model store: the old full-walk hashing against
the hash cache (specstudy.deployment.filehash), measured in one run on one synthetic store.

The store is built in a temporary folder the way Clariden's shared ``hf_models`` looks from a job: many
models, each with its small files (config, tokenizer, index) and a few with large weight shards; the
configured target and draft live in it, and the EDF mounts it whole (plus ``${SCRATCH}``), as
``envs/clariden-vllm.toml`` does. Per deployment it times the parts of the provenance that read files:

* **old** (kept here only, as it was in ``deployment/launch.py`` and ``deployment/provenance.py``):
  every mounted directory walked and up to 2,000 of its files sha256-hashed in full, the image's first
  64 MiB hashed, the models' index/tokenizer files (and weights below 256 MiB in all) hashed;
* **new**: ``ContainerBackend.describe`` (image sha256 and mounts through the cache; directories
  recorded, not walked) and ``provenance.model_info`` for target and draft through the same cache
  file, as consecutive deployment jobs of a study share it. The first deployment reads every weight
  file and the image once (cold); the later ones read none (warm).

Large files are sparse (no disk is spent building them), so each read costs what sha256 costs on this
CPU and nothing for I/O: on a parallel file system reading is slower still, and the old figures with it.
The engine version probe (new: the server's interpreter reports vLLM's version and commit) is timed
apart, as it reads no model file.

    python benchmarks/provenance.py [--models 100] [--small-per-model 30] [--weight-mib 64] \
        [--image-mib 512] [--deployments 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from specstudy.core import atomic  # noqa: E402
from specstudy.deployment import launch, provenance  # noqa: E402
from specstudy.deployment.filehash import HashCache  # noqa: E402


# ------------------------------------------------------------------ the old code (the peer), as it was
def old_sha256_file(path, limit=None):
    try:
        return atomic.sha256_file(path, limit=limit)
    except OSError:
        return None


def old_dir_digest(path: Path, max_files: int = 2000) -> str:
    h = hashlib.sha256()
    for i, f in enumerate(sorted(p for p in path.rglob("*") if p.is_file())):
        if i >= max_files:
            h.update(b"...truncated")
            break
        h.update(str(f.relative_to(path)).encode() + b"\0" + (old_sha256_file(f) or "").encode() + b"\n")
    return h.hexdigest()


def old_bind_mount_hashes(mounts: list) -> list[dict]:
    out = []
    for m in mounts:
        src, _, rest = str(m).partition(":")
        dst = rest.split(":", 1)[0] if rest else src
        p = Path(src)
        entry = {"src": src, "dst": dst, "sha256": None, "kind": "missing"}
        if p.is_file():
            entry.update(kind="file", sha256=old_sha256_file(p))
        elif p.is_dir():
            entry.update(kind="directory", sha256=old_dir_digest(p))
        out.append(entry)
    return out


def old_image_digest(image: str | None) -> str | None:
    if not image or not Path(image).is_file():
        return None
    size = Path(image).stat().st_size
    head = old_sha256_file(image, limit=64 << 20)
    return f"head64m-sha256:{head};size={size}"


def old_model_info(path) -> dict | None:
    if not path:
        return None
    p = Path(path)
    cfg = p / "config.json"
    info = {"path": str(p), "config_sha256": old_sha256_file(cfg) if cfg.exists() else None,
            "exists": p.exists(), "architectures": None, "weights": []}
    if cfg.exists():
        try:
            info["architectures"] = json.loads(cfg.read_text()).get("architectures")
        except ValueError:
            pass
    if p.is_dir():
        for f in sorted(p.glob("*.safetensors.index.json")) + sorted(p.glob("tokenizer*.json")):
            info["weights"].append({"file": f.name, "sha256": old_sha256_file(f)})
        small = sorted(p.glob("*.safetensors"))
        if small and sum(f.stat().st_size for f in small) < (256 << 20):
            info["weights"] += [{"file": f.name, "sha256": old_sha256_file(f)} for f in small]
    return info


def old_provenance_files(backend: launch.ContainerBackend, cfg: dict) -> dict:
    edf = backend.edf()
    return {"image_digest": old_image_digest(edf.get("image")), "mounts": old_bind_mount_hashes(edf.get("mounts") or []),
            "target": old_model_info(cfg["model"]), "draft": old_model_info(cfg["draft_model"])}


# ------------------------------------------------------------------ the new code
def new_provenance_files(backend: launch.ContainerBackend, cfg: dict, cache_path: Path) -> dict:
    cache = HashCache(cache_path)  # a new job: only the cache file carries over
    desc = backend.describe(cache)
    return {"container": desc, "target": provenance.model_info(cfg["model"], cache),
            "draft": provenance.model_info(cfg["draft_model"], cache), "read": len(cache.hashed)}


# ------------------------------------------------------------------ the synthetic store
def sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)


def model_dir(d: Path, n_small: int, shards: int, shard_bytes: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": ["ApertusForCausalLM"], "name": d.name}))
    (d / "generation_config.json").write_text("{}")
    (d / "tokenizer.json").write_bytes(os.urandom(256 << 10))
    (d / "tokenizer_config.json").write_text("{}")
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {f"w{i}": n for i, n in enumerate(names)}}))
    for name in names:
        sparse(d / name, shard_bytes)
    extra = d / "original"  # what a hub snapshot carries besides: notebooks, evaluation files, ...
    for i in range(max(0, n_small - 5)):
        p = extra / f"part-{i:04d}.json"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(os.urandom(2048))


def build_store(tmp: Path, args) -> dict:
    store = tmp / "hf_models"
    mib = 1 << 20
    for i in range(args.models):
        big = i % max(1, args.models // args.big_models) == 0  # a few of the others carry large weights too
        model_dir(store / "models" / f"org{i % 7}" / f"model-{i:03d}", args.small_per_model,
                  shards=4 if big else 1, shard_bytes=args.weight_mib * mib if big else 64 << 10)
    target = store / "models" / "swiss-ai" / "Apertus-target"
    draft = store / "models" / "swiss-ai" / "Apertus-draft"
    model_dir(target, args.small_per_model, shards=4, shard_bytes=args.weight_mib * mib)
    model_dir(draft, args.small_per_model, shards=2, shard_bytes=args.weight_mib * mib // 2)
    image = tmp / "images" / "vllm.sqsh"
    sparse(image, args.image_mib * mib)
    scratch = tmp / "scratch"
    (scratch / "results").mkdir(parents=True)
    edf = tmp / "clariden-like.toml"
    edf.write_text(f'mounts = ["{store}:{store}", "${{SCRATCH}}:${{SCRATCH}}"]\nworkdir = "${{SCRATCH}}"\n\n'
                   '[env]\nHF_HUB_OFFLINE = "1"\nHF_HOME = "${SCRATCH}/hf-home"\n')
    files = sum(1 for p in store.rglob("*") if p.is_file())
    weight_bytes = sum(p.stat().st_size for p in store.rglob("*.safetensors"))
    return {"store": store, "target": target, "draft": draft, "image": image, "scratch": scratch, "edf": edf,
            "files": files, "weight_bytes": weight_bytes}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", type=int, default=100, help="other models in the store")
    ap.add_argument("--big-models", type=int, default=4, help="how many of them carry large weight shards")
    ap.add_argument("--small-per-model", type=int, default=30, help="small files per model")
    ap.add_argument("--weight-mib", type=int, default=64, help="size of a large weight shard (MiB)")
    ap.add_argument("--image-mib", type=int, default=512, help="size of the container image (MiB)")
    ap.add_argument("--deployments", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="specstudy-provenance-bench-"))
    try:
        s = build_store(tmp, args)
        os.environ["SCRATCH"] = str(s["scratch"])
        cfg = {"model": str(s["target"]), "draft_model": str(s["draft"]), "backend": "container",
               "container": {"edf": str(s["edf"]), "image": str(s["image"])}}
        backend = launch.make_backend(cfg)
        cache_path = s["scratch"] / "results" / ".cache" / "content-hashes.json"
        print(f"store: {s['files']} files, {s['weight_bytes'] / 2**30:.1f} GiB of weights "
              f"(target 4 x {args.weight_mib} MiB, draft 2 x {args.weight_mib // 2} MiB); image {args.image_mib} MiB; "
              f"CPU: {os.cpu_count()} logical cores")
        rows = []
        for d in range(1, args.deployments + 1):
            t0 = time.perf_counter()
            old = old_provenance_files(backend, cfg)
            t_old = time.perf_counter() - t0
            t0 = time.perf_counter()
            new = new_provenance_files(backend, cfg, cache_path)
            t_new = time.perf_counter() - t0
            rows.append({"deployment": d, "old_s": round(t_old, 3), "new_s": round(t_new, 3), "new_files_read": new["read"],
                         "old_store_digest": old["mounts"][0]["sha256"][:12]})
            print(f"deployment {d}: old {t_old:7.2f} s   new {t_new:7.3f} s ({'cold' if new['read'] else 'warm'}: "
                  f"{new['read']} large files read)   old/new {t_old / t_new:7.1f}x")
        t0 = time.perf_counter()
        sw = provenance.engine_software(launch.make_backend({"model": "/m"}), {"model": "/m"})
        t_probe = time.perf_counter() - t0
        old_mean = statistics.mean(r["old_s"] for r in rows)
        warm = [r["new_s"] for r in rows[1:]] or [rows[0]["new_s"]]
        summary = {"files": s["files"], "weight_bytes": s["weight_bytes"], "image_bytes": args.image_mib << 20,
                   "old_per_deployment_s": round(old_mean, 3), "new_first_s": rows[0]["new_s"],
                   "new_later_s": round(statistics.median(warm), 3),
                   "ratio_old_to_new_later": round(old_mean / statistics.median(warm), 1),
                   "engine_probe_s": round(t_probe, 3), "engine": sw["engine"].get("version"), "rows": rows}
        print(f"per deployment: old {old_mean:.2f} s; new {rows[0]['new_s']:.2f} s for the first (hashes every weight "
              f"file and the image once), {summary['new_later_s']:.3f} s for each later one: "
              f"{summary['ratio_old_to_new_later']:.0f}x less")
        print(f"engine version probe (server's interpreter, vLLM {summary['engine']}): {t_probe:.2f} s")
        if args.json:
            atomic.write_json(args.json, summary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
