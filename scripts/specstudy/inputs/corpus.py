"""Versioned, deterministic workload corpora.

A corpus spec (YAML, schema ``corpus-spec``) names one source file or directory, its format,
sha256 and license, a sampling seed and count, an input-length window, an instruction template and
a per-prompt output cap. ``build`` turns it into ``<out>/<name>/<version>/``:

- ``prompts.jsonl``: ``{"prompt_id", "stratum", "messages", "max_tokens"}`` per line; file order is
  the request order.
- ``corpus.json``: name, version, ``digest``, the spec, sources (path, sha256, license), count, the
  selection report (pool size, skipped malformed rows, documents rejected by the window).
- ``token_stats.json``: min/median/p95/max input tokens per stratum, measured with the target
  model's tokenizer with its chat template applied (``available: false`` without a tokenizer).

Determinism: candidates are ordered by ``sha256(f"{seed}\\0{row}\\0{source_id}")`` and taken in that
order until ``count`` pass the filters, so the same spec and source always give byte-identical
output, independent of the Python version. The digest is the sha256 of a canonical JSON
serialization of the prompts (in order, with caps) together with the template, seed, filters,
importer options and source hashes (see ``digest_basis`` in ``corpus.json``).

Heavy imports (transformers) happen inside functions only.

Kept as one module (over ~700 lines): the spec, the importers, the deterministic build and the digest check
are one thing, a corpus and what its digest covers (importer options, template, filters, seed, sources);
split, the digest basis would sit apart from the code that produces what it hashes.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from specstudy.core import atomic, schemas
from specstudy.core.stat_util import percentile

FORMATS = ("sharegpt_json", "task_jsonl", "documents_text_dir", "documents_jsonl", "chat_jsonl")
DIGEST_VERSION = 1
CORPUS_SCHEMA = "specstudy.corpus/1"
STATS_SCHEMA = "specstudy.token-stats/1"
MAX_REPORTED_REJECTIONS = 50
CHARS_PER_TOKEN_ESTIMATE = 4
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_ROLE_MAP = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "chatgpt": "assistant",
             "bard": "assistant", "bing": "assistant", "model": "assistant", "system": "system"}


class CorpusError(ValueError):
    """Bad spec or source; the message names the file, the row or field, and the fix."""


class CorpusMismatchError(CorpusError):
    """A built corpus does not have the expected digest (or its files were modified)."""


# --------------------------------------------------------------------------------------------- utils

def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def dir_sha256(path: str | os.PathLike, pattern: str = "*.txt") -> str:
    """sha256 over the sorted lines ``<sha256 of file>  <relative path>`` of the matching files
    (the same lines ``cd DIR && sha256sum <files> | sort -k2`` prints, joined with newlines)."""
    root = Path(path)
    files = sorted(p for p in root.glob(pattern) if p.is_file())
    lines = [f"{atomic.sha256_file(p)}  {p.relative_to(root).as_posix()}" for p in files]
    return sha256_bytes(("\n".join(lines) + "\n").encode("utf-8"))


def source_sha256(path: Path, fmt: str, options: dict) -> str:
    if fmt == "documents_text_dir":
        return dir_sha256(path, options.get("glob", "*.txt"))
    return atomic.sha256_file(path)


def _open_text(path: Path):
    if path.suffix == ".gz":
        with open(path, "rb") as fh:
            magic = fh.read(2)
        if magic != b"\x1f\x8b":
            raise CorpusError(f"{path}: not a gzip file (it ends in .gz but does not start with the gzip magic bytes); "
                              "compress it with `gzip` or drop the .gz suffix (and update source.path and sha256)")
        return _CheckedText(gzip.open(path, "rb"), path)
    return _CheckedText(open(path, "rb"), path)


class _CheckedText:
    """A UTF-8 text file read line by line, whose decoding errors (a Latin-1 byte, a damaged gzip stream)
    name the file and the line."""

    def __init__(self, fh, path: Path):
        self.fh, self.path, self.line = fh, path, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.fh.close()

    def __iter__(self):
        while True:
            try:
                raw = self.fh.readline()
            except (EOFError, OSError) as exc:  # gzip.BadGzipFile is an OSError
                raise CorpusError(f"{self.path}: line {self.line + 1}: the gzip stream is damaged ({exc}); re-download "
                                  "or re-compress the dataset") from None
            if not raw:
                return
            self.line += 1
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{self.path}: line {self.line}: byte 0x{raw[exc.start]:02x} is not UTF-8; re-encode "
                                  "the dataset as UTF-8 (e.g. iconv -f latin1 -t utf-8) and update source.sha256") from None

    def read(self):
        return "".join(self)


def _log(msg: str) -> None:
    print(f"[corpus] {msg}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------- spec

def load_spec(path: str | os.PathLike) -> dict:
    """Read and schema-validate a corpus spec; also checks the template placeholders."""
    from specstudy.core.studyyaml import StudyYamlError, load

    path = Path(path)
    if not path.exists():
        raise CorpusError(f"{path}: corpus spec not found; pass an existing file to --spec (see corpora/embedded/*.yaml)")
    if path.is_dir():
        raise CorpusError(f"{path}: is a directory; --spec (and corpora.workloads.<name>) names one corpus spec file, "
                          "e.g. corpora/embedded/code.yaml")
    try:  # specstudy's reader: file and line for a YAML error, a duplicate key or a non-UTF-8 byte
        spec = load(path, "corpus spec")
    except StudyYamlError as exc:
        raise CorpusError(str(exc)) from None
    try:
        schemas.validate(spec, "corpus-spec", path)
    except schemas.ValidationError as exc:
        raise CorpusError(str(exc)) from exc
    template = spec.get("template")
    needed = {"task_jsonl": "{prompt}", "documents_text_dir": "{document}", "documents_jsonl": "{document}"}.get(
        spec["format"])
    if needed and template is not None and needed not in template:
        raise CorpusError(f"{path}: field 'template' must contain {needed} for format {spec['format']} "
                          f"(got {template!r})")
    if template is not None:
        try:
            template.format_map(_AnyFields())
        except (ValueError, IndexError) as exc:
            raise CorpusError(f"{path}: field 'template' is not a valid format string ({exc}); "
                              "write literal braces as {{ and }}") from exc
    window = (spec.get("filters") or {}).get("input_tokens")
    if window and window.get("min", 0) > window.get("max", math.inf):
        raise CorpusError(f"{path}: filters.input_tokens.min ({window['min']}) > max ({window['max']})")
    return spec


class _AnyFields(dict):
    def __missing__(self, key):
        return ""


def resolve_source_path(spec: dict, spec_path: str | os.PathLike) -> Path:
    raw = spec["source"]["path"]
    for var in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", raw):
        name = var[0] or var[1]
        if name not in os.environ:
            raise CorpusError(f"{spec_path}: field 'source.path' uses ${{{name}}} but the environment variable "
                              f"{name} is not set; export it (e.g. export {name}=/path/to/datasets) or write an "
                              "absolute path")
    expanded = Path(os.path.expanduser(os.path.expandvars(raw)))
    if not expanded.is_absolute():
        expanded = Path(spec_path).resolve().parent / expanded
    return expanded


def check_source(spec: dict, spec_path: str | os.PathLike) -> tuple[Path, str]:
    """Resolve the source, check it exists and matches the declared sha256; return (path, sha256)."""
    path = resolve_source_path(spec, spec_path)
    fmt = spec["format"]
    options = spec.get("options") or {}
    if not path.exists():
        hint = ""
        if spec["source"].get("obtain"):
            hint = f" Obtain it as described: {spec['source']['obtain']}."
        raise CorpusError(f"{spec_path}: field 'source.path': {path} does not exist. Place the dataset there or "
                          f"edit source.path.{hint} Nothing is downloaded at run time.")
    if fmt == "documents_text_dir" and not path.is_dir():
        raise CorpusError(f"{spec_path}: field 'source.path': {path} must be a directory for format documents_text_dir")
    if fmt != "documents_text_dir" and not path.is_file():
        raise CorpusError(f"{spec_path}: field 'source.path': {path} must be a file for format {fmt}")
    actual = source_sha256(path, fmt, options)
    declared = str(spec["source"]["sha256"]).lower()
    if not _SHA_RE.match(declared):
        raise CorpusError(f"{spec_path}: field 'source.sha256' is a placeholder ({spec['source']['sha256']!r}); "
                          f"the file at {path} has sha256 {actual} — check it is the dataset you intend and "
                          "write that value into the spec")
    if declared != actual:
        raise CorpusError(f"{spec_path}: field 'source.sha256' does not match {path}: declared {declared}, actual "
                          f"{actual}. If the data changed on purpose, bump 'version' and write the new sha256; "
                          "otherwise restore the original file")
    return path, actual


# ------------------------------------------------------------------------------------------ importers
# Each importer returns (items, malformed) where an item is
#   {"source_id": str, "row": int, "where": "file:row", "messages": [...], "stratum": str | None}
# and malformed is a list of {"where", "reason"}. Template application happens here.

class _Malformed(Exception):
    pass


def _fill(template: str | None, default: str, values: dict, where: str) -> str:
    template = default if template is None else template
    try:
        return template.format_map(values)
    except KeyError as exc:
        raise CorpusError(f"{where}: template placeholder {{{exc.args[0]}}} has no value in this row "
                          f"(available: {', '.join(sorted(values))}); fix the spec's 'template'") from exc


def _stringify(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in value)
    return "" if value is None else str(value)


def _with_system(messages: list[dict], system_prompt: str | None) -> list[dict]:
    if system_prompt and not (messages and messages[0]["role"] == "system"):
        return [{"role": "system", "content": system_prompt}, *messages]
    return messages


def _check_messages(messages: Any) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise _Malformed("'messages' must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or set(m) - {"role", "content", "name"} or "role" not in m or "content" not in m:
            raise _Malformed(f"messages[{i}] must be an object with 'role' and 'content'")
        if m["role"] not in ("system", "user", "assistant"):
            raise _Malformed(f"messages[{i}].role is {m['role']!r}; use system, user or assistant")
        if not isinstance(m["content"], str) or not m["content"].strip():
            raise _Malformed(f"messages[{i}].content must be a non-empty string")
        if m["role"] == "system" and i != 0:
            raise _Malformed(f"messages[{i}]: a system message may only come first")
        out.append({"role": m["role"], "content": m["content"]})
    body = [m for m in out if m["role"] != "system"]
    if not body or body[-1]["role"] != "user":
        raise _Malformed("the last message must have role 'user' (the request the model answers)")
    for a, b in zip(body, body[1:], strict=False):
        if a["role"] == b["role"]:
            raise _Malformed("user and assistant messages must alternate")
    return out


def _read_jsonl(path: Path) -> list[tuple[int, Any, str | None]]:
    rows = []
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line), None))
            except json.JSONDecodeError as exc:
                rows.append((lineno, None, f"not valid JSON ({exc.msg} at column {exc.colno})"))
    return rows


def _check_row(row: Any, err: str | None, needs: str = "") -> None:
    """A line of a JSONL source (:func:`_read_jsonl`) is a JSON object, or the line is malformed."""
    if err:
        raise _Malformed(err)
    if not isinstance(row, dict):
        raise _Malformed(f"each line must be a JSON object{needs}")


def _template_last(messages: list[dict], spec: dict, where: str) -> list[dict]:
    """The spec's ``template`` (placeholder ``{message}``) applied to the last message; none: as they are."""
    if spec.get("template") is None:
        return messages
    last = dict(messages[-1])
    last["content"] = _fill(spec["template"], "{message}", {"message": last["content"]}, where)
    return [*messages[:-1], last]


