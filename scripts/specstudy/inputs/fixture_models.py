"""Tiny, deterministic target and draft models for the embedded default (no hub, no network).

One byte-level BPE tokenizer is trained on the text bundled under ``corpora/data/``; a small Llama
target is trained briefly on that text formatted as chat turns, and a smaller Llama draft is
distilled from the target (KL on the target's next-token distribution) so that its greedy proposals
agree with the target often: the draft's acceptance rate is clearly above zero by construction, and
``models.json`` records the agreement measured on held-out text. Opt-in (``fixture_models.draft_training:
{method: target_generations}``, :data:`DRAFT_TRAINING`), the draft is distilled instead on the target's own
greedy continuations of chat prompts cut from the training text, which makes it accept far better on prompts
neither model trained on (docs/gpu.md, "A better pair").

Everything is seeded and runs on a fixed number of threads, so the same inputs give the same weights (their sha256
is recorded in ``models.json``).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from specstudy.core import atomic
from specstudy.core.errors import UserError

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
#: The think tag that ``enable_thinking`` opens after the generation prompt (docs/thinking.md). Not a special
#: token: the byte-level BPE encodes it as ordinary text, so the vocabulary (and the weights) stay as they were.
THINK_OPEN = "<think>\n"
# Rendered without ``enable_thinking`` (or with it false) byte-identical to the template before the switch
# existed (tests/test_thinking.py renders both over the smoke corpus).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% if enable_thinking %}" + THINK_OPEN + "{% endif %}{% endif %}"
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

#: How the draft is distilled (``fixture_models.draft_training``). ``kl_text`` (the default, the pair of the
#: embedded study): KL on the target's next-token distribution over training text, plus 0.2 x cross-entropy.
#: ``target_generations`` (sequence-level distillation, issue 27 item 2): the trained target first writes
#: greedy continuations of ``new_tokens`` tokens for ``prompts`` chat prompts cut from the training text
#: (user turns of ``prompt_tokens`` tokens at most; never the held-out prompts), and the draft learns the
#: target's distribution over those continuations -- the target's own greedy behaviour on prompts it did not
#: train on, which is what speculative acceptance measures. ``steps``: the draft's optimizer steps.
DRAFT_TRAINING = {
    "kl_text": {"steps": DEFAULTS["draft_steps"]},
    "target_generations": {"steps": 300, "prompts": 384, "new_tokens": 64, "prompt_tokens": 48},
}
#: ``quick`` (tests): the same methods with few steps and prompts.
QUICK_DRAFT_TRAINING = {"steps": 30, "prompts": 24, "new_tokens": 16}


def draft_training_plan(spec: dict | None, quick: bool = False, where: str = "fixture_models.draft_training") -> dict:
    """The complete draft-training settings of ``spec`` (``{"method": ..., <setting>: ...}``, None: the default
    ``kl_text``); an unknown method or setting, or a value that is not a positive integer, is refused naming the
    field (``prompt_tokens``: >= 8). ``quick`` caps the counts at :data:`QUICK_DRAFT_TRAINING`."""
    spec = dict(spec or {})
    method = spec.pop("method", "kl_text")
    if method not in DRAFT_TRAINING:
        raise UserError(f"{where}.method: {method!r} is not a method; use one of {sorted(DRAFT_TRAINING)}")
    plan = dict(DRAFT_TRAINING[method])
    for key, value in spec.items():
        if key not in plan:
            raise UserError(f"{where}.{key}: not a setting of method {method!r}; its settings are {sorted(plan)}")
        least = 8 if key == "prompt_tokens" else 1  # prompts are cut 8 to prompt_tokens tokens long
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise UserError(f"{where}.{key}: {value!r} is not an integer >= {least}; set a whole number >= {least}")
        plan[key] = value
    room = DEFAULTS["max_position_embeddings"] - 16  # the chat markup around the prompt
    if plan.get("prompt_tokens", 0) + plan.get("new_tokens", 0) > room:
        raise UserError(f"{where}: prompt_tokens + new_tokens = {plan['prompt_tokens'] + plan['new_tokens']} exceeds "
                        f"the models' {room} positions; make them smaller")
    if quick:
        plan.update({k: min(v, QUICK_DRAFT_TRAINING[k]) for k, v in plan.items() if k in QUICK_DRAFT_TRAINING})
    return {"method": method, **plan}


TEXT_SUFFIXES = frozenset({".txt", ".json", ".jsonl", ".md", ".py"})


def training_files(corpus_dir: str | Path) -> list[Path]:
    """The bundled text the models train on (rule fixture_models declares these files as its inputs)."""
    return sorted(p for p in Path(corpus_dir).rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES)


def _text_files(corpus_dir: Path) -> list[Path]:
    files = training_files(corpus_dir)
    if not files:
        raise FileNotFoundError(f"{corpus_dir}: no bundled text (*.txt, *.json, *.jsonl, *.md, *.py) to train the fixture models on")
    return files


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


def _distil_on_text(draft, target, train_ids, p: dict, gen, vocab: int, log) -> None:
    """``kl_text``: KL on the target's next-token distribution over training text (+ 0.2 x cross-entropy)."""
    import torch
    import torch.nn.functional as F

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


