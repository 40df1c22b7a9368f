"""The capture files' shared pieces: what a greedy capture (:mod:`specstudy.measure.greedy_capture`) and a sampled
capture (:mod:`specstudy.phases.sampling_capture`) write and read alike.

- :func:`captured_at` — a capture's ``started_at`` / ``ended_at`` (UTC, to the second);
- :func:`text_sha256` and :func:`output_fields` — a captured output's ``output_sha256`` / ``output_chars``;
- :func:`corpus_ref` — the ``{name, version, digest}`` a capture (and a deployment record) names its corpus by;
- :func:`capture_record` — the record around the prompts' rows (deployment, arm, model, corpus, times);
- :func:`read_capture_json` — a capture or record file's JSON, a missing or broken file raising the caller's
  error naming the path; :func:`capture_data` — a capture given as a file or as its data;
  :func:`is_deployment_record` — whether a file passed where captures are read is a deployment record
  (which then stands for the captures it names).

Imports ``core.atomic`` only.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from specstudy.core import atomic
from specstudy.core.timestamps import utc_now

__all__ = ["capture_data", "capture_record", "captured_at", "corpus_ref", "is_deployment_record", "output_fields",
           "read_capture_json", "text_sha256"]


def captured_at() -> str:
    """A capture's ``started_at`` / ``ended_at``: a record's stamp (:mod:`specstudy.core.timestamps`)."""
    return utc_now()


def text_sha256(text: str | None) -> str | None:
    """A captured output's ``output_sha256`` (None for no output)."""
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def output_fields(text: str | None, sha256: str | None = None) -> dict:
    """A captured row's ``output_sha256`` and ``output_chars`` (``sha256``: a digest the source already gives)."""
    return {"output_sha256": sha256 or text_sha256(text), "output_chars": None if text is None else len(text)}


def corpus_ref(corpus: dict) -> dict:
    """The corpus as a capture or a deployment record names it: name, version (as text), digest."""
    return {"name": corpus.get("name"), "version": str(corpus.get("version")), "digest": corpus.get("digest")}


def capture_record(schema: str, *, deployment_id: str, arm: str, capture_index: int, model: str, corpus: dict,
                   sampling: dict, started: str, ended: str, prompts: list[dict]) -> dict:
    """A capture record (greedy or sampled, by ``schema``) around its prompts' rows."""
    return {
        "schema": schema,
        "deployment_id": deployment_id,
        "arm": arm,
        "capture_index": int(capture_index),
        "model": model,
        "corpus": {"name": corpus.get("name"), "version": corpus.get("version"), "digest": corpus.get("digest")},
        "sampling": sampling,
        "times": {"started_at": started, "ended_at": ended},
        "prompts": prompts,
    }


def read_capture_json(path: str | os.PathLike, error: type[Exception]) -> Any:
    """A capture or record file's JSON; a missing or broken file raises ``error`` naming the path."""
    try:
        return atomic.read_json(path)
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc})") from None


def capture_data(path_or_record: str | os.PathLike | dict, error: type[Exception], what: str,
                 source: str) -> tuple[dict, str]:
    """A capture given as a file or as its data: (the data, the name its errors use: the path, else
    ``source``); a top level that is not a JSON object raises ``error`` naming it as not a ``what``."""
    if isinstance(path_or_record, dict):
        data, src = path_or_record, source
    else:
        data, src = read_capture_json(path_or_record, error), str(path_or_record)
    if not isinstance(data, dict):
        raise error(f"{src}: top level must be a JSON object (a {what})")
    return data, src


def is_deployment_record(data: Any) -> bool:
    """A deployment record (schema ``deployment``, or an older one's fields), not a capture."""
    if not isinstance(data, dict):
        return False
    schema = data.get("schema")
    if isinstance(schema, str) and schema.startswith("specstudy.deployment/"):
        return True
    return "status" in data and "deployment_id" in data and "prompts" not in data