def import_sharegpt(path: Path, spec: dict) -> tuple[list[dict], list[dict]]:
    """ShareGPT-style JSON: a list of ``{"id", "conversations": [{"from", "value"}, ...]}``.

    ``options.conversation_mode``: ``first_turn`` (default; optional system turn + first user turn) or
    ``full_history`` (every turn up to and including the last user turn). ``template`` (placeholder
    ``{message}``) is applied to the final user message.
    """
    options = spec.get("options") or {}
    mode = options.get("conversation_mode", "first_turn")
    try:
        with _open_text(path) as fh:
            data = json.load(fh)
    except json.JSONDecodeError as exc:
        raise CorpusError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno}); expected a ShareGPT-style list "
                          "of conversations") from exc
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        data = data["data"]
    if not isinstance(data, list):
        raise CorpusError(f"{path}: expected a JSON list of conversations (ShareGPT style), got {type(data).__name__}")
    items, malformed = [], []
    for index, conv in enumerate(data):
        where = f"{path}: conversation #{index}"
        try:
            if not isinstance(conv, dict):
                raise _Malformed("each entry must be an object with 'conversations'")
            turns = conv.get("conversations", conv.get("messages"))
            if not isinstance(turns, list) or not turns:
                raise _Malformed("field 'conversations' must be a non-empty list")
            sid = str(conv.get("id", index))
            where = f"{path}: conversation #{index} (id {sid})"
            messages = []
            for t_i, turn in enumerate(turns):
                if not isinstance(turn, dict):
                    raise _Malformed(f"conversations[{t_i}] must be an object")
                role = turn.get("from", turn.get("role"))
                value = turn.get("value", turn.get("content"))
                if role not in _ROLE_MAP:
                    raise _Malformed(f"conversations[{t_i}].from is {role!r}; expected human/gpt/system")
                messages.append({"role": _ROLE_MAP[role], "content": value})
            if mode == "first_turn":
                head = [messages[0]] if messages[0]["role"] == "system" else []
                users = [m for m in messages if m["role"] == "user"]
                if not users:
                    raise _Malformed("no human turn")
                messages = head + [users[0]]
            else:
                last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
                if last_user is None:
                    raise _Malformed("no human turn")
                messages = messages[: last_user + 1]
            messages = _check_messages(messages)
        except _Malformed as exc:
            malformed.append({"where": where, "reason": str(exc)})
            continue
        messages = _template_last(messages, spec, where)
        items.append({"source_id": sid, "row": index, "where": where,
                      "messages": _with_system(messages, spec.get("system_prompt")), "stratum": None})
    return items, malformed


