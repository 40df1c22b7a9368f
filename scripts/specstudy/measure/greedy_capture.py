"""The greedy correctness gate's capture: the smoke prompts issued one at a time at temperature 0 against a
live server, written as a greedy capture (schema ``greedy-capture``, :data:`CAPTURE_SCHEMA`). The gate that
judges captures offline is :mod:`specstudy.analysis.gate`; the capture files' shared pieces are
:mod:`specstudy.core.capture_file`.
"""

from __future__ import annotations

import os

from specstudy.core import atomic, schemas
from specstudy.core.capture_file import capture_record, captured_at, output_fields

CAPTURE_SCHEMA = "specstudy.capture/1"


class GateInputError(ValueError):
    """Bad input to the gate; the message names the file, the field and the fix."""


def capture_greedy(
    base_url: str,
    model: str,
    prompts: list[dict],
    out_path: str | os.PathLike,
    *,
    deployment_id: str,
    arm: str,
    capture_index: int,
    corpus: dict,
    seed: int | None,
    api_key: str | None = None,
) -> dict:
    """Issue ``prompts`` ({prompt_id, messages, max_tokens}) one at a time at temperature 0 and write a capture.

    Uses ``specstudy.measure.loadgen.run_closed_loop(..., concurrency=1, keep_text=True)``. The capture (schema
    ``greedy-capture``) is validated and written atomically to ``out_path``; it is also returned.
    """
    from specstudy.measure import loadgen

    if not prompts:
        raise GateInputError("capture_greedy: 'prompts' is empty; pass the smoke prompts of the corpus")
    specs = []
    for i, row in enumerate(prompts):
        for key in ("prompt_id", "messages", "max_tokens"):
            if key not in row:
                raise GateInputError(f"capture_greedy: prompt row {i} lacks field '{key}' (rows need prompt_id, messages, max_tokens)")
        specs.append(
            loadgen.RequestSpec(
                prompt_id=str(row["prompt_id"]),
                workload=str(row.get("workload") or row.get("stratum") or "smoke"),
                messages=row["messages"],
                max_tokens=int(row["max_tokens"]),
            )
        )
    started = captured_at()
    result = loadgen.run_closed_loop(
        base_url, model, specs, concurrency=1, temperature=0.0, seed=seed, keep_text=True, api_key=api_key
    )
    ended = captured_at()
    by_id = {r.get("prompt_id"): r for r in result.rows}
    out_rows = []
    for spec in specs:
        r = by_id.get(spec.prompt_id)
        if r is None:
            out_rows.append({"prompt_id": spec.prompt_id, "output_text": None, "completion_tokens": None,
                             "prompt_tokens": None, "finish_reason": None, "success": False,
                             "error": "no result row from the load generator", "max_tokens": spec.max_tokens,
                             "output_sha256": None, "output_chars": None})
            continue
        text = r.get("output_text")
        success = bool(r.get("success"))
        if text is None and success:
            text = ""
        out_rows.append({
            "prompt_id": spec.prompt_id,
            "output_text": text,
            "completion_tokens": r.get("completion_tokens"),
            "prompt_tokens": r.get("prompt_tokens"),
            "finish_reason": r.get("finish_reason"),
            "success": success,
            "error": None if success else str(r.get("error") or f"unsuccessful (status {r.get('status_code')})"),
            "max_tokens": spec.max_tokens,
            **output_fields(text),
        })
    record = capture_record(CAPTURE_SCHEMA, deployment_id=deployment_id, arm=arm, capture_index=capture_index,
                            model=model, corpus=corpus, started=started, ended=ended, prompts=out_rows,
                            sampling={"temperature": 0.0, "seed": seed, "max_tokens": max(s.max_tokens for s in specs)})
    schemas.validate(record, "greedy-capture", out_path)
    atomic.write_json(out_path, record)
    return record