def _target_generations(target, tokenizer, train_ids, plan: dict, gen, log) -> list:
    """``plan["prompts"]`` chat prompts, each a user turn of 8 to ``prompt_tokens`` tokens cut from the
    training text at a seeded offset, with the target's greedy continuation of ``new_tokens`` tokens
    (end-of-sequence suppressed, as :mod:`specstudy.inputs.heldout` measures): the prompt+continuation ids
    and the prompt's length."""
    import torch

    n = train_ids.numel() - plan["prompt_tokens"] - 1
    special = set(tokenizer.all_special_ids)
    prompts = []
    for _ in range(plan["prompts"]):
        start = int(torch.randint(0, n, (1,), generator=gen))
        length = int(torch.randint(8, plan["prompt_tokens"] + 1, (1,), generator=gen))
        span = [t for t in train_ids[start:start + length].tolist() if t not in special]
        text = tokenizer.decode(span).strip() or "?"
        prompts.append(list(tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                          tokenize=True, return_dict=True)["input_ids"]))
    seqs, batch, pad = [], 64, tokenizer.pad_token_id
    with torch.no_grad():
        for b in range(0, len(prompts), batch):
            chunk = prompts[b:b + batch]
            width = max(len(x) for x in chunk)  # left-padded: generate derives the positions from the mask
            inp = torch.tensor([[pad] * (width - len(x)) + x for x in chunk], dtype=torch.long)
            mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in chunk], dtype=torch.long)
            out = target.generate(inp, attention_mask=mask, max_new_tokens=plan["new_tokens"],
                                  min_new_tokens=plan["new_tokens"], do_sample=False, pad_token_id=pad)
            for x, row in zip(chunk, out, strict=True):
                seqs.append((torch.cat([torch.tensor(x), row[width:]]), len(x)))
    log(f"target generations: {len(seqs)} prompts x {plan['new_tokens']} tokens")
    return seqs


def _distil_on_generations(draft, target, seqs: list, p: dict, gen, vocab: int, log) -> None:
    """``target_generations``: KL on the target's next-token distribution at every position of each
    prompt+continuation (right-padded, so no real token sees a pad), weighted 1 on the continuation and
    0.25 on the prompt."""
    import torch
    import torch.nn.functional as F

    pad = target.config.pad_token_id
    opt = torch.optim.AdamW(draft.parameters(), lr=p["lr"], weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, p["draft_steps"])
    draft.train()
    for step in range(p["draft_steps"]):
        pick = torch.randint(0, len(seqs), (p["batch_size"],), generator=gen).tolist()
        width = max(seqs[i][0].numel() for i in pick)
        inp = torch.full((len(pick), width), pad, dtype=torch.long)
        weight = torch.zeros(len(pick), width)
        for r, i in enumerate(pick):
            ids, plen = seqs[i]
            inp[r, :ids.numel()] = ids
            weight[r, :ids.numel() - 1] = 0.25
            weight[r, plen - 1:ids.numel() - 1] = 1.0  # positions that predict the continuation
        with torch.no_grad():
            teacher = F.log_softmax(target(input_ids=inp).logits, dim=-1)
        student = F.log_softmax(draft(input_ids=inp).logits, dim=-1)
        kl = (teacher.exp() * (teacher - student)).sum(-1)
        loss = (kl * weight).sum() / weight.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step % 50 == 0 or step == p["draft_steps"] - 1:
            log(f"draft step {step} loss {loss.item():.3f}")


