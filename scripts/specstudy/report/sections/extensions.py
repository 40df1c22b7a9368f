"""The report's last section: the opt-in extension phases' own sections (``results/<phase>/section.md``), under
one heading, none of them feeding the recommendation.
"""

from __future__ import annotations

from pathlib import Path


def extension_sections(B: list, sections: list[str]) -> None:
    """The opt-in extension phases' own sections (results/<phase>/section.md, config extensions.report),
    after everything above and under their own heading: none of them feeds the recommendation."""
    if not sections:
        return
    B.append(("h", 2, "Extensions (opt-in phases, kept apart: none of them feeds the recommendation above)"))
    for path in sections:
        text = Path(path).read_text(encoding="utf-8")
        # each section starts at level 2; nest it one level under the heading above
        lines = ["#" + line if line.startswith("#") else line for line in text.splitlines()]
        B.append(("md", "\n".join(lines) + f"\n\n*Source: `{path}`*"))
