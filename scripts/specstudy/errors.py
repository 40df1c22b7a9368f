"""User-facing errors: turn a bad input into one line that names the file/field and the fix.

``specstudy`` commands raise ordinary exceptions; :func:`explain` recognises the ones caused by bad
input (a missing or corrupt file, a config or pre-registration that fails its checks, a bad
argument) and returns the message to print instead of a traceback. Anything it does not recognise
is a bug and keeps its traceback.
"""

from __future__ import annotations

import json


class UserError(ValueError):
    """Bad input found by a command; the message already says which file/field and how to fix it."""


def explain(exc: BaseException) -> str | None:
    """The message for a bad-input exception, or None for anything else (a bug: keep the traceback)."""
    from . import atomic, config, schemas
    from .corpus import CorpusError

    if isinstance(exc, (UserError, atomic.BadFile, config.ConfigError, CorpusError, schemas.ValidationError)):
        return str(exc)
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename or exc}: file not found. Check the path (relative paths are relative to {_cwd()})."
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return (f"{exc.filename}: a file is in the way: an output directory was to be created there (an --out "
                "that is a file?); pass an --out path that is a directory or does not exist yet, or move the file")
    if isinstance(exc, IsADirectoryError):
        return f"{exc.filename}: is a directory, a file was expected."
    if isinstance(exc, PermissionError):
        return f"{exc.filename}: permission denied."
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
    return None


def _cwd() -> str:
    import os

    return os.getcwd()


def load_json_arg(value: str, option: str):
    """Parse an inline-JSON command-line value; a bad one names the option and shows an example."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise UserError(f"{option} {value!r}: not valid JSON ({exc.msg} at column {exc.colno}); pass a JSON object, "
                        f"e.g. {option} '{{\"method\": \"ngram\", \"num_speculative_tokens\": 3}}'") from None
