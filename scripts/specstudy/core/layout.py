"""The results-path layout: every path under ``results/`` is built here and parsed back here.

Each kind of path is one template in :data:`TEMPLATES`, and each path prefix is named once (the way
snakemake-workflows/dna-seq-varlociraptor's ``rules/common.smk`` names its prefixes). A builder takes the keys
and returns the path, a parser takes a path and returns its keys, and both come from the same template.
Given wildcard patterns (``"{arm}"``, ``"{{arm}}"``) a builder returns a Snakemake pattern: rules/common.smk
builds every rule's input and output patterns with these functions, so the rules spell no path of their own.

Where a file's own keys and its path disagree, the keys written in the file are the source of truth: a
cell's path is derived from its summary's keys (:func:`cell_of_keys`), never its keys from the path. A
summary whose keys name another place is refused (:func:`specstudy.core.integrity.verify_place`), and it is
not quietly given the keys of the folder it was found in.

The tree (``<root>`` is ``results`` unless a caller gives another):

=====================================================================  ===========================================
``<root>/plan/<phase>.json``                                            a phase's ordered plan
``<root>/screen/prereg-lock.json``                                      the pre-registration lock
``<root>/<phase>/<arm>/<rep>/deployment.json``                          a deployment's record (rep<n>, drift<n>)
``<root>/<phase>/<arm>/<rep>/<workload>/c<concurrency>/summary.json``   a cell's summary
``<root>/<phase>/<arm>/<rep>/attempts/<deployment_id>/``                every attempt's raw artifacts
``<root>/deployment-failures/<phase>/<arm>/<rep>/<deployment_id>/``     a deployment that never became ready
``<root>/gates/<phase>/<arm>.json``                                     a greedy correctness gate
``<root>/selection/selection.json``, ``final-candidate.json``           the selection, the final candidate
``<root>/confirm/rounds/round<n>.json``                                 the checkpoint after a confirmation round
``<root>/capacity/<arm>/knee.json``                                     an arm's capacity search
``<root>/tables/<table>.parquet``                                       the tables
``<root>/report/``                                                      the report, its plots, the recommendation
``<root>/<phase>/summary.json``, ``section.md``                         an extension phase's summary and section
``<root>/corpora/<corpus>/<version>/corpus.json``                       a built corpus
``<root>/models/fixture/``, ``models/scale/``, ``models/mechanics/``    built models
``<root>/mechanics/``                                                   the mechanics point (random weights)
``<root>/logs/``, ``<root>/benchmarks/``                                every rule's log and benchmark
``<root>/.config/<name>.json``                                          the effective config
=====================================================================  ===========================================

Paths are ``str`` with ``/`` separators (what Snakemake patterns need); a caller wanting a
:class:`~pathlib.Path` wraps it. Parsing accepts ``str`` or ``Path`` and finds the root as whatever precedes
the template's segments (``results``, ``/tmp/x/results``, ``.``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

from specstudy.core.errors import UserError

#: The results root of a study run from its working directory.
ROOT = "results"

# ---------------------------------------------------------------------------------------------
# Prefixes (under the root) and file names, each named once
# ---------------------------------------------------------------------------------------------
PLAN = "plan"
GATES = "gates"
SELECTION = "selection"
CAPACITY = "capacity"
TABLES = "tables"
REPORT = "report"
CORPORA = "corpora"
MODELS = "models"
MECHANICS = "mechanics"
FAILURES = "deployment-failures"
LOGS = "logs"
BENCHMARKS = "benchmarks"
CONFIG = ".config"
CACHE = ".cache"  # caches shared by a study's jobs (full file hashes of weights and images)
ATTEMPTS = "attempts"

DEPLOYMENT_RECORD = "deployment.json"
CELL_SUMMARY = "summary.json"
ATTEMPT_RECORD = "record.json"
LAUNCH_LOG = "launch.log"  # the engine's own log, in each attempt folder
FAILURE_RECORD = "failure.json"
REQUESTS = "requests.jsonl"

# ---------------------------------------------------------------------------------------------
# The keys' spellings: Snakemake wildcard constraints and the parsers' patterns
# ---------------------------------------------------------------------------------------------
#: a repeat deployment (rep<n>)
REPEAT_PATTERN = r"rep[0-9]+"
#: an interleaved drift baseline (drift<n>)
DRIFT_PATTERN = r"drift[0-9]+"
#: either deployment label
REP_PATTERN = r"rep[0-9]+|drift[0-9]+"
PHASE_PATTERN = r"[a-z][a-z0-9_]*"
WORKLOAD_PATTERN = r"[a-z][a-z0-9_]*"
CONC_PATTERN = r"[0-9]+"
CORPUS_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
VERSION_PATTERN = r"[A-Za-z0-9._-]+"
#: an arm name, a mechanics label or a deployment id: one path segment (the arm names themselves: core.arms)
SEGMENT_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.+@-]*"

#: field -> (regex, how the field is spelt, for messages)
FIELDS: dict[str, tuple[str, str]] = {
    "phase": (PHASE_PATTERN, "a phase name (screen, confirm, sampling, ...)"),
    "arm": (SEGMENT_PATTERN, "an arm name (baseline, draft-k3-tp1, ngram-k3, ...) or mechanics label"),
    "rep": (REP_PATTERN, "rep<n> (a repeat) or drift<n> (a drift baseline)"),
    "workload": (WORKLOAD_PATTERN, "a workload name (lower case, digits, _)"),
    "concurrency": (CONC_PATTERN, "a whole number"),
    "deployment_id": (SEGMENT_PATTERN, "a deployment id"),
    "n": (r"[0-9]+", "a round number"),
    "table": (r"[a-z_]+", "a table name"),
    "corpus": (CORPUS_PATTERN, "a corpus name"),
    "version": (VERSION_PATTERN, "a corpus version"),
    "name": (r"[A-Za-z0-9._-]+", "a file name"),
    "role": (r"target|draft", "target or draft"),
}
_INT_FIELDS = ("concurrency", "n")


class LayoutError(UserError):
    """A path that is not the kind of results path asked for, or keys that cannot make one: the message
    names the path (or key), the expected pattern and what is wrong."""


# ---------------------------------------------------------------------------------------------
# Templates: one per kind of path (relative to the root)
# ---------------------------------------------------------------------------------------------
#: a deployment's folder, relative to the root (every deployment of every phase, the mechanics arms too)
_DEPLOYMENT = "{phase}/{arm}/{rep}"
#: a cell's folder, relative to its deployment's folder or to an attempt's
_CELL = "{workload}/c{concurrency}"

TEMPLATES: dict[str, str] = {
    "cell": f"{_DEPLOYMENT}/{_CELL}/{CELL_SUMMARY}",
    "cell_dir": f"{_DEPLOYMENT}/{_CELL}",
    "cell_rel": _CELL,
    "deployment": f"{_DEPLOYMENT}/{DEPLOYMENT_RECORD}",
    "deployment_dir": _DEPLOYMENT,
    "attempt": f"{_DEPLOYMENT}/{ATTEMPTS}/{{deployment_id}}",
    "attempt_cell_dir": f"{_DEPLOYMENT}/{ATTEMPTS}/{{deployment_id}}/{_CELL}",
    "failure": f"{FAILURES}/{_DEPLOYMENT}/{{deployment_id}}",
    "gate": f"{GATES}/{{phase}}/{{arm}}.json",
    "plan": f"{PLAN}/{{phase}}.json",
    "lock": "screen/prereg-lock.json",
    "selection": f"{SELECTION}/selection.json",
    "final_candidate": f"{SELECTION}/final-candidate.json",
    "round": "confirm/rounds/round{n}.json",
    "knee": f"{CAPACITY}/{{arm}}/knee.json",
    "capacity_dir": f"{CAPACITY}/{{arm}}",
    "table": f"{TABLES}/{{table}}.parquet",
    "report_file": f"{REPORT}/{{name}}",
    "phase_summary": f"{{phase}}/{CELL_SUMMARY}",
    "phase_section": "{phase}/section.md",
    "corpus": f"{CORPORA}/{{corpus}}/{{version}}/corpus.json",
    "corpus_dir": f"{CORPORA}/{{corpus}}/{{version}}",
    "deployment_log": f"{LOGS}/{_DEPLOYMENT}.log",
    "deployment_benchmark": f"{BENCHMARKS}/{_DEPLOYMENT}.tsv",
    "config": f"{CONFIG}/{{name}}.json",
    "hash_cache": f"{CACHE}/content-hashes.json",
    "mechanics_model": f"{MODELS}/{MECHANICS}/{{role}}/model.json",
    "mechanics_arm": f"{_DEPLOYMENT}/mechanics-arm.json",
}

_FIELD_RE = re.compile(r"\{([a-z_]+)\}")


def _is_pattern(value) -> bool:
    """A Snakemake wildcard (``{arm}``) or an escaped one (``{{arm}}``): passed through, never checked."""
    return isinstance(value, str) and "{" in value and "}" in value


def _segments(template: str) -> list[str]:
    return template.split("/")


def _segment_re(segment: str) -> re.Pattern:
    out, pos = [], 0
    for m in _FIELD_RE.finditer(segment):
        out.append(re.escape(segment[pos:m.start()]))
        out.append(f"(?P<{m[1]}>{FIELDS[m[1]][0]})")
        pos = m.end()
    out.append(re.escape(segment[pos:]))
    return re.compile("^(?:" + "".join(out) + ")$")


def _readable(template: str) -> str:
    return _FIELD_RE.sub(lambda m: f"<{m[1]}>", template)


def _check_value(kind: str, field: str, value) -> str:
    if _is_pattern(value):
        return value
    if field in _INT_FIELDS:
        if isinstance(value, bool):
            raise LayoutError(f"{kind} path: key {field!r} is {value!r}, not {FIELDS[field][1]}")
        try:
            as_int = int(value)
        except (TypeError, ValueError):
            raise LayoutError(f"{kind} path: key {field!r} is {value!r}, not {FIELDS[field][1]}") from None
        if as_int < 0 or (isinstance(value, float) and value != as_int):
            raise LayoutError(f"{kind} path: key {field!r} is {value!r}, not {FIELDS[field][1]}")
        return str(as_int)
    if field == "rep" and (isinstance(value, int) and not isinstance(value, bool)):
        value = rep_label(value)
    text = str(value) if value is not None else ""
    if not re.fullmatch(FIELDS[field][0], text):
        raise LayoutError(f"{kind} path: key {field!r} is {value!r}, not {FIELDS[field][1]} "
                          f"(pattern {FIELDS[field][0]})")
    return text


def build(kind: str, root: str | PurePath = ROOT, **keys) -> str:
    """The path of ``kind`` (a key of :data:`TEMPLATES`) under ``root`` from its keys; a key given as a
    wildcard (``"{arm}"``) stays one, so the result is a Snakemake pattern."""
    template = TEMPLATES[kind]
    fields = _FIELD_RE.findall(template)
    missing = [f for f in fields if f not in keys]
    extra = sorted(set(keys) - set(fields))
    if missing or extra:
        raise LayoutError(f"{kind} path ({_readable(template)}): "
                          + "; ".join(([f"missing key(s) {', '.join(missing)}"] if missing else [])
                                      + ([f"unknown key(s) {', '.join(extra)}"] if extra else [])))
    values = {f: _check_value(kind, f, keys[f]) for f in fields}
    rel = template.format(**values)
    root = str(root).replace("\\", "/").rstrip("/")
    return f"{root}/{rel}" if root else rel


def parse(kind: str, path: str | PurePath) -> dict:
    """The keys of a ``kind`` path (concurrency and round numbers as ``int``) and its ``root``: whatever
    precedes the template's segments. A path of another shape raises :class:`LayoutError` naming the path,
    the expected pattern and the first segment that does not fit."""
    template = TEMPLATES[kind]
    text = str(path).replace("\\", "/")
    while "//" in text:
        text = text.replace("//", "/")
    parts = text.rstrip("/").split("/") if text.strip("/") else []
    want = _segments(template)
    expected = f"<root>/{_readable(template)}"
    if len(parts) < len(want):
        raise LayoutError(f"{path}: not a {kind} path ({expected}): it has {len(parts)} path segment(s), "
                          f"the pattern needs {len(want)} after the root")
    tail = parts[len(parts) - len(want):]
    keys: dict = {}
    for seg, pat in zip(tail, want, strict=True):
        m = _segment_re(pat).match(seg)
        if not m:
            fields = _FIELD_RE.findall(pat)
            why = (f"{'; '.join(f'<{f}> is {FIELDS[f][1]}' for f in fields)}" if fields
                   else f"the pattern has {pat!r} there")
            raise LayoutError(f"{path}: not a {kind} path ({expected}): segment {seg!r} does not fit {_readable(pat)!r} "
                              f"({why})")
        keys.update(m.groupdict())
    for f in _INT_FIELDS:
        if f in keys:
            keys[f] = int(keys[f])
    root = "/".join(parts[:len(parts) - len(want)])
    keys["root"] = root if root or not text.startswith("/") else "/"
    return keys


def readable(kind: str, root: str | PurePath = ROOT) -> str:
    """The ``kind`` path as messages spell it: ``results/<phase>/<arm>/<rep>/...`` (``<root>`` for ``root=None``)."""
    rel = _readable(TEMPLATES[kind])
    return f"{'<root>' if root is None else str(root).rstrip('/')}/{rel}"


def glob_pattern(kind: str, root: str | PurePath = ROOT, **keys) -> str:
    """A glob of the ``kind`` paths under ``root``: each key given is fixed, every other one is a ``*``; what
    :func:`matches` then filters (a glob also finds names the key patterns refuse)."""
    template = TEMPLATES[kind]
    extra = sorted(set(keys) - set(_FIELD_RE.findall(template)))
    if extra:
        raise LayoutError(f"{kind} path ({_readable(template)}): unknown key(s) {', '.join(extra)}")
    rel = _FIELD_RE.sub(lambda m: _check_value(kind, m[1], keys[m[1]]) if m[1] in keys else "*", template)
    root = str(root).replace("\\", "/").rstrip("/")
    return f"{root}/{rel}" if root else rel


def matches(kind: str, path: str | PurePath) -> bool:
    """Whether ``path`` is a ``kind`` path."""
    try:
        parse(kind, path)
    except LayoutError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# Deployment labels
# ---------------------------------------------------------------------------------------------
def rep_label(rep: int | str) -> str:
    """``rep<n>`` of a repeat number; a label (``rep3``, ``drift1``) or a wildcard is returned as given."""
    if _is_pattern(rep):
        return rep
    if isinstance(rep, int) and not isinstance(rep, bool):
        return f"rep{rep}"
    text = str(rep)
    if text.isdigit():
        return f"rep{int(text)}"
    if not re.fullmatch(REP_PATTERN, text):
        raise LayoutError(f"deployment label {rep!r}: not {FIELDS['rep'][1]}")
    return text


def drift_label(n: int) -> str:
    return f"drift{int(n)}"


def rep_kind(label: str) -> str:
    """``drift`` for an interleaved drift baseline (drift<n>), ``repeat`` for rep<n>."""
    return "drift" if rep_label(label).startswith("drift") else "repeat"


def rep_number(label: int | str) -> int:
    """The number of a deployment label (``rep3`` -> 3, ``drift2`` -> 2)."""
    return int(re.sub(r"^(rep|drift)", "", rep_label(label)))


# ---------------------------------------------------------------------------------------------
# Deployments and cells
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Deployment:
    """One deployment's place: ``<root>/<phase>/<arm>/<rep>``."""

    phase: str
    arm: str
    rep: str  # the label: rep<n> | drift<n>
    root: str = ROOT

    @property
    def kind(self) -> str:
        return rep_kind(self.rep)

    @property
    def number(self) -> int:
        return rep_number(self.rep)

    @property
    def dir(self) -> str:
        return deployment_dir(self.phase, self.arm, self.rep, root=self.root)

    @property
    def record(self) -> str:
        return deployment_record(self.phase, self.arm, self.rep, root=self.root)

    def cell(self, workload: str, concurrency: int | str) -> Cell:
        return Cell(self.phase, self.arm, self.rep, workload, int(concurrency), self.root)