def build_fixture_models(out_dir: str | Path, corpus_dir: str | Path | None = None, seed: int = 0,
                         quick: bool = False, log=print, draft_preset: str = "default",
                         draft_training: dict | None = None) -> dict:
    """Build tokenizer, target and draft under ``out_dir/{target,draft}``; return the models record.

    ``draft_preset``: the draft's shape (:data:`DRAFT_PRESETS`); ``draft_training``: how the draft is distilled
    (:func:`draft_training_plan`; None: ``kl_text``, the embedded study's pair)."""
    if draft_preset not in DRAFT_PRESETS:
        raise ValueError(f"fixture_models.draft_preset: {draft_preset!r} is not a preset; use one of {sorted(DRAFT_PRESETS)}")
    plan = draft_training_plan(draft_training, quick=quick)
    draft_sizes = DRAFT_PRESETS[draft_preset]
    import torch
    import torch.nn.functional as F
    from transformers import LlamaForCausalLM

    out_dir = Path(out_dir)
    corpus_dir = Path(corpus_dir) if corpus_dir else Path(__file__).resolve().parents[3] / "corpora" / "data"
    files = _text_files(corpus_dir)
    docs = _documents(files)
    p = dict(DEFAULTS)
    if quick:
        p.update(target_steps=30, draft_steps=30)
    p["draft_steps"] = plan["steps"]
    t0 = time.time()
    torch.manual_seed(seed)
    torch.set_num_threads(p["threads"])  # fixed, so the float reduction order is fixed too
    torch.use_deterministic_algorithms(True)
    tok_dir = out_dir / "target"
    tokenizer = train_tokenizer(docs, p["vocab_size"], tok_dir)
    vocab = len(tokenizer)
    text = "".join(tokenizer.bos_token + d for d in docs)
    ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
    split = int(ids.numel() * 0.95)
    train_ids, held_ids = ids[:split], ids[split:]
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
    if plan["method"] == "kl_text":
        _distil_on_text(draft, target, train_ids, p, gen, vocab, log)
    else:
        seqs = _target_generations(target, tokenizer, train_ids, plan, gen, log)
        _distil_on_generations(draft, target, seqs, p, gen, vocab, log)
    draft.eval()

    # Greedy agreement on held-out text: how often the draft's argmax equals the target's argmax.
    with torch.no_grad():
        held = held_ids[: (held_ids.numel() // p["seq_len"]) * p["seq_len"]].view(-1, p["seq_len"])[:16]
        agree = (target(input_ids=held).logits.argmax(-1) == draft(input_ids=held).logits.argmax(-1)).float().mean().item()

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
        "draft_training": plan,
        "target": {"path": str(tok_dir), "sizes": TARGET, "parameters": sum(x.numel() for x in target.parameters()),
                   "weights_sha256": atomic.sha256_file(tok_dir / "model.safetensors")},
        "draft": {"path": str(draft_dir), "sizes": draft_sizes, "preset": draft_preset, "parameters": sum(x.numel() for x in draft.parameters()),
                  "weights_sha256": atomic.sha256_file(draft_dir / "model.safetensors")},
        "tokenizer_sha256": atomic.sha256_file(tok_dir / "tokenizer.json"),
        "training_text": [{"path": str(f.relative_to(corpus_dir)), "sha256": atomic.sha256_file(f)} for f in files],
        "heldout_greedy_agreement": agree,
        "build_seconds": round(time.time() - t0, 1),
        "torch_version": torch.__version__,
    }
    from specstudy.core import schemas

    schemas.validate(record, "models", str(out_dir / "models.json"))
    atomic.write_json(out_dir / "models.json", record)
    log(f"fixture models: held-out greedy agreement draft/target = {agree:.3f}; {record['build_seconds']} s")
    return record


def _cmd_build(args) -> int:
    example = '\'{"method": "target_generations"}\''
    try:
        spec = json.loads(args.draft_training) if args.draft_training else None
    except json.JSONDecodeError as exc:
        raise UserError(f"--draft-training: not JSON ({exc.msg}); pass an object such as {example}") from None
    if spec is not None and not isinstance(spec, dict):
        raise UserError(f"--draft-training: {spec!r} is not an object; pass one such as {example}")
    build_fixture_models(args.out, args.corpus_dir, seed=args.seed, quick=args.quick, draft_preset=args.draft_preset,
                         draft_training=spec)
    return 0


def register(sub) -> None:
    p = sub.add_parser("fixture-models", help="build the tiny target/draft models of the embedded default")
    p.add_argument("--out", required=True, help="output directory (gets target/, draft/, models.json)")
    p.add_argument("--corpus-dir", default=None, help="bundled text to train on (default: corpora/data)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="few training steps (tests)")
    p.add_argument("--draft-preset", default="default", choices=sorted(DRAFT_PRESETS),
                   help="the draft's shape: default (2 heads) or tp4 (4 heads, for draft TP 4)")
    p.add_argument("--draft-training", default=None,
                   help="how the draft is distilled, a JSON object (fixture_models.draft_training), e.g. "
                        "'{\"method\": \"target_generations\", \"steps\": 300}'; default: kl_text")
    p.set_defaults(func=_cmd_build)
