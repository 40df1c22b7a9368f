"""The pre-flight of a study (issue 29): what the deployments will need, checked before any job runs.

``config.check_config`` checks the config's shape and its cross-field rules wherever a config is read
(every command, every job). This module adds what depends on the machine the study runs on: the
engine's files (interpreter, models, chat template, methods record) and the load generator's CPU
pinning against this machine or the Slurm profile's node; and the extension phases' arm names against
the factorial; the datasets the corpus specs read (:func:`dataset_problems`) and the container the
deployments start (:func:`container_problems`). ``specstudy check-config`` and the workflow's parse time
(rules/common.smk) run the same :func:`check_study`, so a dry run stops where ``check-config`` does; the
datasets' full digests are compared by ``check-config`` and by the workflow's ``onstart`` handler (before the
first job of a real run, never in a dry run), not at every parse.

Every path is checked from the machine that runs the check: on Clariden that is the login node, whose
shared file systems (/capstor, $SCRATCH) the compute nodes see at the same paths.
"""

from __future__ import annotations

import os
from pathlib import Path

from specstudy.study.config import REPO_ROOT, ConfigError


def _built_by_workflow(cfg: dict, path: str) -> bool:
    """A path the workflow writes itself (the fixture models under results/models/fixture/): it need not
    exist before the study runs."""
    return bool((cfg.get("fixture_models") or {}).get("build")) and os.path.normpath(path).startswith(
        os.path.join("results", "models"))


def _resolve(path: str) -> Path:
    p = Path(path)
    return p if (p.is_absolute() or p.exists()) else REPO_ROOT / p


def engine_path_problems(cfg: dict) -> list[str]:
    """Files the deployment jobs will open: each missing one as ``field 'engine...': ... ; fix``."""
    from specstudy.study.config import engine_builds

    engine = cfg["engine"]
    problems = []
    for name, build in engine_builds(cfg).items():  # a study of several engine builds: each build's interpreter
        python = (cfg.get("engines") or {}).get(name, {}).get("python") if name else None
        if python and build.get("backend") == "local" and not os.access(python, os.X_OK):
            problems.append(f"field 'engines.{name}.python': {python} is not an executable file; give this build's "
                            "Python interpreter (…/bin/python of its vLLM install)")
    python = engine.get("python")
    if python and engine.get("backend") == "local":
        p = Path(python)
        if not p.exists():
            problems.append(f"field 'engine.python': {python} does not exist; give the server's Python interpreter "
                            "(e.g. /path/to/venv/bin/python) or remove the field to use the harness's own")
        elif p.is_dir() or not os.access(p, os.X_OK):
            problems.append(f"field 'engine.python': {python} is not an executable file; give the interpreter itself "
                            "(…/bin/python), not its directory")
    from specstudy.core import methods

    listed = [m for m in (methods.find(n) for n in cfg["arms"]["methods"]) if m is not None]
    # the target, and the draft/head/drafter directory of each listed method that loads one (core.methods)
    models = [("engine.target.path", engine["target"].get("path"), "the target model directory"),
              ("engine.target.tokenizer", engine["target"].get("tokenizer"), "the tokenizer directory"),
              *((mp.field, (engine.get(mp.section) or {}).get("path"), mp.what)
                for mp in methods.model_paths() if any(m.model == mp for m in listed))]
    for field, path, what in models:
        if not path or _built_by_workflow(cfg, path):
            continue
        if not Path(path).exists():
            problems.append(f"field '{field}': {path} does not exist on this machine (checked from here, e.g. the "
                            f"login node: compute nodes see the same shared paths); give {what} (every deployment "
                            "of an arm that needs it would fail at server start)")
        elif not Path(path).is_dir():
            problems.append(f"field '{field}': {path} is a file; give {what} (the directory holding config.json)")
    template = engine["target"].get("chat_template")
    if template and not _built_by_workflow(cfg, template) and not _resolve(template).is_file():
        problems.append(f"field 'engine.target.chat_template': {template} is not a file; give the Jinja chat template "
                        "file or remove the field to use the model's own")
    return problems


#: where docs/corpora.md says how to put a dataset on a login node and fill in its digest
DATASETS_HOWTO = 'docs/corpora.md, "Production: pointing specs at public datasets on disk"'


def _spec_files(cfg: dict) -> list[tuple[str, str]]:
    """(field, spec path) of every corpus the study builds: its workloads and the smoke set."""
    corpora = cfg["corpora"]
    return [*((f"corpora.workloads.{w}", p) for w, p in corpora["workloads"].items()), ("corpora.smoke", corpora["smoke"])]


def _built_with(spec: dict, sha: str, root: str) -> bool:
    """The corpus of ``spec`` was already built from a source with this sha256 (the build compared it then)."""
    from specstudy.core import atomic, layout

    record = Path(layout.corpus_json(spec["name"], spec["version"], root))
    try:
        return any(str(src.get("sha256", "")).lower() == sha for src in atomic.read_json(record).get("sources") or [])
    except (OSError, ValueError, AttributeError, atomic.BadFile):
        return False