@dataclass(frozen=True)
class Cell:
    """One cell's place: ``<root>/<phase>/<arm>/<rep>/<workload>/c<concurrency>``."""

    phase: str
    arm: str
    rep: str
    workload: str
    concurrency: int
    root: str = ROOT

    @property
    def deployment(self) -> Deployment:
        return Deployment(self.phase, self.arm, self.rep, self.root)

    @property
    def summary(self) -> str:
        return cell_summary(self.phase, self.arm, self.rep, self.workload, self.concurrency, root=self.root)

    @property
    def dir(self) -> str:
        return cell_dir(self.phase, self.arm, self.rep, self.workload, self.concurrency, root=self.root)


def deployment_dir(phase, arm, rep, root=ROOT) -> str:
    return build("deployment_dir", root, phase=phase, arm=arm, rep=rep_label(rep))


def deployment_record(phase, arm, rep, root=ROOT) -> str:
    return build("deployment", root, phase=phase, arm=arm, rep=rep_label(rep))


def cell_summary(phase, arm, rep, workload, concurrency, root=ROOT) -> str:
    return build("cell", root, phase=phase, arm=arm, rep=rep_label(rep), workload=workload, concurrency=concurrency)


def cell_dir(phase, arm, rep, workload, concurrency, root=ROOT) -> str:
    return build("cell_dir", root, phase=phase, arm=arm, rep=rep_label(rep), workload=workload,
                 concurrency=concurrency)


