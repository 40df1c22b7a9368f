"""The report's content as a list of blocks (heading, paragraph, list, table, figure, preformatted text, a
Markdown section) and its two renderings, Markdown and self-contained HTML; the formatting of a value in a
block (a number, an interval, the repeats).
"""

from __future__ import annotations

import html
from typing import Any

#: One block: ``("h", level, text)``, ``("p", text)``, ``("ul", items)``, ``("table", headers, rows)`` (or
#: ``("table", headers, rows, caption)``), ``("img", path, caption)``, ``("pre", text)`` or ``("md", markdown)``.
Block = tuple


def _labelled(text: str, label: str) -> str:
    return text if label.lower() in text.lower() else f"{text} ({label})"


def label_blocks(blocks: list[Block], label: str) -> list[Block]:
    """The blocks of a study that must say what it ran on (the scale model, issue 27): every heading below the
    title, every figure caption and every Markdown section's headings carry ``label``; every table gets a
    caption naming ``label`` and the section it stands in (a table copied out of the report still says it)."""
    import re

    out: list[Block] = []
    section = ""
    for b in blocks:
        kind = b[0]
        if kind == "h":
            section = b[2]
            out.append(b if b[1] == 1 else ("h", b[1], _labelled(b[2], label)))
        elif kind == "table":
            caption = b[3] if len(b) > 3 and b[3] else section
            out.append(("table", b[1], b[2], f"Table ({label}): {caption}" if label.lower() not in caption.lower()
                        else caption))
        elif kind == "img":
            out.append(("img", b[1], _labelled(b[2], label)))
        elif kind == "md":
            out.append(("md", re.sub(r"(?m)^(#{1,6} )(.+?)\s*$", lambda m: m[1] + _labelled(m[2], label), b[1])))
        else:
            out.append(b)
    return out


def fmt(v: Any, spec: str = "{:.3f}") -> str:
    """``v`` formatted by ``spec``; "–" for a missing value, ``str(v)`` when it does not fit the format."""
    if v is None:
        return "–"
    try:
        return spec.format(v)
    except (TypeError, ValueError):
        return str(v)


def fmt_ci(d: dict) -> str:
    if not d or not d.get("n"):
        return "–"
    s = f"{fmt(d['geomean'])}"
    if d.get("ci_low") is not None:
        s += f" [{fmt(d['ci_low'])}, {fmt(d['ci_high'])}]"
    return s


def fmt_reps(d: dict) -> str:
    return ", ".join(fmt(v) for v in (d or {}).get("values", [])) or "–"


def render_markdown(blocks: list[Block]) -> str:
    out = []
    for b in blocks:
        kind = b[0]
        if kind == "h":
            out.append("#" * b[1] + " " + b[2] + "\n")
        elif kind == "p":
            out.append(b[1] + "\n")
        elif kind == "ul":
            out.append("".join(f"- {x}\n" for x in b[1]) if b[1] else "- (none)\n")
        elif kind == "table":
            headers, rows = b[1], b[2]
            caption = f"*{b[3]}*\n\n" if len(b) > 3 and b[3] else ""
            if not rows:
                out.append(caption + "_(no rows)_\n")
                continue
            esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in r] for r in rows]
            out.append(caption + "| " + " | ".join(headers) + " |\n|" + "---|" * len(headers) + "\n"
                       + "".join("| " + " | ".join(r) + " |\n" for r in esc))
        elif kind == "img":
            out.append(f"![{b[2]}]({b[1]})\n\n*Figure: {b[2]}*\n")
        elif kind == "pre":
            out.append("```\n" + b[1].rstrip("\n") + "\n```\n")
        elif kind == "md":  # a section written as Markdown by another step (an extension phase's section.md)
            out.append(b[1].rstrip("\n") + "\n")
    return "\n".join(out)


def render_html(blocks: list[Block], title: str) -> str:
    e = html.escape
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>"
             "body{font-family:sans-serif;max-width:1100px;margin:2em auto;line-height:1.4}"
             "table{border-collapse:collapse;font-size:90%}td,th{border:1px solid #ccc;padding:2px 6px}"
             "th{background:#eee}img{max-width:100%}pre{background:#f6f6f6;padding:8px;overflow-x:auto}"
             "figure{margin:1em 0}figcaption{font-size:90%;color:#444}"
             "</style></head><body>"]
    for b in blocks:
        kind = b[0]
        if kind == "h":
            parts.append(f"<h{b[1]}>{e(b[2])}</h{b[1]}>")
        elif kind == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif kind == "ul":
            parts.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in (b[1] or ["(none)"])) + "</ul>")
        elif kind == "table":
            caption = b[3] if len(b) > 3 and b[3] else None
            if not b[2]:
                parts.append((f"<p><em>{e(caption)}</em></p>" if caption else "") + "<p><em>(no rows)</em></p>")
                continue
            parts.append("<table>" + (f"<caption>{e(caption)}</caption>" if caption else "") + "<tr>" + "".join(f"<th>{e(h)}</th>" for h in b[1]) + "</tr>"
                         + "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in r) + "</tr>" for r in b[2])
                         + "</table>")
        elif kind == "img":
            parts.append(f"<figure><img src='{e(b[1])}' alt='{e(b[2])}'><figcaption>{e(b[2])}</figcaption></figure>")
        elif kind == "pre":
            parts.append(f"<pre>{e(b[1])}</pre>")
        elif kind == "md":
            from markdown_it import MarkdownIt

            parts.append(MarkdownIt("commonmark", {"html": False}).enable("table").render(b[1]))
    parts.append("</body></html>\n")
    return "\n".join(parts)
