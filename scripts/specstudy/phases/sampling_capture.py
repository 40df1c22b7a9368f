"""Sampled captures against a live server (temperature > 0): every prompt x every seed, and their reader.

:func:`capture_sampled` sends every prompt once per pre-registered seed (each request carries its own seed,
``temperature``, ``top_p`` and ``return_token_ids``) and writes a sampled capture (schema
``sampled-capture``); :func:`load_sampled_capture` reads and validates one, errors naming the file and
the field. The judge of the captures is :mod:`specstudy.phases.sampling_judge`; the capture file's shared
pieces (times, digests, the record around the rows) are :mod:`specstudy.core.capture_file`'s, as the greedy
capture's (:mod:`specstudy.measure.greedy_capture`). CLI: ``specstudy phase sampling capture``.

Imports ``core``, ``study.prereg`` and (inside :func:`capture_sampled`) ``measure.loadgen``.
"""

from __future__ import annotations

import os

from specstudy.core import atomic, schemas
from specstudy.core.capture_file import capture_data, capture_record, captured_at, output_fields
from specstudy.study.prereg import SamplingInputError

__all__ = ["CAPTURE_SCHEMA", "GREEDY_CAPTURE_SCHEMA", "capture_sampled", "load_sampled_capture"]

CAPTURE_SCHEMA = "specstudy.sampled-capture/1"
GREEDY_CAPTURE_SCHEMA = "specstudy.capture/1"


def load_sampled_capture(path_or_record: str | os.PathLike | dict, *, source: str | None = None) -> dict:
    """Load and validate a sampled capture (schema ``sampled-capture``); errors name the file and field."""
    data, src = capture_data(path_or_record, SamplingInputError, "sampled capture", source or "<sampled capture>")
    if data.get("schema") == GREEDY_CAPTURE_SCHEMA:
        raise SamplingInputError(f"{src}: field 'schema' is {GREEDY_CAPTURE_SCHEMA!r}, a greedy capture (temperature "
                                 "0); the sampling judge needs sampled captures (schema "
                                 f"{CAPTURE_SCHEMA!r}, temperature > 0); greedy captures go to `specstudy gate judge`")
    if data.get("schema") != CAPTURE_SCHEMA:
        raise SamplingInputError(f"{src}: field 'schema' is {data.get('schema')!r}; expected {CAPTURE_SCHEMA!r}")
    try:
        schemas.validate(data, "sampled-capture", src)
    except schemas.ValidationError as exc:
        raise SamplingInputError(str(exc)) from None
    seen: set[tuple[str, int]] = set()
    for i, row in enumerate(data["prompts"]):
        key = (row["prompt_id"], row["seed"])
        if key in seen:
            raise SamplingInputError(f"{src}: field 'prompts.{i}': prompt_id {key[0]!r} with seed {key[1]} appears "
                                     "twice; each (prompt_id, seed) request must appear once")
        seen.add(key)
    return data


