"""Result records: the one place that knows where a field lives in a record written by this package.

KV capacity
-----------
A deployment record (``deployment.json``, schema ``deployment``) carries the engine's KV pool twice:

- ``"metrics"``: ``cache_config``, the labels of ``vllm:cache_config_info`` scraped from ``/metrics`` once the
  server is ready (``deploy.parse_cache_config_info``): ``kv_cache_tokens`` (vLLM's ``kv_cache_size_tokens``
  label, else ``num_gpu_blocks × block_size``);
- ``"log"``: ``confounds.kv_cache.tokens``, the launch log's ``GPU KV cache size: N tokens``
  (``deploy.parse_launch_log``).

They agree for a model with one KV-cache group; the report shows both (the tables' ``kv_cache_tokens`` and
``kv_log_tokens``). :func:`kv_cache_tokens` reads them in the order its caller asks for: the tables and the
selection use ``/metrics``; the capacity knee prefers the launch log. A capacity knee's ``deployment`` (a
summary of the record, ``capacity.deployment_summary``) keeps both sections, so the same reader serves it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

KV_SOURCES = ("metrics", "log")


def number(v: Any) -> float | None:
    """A finite float from a number or numeric string; ``None`` for anything else (booleans included)."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        f = float(v)
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def _section(record: dict, key: str) -> dict:
    v = record.get(key)
    return v if isinstance(v, dict) else {}


def kv_cache_tokens(record: dict | None, sources: Sequence[str] = ("metrics",)) -> float | None:
    """The KV pool in tokens of a deployment record (or a knee's deployment summary) from the first of
    ``sources`` (``"metrics"``, ``"log"``; see the module docstring) that has it; ``None`` when none has."""
    if not isinstance(record, dict):
        return None
    for source in sources:
        if source == "metrics":
            cc = _section(record, "cache_config")
            tokens = number(cc.get("kv_cache_tokens"))
            if tokens is None:
                blocks, size = number(cc.get("num_gpu_blocks")), number(cc.get("block_size"))
                tokens = blocks * size if blocks is not None and size is not None else None
        elif source == "log":
            tokens = number(_section(_section(record, "confounds"), "kv_cache").get("tokens"))
        else:
            raise ValueError(f"KV source must be one of {KV_SOURCES}, got {source!r}")
        if tokens is not None:
            return tokens
    return None
