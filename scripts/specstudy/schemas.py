"""JSON-schema validation for the study config and for every result record.

Schemas live in ``config/schemas/<name>.schema.json``. Errors name the file, the field (as a
JSON path) and what is allowed, so a user can fix the input without reading code.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parents[2] / "config" / "schemas"


class ValidationError(ValueError):
    """A record or config does not match its schema; the message is meant for the user."""


@cache
def load_schema(name: str) -> dict:
    path = SCHEMA_DIR / f"{name}.schema.json"
    if not path.exists():
        raise FileNotFoundError(f"no schema {name!r}: expected {path}")
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def _field(error) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "(top level)"


def errors(record: Any, name: str) -> list[str]:
    """All violations of schema ``name`` by ``record`` as readable one-line messages."""
    import jsonschema

    schema = load_schema(name)
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    out = []
    for err in sorted(validator.iter_errors(record), key=lambda e: list(map(str, e.absolute_path))):
        allowed = ""
        if err.validator == "enum":
            allowed = f" (allowed: {', '.join(map(str, err.validator_value))})"
        elif err.validator == "additionalProperties":
            known = sorted(err.schema.get("properties", {}))
            allowed = f" (known fields here: {', '.join(known)})"
        out.append(f"field '{_field(err)}': {err.message}{allowed}")
    return out


def validate(record: Any, name: str, source: str | Path = "<record>") -> Any:
    """Raise :class:`ValidationError` naming ``source`` and every bad field; return the record."""
    errs = errors(record, name)
    if errs:
        lines = "\n  - ".join(errs)
        raise ValidationError(f"{source}: does not match schema '{name}' ({SCHEMA_DIR / (name + '.schema.json')}):\n  - {lines}")
    return record