def cell_rel(workload, concurrency) -> str:
    """``<workload>/c<concurrency>``: a cell's folder inside its deployment's folder (and inside an attempt)."""
    return build("cell_rel", "", workload=workload, concurrency=concurrency)


def attempt_dir(phase, arm, rep, deployment_id, root=ROOT) -> str:
    return build("attempt", root, phase=phase, arm=arm, rep=rep_label(rep), deployment_id=deployment_id)


def failure_dir(phase, arm, rep, deployment_id, root=ROOT) -> str:
    return build("failure", root, phase=phase, arm=arm, rep=rep_label(rep), deployment_id=deployment_id)


def parse_cell(path: str | PurePath) -> Cell:
    """The cell a ``.../<phase>/<arm>/<rep>/<workload>/c<c>/summary.json`` path names (never an attempt copy)."""
    k = parse("cell", path)
    if PurePath(str(path).replace("\\", "/")).parts[-7:-6] == (ATTEMPTS,) or k["arm"] == ATTEMPTS:
        raise LayoutError(f"{path}: an attempt's copy, not a declared cell summary "
                          f"(<root>/{_readable(TEMPLATES['cell'])})")
    return Cell(k["phase"], k["arm"], k["rep"], k["workload"], k["concurrency"], k["root"])


def parse_deployment(path: str | PurePath) -> Deployment:
    """The deployment a ``.../<phase>/<arm>/<rep>/deployment.json`` path names."""
    k = parse("deployment", path)
    return Deployment(k["phase"], k["arm"], k["rep"], k["root"])