def import_tasks(path: Path, spec: dict) -> tuple[list[dict], list[dict]]:
    """HumanEval/MBPP-style JSONL (optionally .gz). ``options.prompt_field`` (default ``prompt``,
    MBPP: ``text``) and ``options.id_field`` (default ``task_id``). Every string/list field of the row
    is available to the template (e.g. ``{prompt}``, ``{entry_point}``, ``{test_list}``)."""
    options = spec.get("options") or {}
    prompt_field = options.get("prompt_field", "prompt")
    id_field = options.get("id_field", "task_id")
    items, malformed = [], []
    for lineno, row, err in _read_jsonl(path):
        where = f"{path}: line {lineno}"
        try:
            _check_row(row, err)
            prompt = row.get(prompt_field)
            if not isinstance(prompt, str) or not prompt.strip():
                raise _Malformed(f"field '{prompt_field}' must be a non-empty string (set options.prompt_field "
                                 "if your dataset names it differently, e.g. 'text' for MBPP)")
            if id_field not in row:
                raise _Malformed(f"field '{id_field}' is missing (set options.id_field)")
        except _Malformed as exc:
            malformed.append({"where": where, "reason": str(exc)})
            continue
        values = {k: _stringify(v) for k, v in row.items() if isinstance(v, str | list | int | float)}
        values["prompt"] = prompt
        content = _fill(spec.get("template"), "{prompt}", values, where)
        messages = [{"role": "user", "content": content}]
        items.append({"source_id": str(row[id_field]), "row": lineno, "where": where,
                      "messages": _with_system(messages, spec.get("system_prompt")), "stratum": None})
    return items, malformed


