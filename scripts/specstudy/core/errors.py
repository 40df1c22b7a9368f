"""The errors of bad input: each names the file or field and the fix.

``specstudy`` commands raise ordinary exceptions; :func:`specstudy.cli.explain` recognises the ones
caused by bad input (these, a missing or corrupt file, a bad argument) and prints their one line
instead of a traceback. Anything it does not recognise is a bug and keeps its traceback.
"""

from __future__ import annotations

import json


class UserError(ValueError):
    """Bad input found by a command; the message already says which file/field and how to fix it."""


class ConfigError(ValueError):
    """The study config or pre-registration is unusable; the message says where and how to fix it."""


def load_json_arg(value: str, option: str):
    """Parse an inline-JSON command-line value; a bad one names the option and shows an example."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise UserError(f"{option} {value!r}: not valid JSON ({exc.msg} at column {exc.colno}); pass a JSON object, "
                        f"e.g. {option} '{{\"method\": \"ngram\", \"num_speculative_tokens\": 3}}'") from None