def parse_deployment_dir(path: str | PurePath) -> Deployment:
    k = parse("deployment_dir", path)
    return Deployment(k["phase"], k["arm"], k["rep"], k["root"])


def cell_of_keys(keys, root=ROOT) -> Cell:
    """The cell a summary's ``keys`` name (a mapping or a typed record): the keys written in the file are the
    source of truth, the path is derived from them."""
    get = keys.get if isinstance(keys, dict) else (lambda k, default=None: getattr(keys, k, default))
    label = get("rep_label") or rep_label(get("rep"))
    cell = Cell(get("phase"), get("arm"), label, get("workload"), int(get("concurrency")), str(root))
    cell.summary  # noqa: B018  (checks every key)
    return cell


# ---------------------------------------------------------------------------------------------
# The study's other files
# ---------------------------------------------------------------------------------------------
def plan(phase, root=ROOT) -> str:
    return build("plan", root, phase=phase)


def prereg_lock(root=ROOT) -> str:
    return build("lock", root)


def gate(phase, arm, root=ROOT) -> str:
    return build("gate", root, phase=phase, arm=arm)


def selection(root=ROOT) -> str:
    return build("selection", root)


def final_candidate(root=ROOT) -> str:
    return build("final_candidate", root)


def confirm_round(n, root=ROOT) -> str:
    return build("round", root, n=n)


