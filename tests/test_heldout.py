"""Fixture acceptance on held-out text (#16 item 11): the round arithmetic, the one-pass shortcut checked
against an explicit draft-then-verify loop on the real fixture models, and held-out text that really is
held out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specstudy.core.errors import UserError
from specstudy.inputs import fixture_models as fm
from specstudy.inputs import heldout

ROOT = Path(__file__).resolve().parents[1]
HELDOUT = ROOT / "corpora" / "heldout" / "prompts.jsonl"


def test_rounds_follow_the_draft_then_verify_arithmetic():
    # token 0 from prefill; k=2: round at 1 accepts 2 (1,2) -> 4; round at 4: 4 miss -> 5; round at 5:
    # 5 hit, 6 miss -> 7; round at 7: 7 hit, only 1 token left -> 8 (end)
    m = [False, True, True, False, False, True, False, True]
    r = heldout.rounds(m, 2)
    assert r == {"drafts": 4, "draft_tokens": 7, "accepted": 4, "accepted_at": [3, 1]}
    s = heldout.summarize([r])
    assert s["acceptance_rate"] == pytest.approx(4 / 7)
    assert s["mean_acceptance_length"] == pytest.approx(1 + 4 / 4)
    assert s["per_position"] == [pytest.approx(3 / 4), pytest.approx(1 / 4)]
    assert heldout.rounds([True] * 9, 4)["accepted"] == 8 - 1  # rounds at 1 (4) and 6 (3 left)
    with pytest.raises(ValueError):
        heldout.rounds(m, 0)


def test_drop_interval_is_the_difference_of_ratios_with_an_interval_around_it():
    tr = [{"accepted": 8, "draft_tokens": 10}, {"accepted": 6, "draft_tokens": 10}]
    he = [{"accepted": 2, "draft_tokens": 10}, {"accepted": 4, "draft_tokens": 10}]
    d = heldout.drop_interval(tr, he, resamples=500)
    assert d["drop"] == pytest.approx(0.7 - 0.3)
    assert d["ci"][0] <= d["drop"] <= d["ci"][1] and d["ci"][0] > 0


def test_heldout_prompts_are_not_in_the_training_text():
    files = fm._text_files(ROOT / "corpora" / "data")
    training = re.sub(r"\s+", " ", "\n".join(fm._documents(files)))
    rows = heldout.read_prompts(HELDOUT)
    assert {r["stratum"] for r in rows} == {"open_chat", "code", "summarization"}
    for r in rows:
        text = r["messages"][-1]["content"]
        # the shared instruction / import prefixes aside, no 60-character run of a held-out prompt was trained on
        body = re.sub(r"\s+", " ", text.split("\n\n", 1)[-1] if r["stratum"] == "summarization" else
                      text.replace("from __future__ import annotations", ""))
        hits = [body[i:i + 60] for i in range(0, max(1, len(body) - 60), 10) if body[i:i + 60] in training]
        assert not hits, (r["id"], hits[:3])
    assert not any("heldout" in str(p) for p in files)


def test_bad_prompt_file_names_file_line_and_field(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text('{"id": "a", "messages": [{"role": "user", "content": "hi"}]}\n{"id": "b"}\n')
    with pytest.raises(UserError, match=r"p\.jsonl: line 2: 'messages' must be a non-empty list"):
        heldout.read_prompts(p)
    p.write_text("not json\n")
    with pytest.raises(UserError, match=r"p\.jsonl: line 1: not valid JSON"):
        heldout.read_prompts(p)


def test_one_pass_shortcut_equals_an_explicit_speculative_loop(fixture_models):
    """The draft's teacher-forced argmax along the target's greedy path decides every proposal: check it
    against proposing k tokens with the draft's own generate and verifying them against the target."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    torch.set_num_threads(2)
    d = Path(fixture_models["dir"])
    tok = AutoTokenizer.from_pretrained(str(d / "target"))
    target = LlamaForCausalLM.from_pretrained(str(d / "target"), dtype=torch.float32).eval()
    draft = LlamaForCausalLM.from_pretrained(str(d / "draft"), dtype=torch.float32).eval()
    prompts = heldout.read_prompts(HELDOUT)[:2] + heldout.read_prompts(HELDOUT)[8:9]
    k, n = 3, 24
    for p in prompts:
        ids = list(tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True,
                                           return_dict=True)["input_ids"])
        matches, path, natural = heldout._greedy_matches(target, draft, ids, n)
        shortcut = heldout.rounds(matches, k)
        # the natural length: the plain greedy answer (end-of-sequence allowed) is the path's first tokens
        ctx = torch.tensor([ids])
        with torch.no_grad():
            plain = target.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=n, do_sample=False,
                                    pad_token_id=target.config.pad_token_id)[0, len(ids):].tolist()
        eos = target.config.eos_token_id
        assert plain[:natural] == path[:natural]
        assert (natural == n and eos not in plain) or plain[natural] == eos
        # explicit: from each round's context, the draft proposes kk tokens greedily; accept the prefix
        # equal to the target's path
        t, drafts, accepted = 1, 0, 0
        while t < n:
            kk = min(k, n - t)
            ctx = torch.tensor([ids + path[:t]])
            with torch.no_grad():
                prop = draft.generate(ctx, attention_mask=torch.ones_like(ctx), max_new_tokens=kk, min_new_tokens=kk,
                                      do_sample=False, pad_token_id=draft.config.pad_token_id)[0, ctx.shape[1]:].tolist()
            a = 0
            while a < kk and prop[a] == path[t + a]:
                a += 1
            drafts += 1
            accepted += a
            t += a + 1
        assert (shortcut["drafts"], shortcut["accepted"]) == (drafts, accepted), p["id"]


