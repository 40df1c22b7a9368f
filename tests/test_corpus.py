"""Tests for specstudy.inputs.corpus: importers, determinism, digest sensitivity, bad input, token stats."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from specstudy.inputs import corpus
from specstudy.inputs.corpus import CorpusError, CorpusMismatchError

REPO = Path(__file__).resolve().parents[1]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def write_spec(tmp_path: Path, src: Path, fmt: str, *, name: str = "t", **over) -> Path:
    spec = {
        "schema": "specstudy.corpus-spec/1",
        "name": name,
        "version": "1",
        "format": fmt,
        "source": {"path": str(src), "license": "CC0-1.0",
                   "sha256": corpus.source_sha256(src, fmt, over.get("options") or {})},
        "sampling": {"seed": 7, "count": 3},
        "max_tokens": 32,
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sharegpt_file(tmp_path: Path, n: int = 5) -> Path:
    convs = [{"id": f"c{i}", "conversations": [{"from": "human", "value": f"Question number {i} about rivers?"},
                                               {"from": "gpt", "value": f"Answer {i}."},
                                               {"from": "human", "value": f"Follow-up {i}?"}]} for i in range(n)]
    convs[0]["conversations"].insert(0, {"from": "system", "value": "Be brief."})
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(convs))
    return path


def tasks_file(tmp_path: Path, n: int = 5, gz: bool = False) -> Path:
    rows = [{"task_id": f"T/{i}", "prompt": f"def f{i}(x):\n    \"\"\"Return x plus {i}.\"\"\"\n",
             "entry_point": f"f{i}"} for i in range(n)]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    path = tmp_path / ("tasks.jsonl.gz" if gz else "tasks.jsonl")
    if gz:
        path.write_bytes(gzip.compress(text.encode(), mtime=0))
    else:
        path.write_text(text)
    return path


def docs_dir(tmp_path: Path, lengths=(40, 60, 80, 100, 400)) -> Path:
    d = tmp_path / "docs"
    d.mkdir()
    for i, words in enumerate(lengths):
        (d / f"doc{i:02d}.txt").write_text(" ".join(["lorem"] * words) + "\n")
    return d


def build_one(tmp_path: Path, spec: Path, out: str = "out", tokenizer=None) -> Path:
    return corpus.build(spec, tmp_path / out, tokenizer)


# ------------------------------------------------------------------------------------------ importers

def test_sharegpt_first_turn_and_full_history(tmp_path):
    src = sharegpt_file(tmp_path)
    first = build_one(tmp_path, write_spec(tmp_path, src, "sharegpt_json", name="a", sampling={"count": 5}))
    rows = corpus.load_prompts(first)
    assert len(rows) == 5
    by_len = sorted(len(r["messages"]) for r in rows)
    assert by_len == [1, 1, 1, 1, 2]  # conversation c0 keeps its system turn
    assert all(r["messages"][-1]["role"] == "user" and r["messages"][-1]["content"].startswith("Question")
               for r in rows)
    full = build_one(tmp_path, write_spec(tmp_path, src, "sharegpt_json", name="b", sampling={"count": 5},
                                          options={"conversation_mode": "full_history"}))
    rows = corpus.load_prompts(full)
    assert sorted(len(r["messages"]) for r in rows) == [3, 3, 3, 3, 4]
    assert [m["role"] for m in rows[0]["messages"]][-3:] == ["user", "assistant", "user"]
    assert [r["prompt_id"] for r in rows] == [f"b-{i:04d}" for i in range(5)]


def test_task_jsonl_template_ids_and_gzip(tmp_path):
    src = tasks_file(tmp_path, gz=True)
    spec = write_spec(tmp_path, src, "task_jsonl", stratum="code", template="Complete {entry_point}:\n{prompt}")
    out = build_one(tmp_path, spec)
    rows = corpus.load_prompts(out)
    assert [r["prompt_id"] for r in rows] == ["code-0000", "code-0001", "code-0002"]
    assert all(r["stratum"] == "code" and r["max_tokens"] == 32 for r in rows)
    content = rows[0]["messages"][0]["content"]
    assert content.startswith("Complete f") and "def f" in content
    meta = json.loads((out / "corpus.json").read_text())
    assert meta["count"] == 3 and meta["selection"]["pool"] == 5
    assert meta["sources"][0]["sha256"] == sha(src) and meta["sources"][0]["license"] == "CC0-1.0"
    assert {i["source_id"] for i in meta["items"]} <= {f"T/{i}" for i in range(5)}


def test_mbpp_style_prompt_field(tmp_path):
    src = tmp_path / "mbpp.jsonl"
    src.write_text("".join(json.dumps({"task_id": i, "text": f"Write a function number {i}.",
                                       "test_list": [f"assert f({i}) == {i}"]}) + "\n" for i in range(4)))
    spec = write_spec(tmp_path, src, "task_jsonl", options={"prompt_field": "text"},
                      template="{prompt}\nTests:\n{test_list}")
    rows = corpus.load_prompts(build_one(tmp_path, spec))
    assert "Tests:\nassert f(" in rows[0]["messages"][0]["content"]


def test_documents_dir_and_jsonl(tmp_path):
    d = docs_dir(tmp_path)
    spec = write_spec(tmp_path, d, "documents_text_dir", stratum="summarization", sampling={"count": 5},
                      template="Summarize in 2 sentences:\n\n{document}")
    rows = corpus.load_prompts(build_one(tmp_path, spec))
    assert len(rows) == 5 and all(r["messages"][0]["content"].startswith("Summarize in 2") for r in rows)
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "report": "word " * (10 + i)}) + "\n" for i in range(4)))
    spec = write_spec(tmp_path, src, "documents_jsonl", name="j", options={"text_field": "report"},
                      template="S: {document}")
    out = build_one(tmp_path, spec)
    assert all(r["messages"][0]["content"].startswith("S: word") for r in corpus.load_prompts(out))


def test_chat_jsonl_row_stratum(tmp_path):
    src = tmp_path / "smoke.jsonl"
    src.write_text("".join(json.dumps({"id": f"s{i}", "stratum": ["code", "open_chat"][i % 2],
                                       "messages": [{"role": "user", "content": f"hi {i}"}]}) + "\n"
                           for i in range(4)))
    spec = write_spec(tmp_path, src, "chat_jsonl", stratum="smoke", id_prefix="smoke", sampling={"count": 4})
    rows = corpus.load_prompts(build_one(tmp_path, spec))
    assert {r["stratum"] for r in rows} == {"code", "open_chat"}
    assert [r["prompt_id"] for r in rows] == [f"smoke-{i:04d}" for i in range(4)]



def test_chat_jsonl_template_wraps_the_last_message_and_bad_lines_say_why(tmp_path):
    src = tmp_path / "chat.jsonl"
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    src.write_text(json.dumps({"id": "a", "messages": msgs}) + "\n[1, 2]\n{not json\n")
    items, malformed = corpus.import_chat_jsonl(src, {"template": "Q: {message}"})
    assert [i["messages"] for i in items] == [[msgs[0], {"role": "user", "content": "Q: hi"}]]
    assert [m["reason"] for m in malformed][0] == "each line must be a JSON object with 'messages'"
    assert malformed[1]["reason"].startswith("not valid JSON (") and malformed[1]["where"] == f"{src}: line 3"
    items, _ = corpus.import_chat_jsonl(src, {})
    assert items[0]["messages"] == msgs
    _, malformed = corpus.import_tasks(src, {})
    assert malformed[1]["reason"] == "each line must be a JSON object" and malformed[1]["where"] == f"{src}: line 2"


# ---------------------------------------------------------------------------------------- determinism

def test_rebuild_is_byte_identical(tmp_path):
    src = tasks_file(tmp_path)
    spec = write_spec(tmp_path, src, "task_jsonl")
    a = build_one(tmp_path, spec, "a")
    b = build_one(tmp_path, spec, "b")
    for name in ("prompts.jsonl", "corpus.json", "token_stats.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name
    digest = json.loads((a / "corpus.json").read_text())["digest"]
    assert corpus.verify_digest(a, digest)["digest"] == digest
    assert corpus.verify_digest(a / "corpus.json", digest)["count"] == 3


def _digest(tmp_path: Path, label: str, src: Path, **over) -> str:
    sub = tmp_path / label
    sub.mkdir()
    out = corpus.build(write_spec(sub, src, "task_jsonl", **over), sub / "out")
    return json.loads((out / "corpus.json").read_text())["digest"]


def test_digest_sensitivity(tmp_path):
    src = tasks_file(tmp_path, n=3)
    base = _digest(tmp_path, "base", src)
    assert _digest(tmp_path, "same", src) == base
    assert _digest(tmp_path, "seed", src, sampling={"seed": 8}) != base
    assert _digest(tmp_path, "cap", src, max_tokens=33) != base
    assert _digest(tmp_path, "tmpl", src, template="Please: {prompt}") != base
    changed = tmp_path / "changed"
    changed.mkdir()
    src2 = tasks_file(changed, n=3)
    src2.write_text(src2.read_text().replace("plus 2", "plus two"))
    assert _digest(tmp_path, "source", src2) != base


def test_sampling_order_is_seeded_and_stable(tmp_path):
    src = tasks_file(tmp_path, n=20)
    def ids(label, seed):
        sub = tmp_path / label
        sub.mkdir()
        out = corpus.build(write_spec(sub, src, "task_jsonl", sampling={"seed": seed, "count": 10}), sub / "o")
        return [i["source_id"] for i in json.loads((out / "corpus.json").read_text())["items"]]
    assert ids("x", 1) == ids("y", 1)
    assert ids("x2", 1) != ids("z", 2)


def test_verify_digest_mismatch_and_tamper(tmp_path):
    out = build_one(tmp_path, write_spec(tmp_path, tasks_file(tmp_path), "task_jsonl"))
    digest = json.loads((out / "corpus.json").read_text())["digest"]
    with pytest.raises(CorpusMismatchError, match="expected 0+, found"):
        corpus.verify_digest(out, "0" * 64)
    p = out / "prompts.jsonl"
    p.write_text(p.read_text().replace('"max_tokens":32', '"max_tokens":99', 1))
    with pytest.raises(CorpusMismatchError, match="modified after the build"):
        corpus.verify_digest(out, digest)


def test_cli_build_and_check(tmp_path, capsys):
    from specstudy import cli

    spec = write_spec(tmp_path, tasks_file(tmp_path), "task_jsonl")
    assert cli.main(["corpus", "build", "--spec", str(spec), "--out", str(tmp_path / "r")]) == 0
    meta = json.loads((tmp_path / "r" / "t" / "1" / "corpus.json").read_text())
    path = str(tmp_path / "r" / "t" / "1" / "corpus.json")
    assert cli.main(["corpus", "check", "--corpus", path, "--digest", meta["digest"]]) == 0
    assert cli.main(["corpus", "check", "--corpus", path, "--digest", "f" * 64]) == 1
    assert "digest mismatch" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ bad input

def test_missing_source(tmp_path):
    src = tasks_file(tmp_path)
    spec = write_spec(tmp_path, src, "task_jsonl")
    src.unlink()
    with pytest.raises(CorpusError, match=r"source\.path.*does not exist"):
        corpus.build(spec, tmp_path / "o")


def test_sha_mismatch_and_placeholder(tmp_path):
    src = tasks_file(tmp_path)
    spec = write_spec(tmp_path, src, "task_jsonl")
    src.write_text(src.read_text() + json.dumps({"task_id": "x", "prompt": "def g(): pass\n"}) + "\n")
    with pytest.raises(CorpusError, match=r"source\.sha256' does not match.*bump 'version'"):
        corpus.build(spec, tmp_path / "o")
    spec2 = write_spec(tmp_path, src, "task_jsonl", name="p", source={"sha256": "FILL-ME-sha256"})
    with pytest.raises(CorpusError, match=f"placeholder.*{sha(src)}"):
        corpus.build(spec2, tmp_path / "o")


def test_malformed_row_names_file_and_line(tmp_path):
    src = tasks_file(tmp_path)
    src.write_text(src.read_text() + '{"task_id": "bad", "prompt": ""}\n{not json\n')
    spec = write_spec(tmp_path, src, "task_jsonl")
    with pytest.raises(CorpusError, match=r"tasks\.jsonl: line 6: malformed row: field 'prompt'.*1 more"):
        corpus.build(spec, tmp_path / "o")
    spec = write_spec(tmp_path, src, "task_jsonl", name="skip", options={"on_malformed": "skip"})
    meta = json.loads((corpus.build(spec, tmp_path / "o") / "corpus.json").read_text())
    assert meta["selection"]["malformed_skipped"] == 2


def test_malformed_sharegpt(tmp_path):
    src = tmp_path / "bad.json"
    src.write_text(json.dumps([{"id": "x", "conversations": [{"from": "gpt", "value": "only an answer"}]}]))
    with pytest.raises(CorpusError, match=r"conversation #0 \(id x\): malformed row: no human turn"):
        corpus.build(write_spec(tmp_path, src, "sharegpt_json"), tmp_path / "o")


def test_window_rejects_reports_and_fails_when_too_few(tmp_path):
    d = docs_dir(tmp_path)  # 40..100 words and one of 400 words
    window = {"input_tokens": {"min": 10, "max": 200}}  # chars/4 estimate: 400 words * 6 chars / 4 = 600
    spec = write_spec(tmp_path, d, "documents_text_dir", sampling={"count": 4}, filters=window,
                      template="{document}")
    meta = json.loads((corpus.build(spec, tmp_path / "o") / "corpus.json").read_text())
    assert meta["count"] == 4 and meta["selection"]["rejected_out_of_window"] == 1
    assert meta["selection"]["rejected_examples"][0]["source_id"] == "doc04"
    assert meta["selection"]["window_measure"] == "estimate_chars_div_4"
    spec = write_spec(tmp_path, d, "documents_text_dir", name="five", sampling={"count": 5}, filters=window,
                      template="{document}")
    with pytest.raises(CorpusError, match=r"count is 5 but only 4 rows qualify.*doc04\.txt"):
        corpus.build(spec, tmp_path / "o")
    spec = write_spec(tmp_path, d, "documents_text_dir", name="fail", sampling={"count": 5},
                      filters={**window, "on_out_of_window": "fail"}, template="{document}")
    with pytest.raises(CorpusError, match=r"doc04\.txt: input is \d+ tokens.*outside the window"):
        corpus.build(spec, tmp_path / "o")
    spec = write_spec(tmp_path, d, "documents_text_dir", name="few", sampling={"count": 5, "allow_fewer": True},
                      filters=window, template="{document}")
    assert json.loads((corpus.build(spec, tmp_path / "o") / "corpus.json").read_text())["count"] == 4


def test_empty_stratum_fails(tmp_path):
    d = docs_dir(tmp_path, lengths=(400, 500))
    spec = write_spec(tmp_path, d, "documents_text_dir", filters={"input_tokens": {"max": 50}})
    with pytest.raises(CorpusError, match="is empty"):
        corpus.build(spec, tmp_path / "o")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CorpusError, match="no usable rows"):
        corpus.build(write_spec(tmp_path, empty, "task_jsonl", name="e"), tmp_path / "o")


def test_bad_spec_schema_and_template(tmp_path):
    src = tasks_file(tmp_path)
    with pytest.raises(CorpusError, match="field 'format'.*allowed"):
        corpus.build(write_spec(tmp_path, src, "task_jsonl", format="csv"), tmp_path / "o")
    with pytest.raises(CorpusError, match=r"must contain \{prompt\}"):
        corpus.build(write_spec(tmp_path, src, "task_jsonl", name="tt", template="Do it"), tmp_path / "o")
    with pytest.raises(CorpusError, match=r"placeholder \{nope\}"):
        corpus.build(write_spec(tmp_path, src, "task_jsonl", name="tn", template="{prompt}{nope}"), tmp_path / "o")


# ---------------------------------------------------------------------------------------- token stats

@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["Question number about rivers lorem word def return x plus"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


def test_token_stats_with_tokenizer(tmp_path, tiny_tokenizer):
    from transformers import AutoTokenizer

    spec = write_spec(tmp_path, sharegpt_file(tmp_path), "sharegpt_json", stratum="open_chat",
                      sampling={"count": 5})
    out = corpus.build(spec, tmp_path / "o", tiny_tokenizer)
    stats = json.loads((out / "token_stats.json").read_text())
    assert stats["available"] is True and stats["tokenizer"]["measure"] == "chat_template"
    tok = AutoTokenizer.from_pretrained(str(tiny_tokenizer))
    expected = {}
    for row in corpus.load_prompts(out):
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in row["messages"])
        text += "<|im_start|>assistant\n"
        expected[row["prompt_id"]] = len(tok(text, add_special_tokens=False)["input_ids"])
    assert stats["per_prompt"] == expected
    values = sorted(expected.values())
    s = stats["strata"]["open_chat"]
    assert (s["min"], s["max"], s["count"]) == (values[0], values[-1], 5)
    assert s["p95"] == values[-1]  # nearest rank of 5 values
    assert stats["max_input_plus_max_tokens"] == values[-1] + 32
    # the window is measured with the tokenizer when one is given
    meta = json.loads((out / "corpus.json").read_text())
    assert meta["selection"]["window_measure"] == "none"
    spec = write_spec(tmp_path, sharegpt_file(tmp_path), "sharegpt_json", name="w", sampling={"count": 5},
                      filters={"input_tokens": {"min": 1, "max": values[-1] - 1}}, options={"on_malformed": "fail"})
    with pytest.raises(CorpusError, match=r"only 4 rows qualify"):
        corpus.build(spec, tmp_path / "o", tiny_tokenizer)


def test_token_stats_unavailable_without_tokenizer(tmp_path):
    out = build_one(tmp_path, write_spec(tmp_path, tasks_file(tmp_path), "task_jsonl"))
    stats = json.loads((out / "token_stats.json").read_text())
    assert stats["available"] is False and "no tokenizer" in stats["reason"]


def test_missing_tokenizer_dir(tmp_path):
    with pytest.raises(CorpusError, match="--tokenizer"):
        build_one(tmp_path, write_spec(tmp_path, tasks_file(tmp_path), "task_jsonl"), tokenizer=tmp_path / "nope")


# -------------------------------------------------------------------------------------- bundled specs

@pytest.mark.parametrize("stratum", ["open_chat", "code", "summarization", "smoke"])
def test_embedded_specs_build(tmp_path, stratum):
    out = corpus.build(REPO / "corpora" / "embedded" / f"{stratum}.yaml", tmp_path / "o")
    meta = json.loads((out / "corpus.json").read_text())
    rows = corpus.load_prompts(out)
    assert meta["count"] == len(rows) == meta["spec"]["sampling"]["count"]
    assert out.parent.name == meta["name"] and out.name == meta["version"]
    assert all(r["prompt_id"].startswith(f"{meta['spec'].get('id_prefix', stratum)}-") for r in rows)
    if stratum == "smoke":
        assert {r["stratum"] for r in rows} == {"open_chat", "code", "summarization"}
    assert "/work/" not in (out / "corpus.json").read_text().replace(str(tmp_path), "")


def test_clariden_specs_validate():
    paths = sorted((REPO / "corpora" / "clariden").glob("*.yaml"))
    assert paths, "no corpus spec under corpora/clariden/"
    for path in paths:
        spec = corpus.load_spec(path)
        assert spec["source"]["license"]


def test_bundled_code_reference_solutions_pass_their_tests():
    rows = [json.loads(line) for line in (REPO / "corpora/data/code/tasks.jsonl").read_text().splitlines()]
    assert len(rows) >= 30
    for row in rows:
        ns: dict = {}
        exec(row["prompt"] + row["canonical_solution"], ns)  # noqa: S102 - our own bundled data
        exec(row["test"], ns)  # noqa: S102
        ns["check"](ns[row["entry_point"]])