def confirm_rounds_dir(root=ROOT) -> str:
    """``<root>/confirm/rounds``: the confirmation checkpoints (:func:`confirm_round`)."""
    return _under(root, *_segments(TEMPLATES["round"])[:-1])


def capacity_dir(arm, root=ROOT) -> str:
    return build("capacity_dir", root, arm=arm)


def capacity_knee(arm, root=ROOT) -> str:
    return build("knee", root, arm=arm)


def tables_dir(root=ROOT) -> str:
    return _under(root, TABLES)


def table(name, root=ROOT) -> str:
    return build("table", root, table=name)


def report_dir(root=ROOT) -> str:
    return _under(root, REPORT)


def report_file(name, root=ROOT) -> str:
    return build("report_file", root, name=name)


def phase_summary(phase, root=ROOT) -> str:
    """An extension phase's summary (``<root>/<phase>/summary.json``)."""
    return build("phase_summary", root, phase=phase)


def phase_section(phase, root=ROOT) -> str:
    """An extension phase's report section (``<root>/<phase>/section.md``)."""
    return build("phase_section", root, phase=phase)


def phase_dir(phase, root=ROOT) -> str:
    return _under(root, _check_value("phase", "phase", phase))


def phase_file(phase, name, root=ROOT) -> str:
    """``<root>/<phase>/<name>``: a file or folder an extension phase's summary writes beside its summary
    (the sampling phase's ``gates/``)."""
    return _under(phase_dir(phase, root), name)