def test_run_writes_both_sets_and_the_drop(tmp_path, fixture_models):
    (tmp_path / "w").mkdir()
    work = tmp_path / "w" / "prompts.jsonl"  # a built corpus's prompt file (specstudy.inputs.corpus.load_prompts)
    rows = [json.loads(line) for line in HELDOUT.read_text().splitlines()]
    # "workload" prompts in the corpus format (prompt_id), taken from the training text itself
    train_rows = [json.loads(line) for line in (ROOT / "corpora/data/code/tasks.jsonl").read_text().splitlines()[:3]]
    work.write_text("".join(json.dumps({"prompt_id": t["task_id"], "stratum": "code", "max_tokens": 16,
                                        "messages": [{"role": "user", "content": t["prompt"]}]}) + "\n"
                            for t in train_rows))
    held = tmp_path / "h.jsonl"
    held.write_text("".join(json.dumps(r) + "\n" for r in [r for r in rows if r["stratum"] == "code"][:3]))
    out = tmp_path / "heldout.json"
    rec = heldout.run(Path(fixture_models["dir"]) / "models.json", held, [tmp_path / "w"], [2, 4], out, max_new_tokens=16,
                      log=lambda *_: None)
    assert json.loads(out.read_text())["schema"] == heldout.SCHEMA
    for k in ("2", "4"):
        for name in ("workloads", "heldout"):
            s = rec["sets"][name]["by_k"][k]
            assert s["prompts"] == 3 and 0 <= s["acceptance_rate"] <= 1
            assert s["mean_acceptance_length"] == pytest.approx(1 + s["accepted"] / s["drafts"])
            assert s["per_position"] == sorted(s["per_position"], reverse=True)
        d = rec["drop"][k]
        assert d["drop"] == pytest.approx(rec["sets"]["workloads"]["by_k"][k]["acceptance_rate"]
                                          - rec["sets"]["heldout"]["by_k"][k]["acceptance_rate"])
        assert set(d["strata"]) == {"code"}
        dn = rec["drop_natural"][k]
        nat = {n: rec["sets"][n]["natural"]["by_k"][k]["acceptance_rate"] for n in ("workloads", "heldout")}
        assert None not in nat.values(), nat  # the natural (free-running) figure exists for both sets
        assert dn["drop"] == pytest.approx(nat["workloads"] - nat["heldout"])