def dataset_problems(cfg: dict, *, digests: bool = False, skip_built: str | None = None) -> list[str]:
    """The datasets the corpus specs read, as a login node must hold them before anything is submitted: the
    ``${VAR}`` of ``source.path`` set (``SPECSTUDY_DATASETS``), the file there, ``source.sha256`` filled in (not
    a ``FILL-ME`` placeholder) and, with ``digests``, equal to the file's sha256 (read in full; ``skip_built``:
    a results root whose built corpus already recorded that sha256 is not read again)."""
    from specstudy.inputs.corpus import (
        _SHA_RE,
        CorpusError,
        check_source,
        load_spec,
        resolve_source_path,
        source_sha256,
    )

    problems = []
    for field, spec_file in _spec_files(cfg):
        spec_path = _resolve(spec_file)
        try:
            spec = load_spec(spec_path)
        except CorpusError as exc:
            problems.append(f"field '{field}': {exc}")
            continue
        declared = str(spec["source"]["sha256"]).lower()
        obtain = f" (obtain: {spec['source']['obtain']})" if spec["source"].get("obtain") else ""
        path = None
        try:
            path = resolve_source_path(spec, spec_path)
        except CorpusError as exc:
            problems.append(f"{exc}; on the login node put the dataset there{obtain} before submitting "
                            f"({DATASETS_HOWTO})")
        if path is not None and not path.exists():
            problems.append(f"{spec_file}: field 'source.path': {path} does not exist (checked from this machine, e.g. "
                            f"the login node); place the dataset there{obtain} or edit source.path ({DATASETS_HOWTO}). "
                            "Nothing is downloaded at run time")
            path = None
        if not _SHA_RE.match(declared):
            actual = (f" (the file there has sha256 {source_sha256(path, spec['format'], spec.get('options') or {})})"
                      if digests and path is not None else "")
            problems.append(f"{spec_file}: field 'source.sha256' is still the placeholder {spec['source']['sha256']!r}"
                            f"{actual}; on the login node run `sha256sum {path or spec['source']['path']}`, check it is "
                            f"the dataset you mean and write that value into the spec ({DATASETS_HOWTO})")
        elif path is not None and digests and not (skip_built and _built_with(spec, declared, skip_built)):
            try:
                check_source(spec, spec_path)
            except CorpusError as exc:
                problems.append(str(exc))
    return problems


def _local_path(value: str) -> bool:
    """A container image or EDF named by a path on this machine (not a registry reference or an EDF name)."""
    return value.startswith(("/", "./", "../", "~", "$")) or value.endswith((".sqsh", ".squashfs", ".toml"))


def container_problems(cfg: dict) -> list[str]:
    """The container backend's files, checked from this machine (the login node): the EDF parses as TOML and
    the image it runs (``engine.container.image``, else the EDF's ``image``) exists where it is a local path;
    ``engine.container.env_file`` exists. A registry image or a named EDF is left to the container engine."""
    engine = cfg["engine"]
    if engine.get("backend") != "container":
        return []
    import tomllib

    container = engine.get("container") or {}
    problems = []
    image, image_field = container.get("image"), "engine.container.image"
    edf = container.get("edf")
    if edf and _local_path(str(edf)):
        p = _resolve(os.path.expanduser(os.path.expandvars(str(edf))))
        if not p.is_file():
            problems.append(f"field 'engine.container.edf': {edf} is not a file on this machine (checked from here, "
                            "e.g. the login node); give the Environment Definition File (.toml), e.g. "
                            "envs/clariden-vllm.toml")
        else:
            try:
                with open(p, "rb") as fh:
                    data = tomllib.load(fh)
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                problems.append(f"field 'engine.container.edf': {edf} does not parse as TOML ({exc}); fix the EDF "
                                "(https://docs.cscs.ch/software/container-engine/edf/), every deployment would fail "
                                "at srun --environment")
            else:
                if not image and isinstance(data.get("image"), str):
                    image, image_field = data["image"], f"image of {edf}"
    if image and _local_path(str(image)):
        p = Path(os.path.expanduser(os.path.expandvars(str(image))))
        if not p.is_file():
            problems.append(f"field '{image_field}': {image} does not exist on this machine (checked from here, e.g. "
                            "the login node: compute nodes see the same shared paths); give the squashfs image "
                            "(build it with `enroot import docker://<image>` on a compute node and keep the .sqsh on "
                            "a shared store)")
    env_file = container.get("env_file")
    if env_file and not _resolve(os.path.expanduser(os.path.expandvars(str(env_file)))).is_file():
        problems.append(f"field 'engine.container.env_file': {env_file} is not a file on this machine; give the "
                        "KEY=VALUE file of the server's variables (e.g. envs/clariden-vllm.env) or remove the field")
    return problems