def corpora_dir(root=ROOT) -> str:
    return _under(root, CORPORA)


def corpus_dir(corpus, version, root=ROOT) -> str:
    return build("corpus_dir", root, corpus=corpus, version=version)


def corpus_json(corpus, version, root=ROOT) -> str:
    return build("corpus", root, corpus=corpus, version=version)


def failures_dir(root=ROOT) -> str:
    return _under(root, FAILURES)


def gates_dir(root=ROOT) -> str:
    return _under(root, GATES)


def config_file(name, root=ROOT) -> str:
    """The effective config ``<root>/.config/<name>.json`` (content-addressed)."""
    return build("config", root, name=name)


def hash_cache(root=ROOT) -> str:
    """``<root>/.cache/content-hashes.json``: full sha256 of weights and images by (path, size, mtime),
    shared by every deployment job (:mod:`specstudy.deployment.filehash`)."""
    return build("hash_cache", root)


def models_dir(*parts, root=ROOT) -> str:
    """``<root>/models/<parts...>`` (``fixture``, ``scale``, ``mechanics/<role>``)."""
    return _under(root, MODELS, *parts)


def mechanics_model(role, root=ROOT) -> str:
    return build("mechanics_model", root, role=role)


def mechanics_arm(label, root=ROOT) -> str:
    """A mechanics arm's record: ``<root>/mechanics/<label>/rep1/mechanics-arm.json`` (one deployment per arm)."""
    return build("mechanics_arm", root, phase=MECHANICS, arm=label, rep=rep_label(1))


def mechanics_dir(*parts, root=ROOT) -> str:
    """``<root>/mechanics/<parts...>``."""
    return _under(root, MECHANICS, *parts)


def log(*parts, root=ROOT) -> str:
    """``<root>/logs/<parts...>.log``: a rule's log."""
    return _under(root, LOGS, *parts) + ".log"


def benchmark(*parts, root=ROOT) -> str:
    """``<root>/benchmarks/<parts...>.tsv``: a rule's benchmark."""
    return _under(root, BENCHMARKS, *parts) + ".tsv"


def deployment_log(phase, arm, rep, root=ROOT) -> str:
    return build("deployment_log", root, phase=phase, arm=arm, rep=rep_label(rep))


def deployment_benchmark(phase, arm, rep, root=ROOT) -> str:
    return build("deployment_benchmark", root, phase=phase, arm=arm, rep=rep_label(rep))


def _under(root, *parts) -> str:
    for p in parts:
        if not _is_pattern(p) and not str(p).strip("/"):
            raise LayoutError(f"path segment {p!r} under {root}: empty")
    root = str(root).replace("\\", "/").rstrip("/")
    rel = "/".join(str(p).strip("/") for p in parts)
    return f"{root}/{rel}" if root else rel
