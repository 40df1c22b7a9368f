"""The spec of one deployment job: what runs from the plan, how from the study config.

:func:`deployment_spec` builds it for ``specstudy deployment run --plan … --deployment <phase>/<arm>/<rep>``;
:func:`engine_flat` maps the config's ``engine`` section onto the launcher's settings;
:func:`fingerprint_context` / :func:`fingerprint` say which earlier cell results may be reused.
"""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.core import atomic, methods
from specstudy.core.records import Plan, to_record
from specstudy.deployment import provenance
from specstudy.study.config import engine_builds, engine_label


def is_loopback(host: str) -> bool:
    """``host`` reaches only this machine (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    import ipaddress

    if str(host).lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def server_api_key(server: dict) -> str | None:
    """The API key of one deployment's server: the value of ``server.api_key_env`` when the config names one; else,
    for a server bound to anything but loopback, a new random key (this deployment's only: the load generator runs
    in the same job and sends it; docs/deployments.md "Who can reach a server"); none on loopback."""
    import secrets

    key_env = server.get("api_key_env")
    if key_env:
        return os.environ.get(key_env)
    return None if is_loopback(server.get("host", "127.0.0.1")) else secrets.token_urlsafe(32)


def engine_flat(engine: dict) -> dict:
    """Map the study config's ``engine`` section onto the launcher's flat engine settings (the API key:
    :func:`server_api_key`, a new one on every call)."""
    target = engine["target"]
    server = engine.get("server") or {}
    flat = {
        "backend": engine.get("backend", "local"),
        "python": engine.get("python"),
        "model": target["path"],
        "tokenizer": target.get("tokenizer") or target["path"],
        "tensor_parallel_size": target.get("tensor_parallel_size", 1),
        "max_model_len": target["max_model_len"],
        "dtype": target.get("dtype"),
        "chat_template": target.get("chat_template"),
        # the model directory of each registered method that loads one (core.methods: ModelPath)
        **{mp.flat: (engine.get(mp.section) or {}).get("path") for mp in methods.model_paths()},
        "gpu_memory_utilization": server.get("gpu_memory_utilization", 0.9),
        "extra_args": list(server.get("extra_args") or []),
        "env": dict(server.get("env") or {}),
        "host": server.get("host", "127.0.0.1"),
        "port": server.get("port"),
        "readiness_timeout_s": server.get("ready_timeout_s", 900),
        "stop_grace_s": server.get("stop_grace_s", 30),
        "idle_timeout_s": server.get("idle_timeout_s"),
        "cache_root": server.get("cache_root"),
        "api_key": server_api_key(server),
    }
    if engine.get("container"):
        flat["container"] = engine["container"]
    return flat


# Settings that cannot change a measurement (where and how long to wait, how to reach the server).
_OPERATIONAL_SERVER_KEYS = ("host", "port", "ready_timeout_s", "stop_grace_s", "idle_timeout_s", "api_key_env")
_OPERATIONAL_CELL_KEYS = ("reuse_valid",)
_HASH_LIMIT = 64 << 20  # files up to 64 MiB are hashed; larger ones (real weights) by name, size and mtime


def model_identity(path: str | None) -> dict | None:
    """What identifies a model directory's content: config.json's sha256 and every file's name, size
    and (up to 64 MiB) sha256 — larger files by mtime. ``None`` when the path is not readable here."""
    from specstudy.core.atomic import sha256_file

    if not path:
        return None
    root = Path(path)
    if not root.exists():
        return {"path": str(path), "readable": False}
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    entries = []
    for f in files:
        st = f.stat()
        entry = {"name": str(f.relative_to(root)) if f != root else f.name, "size": st.st_size}
        if st.st_size <= _HASH_LIMIT:
            entry["sha256"] = sha256_file(f)
        else:
            entry["mtime_ns"] = st.st_mtime_ns
        entries.append(entry)
    return {"path": str(path), "readable": True, "files": entries}


def engine_identity(engine: dict) -> dict:
    """The engine software a measurement ran on: the local interpreter's vLLM/torch versions, or the
    container image (path, size, mtime). Collected once per deployment job."""
    if engine.get("backend", "local") == "container":
        cont = engine.get("container") or {}
        image = cont.get("image")
        st = Path(image).stat() if image and Path(image).exists() else None
        return {"backend": "container", "image": image, "image_size": st.st_size if st else None,
                "image_mtime_ns": st.st_mtime_ns if st else None}
    sw = provenance.server_software(engine.get("python"))
    return {"backend": "local", **{k: sw.get(k) for k in ("python", "vllm", "vllm_distribution", "torch", "transformers")}}


def fingerprint_context(spec: dict) -> dict:
    """Everything of the deployment that can change a cell's measurement (computed once per job)."""
    engine = spec["engine"]
    server = {k: v for k, v in (engine.get("server") or {}).items() if k not in _OPERATIONAL_SERVER_KEYS}
    arm = {k: v for k, v in spec["arm"].items() if k not in ("servable", "skip_reason")}
    ctx = {
        "arm": arm,
        "engine": {"backend": engine.get("backend", "local"), "python": engine.get("python"),
                   "target": engine["target"], "server": server, "container": engine.get("container")},
        "engine_software": engine_identity(engine),
        "target_identity": model_identity(engine["target"].get("path")),
        "cell_settings": {k: v for k, v in spec["cell_settings"].items() if k not in _OPERATIONAL_CELL_KEYS},
    }
    decl = methods.find(arm.get("method"))
    if decl is not None and decl.model is not None:  # a draft, head or drafter is loaded only by its method's arms
        section = decl.model.section
        ctx["engine"][section] = engine.get(section)
        ctx[f"{section}_identity"] = model_identity((engine.get(section) or {}).get("path"))
    return ctx


