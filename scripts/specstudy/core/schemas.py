"""JSON-schema validation for the study config and for every result record.

Schemas live in ``config/schemas/<name>.schema.json``. Errors name the file, the field (as a
JSON path) and what is allowed, so a user can fix the input without reading code.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parents[3] / "config" / "schemas"


class ValidationError(ValueError):
    """A record or config does not match its schema; the message is meant for the user."""


@cache
def load_schema(name: str) -> dict:
    path = SCHEMA_DIR / f"{name}.schema.json"
    if not path.exists():
        raise FileNotFoundError(f"no schema {name!r}: expected {path}")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


@cache
def _registry():
    """Every schema under its ``$id`` (``specstudy/<name>``), so that one schema can ``$ref`` another
    (the study config's ``capacity.gates`` is the capacity-gates schema: one source of truth)."""
    from referencing import Registry, Resource

    resources = []
    for path in sorted(SCHEMA_DIR.glob("*.schema.json")):
        schema = load_schema(path.name[: -len(".schema.json")])
        if "$id" in schema:
            resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


#: Fields on a [0, 1] scale: a value above 1 there is almost always a percent (5 for 5 %).
def _percent_hint(err) -> str:
    if err.validator in ("maximum", "exclusiveMaximum") and err.validator_value == 1 and isinstance(err.instance, (int, float)) \
            and 1 < err.instance <= 100:
        return f"; this field is a fraction in [0, 1]: write {err.instance / 100:g} for {err.instance:g} %"
    return ""


def _field(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def errors(record: Any, name: str) -> list[str]:
    """All violations of schema ``name`` by ``record`` as readable one-line messages."""
    import jsonschema

    schema = load_schema(name)
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema, registry=_registry())
    out = []
    for err in sorted(validator.iter_errors(record), key=lambda e: list(map(str, e.absolute_path))):
        allowed = ""
        if err.validator == "enum":
            allowed = f" (allowed: {', '.join(map(str, err.validator_value))})"
        elif err.validator == "additionalProperties":
            known = sorted(err.schema.get("properties", {}))
            allowed = f" (known fields here: {', '.join(known)})"
        out.append(f"field '{_field(err)}': {err.message}{allowed}{_percent_hint(err)}")
    return out


def validate(record: Any, name: str, source: str | Path = "<record>") -> Any:
    """Raise :class:`ValidationError` naming ``source`` and every bad field; return the record."""
    errs = errors(record, name)
    if errs:
        lines = "\n  - ".join(errs)
        raise ValidationError(f"{source}: does not match schema '{name}' ({SCHEMA_DIR / (name + '.schema.json')}):\n  - {lines}")
    return record
