"""The capacity search's declared settings: the gates a step is judged against and the search's own settings
(rates, growth, resolution, soaks), validated against their schemas with the defaults filled, and read from
inline JSON, a JSON/YAML file or a study config's ``capacity`` section. Also the record schemas' names.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

SCHEMA_GATES = "specstudy.capacity-gates/1"
SCHEMA_STEP = "specstudy.capacity-step/1"
SCHEMA_KNEE = "specstudy.capacity-knee/1"

DEFAULT_GATES: dict[str, Any] = {
    "ttft_p95_ms": 2000.0,
    "tpot_p95_ms": 200.0,
    "max_error_rate": 0.01,
    "backlog": {
        "max_waiting_slope_frac": 0.05,
        "slope_t_min": 3.0,
        "max_preemptions": 0,
        "max_kv_cache_usage": 0.98,
    },
    "client": {
        "max_lateness_p99_ms": 2.0,  # a measured send later than this is "late" (see judge_lateness)
        "max_late_fraction": 0.01,  # ... and at most this fraction of them may be (1 %: the p99 statement)
        "max_cpu_share": 0.9,
        "max_pool_wait_p99_ms": 5.0,
        "max_event_loop_lag_p99_ms": 20.0,
        "tail_alpha": 0.05,  # level of the binomial tests of the lateness, pool-wait and loop-lag gates
        "honour_loadgen_flag": True,
        "capacity_rps": None,
    },
}

DEFAULT_SEARCH: dict[str, Any] = {
    "start_rate_rps": 1.0,
    "growth": 2.0,
    "max_rate_rps": 256.0,
    "min_rate_rps": 0.05,
    "resolution_frac": 0.1,
    "max_steps": 20,
    "warmup_s": 10.0,
    "step_duration_s": 60.0,
    "sample_interval_s": 1.0,
    "arrival_seed": 0,
    "request_timeout_s": 600.0,
    "soak": {"count": 3, "duration_s": 300.0, "max_moves": 2},
}




def _merge(defaults: dict, given: dict | None) -> dict:
    out = copy.deepcopy(defaults)
    for k, v in (given or {}).items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def resolve_gates(gates: dict | None, source: str = "<gates>") -> dict:
    """Validate user gates (schema ``capacity-gates``) and fill defaults."""
    from specstudy.core import schemas

    schemas.validate(gates or {}, "capacity-gates", source)
    return _merge(DEFAULT_GATES, gates)


def resolve_search(search_cfg: dict | None, source: str = "<search>") -> dict:
    """Validate user search settings (schema ``capacity-search``) and fill defaults."""
    from specstudy.core import schemas

    schemas.validate(search_cfg or {}, "capacity-search", source)
    cfg = _merge(DEFAULT_SEARCH, search_cfg)
    if cfg["min_rate_rps"] > cfg["start_rate_rps"] or cfg["start_rate_rps"] > cfg["max_rate_rps"]:
        raise ValueError(
            f"{source}: field 'start_rate_rps' must lie in [min_rate_rps, max_rate_rps] "
            f"(got {cfg['min_rate_rps']} <= {cfg['start_rate_rps']} <= {cfg['max_rate_rps']}); fix one of the three"
        )
    return cfg


def load_json_or_file(arg: str | dict | None, what: str) -> dict:
    """``arg`` is a dict, inline JSON, or a path to a JSON/YAML file (``{"gates": …}`` and a study
    config's ``capacity.<what>`` are unwrapped)."""
    if arg is None:
        return {}
    if isinstance(arg, dict):
        return arg
    text = arg.strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--{what}: inline JSON is invalid ({exc}); pass a JSON object or a file path") from exc
    path = Path(arg)
    if not path.exists():
        raise ValueError(f"--{what}: {arg!r} is neither inline JSON nor an existing file")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    else:
        data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict) and isinstance(data.get("capacity"), dict) and what in data["capacity"]:
        data = data["capacity"][what]  # a whole study config: capacity.<what>
    elif isinstance(data, dict) and set(data) == {what}:
        data = data[what]
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of {what} settings")
    return data