def test_report_shows_the_drop_beside_vllms_own_figure(tmp_path):
    from specstudy.analysis import tables
    from specstudy.report import document as report
    from specstudy.report.files import from_root
    from specstudy.report.sections.inputs import measured_acceptance
    from test_tables import make_results_tree

    res = make_results_tree(tmp_path)
    tables.build_tables(res, res / "tables")
    from specstudy.inference import stats

    cells = stats._records(tables.read_tables(res / "tables")["cells"])
    measured = measured_acceptance(cells, 3)
    assert measured["cells"] > 0 and 0 < measured["acceptance_rate"] <= 1

    def prompt(i, stratum, m, natural):
        return {"id": f"p{i}", "stratum": stratum, "tokens": len(m), "natural_tokens": natural,
                "by_k": {"3": heldout.rounds(m, 3)}, "by_k_natural": {"3": heldout.rounds(m[:natural], 3)}}

    hit, miss = [True] * 12, [True, False] * 6
    per_prompt = {"workloads": [prompt(i, "code", hit, 12) for i in range(4)],
                  "heldout": [prompt(i, "code", miss, 1) for i in range(4)]}
    rec = {"schema": heldout.SCHEMA, "k": [3], "max_new_tokens": 12, **heldout.analyse(per_prompt, [3])}
    (res / "models" / "fixture").mkdir(parents=True)
    (res / "models" / "fixture" / "heldout.json").write_text(json.dumps(rec))
    out = report.build(from_root(res, res / "tables"), {}, res / "report")
    md = (res / "report" / "report.md").read_text()
    assert "## Fixture acceptance on held-out text" in md
    tr = rec["sets"]["workloads"]["by_k"]["3"]["acceptance_rate"]
    he = rec["sets"]["heldout"]["by_k"]["3"]["acceptance_rate"]
    assert tr == 1.0 and he < 0.5
    assert f"| all | 3 | {measured['acceptance_rate']:.3f} | 1.000 | 1.000 | {he:.3f} | {1 - he:.3f} [" in md
    assert "mean 12.0 tokens on the workload prompts (0 of 4 shorter than 2 tokens), 1.0 on the held-out " \
           "prompts (4 of 4 shorter than 2 tokens)" in md
    assert "On held-out text the target mostly ends at once" in md
    # held-out prompts with no natural answer have nothing to compare over their natural answers
    assert "Over the natural answers" not in md and "drop_natural" not in rec
    assert out["fixture_heldout"]["drop"]["3"] == pytest.approx(1 - he)
    # without the record the section says why it is absent
    (res / "models" / "fixture" / "heldout.json").unlink()
    report.build(from_root(res, res / "tables"), {}, res / "report2")
    assert "Not measured: no results/models/fixture/heldout.json" in (res / "report2" / "report.md").read_text()


def test_measure_computes_in_the_requested_dtype(fixture_models, monkeypatch):
    """benchmarks/acceptance_gap.py compares engines per dtype: measure() must load both models in that dtype
    (read from the loaded weights, not from the argument) and refuse a dtype torch does not have."""
    import torch
    from transformers import LlamaForCausalLM

    loaded = []
    real = LlamaForCausalLM.from_pretrained.__func__

    def spy(cls, *a, **kw):
        model = real(cls, *a, **kw)
        loaded.append(next(model.parameters()).dtype)
        return model

    monkeypatch.setattr(LlamaForCausalLM, "from_pretrained", classmethod(spy))
    prompts = heldout.read_prompts(HELDOUT)[:2]
    for dt in ("bfloat16", "float32"):
        loaded.clear()
        rows = heldout.measure(fixture_models["dir"], {"p": prompts}, [2], max_new_tokens=8, dtype=dt,
                               log=lambda *_: None)["p"]
        assert loaded == [getattr(torch, dt)] * 2, dt
        assert [r["tokens"] for r in rows] == [8, 8]
    with pytest.raises(UserError, match="dtype 'float31' is not one of float32, bfloat16, float16"):
        heldout.measure(fixture_models["dir"], {"p": prompts[:1]}, [2], max_new_tokens=4, dtype="float31")
