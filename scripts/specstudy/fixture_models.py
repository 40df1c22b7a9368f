"""Tiny, deterministic target and draft models for the embedded default (no hub, no network).

One byte-level BPE tokenizer is trained on the *training part* of the text bundled under
``corpora/data/``; a small Llama target is trained briefly on that text formatted as chat turns, and a
smaller Llama draft is distilled from the target (KL on the target's next-token distribution) so that
its greedy proposals agree with the target often.

The embedded workloads never send text the models trained on: every bundled source an embedded
workload draws from is split item by item (:func:`specstudy.corpus.split_part`); the workloads use the
``prompts`` part (``options.split: prompts`` in ``corpora/embedded/*.yaml``), training uses the
``training`` part, and sources whose every item can be a prompt (the smoke prompts) or that repeat
prompt text (``code/reference_solutions.py``, the source of ``tasks.jsonl``) are not trained on.
``models.json`` records the draft/target greedy agreement on the training text and on the held-out
prompt sources, so the gap is visible.

Everything is seeded and runs on a fixed number of threads, so the same inputs give the same weights (their sha256
is recorded in ``models.json``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import atomic

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# Sizes: head_dim 64 is supported by vLLM's CPU attention backend.
TARGET = dict(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4)
DRAFT = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2)
# Draft presets: ``default`` (above) and ``tp4``, whose 4 attention/KV heads (head_dim 64, as the target's)
# let tensor parallelism 4 divide the draft too (config/gpu-h200x4.yaml: draft TP 4).
DRAFT_PRESETS = {
    "default": DRAFT,
    "tp4": dict(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4),
}
DEFAULTS = dict(vocab_size=2048, max_position_embeddings=1024, seq_len=128, batch_size=12,
                target_steps=200, draft_steps=120, lr=3e-3, threads=2)


def _text_files(corpus_dir: Path) -> list[Path]:
    files = sorted(p for p in corpus_dir.rglob("*") if p.is_file() and p.suffix in {".txt", ".json", ".jsonl", ".md", ".py"})
    if not files:
        raise FileNotFoundError(f"{corpus_dir}: no bundled text (*.txt, *.json, *.jsonl, *.md, *.py) to train the fixture models on")
    return files


# Bundled files an embedded workload draws prompts from, split item by item (corpus.split_part): the
# item id as the corpus importer names it. Files listed in NOT_TRAINED are left out whole.
SPLIT_SOURCES = {"open_chat/conversations.json": "sharegpt", "code/tasks.jsonl": "tasks",
                 "summarization/documents": "documents"}
NOT_TRAINED = {"smoke/smoke.jsonl": "every smoke prompt is sent to the server (greedy correctness captures)",
               "code/reference_solutions.py": "the source of code/tasks.jsonl: it repeats every task prompt"}


def _items(rel: str, path: Path) -> list[tuple[str, str]]:
    """(source id, training text) of every item of a split source, ids as the corpus importers give them."""
    kind = SPLIT_SOURCES[rel]
    if kind == "sharegpt":
        data = json.loads(path.read_text(encoding="utf-8"))
        return [(str(conv.get("id", i)), _row_text(conv)) for i, conv in enumerate(data)]
    if kind == "tasks":
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        return [(str(r["task_id"]), _row_text(r)) for r in rows]
    files = sorted(p for p in path.glob("*.txt") if p.is_file())
    return [(f.relative_to(path).with_suffix("").as_posix(), f.read_text(encoding="utf-8")) for f in files]


def training_documents(corpus_dir: str | Path) -> tuple[list[str], list[str], dict]:
    """(training documents, held-out prompt-source documents, record of what went where)."""
    from .corpus import split_part

    corpus_dir = Path(corpus_dir)
    train: list[str] = []
    held: list[str] = []
    record: dict = {"split_sources": {}, "not_trained": {}, "whole_files": []}
    split_roots = {corpus_dir / rel for rel in SPLIT_SOURCES}
    for rel, _kind in SPLIT_SOURCES.items():
        path = corpus_dir / rel
        if not path.exists():
            continue
        items = _items(rel, path)
        ids = [i for i, _ in items]
        parts = {i: split_part(i, ids) for i in ids}
        train += [t for i, t in items if parts[i] == "training"]
        held += [t for i, t in items if parts[i] == "prompts"]
        record["split_sources"][rel] = {"training": sorted(i for i in ids if parts[i] == "training"),
                                        "prompts_held_out": sorted(i for i in ids if parts[i] == "prompts")}
    for f in _text_files(corpus_dir):
        rel = f.relative_to(corpus_dir).as_posix()
        if any(root == f or root in f.parents for root in split_roots):
            continue
        if rel in NOT_TRAINED:
            record["not_trained"][rel] = NOT_TRAINED[rel]
            continue
        train += _documents([f])
        record["whole_files"].append(rel)
    return [d for d in train if d.strip()], [d for d in held if d.strip()], record


def _documents(files: list[Path]) -> list[str]:
    """Turn bundled files into training documents formatted as chat turns where structure exists."""
    docs: list[str] = []
    for path in files:
        raw = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            for line in raw.splitlines():
                if line.strip():
                    docs.append(_row_text(json.loads(line)))
        elif path.suffix == ".json":
            data = json.loads(raw)
            for row in data if isinstance(data, list) else [data]:
                docs.append(_row_text(row))
        else:
            docs.append(raw)
    return [d for d in docs if d.strip()]


def _row_text(row) -> str:
    if isinstance(row, str):
        return row
    if not isinstance(row, dict):
        return json.dumps(row)
    turns = row.get("conversations") or row.get("messages")
    if isinstance(turns, list):
        parts = []
        for t in turns:
            role = t.get("from") or t.get("role") or "user"
            role = {"human": "user", "gpt": "assistant"}.get(role, role)
            parts.append(f"<|{role}|>\n{t.get('value') or t.get('content') or ''}<|end|>\n")
        return "".join(parts)
    prompt = row.get("prompt") or row.get("text") or row.get("instruction") or ""
    answer = row.get("canonical_solution") or row.get("code") or row.get("solution") or row.get("response") or ""
    if answer:
        return f"<|user|>\n{prompt}<|end|>\n<|assistant|>\n{answer}<|end|>\n"
    return str(prompt) or json.dumps(row)


def train_tokenizer(docs: list[str], vocab_size: int, out_dir: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|bos|>", eos_token="<|end|>",
                                   pad_token="<|pad|>", unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = DEFAULTS["max_position_embeddings"]
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return fast


def _config(sizes: dict, tokenizer, vocab_size: int):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, max_position_embeddings=DEFAULTS["max_position_embeddings"],
                       rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                       dtype="float32", **sizes)


def _batches(ids, seq_len: int, batch_size: int, steps: int, generator):
    import torch

    n = ids.numel() - seq_len - 1
    for _ in range(steps):
        starts = torch.randint(0, n, (batch_size,), generator=generator)
        yield torch.stack([ids[s:s + seq_len + 1] for s in starts.tolist()])


def build_fixture_models(out_dir: str | Path, corpus_dir: str | Path | None = None, seed: int = 0,
                         quick: bool = False, log=print, draft_preset: str = "default") -> dict:
    """Build tokenizer, target and draft under ``out_dir/{target,draft}``; return the models record.

    ``draft_preset``: the draft's shape (:data:`DRAFT_PRESETS`)."""
    if draft_preset not in DRAFT_PRESETS:
        raise ValueError(f"fixture_models.draft_preset: {draft_preset!r} is not a preset; use one of {sorted(DRAFT_PRESETS)}")
    draft_sizes = DRAFT_PRESETS[draft_preset]
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    corpus_dir = Path(corpus_dir) if corpus_dir else Path(__file__).resolve().parents[2] / "corpora" / "data"
    files = _text_files(corpus_dir)
    docs, held_docs, split_record = training_documents(corpus_dir)
    p = dict(DEFAULTS)
    if quick:
        p.update(target_steps=30, draft_steps=30)
    t0 = time.time()
    torch.manual_seed(seed)
    torch.set_num_threads(p["threads"])  # fixed, so the float reduction order is fixed too
    torch.use_deterministic_algorithms(True)
    tok_dir = out_dir / "target"
    tokenizer = train_tokenizer(docs, p["vocab_size"], tok_dir)
    vocab = len(tokenizer)
    def token_ids(texts: list[str]):
        text = "".join(tokenizer.bos_token + d for d in texts)
        return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

    train_ids, held_ids = token_ids(docs), token_ids(held_docs)
    gen = torch.Generator().manual_seed(seed)

    target = LlamaForCausalLM(_config(TARGET, tokenizer, vocab))
    opt = torch.optim.AdamW(target.parameters(), lr=p["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, p["target_steps"])
    target.train()
    for step, batch in enumerate(_batches(train_ids, p["seq_len"], p["batch_size"], p["target_steps"], gen)):
        logits = target(input_ids=batch[:, :-1]).logits
        loss = F.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == p["target_steps"] - 1:
            log(f"target step {step} loss {loss.item():.3f}")
    target.eval()

    draft = LlamaForCausalLM(_config(draft_sizes, tokenizer, vocab))
    opt = torch.optim.AdamW(draft.parameters(), lr=p["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, p["draft_steps"])
    draft.train()
    for step, batch in enumerate(_batches(train_ids, p["seq_len"], p["batch_size"], p["draft_steps"], gen)):
        inp = batch[:, :-1]
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=inp).logits, dim=-1)
        student = F.log_softmax(draft(input_ids=inp).logits, dim=-1)
        kl = F.kl_div(student.reshape(-1, vocab), teacher.reshape(-1, vocab), log_target=True, reduction="batchmean")
        ce = F.cross_entropy(student.reshape(-1, vocab), batch[:, 1:].reshape(-1))
        loss = kl + 0.2 * ce
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == p["draft_steps"] - 1:
            log(f"draft step {step} loss {loss.item():.3f} (kl {kl.item():.3f})")
    draft.eval()

    # Greedy agreement (how often the draft's argmax equals the target's) on the held-out prompt sources
    # and, for comparison, on the training text: acceptance on the workloads follows the former.
    def agreement(ids) -> float:
        with torch.no_grad():
            x = ids[: (ids.numel() // p["seq_len"]) * p["seq_len"]].view(-1, p["seq_len"])[:16]
            return (target(input_ids=x).logits.argmax(-1) == draft(input_ids=x).logits.argmax(-1)).float().mean().item()

    agree, agree_train = agreement(held_ids), agreement(train_ids)

    draft_dir = out_dir / "draft"
    for model, d in ((target, tok_dir), (draft, draft_dir)):
        model.config.dtype = "float32"
        model.save_pretrained(str(d), safe_serialization=True)
        model.generation_config.save_pretrained(str(d))
    tokenizer.save_pretrained(str(draft_dir))
    record = {
        "schema": "specstudy.models/1",
        "seed": seed,
        "quick": quick,
        "params": p,
        "target": {"path": str(tok_dir), "sizes": TARGET, "parameters": sum(x.numel() for x in target.parameters()),
                   "weights_sha256": atomic.sha256_file(tok_dir / "model.safetensors")},
        "draft": {"path": str(draft_dir), "sizes": draft_sizes, "preset": draft_preset, "parameters": sum(x.numel() for x in draft.parameters()),
                  "weights_sha256": atomic.sha256_file(draft_dir / "model.safetensors")},
        "tokenizer_sha256": atomic.sha256_file(tok_dir / "tokenizer.json"),
        "training_text": [{"path": str(f.relative_to(corpus_dir)), "sha256": atomic.sha256_file(f)} for f in files
                          if f.relative_to(corpus_dir).as_posix() not in NOT_TRAINED],
        "training_split": split_record,
        "training_documents": len(docs),
        "heldout_documents": len(held_docs),
        "heldout_greedy_agreement": agree,
        "heldout_source": "the prompt part of the split sources (what the embedded workloads send; never trained on)",
        "training_greedy_agreement": agree_train,
        "build_seconds": round(time.time() - t0, 1),
        "torch_version": torch.__version__,
    }
    from . import schemas

    schemas.validate(record, "models", str(out_dir / "models.json"))
    atomic.write_json(out_dir / "models.json", record)
    log(f"fixture models: greedy agreement draft/target = {agree:.3f} on held-out prompt sources, "
        f"{agree_train:.3f} on training text; {record['build_seconds']} s")
    return record


def _cmd_build(args) -> int:
    build_fixture_models(args.out, args.corpus_dir, seed=args.seed, quick=args.quick, draft_preset=args.draft_preset)
    return 0


def register(sub) -> None:
    p = sub.add_parser("fixture-models", help="build the tiny target/draft models of the embedded default")
    p.add_argument("--out", required=True, help="output directory (gets target/, draft/, models.json)")
    p.add_argument("--corpus-dir", default=None, help="bundled text to train on (default: corpora/data)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="few training steps (tests)")
    p.add_argument("--draft-preset", default="default", choices=sorted(DRAFT_PRESETS),
                   help="the draft's shape: default (2 heads) or tp4 (4 heads, for draft TP 4)")
    p.set_defaults(func=_cmd_build)