def _document_item(text: str, sid: str, row: int, where: str, spec: dict, extra: dict) -> dict:
    if not text.strip():
        raise _Malformed("the document is empty")
    values = {**extra, "document": text.strip(), "doc_id": sid}
    content = _fill(spec.get("template"), "{document}", values, where)
    messages = [{"role": "user", "content": content}]
    return {"source_id": sid, "row": row, "where": where,
            "messages": _with_system(messages, spec.get("system_prompt")), "stratum": None}


def import_documents_dir(path: Path, spec: dict) -> tuple[list[dict], list[dict]]:
    """A directory of plain-text documents (``options.glob``, default ``*.txt``), in sorted path order.
    The template gets ``{document}`` and ``{doc_id}`` (relative path without suffix)."""
    pattern = (spec.get("options") or {}).get("glob", "*.txt")
    files = sorted(p for p in path.glob(pattern) if p.is_file())
    items, malformed = [], []
    for index, file in enumerate(files):
        sid = file.relative_to(path).with_suffix("").as_posix()
        where = str(file)
        try:
            try:
                text = file.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise _Malformed(f"not UTF-8 text ({exc.reason} at byte {exc.start}); re-encode it as UTF-8") from exc
            items.append(_document_item(text, sid, index, where, spec, {}))
        except _Malformed as exc:
            malformed.append({"where": where, "reason": str(exc)})
    return items, malformed


