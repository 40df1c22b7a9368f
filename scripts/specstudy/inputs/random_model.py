"""Random-initialised Llama models built from a seed, for the mechanics point (never shipped).

A model is a preset shape (:data:`PRESETS`) with the vocabulary, special tokens and chat template
of an existing tokenizer directory (the fixture tokenizer), so vLLM serves it with the study's
corpora and chat template. The weights are transformers' own initialisation under
``torch.manual_seed(seed)``, created directly on ``device`` in ``dtype`` (an 8B model initialises
in seconds on a GPU). Same preset, seed, tokenizer, device and dtype: same weights (the record
keeps the sha256 of every weights file; CPU and CUDA random streams differ, so the device is part
of the identity). Output goes under ``results/`` only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path

from specstudy.core import atomic

# Llama-3-8B's shape (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate 14336) with the
# tokenizer's small vocabulary: ~7.0e9 parameters, all but ~17 M of them outside the embeddings.
PRESETS: dict[str, dict] = {
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, rope_theta=500000.0),
    # A small draft: acceptance against an unrelated random target is ~0 (pure overhead).
    "small-draft": dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=8,
                        num_key_value_heads=8, rope_theta=500000.0),
    # Tests on CPU (seconds): head_dim 64 is supported by vLLM's CPU attention backend.
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=2, rope_theta=10000.0),
}
MAX_POSITION_EMBEDDINGS = 4096
SCHEMA = "specstudy.random-model/1"


class RandomModelError(ValueError):
    """Unusable arguments; the message names the argument and the fix."""


def _dtype(name: str):
    import torch

    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if name not in table:
        raise RandomModelError(f"--dtype {name!r}: use one of {', '.join(table)}")
    return table[name]


def config_for(preset: str, tokenizer) -> dict:
    """The LlamaConfig keyword arguments of ``preset`` with the tokenizer's vocabulary and special tokens."""
    if preset not in PRESETS:
        raise RandomModelError(f"--preset {preset!r}: unknown preset; use one of {', '.join(PRESETS)}")
    return dict(PRESETS[preset], vocab_size=len(tokenizer), max_position_embeddings=MAX_POSITION_EMBEDDINGS,
                rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                initializer_range=0.02)


def count_parameters(cfg: dict) -> dict:
    """Exact parameter count of a Llama config (no bias, untied embeddings), without building it."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    head = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * head
    per_layer = h * h * 2 + h * kv * 2 + 3 * h * i + 2 * h
    embeddings = 2 * cfg["vocab_size"] * h  # input embedding + lm_head
    body = n * per_layer + h  # + final norm
    return {"total": body + embeddings, "non_embedding": body, "embedding_and_lm_head": embeddings}


def build_random_model(out: str | Path, preset: str, seed: int, tokenizer_dir: str | Path, *,
                       device: str = "cpu", dtype: str = "bfloat16", log=print) -> dict:
    """Build the model, write ``out/{config.json, *.safetensors, tokenizer files, model.json}``; return the record."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    tok_dir = Path(tokenizer_dir)
    if not (tok_dir / "tokenizer.json").exists() and not (tok_dir / "tokenizer_config.json").exists():
        raise RandomModelError(f"--tokenizer {tok_dir}: no tokenizer files there; point it at the fixture target "
                               "(results/models/fixture/target) or another tokenizer directory")
    torch_dtype = _dtype(dtype)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RandomModelError(f"--device {device}: CUDA is not available here; use --device cpu (slow for large presets)")
    tokenizer = AutoTokenizer.from_pretrained(str(tok_dir))
    kwargs = config_for(preset, tokenizer)
    counts = count_parameters(kwargs)
    log(f"random model {preset}: {counts['total']:,} parameters ({counts['non_embedding']:,} outside the "
        f"embeddings), {dtype} on {device}, seed {seed}")
    t0 = time.time()
    config = LlamaConfig(**kwargs)
    config.dtype = dtype  # recorded in config.json (transformers >= 4.56 spelling; torch_dtype is deprecated)
    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    if device.startswith("cuda"):
        torch.cuda.manual_seed_all(seed)
    try:
        torch.set_default_dtype(torch_dtype)
        with torch.device(device), torch.no_grad():
            model = LlamaForCausalLM(config)
        model = model.to(torch_dtype)
    finally:
        torch.set_default_dtype(previous)
    built = sum(p.numel() for p in model.parameters())
    if built != counts["total"]:
        raise RuntimeError(f"{preset}: built {built} parameters, expected {counts['total']} (count_parameters is wrong)")
    init_s = time.time() - t0
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    model.generation_config.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    config_text = (tmp / "config.json").read_bytes()
    weights = {p.name: atomic.sha256_file(p) for p in sorted(tmp.glob("*.safetensors"))}
    record = {
        "schema": SCHEMA,
        "label": "mechanics (random weights; not a study result)",
        "preset": preset,
        "shape": PRESETS[preset],
        "seed": int(seed),
        "device": device,
        "dtype": dtype,
        "parameters": counts,
        "vocab_size": kwargs["vocab_size"],
        "tokenizer_dir": str(tok_dir),
        "tokenizer_sha256": atomic.sha256_file(tok_dir / "tokenizer.json") if (tok_dir / "tokenizer.json").exists() else None,
        "config_sha256": hashlib.sha256(config_text).hexdigest(),
        "weights_sha256": weights,
        "init_seconds": round(init_s, 2),
        "build_seconds": round(time.time() - t0, 2),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
    }
    atomic.write_json(tmp / "model.json", record)
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    log(f"random model {preset}: written to {out} in {record['build_seconds']} s (init {record['init_seconds']} s)")
    return record


def _cmd_build(args) -> int:
    try:
        build_random_model(args.out, args.preset, args.seed, args.tokenizer, device=args.device, dtype=args.dtype)
    except RandomModelError as exc:
        print(f"specstudy random-model: {exc}")
        return 2
    return 0


def register(sub) -> None:
    p = sub.add_parser("random-model", help="build a random-initialised Llama from a seed (mechanics point; never shipped)")
    p.add_argument("--out", required=True, help="output directory (under results/)")
    p.add_argument("--preset", required=True, choices=sorted(PRESETS), help="model shape")
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--tokenizer", required=True, help="tokenizer directory whose vocabulary and chat template the model uses")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (where the weights are initialised)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.set_defaults(func=_cmd_build)


def describe(path: str | Path) -> dict:
    """The ``model.json`` record of a built random model."""
    return json.loads((Path(path) / "model.json").read_text())
