"""The engine builds a study declares (``engines``: overlays of the ``engine`` section), named and resolved.

Kept apart from :mod:`specstudy.study.config` so that the phase declarations, which the config's checks read,
can name the builds without importing the config module back. The checks of the builds themselves are
:mod:`specstudy.study.config`'s.
"""

from __future__ import annotations

import copy


def _overlay(base: dict, over: dict) -> dict:
    """``base`` with ``over`` laid on it: mappings merged key by key (so ``server.env`` gains a variable),
    every other value replaced."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _overlay(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def engine_names(cfg: dict) -> list[str | None]:
    """The engine builds the arms are crossed with: the keys of ``engines``, or ``[None]`` for a study of
    one engine (its arm names carry no ``@``)."""
    return list(cfg.get("engines") or {}) or [None]


def engine_builds(cfg: dict) -> dict[str | None, dict]:
    """Every engine build's whole ``engine`` section: ``engine`` with the build's overlay (``engines.<name>``,
    less its label) laid on it; ``{None: engine}`` for a study of one engine."""
    engines = cfg.get("engines") or {}
    if not engines:
        return {None: cfg["engine"]}
    return {name: _overlay(cfg["engine"], {k: v for k, v in over.items() if k != "label"})
            for name, over in engines.items()}


def engine_label(cfg: dict, name: str | None) -> str | None:
    """How the report names a build (``engines.<name>.label``); None for a study of one engine."""
    return ((cfg.get("engines") or {}).get(name) or {}).get("label") if name else None