def import_documents_jsonl(path: Path, spec: dict) -> tuple[list[dict], list[dict]]:
    """JSONL (optionally .gz) documents: ``options.text_field`` (default ``text``; GovReport: ``report``,
    arXiv summarization: ``article``) and ``options.id_field`` (default ``id``; the line number when absent)."""
    options = spec.get("options") or {}
    text_field = options.get("text_field", "text")
    id_field = options.get("id_field", "id")
    items, malformed = [], []
    for lineno, row, err in _read_jsonl(path):
        where = f"{path}: line {lineno}"
        try:
            _check_row(row, err)
            text = row.get(text_field)
            if isinstance(text, list):
                text = "\n".join(map(str, text))
            if not isinstance(text, str):
                raise _Malformed(f"field '{text_field}' must be a string (set options.text_field to the field that "
                                 "holds the document)")
            sid = str(row.get(id_field, f"line{lineno}"))
            extra = {k: _stringify(v) for k, v in row.items() if isinstance(v, str) and k != text_field}
            items.append(_document_item(text, sid, lineno, where, spec, extra))
        except _Malformed as exc:
            malformed.append({"where": where, "reason": str(exc)})
    return items, malformed


def import_chat_jsonl(path: Path, spec: dict) -> tuple[list[dict], list[dict]]:
    """JSONL of ready chat requests: ``{"id", "messages": [...], "stratum"?}``. A row's ``stratum``
    (e.g. in the smoke set) overrides the spec's. ``template`` (``{message}``) wraps the last user message."""
    items, malformed = [], []
    for lineno, row, err in _read_jsonl(path):
        where = f"{path}: line {lineno}"
        try:
            _check_row(row, err, " with 'messages'")
            messages = _check_messages(row.get("messages"))
            stratum = row.get("stratum")
            if stratum is not None and not (isinstance(stratum, str) and re.match(r"^[a-z][a-z0-9_]*$", stratum)):
                raise _Malformed(f"field 'stratum' is {stratum!r}; use a name matching [a-z][a-z0-9_]*")
        except _Malformed as exc:
            malformed.append({"where": where, "reason": str(exc)})
            continue
        messages = _template_last(messages, spec, where)
        items.append({"source_id": str(row.get("id", f"line{lineno}")), "row": lineno, "where": where,
                      "messages": _with_system(messages, spec.get("system_prompt")), "stratum": stratum})
    return items, malformed


IMPORTERS = {
    "sharegpt_json": import_sharegpt,
    "task_jsonl": import_tasks,
    "documents_text_dir": import_documents_dir,
    "documents_jsonl": import_documents_jsonl,
    "chat_jsonl": import_chat_jsonl,
}


# ------------------------------------------------------------------------------------------ tokenizer