def _profile_node_cpus(profile: str | Path | None) -> int | None:
    """CPUs a deployment job gets on a Slurm profile's node (``set-resources.<deploy rule>.cpus_per_task``)."""
    if not profile:
        return None
    from specstudy.study.cost import read_profile

    raw, _ = read_profile(profile)
    if raw.get("executor") != "slurm":
        return None
    cpus = [res.get("cpus_per_task") for rule, res in (raw.get("set-resources") or {}).items()
            if isinstance(res, dict) and rule.startswith(("deploy", "capacity"))]
    cpus = [c for c in cpus if isinstance(c, int)]
    return min(cpus) if cpus else None


def client_cpu_problems(cfg: dict, profile: str | Path | None = None) -> list[str]:
    cpus = (cfg.get("cells") or {}).get("client_cpus")
    if not cpus:
        return []
    node = _profile_node_cpus(profile)
    if node is not None:
        have, where = set(range(node)), f"a deployment job's node ({node} CPUs: cpus_per_task of {profile})"
    else:
        try:
            have = set(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            have = set(range(os.cpu_count() or 1))
        where = f"this machine (CPUs {_ranges(sorted(have))})"
    missing = sorted(set(cpus) - have)
    if missing:
        return [f"field 'cells.client_cpus': CPU(s) {missing} do not exist on {where}; pin the load generator to "
                f"CPUs it has, e.g. [{max(have)}], or set client_cpus: null"]
    return []


def _ranges(ids: list[int]) -> str:
    return f"{ids[0]}-{ids[-1]}" if ids and ids == list(range(ids[0], ids[-1] + 1)) else ",".join(map(str, ids))


def extension_arm_problems(cfg: dict) -> list[str]:
    arms = (cfg.get("extensions") or {}).get("arms")
    if not isinstance(arms, list):
        return []
    from specstudy.core import methods
    from specstudy.study import plan

    by_name = {a["name"]: a for a in plan.all_arms(cfg) + plan.variant_arms(cfg)}
    known = list(by_name)
    problems = []
    unregistered = [a for a in arms if isinstance(a, str) and methods.method_of_unknown_arm(a)]
    for a in unregistered:  # an arm of a method that is not registered: name the nearest registered method
        problems.append(f"{methods.unknown_method(methods.method_of_unknown_arm(a), 'extensions.arms')} (arm {a!r})")
    for a in arms:  # an arm the plan skips (the engine's recorded refusal, or declared unservable) is never deployed
        if a in by_name and not by_name[a]["servable"]:
            problems.append(f"field 'extensions.arms': {a!r} is skipped by this study's plan: {by_name[a]['skip_reason']}; "
                            f"remove it, or declare an engine that serves it")
    bad = [a for a in arms if a not in known and a not in unregistered]
    if not bad:
        return problems
    from rapidfuzz import process

    hints = []
    for a in bad:
        near = [m for m, _score, _ in process.extract(a, known, limit=2)]
        hints.append(f"{a!r} (nearest: {', '.join(near)})")
    return problems + [f"field 'extensions.arms': {'; '.join(hints)} not an arm of this study's factorial or its variants; "
                       f"use arm names from arms.methods × num_speculative_tokens or arms.variants ({', '.join(known)})"]


def method_probe_problems(cfg: dict, source: str) -> list[str]:
    """A listed method whose servability the engine's declared record must state (its registration names a
    probe entry) but does not: nothing would say whether this engine build serves it."""
    from specstudy.study.config import engine_builds
    from specstudy.study.engine_methods import load_record, methods_record_path, unprobed

    out = []
    for build, engine in engine_builds(cfg).items():  # in a study of several engine builds: each build's record
        one = {"engine": engine}
        record = engine.get("methods_record")
        missing = unprobed(one, cfg["arms"]["methods"])
        if not missing:
            continue
        probed = list(load_record(methods_record_path(one)).get("methods") or {})
        whose = f"engine build {build}'s" if build else "the engine's"
        out += [f"field 'arms.methods': method {name} has no entry in {whose} recorded probe {record}, so nothing "
                f"says whether this engine serves it; probe it (the record is written anew, so name its methods too): "
                f"`specstudy engine probe-methods --config {source} --methods {' '.join([*probed, *missing])} --out {record}`"
                for name in missing]
    return out


def check_study(cfg: dict, source: str, *, profile: str | Path | None = None, cpus: bool = True,
                digests: bool = False, datasets: bool = True) -> None:
    """Raise :class:`ConfigError` listing every machine-dependent problem of an already checked config.
    ``cpus=False`` where the deployments run on other nodes than this process and no profile says which
    (the workflow parsed under a cluster executor: ``check-config --profile`` checks them); ``digests``: read
    every dataset in full and compare its sha256 (``check-config``); ``datasets=False`` where the corpora
    are built already (a deployment job's own parse)."""
    problems = (engine_path_problems(cfg) + method_probe_problems(cfg, source) + container_problems(cfg)
                + (dataset_problems(cfg, digests=digests) if datasets else [])
                + (client_cpu_problems(cfg, profile) if cpus else []) + extension_arm_problems(cfg))
    if problems:
        raise ConfigError(f"{source}: the study cannot run as configured:\n  - " + "\n  - ".join(problems))