def fingerprint(spec: dict, cell: dict, digest: str, context: dict | None = None) -> str:
    """The cell fingerprint: the deployment's context (arm, engine settings and software, model
    identities, every client setting) plus the cell's workload, concurrency and corpus digest, and
    the workload's chat-template kwargs where it declares any (``workload_options``)."""
    from specstudy.measure.cell import cell_fingerprint
    from specstudy.study.template_args import request_extra_body

    context = context if context is not None else fingerprint_context(spec)
    data = dict(context, workload=cell["workload"], concurrency=int(cell["concurrency"]), corpus_digest=digest)
    extra = request_extra_body(spec, cell["workload"])
    if extra:  # a switched workload (docs/thinking.md); absent otherwise, so unswitched fingerprints stay as they were
        data["request_extra_body"] = extra
    return cell_fingerprint(data)


def corpus_dirs(cfg: dict, results: str = "results") -> dict[str, str]:
    """``results/corpora/<name>/<version>`` of every workload's corpus and of ``smoke`` (from their specs)."""
    from specstudy.inputs.corpus import CorpusError, load_spec

    specs = dict(cfg["corpora"]["workloads"], smoke=cfg["corpora"]["smoke"])
    out = {}
    for workload, path in specs.items():
        field_name = "corpora.smoke" if workload == "smoke" else f"corpora.workloads.{workload}"
        try:
            spec = load_spec(path)
        except CorpusError as exc:
            raise CorpusError(f"config field '{field_name}': {exc}") from None
        out[workload] = f"{results}/corpora/{spec['name']}/{spec['version']}"
    return out