class TokenCounter:
    """Counts input tokens of a chat request with the target model's tokenizer and chat template."""

    def __init__(self, path: str | os.PathLike):
        from transformers import AutoTokenizer

        self.path = str(path)
        if not Path(path).exists():
            raise CorpusError(f"--tokenizer {path}: directory does not exist; pass the target model's directory "
                              "(or omit --tokenizer to build without token statistics)")
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any loader failure is a user-facing input problem
            raise CorpusError(f"--tokenizer {path}: cannot load a tokenizer from this directory ({exc}); it must "
                              "contain tokenizer.json / tokenizer_config.json") from exc
        self.has_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        self.measure = "chat_template" if self.has_chat_template else "plain_concatenation_no_chat_template"

    def count(self, messages: list[dict]) -> int:
        if self.has_chat_template:
            ids = self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                                     return_dict=False)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return len(ids)
        text = "\n".join(m["content"] for m in messages)
        return len(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def describe(self) -> dict:
        return {"path": self.path, "class": type(self.tokenizer).__name__, "measure": self.measure,
                "vocab_size": len(self.tokenizer)}


def estimate_tokens(messages: list[dict]) -> int:
    chars = sum(len(m["content"]) for m in messages)
    return math.ceil(chars / CHARS_PER_TOKEN_ESTIMATE)


def token_summary(values: list[int]) -> dict:
    s = sorted(values)
    return {"count": len(s), "min": s[0], "median": statistics.median(s), "p95": percentile(s, 95, method="nearest_rank"),
            "max": s[-1], "mean": round(sum(s) / len(s), 3)}


# ---------------------------------------------------------------------------------------------- build

def order_key(seed: int, item: dict) -> str:
    return sha256_bytes(f"{seed}\0{item['row']}\0{item['source_id']}".encode())


def compute_digest(basis: dict, prompts: list[dict]) -> str:
    material = {"digest_version": DIGEST_VERSION, "basis": basis, "prompts": prompts}
    return sha256_bytes(canonical_json(material).encode("utf-8"))


def build(spec_path: str | os.PathLike, out_root: str | os.PathLike, tokenizer: str | os.PathLike | None = None,
          *, counter: TokenCounter | None = None) -> Path:
    """Build the corpus described by ``spec_path`` under ``out_root``; return the corpus directory."""
    spec = load_spec(spec_path)
    src_path, src_sha = check_source(spec, spec_path)
    fmt = spec["format"]
    stratum = spec.get("stratum", spec["name"])
    prefix = spec.get("id_prefix", stratum)
    options = spec.get("options") or {}
    on_malformed = options.get("on_malformed", "fail")
    sampling = spec["sampling"]
    seed, count, allow_fewer = sampling["seed"], sampling["count"], sampling.get("allow_fewer", False)
    filters = spec.get("filters") or {}
    window = filters.get("input_tokens")
    on_out = filters.get("on_out_of_window", "reject")

    src_path = src_path.resolve()
    items, malformed = IMPORTERS[fmt](src_path, spec)
    if malformed:
        if on_malformed == "fail":
            first = malformed[0]
            more = f" (and {len(malformed) - 1} more malformed rows)" if len(malformed) > 1 else ""
            raise CorpusError(f"{first['where']}: malformed row: {first['reason']}{more}. Fix the row, or set "
                              f"options.on_malformed: skip in {spec_path} to skip such rows (they are counted in "
                              "corpus.json)")
        _log(f"{spec_path}: skipped {len(malformed)} malformed rows (options.on_malformed: skip)")
    if not items:
        raise CorpusError(f"{src_path}: no usable rows for format {fmt} (empty stratum '{stratum}'); check "
                          f"source.path and format in {spec_path}")
    first_at: dict[str, str] = {}
    for item in items:  # a dataset concatenated twice would sample the same prompt twice
        key = canonical_json([item["source_id"], item["messages"]])
        if key in first_at:
            raise CorpusError(f"{item['where']}: duplicate row: id {item['source_id']!r} with the same prompt as "
                              f"{first_at[key]}; remove the repeated rows (a file concatenated twice?) and update "
                              f"source.sha256 in {spec_path}")
        first_at[key] = item["where"].rsplit(": ", 1)[-1]

    if counter is None and tokenizer is not None:
        counter = TokenCounter(tokenizer)
    measure = "none"
    if window:
        measure = counter.measure if counter else f"estimate_chars_div_{CHARS_PER_TOKEN_ESTIMATE}"
        if counter is None:
            _log(f"{spec_path}: no --tokenizer given; the input window is checked with an estimate "
                 f"(characters/{CHARS_PER_TOKEN_ESTIMATE}). Pass the target model's tokenizer for exact filtering.")

    def length(item: dict) -> int:
        if "_tokens" not in item:
            item["_tokens"] = counter.count(item["messages"]) if counter else estimate_tokens(item["messages"])
        return item["_tokens"]

    ordered = sorted(items, key=lambda it: order_key(seed, it))
    chosen, rejected = [], []
    for item in ordered:  # every row is measured so that the rejection report covers the whole source
        if window:
            n = length(item)
            lo, hi = window.get("min", 0), window.get("max", math.inf)
            if not lo <= n <= hi:
                if on_out == "fail":
                    raise CorpusError(f"{item['where']}: input is {n} tokens ({measure}), outside the window "
                                      f"[{lo}, {hi}] of filters.input_tokens in {spec_path}; remove the document, "
                                      "widen the window, or set filters.on_out_of_window: reject")
                rejected.append({"source_id": item["source_id"], "where": item["where"], "input_tokens": n,
                                 "reason": "below_window" if n < lo else "above_window"})
                continue
        chosen.append(item)
    examined = len(chosen) + len(rejected)
    chosen = chosen[:count]
    if rejected:
        _log(f"{spec_path}: rejected {len(rejected)} of {examined} rows outside the "
             f"input window {window} ({measure})")
    if not chosen:
        raise CorpusError(f"{spec_path}: stratum '{stratum}' is empty: all {len(rejected)} rows of {src_path} "
                          f"are outside filters.input_tokens {window} ({measure}); widen the window or use "
                          "longer/shorter documents")
    if len(chosen) < count and not allow_fewer:
        detail = f"{len(items)} usable rows" + (f", {len(rejected)} rejected by the input window {window}"
                                                if rejected else "")
        examples = "; ".join(f"{r['where']} ({r['input_tokens']} tokens)" for r in rejected[:5])
        raise CorpusError(f"{spec_path}: sampling.count is {count} but only {len(chosen)} rows qualify ({detail}"
                          f"{': ' + examples if examples else ''}). Lower sampling.count, widen "
                          "filters.input_tokens, or set sampling.allow_fewer: true")

    # reports in corpus.json name the source as written in the spec, so the bytes do not depend on
    # where the repository is checked out
    def _portable(rec: dict) -> dict:
        return {**rec, "where": rec["where"].replace(str(src_path), spec["source"]["path"], 1)}

    malformed = [_portable(r) for r in malformed]
    rejected = [_portable(r) for r in rejected]

    prompts = []
    for i, item in enumerate(chosen):
        prompts.append({"prompt_id": f"{prefix}-{i:04d}", "stratum": item["stratum"] or stratum,
                        "messages": item["messages"], "max_tokens": spec["max_tokens"]})

    source_rec = {"path": spec["source"]["path"], "sha256": src_sha, "license": spec["source"]["license"],
                  "bundled": bool(spec["source"].get("bundled", False))}
    basis = {"format": fmt, "stratum": stratum, "id_prefix": prefix, "template": spec.get("template"),
             "system_prompt": spec.get("system_prompt"), "seed": seed, "count": count,
             "max_tokens": spec["max_tokens"], "filters": filters, "options": options,
             "window_measure": measure, "sources": [{"sha256": src_sha}]}
    digest = compute_digest(basis, prompts)

    out_dir = Path(out_root) / spec["name"] / spec["version"]
    prompts_text = "".join(canonical_json(p) + "\n" for p in prompts)
    corpus = {
        "schema": CORPUS_SCHEMA,
        "name": spec["name"],
        "version": spec["version"],
        "digest": digest,
        "stratum": stratum,
        "count": len(prompts),
        "spec": spec,
        "sources": [source_rec],
        "digest_basis": basis,
        "prompts_sha256": sha256_bytes(prompts_text.encode("utf-8")),
        "items": [{"prompt_id": p["prompt_id"], "source_id": it["source_id"]} for p, it in zip(prompts, chosen,
                                                                                               strict=True)],
        "selection": {
            "pool": len(items),
            "malformed_skipped": len(malformed),
            "malformed_examples": malformed[:MAX_REPORTED_REJECTIONS],
            "examined": examined,
            "rejected_out_of_window": len(rejected),
            "rejected_examples": rejected[:MAX_REPORTED_REJECTIONS],
            "window_measure": measure,
            "fewer_than_requested": len(chosen) < count,
        },
    }
    try:
        schemas.validate(corpus, "corpus", out_dir / "corpus.json")
    except schemas.ValidationError as exc:  # a bug in this module, not user input
        raise RuntimeError(str(exc)) from exc

    stats = token_stats(prompts, counter)
    atomic.write_text(out_dir / "prompts.jsonl", prompts_text)
    atomic.write_json(out_dir / "token_stats.json", stats)
    atomic.write_json(out_dir / "corpus.json", corpus)
    return out_dir


def token_stats(prompts: list[dict], counter: TokenCounter | None) -> dict:
    if counter is None:
        return {"schema": STATS_SCHEMA, "available": False,
                "reason": "no tokenizer given (specstudy corpus build --tokenizer <target model dir>)",
                "tokenizer": None, "strata": {}, "per_prompt": {}}
    per_prompt = {p["prompt_id"]: counter.count(p["messages"]) for p in prompts}
    strata: dict[str, list[int]] = {}
    for p in prompts:
        strata.setdefault(p["stratum"], []).append(per_prompt[p["prompt_id"]])
    return {
        "schema": STATS_SCHEMA,
        "available": True,
        "reason": None,
        "tokenizer": counter.describe(),
        "strata": {name: token_summary(v) for name, v in sorted(strata.items())},
        "all": token_summary(list(per_prompt.values())),
        "max_input_plus_max_tokens": max(per_prompt[p["prompt_id"]] + p["max_tokens"] for p in prompts),
        "per_prompt": per_prompt,
    }


# ------------------------------------------------------------------------------------- read / verify

def _corpus_json_path(corpus_dir: str | os.PathLike) -> Path:
    p = Path(corpus_dir)
    return p if p.name == "corpus.json" else p / "corpus.json"


def load_corpus(corpus_dir: str | os.PathLike) -> dict:
    path = _corpus_json_path(corpus_dir)
    if Path(corpus_dir).is_file() and path != Path(corpus_dir):
        raise CorpusError(f"{corpus_dir}: a file, not a corpus directory or its corpus.json; give the directory "
                          "results/corpora/<name>/<version>/ that `specstudy corpus build` wrote")
    if not path.exists():
        raise CorpusError(f"{path}: corpus.json not found; build it with `specstudy corpus build --spec <spec>`")
    try:
        return atomic.read_json(path)
    except atomic.BadFile:
        head = path.read_text(encoding="utf-8", errors="replace")[:4000]
        if "specstudy.corpus-spec" in head or ("format:" in head and "source:" in head):
            raise CorpusError(f"{path}: this is a corpus spec (YAML), not a built corpus.json; build the corpus with "
                              f"`specstudy corpus build --spec {path}` and pass its output directory") from None
        raise


def load_prompts(corpus_dir: str | os.PathLike) -> list[dict]:
    """The prompt rows of a built corpus, in request order."""
    path = _corpus_json_path(corpus_dir).parent / "prompts.jsonl"
    if not path.exists():
        raise CorpusError(f"{path}: prompts.jsonl not found; rebuild the corpus with `specstudy corpus build`")
    rows = atomic.read_jsonl(path)
    for i, row in enumerate(rows, start=1):
        missing = {"prompt_id", "stratum", "messages", "max_tokens"} - set(row)
        if missing:
            raise CorpusError(f"{path}: line {i}: missing fields {sorted(missing)}; rebuild the corpus")
    return rows


def verify_digest(corpus_dir: str | os.PathLike, expected: str) -> dict:
    """Check that the corpus at ``corpus_dir`` has digest ``expected`` and that its prompts still hash to
    it; return corpus.json. Raises :class:`CorpusMismatchError` with both digests otherwise."""
    corpus = load_corpus(corpus_dir)
    path = _corpus_json_path(corpus_dir)
    prompts = load_prompts(corpus_dir)
    recomputed = compute_digest(corpus["digest_basis"], prompts)
    if recomputed != corpus["digest"]:
        raise CorpusMismatchError(f"{path}: prompts.jsonl no longer matches the recorded digest (recorded "
                                  f"{corpus['digest']}, recomputed {recomputed}); the files were modified after the "
                                  "build — rebuild with `specstudy corpus build`")
    if corpus["digest"] != expected:
        raise CorpusMismatchError(f"{path}: corpus digest mismatch for {corpus['name']}/{corpus['version']}: expected "
                                  f"{expected}, found {corpus['digest']}. The corpus was rebuilt from a different "
                                  "spec or source; use the corpus the plan was made with or re-plan")
    return corpus


# ------------------------------------------------------------------------------------------------ CLI

def _cmd_build(args) -> int:
    try:
        out_dir = build(args.spec, args.out, args.tokenizer)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    corpus = atomic.read_json(out_dir / "corpus.json")
    sel = corpus["selection"]
    print(f"{out_dir}: {corpus['count']} prompts, digest {corpus['digest']} "
          f"(pool {sel['pool']}, malformed skipped {sel['malformed_skipped']}, "
          f"rejected by window {sel['rejected_out_of_window']})")
    return 0


def _cmd_check(args) -> int:
    try:
        corpus = verify_digest(args.corpus, args.digest)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"ok: {corpus['name']}/{corpus['version']} digest {corpus['digest']}")
    return 0


def register(subparsers) -> None:
    parser = subparsers.add_parser("corpus", help="build and check versioned workload corpora")
    sub = parser.add_subparsers(dest="corpus_command", required=True)
    b = sub.add_parser("build", help="build <out>/<name>/<version>/{prompts.jsonl,corpus.json,token_stats.json}")
    b.add_argument("--spec", required=True, help="corpus spec YAML (e.g. corpora/embedded/code.yaml)")
    b.add_argument("--out", default="results/corpora", help="output root (default: results/corpora)")
    b.add_argument("--tokenizer", default=None,
                   help="local directory of the target model's tokenizer; omitted: token stats unavailable and the "
                        "input window is checked with a characters/4 estimate")
    b.set_defaults(func=_cmd_build)
    c = sub.add_parser("check", help="verify a built corpus against an expected digest")
    c.add_argument("--corpus", required=True, help="corpus.json or its directory")
    c.add_argument("--digest", required=True, help="expected digest")
    c.set_defaults(func=_cmd_check)
