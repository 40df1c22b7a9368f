"""The docs name only what exists. For README.md and docs/*.md (not the records of earlier runs under
docs/gpu-results/ and docs/embedded-results/, which stay as they were written):

* every cited ``scripts/specstudy/...`` path exists;
* every cited test file (``tests/test_*.py``, or ``test_*.py`` of tests/) exists, and so does its
  ``::test_name`` when one is given;
* every ``specstudy <command> ...`` (or ``python -m specstudy.cli <command> ...``) written as code (a code span,
  a fenced or indented block; a shell comment is not a command) names a subcommand of
  :data:`specstudy.cli.SUBCOMMANDS`, and its sub-subcommands, a positional's fixed choice and its options exist
  in the parser;
* every dotted ``specstudy.<module>[.<name>]`` names a module of the package and, when a name follows, one the
  module defines (read with ``ast``; nothing is imported for it).

Read from the text: the CLI from its table and one in-process ``build_parser()``, no subprocess per command.
``test_the_checks_fail_on_made_up_names`` feeds the same checks a constructed doc.
"""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

import specstudy
from specstudy import cli

ROOT = Path(__file__).resolve().parents[1]
PKG = Path(specstudy.__file__).resolve().parent
#: records of earlier runs, kept as written: not checked
HISTORICAL = ("docs/gpu-results", "docs/embedded-results")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [p for p in files if not p.relative_to(ROOT).as_posix().startswith(HISTORICAL)]


# ------------------------------------------------------------------------------------------- code in the text
_SPAN = re.compile(r"(?<!`)`([^`]+)`(?!`)")
_INDENTED_COMMAND = re.compile(r"^ {4,}(?:specstudy|python3? -m specstudy\.cli) ")


