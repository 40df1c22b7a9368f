"""Every relative Markdown link of README.md, docs/*.md and the run records under docs/runs/ points at a file or
folder that exists, so a document moved into docs/runs/ (or anywhere) leaves no dangling link behind. External
links (a scheme such as ``https:``), links to an anchor of the same page and links inside fenced code blocks
are not checked; an anchor after a path is not checked either, only the path.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_FENCED = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1", re.S | re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def link_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "runs").glob("*.md"))]


def broken_links(path: Path) -> list[str]:
    """The relative link targets of ``path`` whose file part does not exist (relative to the page's folder)."""
    text = _FENCED.sub("", path.read_text(encoding="utf-8"))
    out = []
    for m in _LINK.finditer(text):
        target = m.group(1)
        if _SCHEME.match(target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#", 1)[0]).exists():
            out.append(target)
    return out


def test_every_relative_link_resolves():
    files = link_docs()
    assert ROOT / "docs" / "runs" / "README.md" in files and len(files) > 20
    bad = {p.relative_to(ROOT).as_posix(): b for p in files if (b := broken_links(p))}
    assert not bad, f"links to files that do not exist: {bad}"


def test_a_dangling_link_is_found(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "there.md").write_text("# there\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "[ok](runs/there.md) [ok, anchor](runs/there.md#there) [folder](runs/) [page](#top)\n"
        "[web](https://example.org/x.md) [gone](runs/moved.md) [gone too](../nowhere.md#a)\n"
        "```\n[in code](not-checked.md)\n```\n")
    assert broken_links(doc) == ["runs/moved.md", "../nowhere.md#a"]