def deployment_spec(plan: Plan | dict, key: str, cfg: dict) -> dict:
    """The spec of deployment ``key`` (``<phase>/<arm>/<rep>``, e.g. ``screen/draft-k3-tp4/rep1``).

    What runs comes from the plan — the arm's settings, the kind, block and order, the cells in their
    planned order; how it runs from the study config — engine, cell settings, corpora. The capacity
    search of an arm (``capacity/<arm>/rep1``) takes its arm from the confirmation plan and its
    search from ``capacity`` in the config. ``plan``: a :class:`~specstudy.core.records.Plan` (records.read_plan) or
    the dict of plan.make_plan.
    """
    from specstudy.core.errors import UserError
    from specstudy.study.template_args import check_workload_options

    if not isinstance(plan, Plan):
        plan = to_record(plan, Plan, "<plan>")

    parts = key.split("/")
    if len(parts) != 3:
        raise UserError(f"--deployment {key!r}: expected <phase>/<arm>/<rep>, e.g. screen/baseline/rep1")
    phase, arm_name, rep = parts
    arms = {a["name"]: a for a in plan.arms}
    if arm_name not in arms:
        raise UserError(f"--deployment {key!r}: arm {arm_name!r} is not in the {plan.phase} plan "
                        f"(arms: {', '.join(sorted(arms))})")
    dirs = corpus_dirs(cfg)
    # Before any server starts: every chat-template switch is one the target's template reads (docs/thinking.md).
    check_workload_options(cfg, "the study config (workload_options)", require_template=True)
    build = arms[arm_name].get("engine")  # a study of several engine builds: the arm's own
    builds = engine_builds(cfg)
    if build not in builds:
        raise UserError(f"--deployment {key!r}: the arm names engine build {build!r}, which the study config does "
                        f"not declare (engines: {', '.join(str(b) for b in builds)}); plan again from this config")
    common = {"arm": arms[arm_name], "smoke_corpus_dir": dirs["smoke"], "engine": builds[build],
              "cell_settings": cfg["cells"], "study": cfg["study"]["name"], "seed": cfg["study"]["seed"]}
    if build:
        common["engine_build"] = {"name": build, "label": engine_label(cfg, build),
                                  "overlay": cfg["engines"][build]}
    if cfg.get("workload_options"):
        common["workload_options"] = cfg["workload_options"]
    if phase == "capacity":
        cap = cfg.get("capacity") or {}
        return {"phase": "capacity", "rep": rep, "kind": "capacity", "block": 1, "order": 0, "cells": [],
                "capacity": cap, "capacity_corpus_dir": dirs[cap["workload"]], **common}
    if phase != plan.phase:
        raise UserError(f"--deployment {key!r}: the plan is of phase {plan.phase!r}, not {phase!r}")
    try:
        dep = plan.deployment(arm_name, rep)
    except KeyError as exc:
        raise UserError(f"--deployment {key!r}: {exc.args[0]}") from None
    spec = {"phase": phase, "rep": rep, "kind": dep.kind, "block": dep.block, "order": dep.order,
            "cells": [{"workload": c.workload, "concurrency": c.concurrency, "corpus_dir": dirs[c.workload]}
                      for c in dep.cells], **common}
    from specstudy.phases import registry

    # The phase's plan design overrides cell settings (an extension phase's: the sampling temperature, the fixed
    # length, its request counts) and, through the phase's behaviour, names what the deployment runs besides
    # its cells; phase-only server settings join the engine's.
    design = plan.design or {}
    spec["cell_settings"] = {**cfg["cells"], **(design.get("cell_settings") or {})}
    spec.update(registry.get(phase).spec_extras(design, dirs))
    if design.get("extra_args") or design.get("env"):
        # phase-only server settings: flags added; env values replace the study's, null removes one
        engine = dict(builds[build])
        server = engine["server"] = dict(engine.get("server") or {})
        server["extra_args"] = list(server.get("extra_args") or []) + list(design.get("extra_args") or [])
        env = dict(server.get("env") or {})
        for key, value in (design.get("env") or {}).items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = str(value)
        server["env"] = env
        spec["engine"] = engine
    return spec


def load_settings(path: str) -> dict:
    """The study settings a deployment job reads: the workflow's effective config (JSON, checked when the
    workflow was parsed; ``deployment-<hash>.json`` holds only config.DEPLOYMENT_SECTIONS) or a study config YAML."""
    if str(path).endswith(".json"):
        return atomic.read_json(path)
    from specstudy.study.config import load_config

    return load_config(path)
