"""Regenerate the machine-readable bundled corpora under ``corpora/data/`` from their sources.

Sources (all written for this project, CC0-1.0):
  corpora/tools/src/open_chat_*.txt            -> corpora/data/open_chat/conversations.json (ShareGPT-style)
  corpora/data/code/reference_solutions.py     -> corpora/data/code/tasks.jsonl (HumanEval-style)
  SMOKE below                                  -> corpora/data/smoke/smoke.jsonl (chat JSONL)
The summarization documents (corpora/data/summarization/documents/*.txt) are edited directly.

Run from the repository root:  python corpora/tools/make_bundled_data.py
The output is byte-for-byte deterministic. After changing any bundled file, bump the ``version`` and
update the ``sha256`` in the matching corpora/embedded/*.yaml spec (``specstudy corpus build`` tells you
the new hash).
"""

from __future__ import annotations

import ast
import doctest
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "corpora" / "tools" / "src"
DATA = ROOT / "corpora" / "data"

ROLE_MARKERS = {">>> user": "human", "<<< assistant": "gpt", "=== system": "system"}


def parse_chat_source(text: str, origin: str) -> list[dict]:
    conversations: list[dict] = []
    current: dict | None = None
    turn: dict | None = None
    for lineno, line in enumerate(text.splitlines(), start=1):
        if line.startswith("### "):
            current = {"id": line[4:].strip(), "conversations": []}
            conversations.append(current)
            turn = None
        elif line.strip() in ROLE_MARKERS:
            if current is None:
                raise SystemExit(f"{origin}:{lineno}: role marker before any '### <id>' line")
            turn = {"from": ROLE_MARKERS[line.strip()], "value": ""}
            current["conversations"].append(turn)
        else:
            if turn is None:
                if line.strip():
                    raise SystemExit(f"{origin}:{lineno}: text outside a turn")
                continue
            turn["value"] += line + "\n"
    for conv in conversations:
        for t in conv["conversations"]:
            t["value"] = t["value"].strip()
    return conversations


def build_open_chat() -> None:
    conversations = []
    for path in sorted(SRC.glob("open_chat_*.txt")):
        conversations.extend(parse_chat_source(path.read_text(encoding="utf-8"), str(path)))
    ids = [c["id"] for c in conversations]
    assert len(ids) == len(set(ids)), "duplicate conversation id"
    out = DATA / "open_chat" / "conversations.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(conversations, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{out.relative_to(ROOT)}: {len(conversations)} conversations")


def _doctest_to_asserts(docstring: str, name: str) -> str:
    lines = ["def check(candidate):"]
    for example in doctest.DocTestParser().get_examples(docstring):
        call = re.sub(rf"\b{name}\(", "candidate(", example.source.strip())
        want = example.want.strip()
        if want:
            lines.append(f"    assert {call} == {want}")
        else:
            lines.append(f"    assert {call} is None")
    return "\n".join(lines) + "\n"


def build_code() -> None:
    path = DATA / "code" / "reference_solutions.py"
    source = path.read_text(encoding="utf-8")
    src_lines = source.splitlines(keepends=True)
    tree = ast.parse(source)
    rows = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef):
            continue
        doc_node = node.body[0]
        header = "".join(src_lines[node.lineno - 1 : doc_node.end_lineno])
        body = "".join(src_lines[doc_node.end_lineno : node.end_lineno])
        prompt = "from __future__ import annotations\n\n\n" + header
        rows.append(
            {
                "task_id": f"Bundled/{len(rows)}",
                "prompt": prompt,
                "entry_point": node.name,
                "canonical_solution": body,
                "test": _doctest_to_asserts(ast.get_docstring(node) or "", node.name),
            }
        )
    out = DATA / "code" / "tasks.jsonl"
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{out.relative_to(ROOT)}: {len(rows)} tasks")


SMOKE = [
    {
        "id": "smoke-chat-capital",
        "stratum": "open_chat",
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    },
    {
        "id": "smoke-chat-list",
        "stratum": "open_chat",
        "messages": [{"role": "user", "content": "List three tips for writing clear emails at work."}],
    },
    {
        "id": "smoke-code-add",
        "stratum": "code",
        "messages": [
            {
                "role": "user",
                "content": "Complete the following Python function. Reply with code only.\n\n"
                'def add_numbers(a: int, b: int) -> int:\n    """Return the sum of two integers."""\n',
            }
        ],
    },
    {
        "id": "smoke-code-reverse",
        "stratum": "code",
        "messages": [
            {
                "role": "user",
                "content": "Complete the following Python function. Reply with code only.\n\n"
                'def reverse_words(sentence: str) -> str:\n    """Return the words of sentence in reverse order."""\n',
            }
        ],
    },
    {
        "id": "smoke-summ-bees",
        "stratum": "summarization",
        "messages": [
            {
                "role": "user",
                "content": "Summarize the following text in at most two sentences:\n\n"
                "In late spring, a strong honeybee colony often divides. The old queen leaves the hive with "
                "about half of the workers, and the swarm settles on a tree branch while scouts search for a "
                "new home. Each scout dances for the site she found, and dances longer for a better site. "
                "When enough scouts gather at one site, the whole swarm flies there.",
            }
        ],
    },
    {
        "id": "smoke-summ-cache",
        "stratum": "summarization",
        "messages": [
            {
                "role": "user",
                "content": "Summarize the following text in at most two sentences:\n\n"
                "Main memory is far slower than the processor. Cache memory keeps small copies of recently "
                "used data close to the processor, in several levels that trade size for speed. Caches work "
                "because programs reuse recent data and read nearby addresses, so walking through an array "
                "in order is much faster than jumping around at random.",
            }
        ],
    },
]


def build_smoke() -> None:
    out = DATA / "smoke" / "smoke.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in SMOKE), encoding="utf-8")
    print(f"{out.relative_to(ROOT)}: {len(SMOKE)} prompts")


if __name__ == "__main__":
    build_open_chat()
    build_code()
    build_smoke()