def capture_sampled(
    base_url: str,
    model: str,
    prompts: list[dict],
    out_path: str | os.PathLike,
    *,
    seeds: list[int],
    temperature: float,
    top_p: float,
    concurrency: int,
    deployment_id: str,
    arm: str,
    corpus: dict,
    capture_index: int = 1,
    api_key: str | None = None,
    request_timeout_s: float = 300.0,
) -> dict:
    """Send every prompt ({prompt_id, messages, max_tokens}) once per seed and write a sampled capture.

    Request (prompt, seed) carries, in its own body (``RequestSpec.extra_body``, applied last), its seed,
    ``temperature``, ``top_p`` and ``return_token_ids: true`` (vLLM then streams the generated token ids in
    ``choices[].token_ids``); ``max_tokens`` is the prompt's. The requests go closed-loop at ``concurrency``
    through ``loadgen.run_closed_loop(..., keep_text=True)``, prompt-major, seeds in the given order. The
    capture (schema ``sampled-capture``) is validated, written atomically to ``out_path`` and returned.
    """
    from specstudy.measure import loadgen

    src = "capture_sampled"
    if not prompts:
        raise SamplingInputError(f"{src}: 'prompts' is empty; pass the sampling prompts (rows with prompt_id, "
                                 "messages, max_tokens)")
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise SamplingInputError(f"{src}: temperature {temperature!r} must be > 0 (a temperature-0 capture is a greedy "
                                 "capture: use greedy_capture.capture_greedy)")
    if not isinstance(top_p, (int, float)) or isinstance(top_p, bool) or not 0 < top_p <= 1:
        raise SamplingInputError(f"{src}: top_p {top_p!r} must be in (0, 1]")
    if (not seeds or any(not isinstance(x, int) or isinstance(x, bool) for x in seeds)
            or len(set(seeds)) != len(seeds)):
        raise SamplingInputError(f"{src}: seeds {seeds!r} must be a non-empty list of distinct integers (the "
                                 "pre-registered seeds.base + i)")
    if not isinstance(concurrency, int) or isinstance(concurrency, bool) or concurrency < 1:
        raise SamplingInputError(f"{src}: concurrency {concurrency!r} must be an integer >= 1")
    specs, keys, seen = [], [], set()
    for i, row in enumerate(prompts):
        for key in ("prompt_id", "messages", "max_tokens"):
            if key not in row:
                raise SamplingInputError(f"{src}: prompt row {i} lacks field '{key}' (rows need prompt_id, messages, "
                                         "max_tokens)")
        pid = str(row["prompt_id"])
        if pid in seen:
            raise SamplingInputError(f"{src}: prompt row {i}: prompt_id {pid!r} appears twice; each prompt once")
        seen.add(pid)
        max_tokens = int(row["max_tokens"])
        for seed in seeds:
            specs.append(loadgen.RequestSpec(
                prompt_id=pid, workload=str(row.get("workload") or row.get("stratum") or "sampling"),
                messages=row["messages"], max_tokens=max_tokens,
                extra_body={"seed": int(seed), "temperature": float(temperature), "top_p": float(top_p),
                            "return_token_ids": True}))
            keys.append((pid, int(seed), max_tokens))
    started = captured_at()
    result = loadgen.run_closed_loop(base_url, model, specs, concurrency, temperature=float(temperature), seed=None,
                                     keep_text=True, api_key=api_key, request_timeout_s=request_timeout_s)
    ended = captured_at()
    by_index = {r["request_index"]: r for r in result.rows}
    out_rows = []
    for i, (pid, seed, max_tokens) in enumerate(keys):
        r = by_index.get(i) or {"error": "no result row from the load generator", "success": False}
        success = bool(r.get("success"))
        text = r.get("output_text")
        if text is None and success:
            text = ""
        elif not success and not text:
            text = None  # failed before any text
        ids = r.get("completion_token_ids")
        out_rows.append({
            "prompt_id": pid, "seed": seed, "temperature": float(temperature), "top_p": float(top_p),
            "max_tokens": max_tokens, "output_text": text, "completion_tokens": r.get("completion_tokens"),
            "completion_token_ids": None if ids is None else list(ids), "prompt_tokens": r.get("prompt_tokens"),
            "finish_reason": r.get("finish_reason"), "success": success,
            "error": None if success else str(r.get("error") or f"unsuccessful (status {r.get('status_code')})"),
            **output_fields(text),
        })
    record = capture_record(CAPTURE_SCHEMA, deployment_id=deployment_id, arm=arm, capture_index=capture_index,
                            model=model, corpus=corpus, started=started, ended=ended, prompts=out_rows,
                            sampling={"temperature": float(temperature), "top_p": float(top_p),
                                      "seed_policy": "same_per_request_across_arms", "seeds": [int(x) for x in seeds]})
    schemas.validate(record, "sampled-capture", str(out_path))
    atomic.write_json(out_path, record)
    return record