def _joined(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Shell lines with their ``\\`` continuations joined, each with the line it starts on."""
    out: list[tuple[int, str]] = []
    for n, line in lines:
        if out and out[-1][1].endswith("\\"):
            out[-1] = (out[-1][0], out[-1][1][:-1] + " " + line.strip())
        else:
            out.append((n, line.rstrip()))
    return out


def code_pieces(text: str) -> list[tuple[int, str]]:
    """(line number, code) for every line of a fenced block, every indented command line and every code span
    (a span may wrap onto the next line)."""
    pieces: list[tuple[int, str]] = []
    block: list[tuple[int, str]] | None = None
    prose: list[tuple[int, str]] = []
    indented: list[tuple[int, str]] = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.lstrip().startswith(("```", "~~~")):
            if block is None:
                block = []
            else:
                pieces += _joined(block)
                block = None
        elif block is not None:
            block.append((n, line))
        elif _INDENTED_COMMAND.match(line) or (indented and indented[-1][1].rstrip().endswith("\\")):
            indented.append((n, line))
        else:
            prose.append((n, line))
    pieces += _joined(indented)
    starts = [n for n, _ in prose]
    joined = "\n".join(line for _, line in prose)
    for m in _SPAN.finditer(joined):
        pieces.append((starts[joined.count("\n", 0, m.start())], m.group(1).replace("\n", " ")))
    return pieces


# ------------------------------------------------------------------------------------------------- the CLI
@cache
def parser_tree() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """Every (sub)parser of ``specstudy``, by its command path: ``()`` is ``specstudy`` itself."""
    tree: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        tree[path] = p
        for a in p._actions:
            if a.nargs == argparse.PARSER:
                for name, sub in a.choices.items():
                    walk(sub, path + (name,))

    walk(cli.build_parser(), ())
    return tree


def _subcommands(p: argparse.ArgumentParser) -> dict:
    return next((a.choices for a in p._actions if a.nargs == argparse.PARSER), {})


def _options(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions for s in a.option_strings}


def _first_choices(p: argparse.ArgumentParser):
    pos = [a for a in p._actions if not a.option_strings and a.nargs != argparse.PARSER]
    return pos[0].choices if pos else None


_COMMAND = re.compile(r"(?:^|(?<=[\s(;&|/]))(?:python3? -m specstudy\.cli|specstudy)[ \t]+(?P<args>.*)")
_END = re.compile(r"\s(?:\|\|?|;|&&|>>?|2>&1|2>)\s|;$")


def _placeholder(token: str) -> bool:
    return token.startswith(("<", "{", "[", "$", "...", "…"))


def command_problems(code: str) -> list[str]:
    """What a line of code says of ``specstudy`` that its parser does not have."""
    code = re.split(r"(?:^|\s)#", code, maxsplit=1)[0]  # a shell comment is not a command
    tree, table = parser_tree(), [name for name, _ in cli.SUBCOMMANDS]
    out = []
    for m in _COMMAND.finditer(code):
        args = _END.split(m.group("args"), maxsplit=1)[0]
        tokens = args.split()
        if not tokens or _placeholder(tokens[0]):
            continue
        if tokens[0] not in table:
            out.append(f"`specstudy {tokens[0]}`: no such subcommand (specstudy.cli.SUBCOMMANDS)")
            continue
        path, i = (tokens[0],), 1
        while i < len(tokens) and _subcommands(tree[path]) and not tokens[i].startswith("-"):
            if _placeholder(tokens[i]):
                break
            if tokens[i] not in _subcommands(tree[path]):
                out.append(f"`specstudy {' '.join(path)} {tokens[i]}`: no such subcommand; "
                           f"`specstudy {' '.join(path)}` has {sorted(_subcommands(tree[path]))}")
                break
            path += (tokens[i],)
            i += 1
        else:
            choices = _first_choices(tree[path])
            if choices and i < len(tokens) and not tokens[i].startswith("-") and not _placeholder(tokens[i]) \
                    and tokens[i] not in choices:
                out.append(f"`specstudy {' '.join(path)} {tokens[i]}`: not one of {sorted(choices)}")
            known = _options(tree[path])
            for t in tokens[i:]:
                opt = re.match(r"\[?(--?[A-Za-z][\w-]*)", t)
                if opt and opt.group(1) not in known:
                    out.append(f"`specstudy {' '.join(path)}` has no option {opt.group(1)}")
    return out


# ------------------------------------------------------------------------------------------ modules, paths
@cache
def top_level_names(path: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (inside top-level if/try too)."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                    names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body + node.orelse + getattr(node, "finalbody", [])
                      + [s for h in getattr(node, "handlers", []) for s in h.body])

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return frozenset(names)


def _module_file(parts: list[str]) -> Path | None:
    base = PKG.joinpath(*parts)
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


_DOTTED = re.compile(r"(?<![\w/.-])specstudy((?:\.[A-Za-z_]\w*)+)")


def dotted_problems(text: str) -> list[str]:
    out = []
    for m in _DOTTED.finditer(text):
        if re.match(r"[\w/-]", text[m.end():m.end() + 1]):
            continue  # a schema id (specstudy.cell/v1, specstudy.capacity-gates/1), not a module
        parts = m.group(1)[1:].split(".")
        k = next(k for k in range(len(parts), -1, -1) if _module_file(parts[:k]))  # 0: the package
        if k < len(parts) and parts[k] not in top_level_names(_module_file(parts[:k])):
            out.append(f"{m.group(0)}: {'.'.join(['specstudy', *parts[:k]])} has no {parts[k]!r}")
    return out


_PKG_PATH = re.compile(r"(?<![\w/.-])scripts/specstudy(?:/[\w.-]+)*")
_TEST_PATH = re.compile(r"(?<![\w/.-])(?:tests/)?(test_\w+\.py)(?:::(\w+))?")


def path_problems(text: str) -> list[str]:
    out = []
    for m in _PKG_PATH.finditer(text):
        rel = m.group(0).rstrip(".")
        if not (ROOT / rel).exists():
            out.append(f"{rel}: no such file or folder")
    for m in _TEST_PATH.finditer(text):
        path = ROOT / "tests" / m.group(1)
        if not path.is_file():
            out.append(f"tests/{m.group(1)}: no such test file")
        elif m.group(2) and not re.search(rf"^(?:async\s+)?def {m.group(2)}\b|^class {m.group(2)}\b",
                                          path.read_text(encoding="utf-8"), re.M):
            out.append(f"tests/{m.group(1)}::{m.group(2)}: no such test")
    return out


def problems(text: str) -> list[str]:
    """Every stale name in a doc's text, each ``line N: what``."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        out += [f"line {n}: {p}" for p in path_problems(line) + dotted_problems(line)]
    for n, code in code_pieces(text):
        out += [f"line {n}: {p}" for p in command_problems(code)]
    return out


# ------------------------------------------------------------------------------------------------- tests
def test_docs_name_only_what_exists():
    files = doc_files()
    assert ROOT / "README.md" in files and len(files) > 10
    assert not [p for p in files if p.relative_to(ROOT).as_posix().startswith(HISTORICAL)]
    found = [f"{p.relative_to(ROOT)}: {msg}" for p in files for msg in problems(p.read_text(encoding="utf-8"))]
    assert not found, "the docs name things that do not exist:\n" + "\n".join(found)


DOC = """\
# a made-up doc

specstudy is a workflow; `specstudy phase summary memory` (docs/memory.md) replaced
`specstudy memory summary`, and `specstudy phase summary fixed_length` was never a phase.
The log's first line reads `# specstudy launch <UTC ISO>`; the record's schema is `specstudy.cell/v1`.
Code: scripts/specstudy/core/layout.py, scripts/specstudy/core/no_such_module.py, `specstudy.core.layout.build`,
`specstudy.study.extensions.check`, `specstudy.core.layout.no_such_function`, specstudy.LAYERS, specstudy.NO_SUCH; tests: tests/test_layout.py,
tests/test_no_such_file.py, `test_layers.py::test_no_such_test`.

```
specstudy plan --cost --config config/config.yaml \\
    --phases screen
python -m specstudy.cli phase sampling judgee --baseline a.json
specstudy check-config <file>   # --no-such-option in a comment is not checked
```

    specstudy tables --results results \\
        --cellz x
"""


def test_the_checks_fail_on_made_up_names():
    assert problems(DOC) == [
        "line 6: scripts/specstudy/core/no_such_module.py: no such file or folder",
        "line 7: specstudy.study.extensions.check: specstudy.study has no 'extensions'",
        "line 7: specstudy.core.layout.no_such_function: specstudy.core.layout has no 'no_such_function'",
        "line 7: specstudy.NO_SUCH: specstudy has no 'NO_SUCH'",
        "line 8: tests/test_no_such_file.py: no such test file",
        "line 8: tests/test_layers.py::test_no_such_test: no such test",
        "line 11: `specstudy plan` has no option --phases",
        "line 13: `specstudy phase sampling judgee`: no such subcommand; `specstudy phase sampling` has "
        "['capture', 'judge']",
        "line 17: `specstudy tables` has no option --cellz",
        "line 4: `specstudy memory`: no such subcommand (specstudy.cli.SUBCOMMANDS)",
        "line 4: `specstudy phase summary fixed_length`: not one of ['ignore_eos', 'memory', 'profile', 'sampling']",
    ]
