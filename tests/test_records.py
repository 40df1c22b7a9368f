"""Tests for specstudy.records: the one reader of record fields (KV capacity, typed records)."""

from __future__ import annotations

import pytest

from specstudy import capacity, records, select, tables
from specstudy.records import kv_cache_tokens

LOG = {"kv_cache": {"tokens": 12345, "available_memory_gib": 2.5}}


def test_kv_from_metrics_then_blocks():
    assert kv_cache_tokens({"cache_config": {"kv_cache_tokens": 1600, "num_gpu_blocks": 1, "block_size": 16}}) == 1600
    assert kv_cache_tokens({"cache_config": {"kv_cache_tokens": None, "num_gpu_blocks": 100, "block_size": 16}}) == 1600
    assert kv_cache_tokens({"cache_config": {"num_gpu_blocks": 100, "block_size": None}}) is None
    assert kv_cache_tokens({"cache_config": None, "confounds": LOG}) is None  # metrics only by default
    assert kv_cache_tokens(None) is None and kv_cache_tokens({}) is None


def test_kv_source_order_is_the_callers():
    rec = {"cache_config": {"kv_cache_tokens": 16000}, "confounds": LOG}
    assert kv_cache_tokens(rec, sources=("log", "metrics")) == 12345
    assert kv_cache_tokens(rec, sources=("metrics", "log")) == 16000
    assert kv_cache_tokens({"confounds": LOG}, sources=("metrics", "log")) == 12345
    with pytest.raises(ValueError, match="KV source"):
        kv_cache_tokens(rec, sources=("nvml",))


def test_every_reader_uses_it():
    rec = {"status": "ok", "arm": {"name": "baseline"}, "cache_config": {"kv_cache_tokens": 16000}, "confounds": LOG}
    assert tables.confound_fields(rec["confounds"], rec["cache_config"])["kv_cache_tokens"] == 16000
    assert tables.startup_fields(rec)["kv_log_tokens"] == 12345
    assert capacity.kv_capacity_tokens(rec) == 12345  # the knee prefers the launch log
    assert capacity.kv_capacity_tokens({"kv_capacity_tokens": 7.0}) == 7.0  # a knee's own summary field
    assert select.kv_cache_tokens is records.kv_cache_tokens


def test_number():
    assert records.number("12") == 12.0 and records.number(3) == 3.0
    assert records.number(True) is None and records.number(float("nan")) is None and records.number("x") is None
    assert records.number([1]) is None
