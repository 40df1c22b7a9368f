"""The package's shape: its layers (declared once, ``specstudy.LAYERS``) are imported only downwards, and no
module imports itself back through others (no import circle). Every import counts, top-level or inside a
function: an import hidden in a function still ties the two modules together.

Read from the source with ``ast`` (nothing is imported), so the check also covers modules whose imports
need heavy dependencies. ``test_the_check_can_fail`` feeds the same check a made-up package with an
upward import and a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import specstudy

PKG = Path(specstudy.__file__).resolve().parent


def modules(pkg_dir: Path, name: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package (``__init__.py`` is its package)."""
    out = {}
    for p in sorted(pkg_dir.rglob("*.py")):
        parts = [name, *p.relative_to(pkg_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def imports(mods: dict[str, Path], name: str) -> dict[str, dict[str, int]]:
    """module -> {imported module of the package: line of the first import}, top-level and inside functions."""
    def owner(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    edges: dict[str, dict[str, int]] = {m: {} for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    src = ".".join(base + ([node.module] if node.module else []))
                else:
                    src = node.module or ""
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets = [f"{src}.{a.name}" if f"{src}.{a.name}" in mods else src for a in node.names]
            else:
                continue
            for t in targets:
                if t == name or t.startswith(name + "."):
                    target = owner(t)
                    if target and target != mod:
                        edges[mod].setdefault(target, node.lineno)
    return edges


def layer_of(mod: str, name: str, layers: tuple[str, ...]) -> int:
    """The root package is below every layer (it may import nothing of its own); a module directly under it
    (the command line) is above every layer."""
    parts = mod.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] in layers:
        return layers.index(parts[1])
    return len(layers)


def upward(edges, name: str, layers: tuple[str, ...]) -> list[str]:
    return [f"{a} (layer {layer_of(a, name, layers)}) imports {b} (layer {layer_of(b, name, layers)}) at line {line}"
            for a, targets in sorted(edges.items()) for b, line in sorted(targets.items())
            if layer_of(b, name, layers) > layer_of(a, name, layers)]


def circles(edges) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def undeclared(pkg_dir: Path, layers: tuple[str, ...]) -> list[str]:
    """Subpackages that are no declared layer, and declared layers that are no subpackage."""
    dirs = {p.parent.name for p in pkg_dir.glob("*/__init__.py")}
    return sorted(f"{d}/ is not in LAYERS" for d in dirs - set(layers)) + \
        sorted(f"layer {d!r} has no folder" for d in set(layers) - dirs)


def check(pkg_dir: Path, name: str, layers: tuple[str, ...]) -> list[str]:
    mods = modules(pkg_dir, name)
    edges = imports(mods, name)
    return undeclared(pkg_dir, layers) + upward(edges, name, layers) + \
        [f"import circle: {' <-> '.join(c)}" for c in circles(edges)]


def test_specstudy_imports_only_down_its_layers_and_has_no_circle():
    problems = check(PKG, "specstudy", specstudy.LAYERS)
    assert not problems, "\n".join(problems)


def test_the_check_reads_imports_inside_functions_and_resolves_relative_ones():
    edges = imports(modules(PKG, "specstudy"), "specstudy")
    # specstudy.cli imports the bad-input errors inside explain() only
    assert "specstudy.core.errors" in edges["specstudy.cli"]
    assert "specstudy.deployment.launch" in edges["specstudy.deployment.readiness"]  # `from .launch import Server`
    assert sum(len(t) for t in edges.values()) > 200, "the package's imports were not read"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root / "pkg"


def test_the_check_can_fail(tmp_path):
    pkg = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "def f():\n    from pkg.high import b  # up the layers, inside a function\n",
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from ..low import a\n",
        "pkg/high/c.py": "from . import d\n",
        "pkg/high/d.py": "import pkg.high.c\n",
        "pkg/stray/__init__.py": "",
    })
    problems = check(pkg, "pkg", ("low", "high"))
    assert "stray/ is not in LAYERS" in problems
    assert any(p.startswith("pkg.low.a (layer 0) imports pkg.high.b (layer 1) at line 2") for p in problems), problems
    assert "import circle: pkg.high.b <-> pkg.low.a" in problems
    assert "import circle: pkg.high.c <-> pkg.high.d" in problems
    assert check(pkg, "pkg", ("low", "high", "stray", "gone")) == [
        "layer 'gone' has no folder", *[p for p in problems if "LAYERS" not in p]]


def test_every_module_says_its_concept():
    """Every module opens with a docstring saying what it is (issue 30: a newcomer reads the package from its
    folder names and first lines)."""
    missing = [str(p.relative_to(PKG)) for p in sorted(PKG.rglob("*.py"))
               if not (ast.get_docstring(ast.parse(p.read_text(), str(p))) or "").strip()]
    assert not missing, f"modules without a docstring: {missing}"
