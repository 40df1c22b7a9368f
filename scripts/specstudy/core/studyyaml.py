"""specstudy's own YAML reader for study configs and pre-registrations (issue 29).

PyYAML's ``safe_load`` (what Snakemake uses for ``--configfile``) keeps the *last* of two equal keys
without a word, reads ``1e3`` as the string ``'1e3'`` (YAML 1.1) and accepts ``.inf`` and ``.nan``,
which are then written as non-standard JSON. This reader refuses duplicate keys and non-finite
numbers, reads ``1e3``/``5E-2`` as numbers (YAML 1.2), and names the file and line of every problem.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from specstudy.core.errors import UserError

# YAML 1.2 core-schema floats without a dot (``1e3``, ``-5E-2``): YAML 1.1 (PyYAML) reads them as strings.
_EXP_FLOAT = re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$")


class StudyYamlError(UserError):
    """A YAML file specstudy cannot read as intended; the message names the file, the line and the fix."""


class _StrictLoader(yaml.SafeLoader):
    pass


_StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", _EXP_FLOAT, list("-+0123456789."))


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            hash(key)
        except TypeError:
            raise StudyYamlError(f"{loader.name}: line {key_node.start_mark.line + 1}: a mapping key must be a plain "
                                 "value (a name), not a list or mapping") from None
        if key in seen:
            raise StudyYamlError(
                f"{loader.name}: line {key_node.start_mark.line + 1}: duplicate key {key!r} (first at line {seen[key]}); "
                "YAML keeps only the last one, so the first block would be dropped silently: merge the two blocks "
                "into one or rename one")
        seen[key] = key_node.start_mark.line + 1
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


def _construct_float(loader: _StrictLoader, node: yaml.ScalarNode) -> float | int:
    text = loader.construct_scalar(node)
    if _EXP_FLOAT.match(str(text)):
        value = float(text)
        # ``requests: 1e3`` is a count: an integral exponent form is the integer it spells.
        return int(value) if value.is_integer() and abs(value) < 2**53 else value
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    if not math.isfinite(value):
        raise StudyYamlError(f"{loader.name}: line {node.start_mark.line + 1}: {text!r} is not a finite number "
                             "(infinity and NaN cannot be written as JSON results); give a finite value, or null where "
                             "the field allows 'no limit'")
    return value


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def loads(text: str, name: str = "<yaml>") -> Any:
    """Parse ``text`` (``name`` is the file shown in messages)."""
    loader = _StrictLoader(text)
    loader.name = name
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "somewhere"
        raise StudyYamlError(f"{name}: not valid YAML at {where}: {exc.problem or exc.context}"
                             f"{' (' + exc.context + ')' if exc.context and exc.problem else ''}; "
                             "check the indentation (spaces only, no tabs) and brackets near that line") from None
    except yaml.YAMLError as exc:
        raise StudyYamlError(f"{name}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def read_text(path: str | Path, what: str = "file") -> str:
    """The file's text; missing, a directory, unreadable or not UTF-8 are one-line errors naming ``path``."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise StudyYamlError(f"{path}: {what} not found (relative paths are relative to {Path.cwd()}); "
                             "check the spelling") from None
    except IsADirectoryError:
        raise StudyYamlError(f"{path}: is a directory; the {what} must be a YAML file") from None
    except PermissionError:
        raise StudyYamlError(f"{path}: permission denied reading the {what}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise StudyYamlError(f"{path}: line {line}: byte 0x{data[exc.start]:02x} is not UTF-8; save the {what} "
                             "as UTF-8") from None


def load(path: str | Path, what: str = "file") -> Any:
    return loads(read_text(path, what), str(path))


def load_study_files(paths: list[str | Path], overrides: dict | None = None) -> dict:
    """The study config as Snakemake merges it (``--configfile`` files in order, then ``--config``
    values), each file read by this reader: what the workflow uses instead of Snakemake's own parse."""
    from snakemake.utils import update_config

    merged: dict = {}
    for p in paths:
        update_config(merged, load_mapping(p, "study config", "study, engine, corpora, cells, arms, screen"))
    if overrides:
        update_config(merged, dict(overrides))
    return merged


def load_mapping(path: str | Path, what: str, keys: str) -> dict:
    """A YAML file whose document must be a mapping (``keys``: what it should hold, for the message)."""
    data = load(path, what)
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise StudyYamlError(f"{path}: line 1: the {what} is {kind}, not a mapping; it must be a YAML mapping with "
                             f"keys {keys}")
    return data
