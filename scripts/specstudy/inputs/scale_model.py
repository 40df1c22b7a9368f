"""Scale models: the trained fixture pair embedded, exactly, in an 8B-shaped target and a 1B-shaped draft.

A *scale model* has the memory traffic and KV cost of a large model and the function of a fixture
model (issue 27, "The construction"). Built from the fixture models and a seed, never shipped:

- **Width.** The residual stream holds the fixture's dimensions and zeros: embedding and ``lm_head``
  are padded with zero columns. The head size is kept. Fixture query head ``j`` of KV group ``g``
  goes to wide query head ``g * G' + (j mod G)`` (``G``, ``G'``: query heads per KV group of the
  fixture and of the wide model), so it reads wide KV head ``g``, which holds the fixture's KV head
  ``g``. ``o_proj`` is non-zero only in the fixture block (rows of the fixture dims, columns of the
  mapped heads), so unmapped heads (seeded random ``q/k/v``) contribute nothing. MLP: the fixture
  units are the first rows of ``gate``/``up`` (the other units are seeded random), ``down_proj`` is
  non-zero only in the fixture block. RMSNorm averages over h'/h times more dimensions: its weights
  on the fixture dims are divided by sqrt(h'/h) and ``rms_norm_eps`` by h'/h, both exact in floating
  point when h'/h is a power of 4.
- **Depth.** The layers after the fixture's are exact identities (``o_proj = 0``, ``down_proj = 0``)
  with seeded random ``q/k/v/gate/up``: every matmul reads a full model's bytes and every layer
  writes a full model's KV cache.
- **Function check.** In float32 on the build device, the wide model's logits against the fixture's
  over each smoke prompt and the fixture's greedy continuation (max-abs difference), and both
  models' greedy continuations (equal or not). A scale model whose check fails is refused: nothing
  is written under ``--out``.

The record (``scale.json``, schema ``config/schemas/scale-model.schema.json``) holds the
construction, the seed, the device, the sha256 of every file and the check. Label: "scale model"
(memory traffic, KV cost and engine behaviour of an 8B/1B pair; outputs and acceptance of the 6 M
fixture pair).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path

from specstudy.core import atomic, layout

SCHEMA = "specstudy.scale-model/1"
LABEL = "scale model"
ROLES = ("target", "draft")
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
#: Named shapes: Llama-3-8B's (64 heads of 64, 16 KV heads: Llama-3-8B's KV bytes per token with the
#: fixture's head size) and Llama-3.2-1B's (32 heads of 64, 8 KV heads).
SHAPES: dict[str, dict] = {
    "llama-3-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=64,
                       num_key_value_heads=16),
    "llama-3.2-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8),
}
DEFAULT_SHAPES = {"target": "llama-3-8b", "draft": "llama-3.2-1b"}
DEFAULTS = dict(seed=0, device="auto", dtype="bfloat16", max_abs_logit_diff=1e-4, greedy_tokens=32, init_std=0.02)
RECORD_NAME = "scale.json"


class ScaleModelError(ValueError):
    """A scale model that cannot be built or is refused; the message names the model and the fix."""


# ------------------------------------------------------------------ shapes (no torch needed)

def resolve_shape(spec, role: str) -> dict:
    """A shape: a name of :data:`SHAPES` or a mapping with every key of :data:`SHAPE_KEYS`."""
    if spec is None:
        spec = DEFAULT_SHAPES[role]
    if isinstance(spec, str):
        if spec not in SHAPES:
            raise ScaleModelError(f"scale model {role}: shape {spec!r} is not a named shape; use one of "
                                  f"{', '.join(SHAPES)} or give {', '.join(SHAPE_KEYS)}")
        return dict(SHAPES[spec])
    if not isinstance(spec, dict):
        raise ScaleModelError(f"scale model {role}: shape must be a name or a mapping, not {type(spec).__name__}")
    missing = [k for k in SHAPE_KEYS if k not in spec]
    extra = [k for k in spec if k not in SHAPE_KEYS]
    if missing or extra:
        raise ScaleModelError(f"scale model {role}: shape {spec} lacks {missing} / has unknown keys {extra}; "
                              f"give exactly {', '.join(SHAPE_KEYS)}")
    bad = [k for k in SHAPE_KEYS if not isinstance(spec[k], int) or spec[k] < 1]
    if bad:
        raise ScaleModelError(f"scale model {role}: shape fields {bad} must be positive integers")
    return {k: int(spec[k]) for k in SHAPE_KEYS}


def _power_of_4(n: int) -> bool:
    while n > 1 and n % 4 == 0:
        n //= 4
    return n == 1


def check_shapes(small: dict, wide: dict, role: str) -> dict:
    """Refuse a widening of ``small`` (the fixture model's sizes, with head_dim) to ``wide`` that is not exact.

    Returns the derived construction facts (ratio, head size, group sizes)."""
    head_dim = small.get("head_dim") or small["hidden_size"] // small["num_attention_heads"]
    h, h2 = small["hidden_size"], wide["hidden_size"]
    where = f"scale model {role} ({h} -> {h2} hidden)"
    if h2 % h or not _power_of_4(h2 // h):
        raise ScaleModelError(f"{where}: h'/h = {h2}/{h} is not a power of 4, so RMSNorm cannot be rescaled "
                              f"exactly; choose hidden_size {h} * 4^n (e.g. {h * 4}, {h * 16}, {h * 64})")
    if wide["num_attention_heads"] * head_dim != h2:
        raise ScaleModelError(f"{where}: {wide['num_attention_heads']} heads of the fixture's head size {head_dim} "
                              f"make {wide['num_attention_heads'] * head_dim}, not hidden_size {h2}; "
                              f"set num_attention_heads to {h2 // head_dim}")
    if wide["num_attention_heads"] % wide["num_key_value_heads"]:
        raise ScaleModelError(f"{where}: num_attention_heads {wide['num_attention_heads']} is not a multiple of "
                              f"num_key_value_heads {wide['num_key_value_heads']}")
    kv, q = small["num_key_value_heads"], small["num_attention_heads"]
    g, g2 = q // kv, wide["num_attention_heads"] // wide["num_key_value_heads"]
    if kv > wide["num_key_value_heads"] or g > g2:
        raise ScaleModelError(f"{where}: the fixture's {kv} KV heads of {g} query heads each do not fit into "
                              f"{wide['num_key_value_heads']} KV heads of {g2}; give at least {kv} KV heads "
                              f"and {g} query heads per KV head")
    for key in ("intermediate_size", "num_hidden_layers"):
        if wide[key] < small[key]:
            raise ScaleModelError(f"{where}: {key} {wide[key]} is below the fixture's {small[key]}; "
                                  f"give at least {small[key]}")
    return {"ratio": h2 // h, "head_dim": head_dim, "fixture_group": g, "wide_group": g2,
            "head_map": [(j // g) * g2 + (j % g) for j in range(q)],
            "fixture_layers": list(range(small["num_hidden_layers"]))}


def check_plan(section: dict | None, fixture_sizes: dict[str, dict], source: str = "config") -> None:
    """Refuse a ``scale_model`` config section whose shapes cannot embed the fixture shapes (dry run, no torch)."""
    if not section or not section.get("build"):
        return
    for role in ROLES:
        try:
            wide = resolve_shape((section.get(role) or {}).get("shape"), role)
            check_shapes(dict(fixture_sizes[role]), wide, role)
        except ScaleModelError as exc:
            raise ScaleModelError(f"{source}: scale_model.{role}.shape: {exc}") from None


def count_parameters(shape: dict, vocab: int, head_dim: int) -> int:
    h, i, n = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    q, kv = shape["num_attention_heads"] * head_dim, shape["num_key_value_heads"] * head_dim
    return n * (h * q * 2 + h * kv * 2 + 3 * h * i + 2 * h) + h + 2 * vocab * h


# ------------------------------------------------------------------ the widening (torch)

def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ScaleModelError(f"--device {name}: CUDA is not available here; use --device auto or cpu")
    return name


def _fixture_sizes(cfg) -> dict:
    sizes = {k: int(getattr(cfg, k)) for k in SHAPE_KEYS}
    sizes["head_dim"] = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return sizes


def wide_config(small_cfg, wide: dict, ratio: int, head_dim: int):
    """The wide model's LlamaConfig: the fixture's, with the wide shape and rms_norm_eps / (h'/h)."""
    from transformers import LlamaConfig

    d = small_cfg.to_dict()
    for k in ("architectures", "transformers_version", "_name_or_path", "torch_dtype", "dtype"):
        d.pop(k, None)
    d.update(wide, head_dim=head_dim, rms_norm_eps=small_cfg.rms_norm_eps / ratio)
    cfg = LlamaConfig(**d)
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def widen_model(small, wide_shape: dict, seed: int, device: str, init_std: float = DEFAULTS["init_std"], role: str = "target"):
    """The float32 wide model on ``device`` computing exactly ``small``'s function; returns (model, construction)."""
    import torch
    from transformers import LlamaForCausalLM

    scfg = small.config
    if getattr(scfg, "model_type", None) != "llama":
        raise ScaleModelError(f"scale model {role}: the fixture model is {getattr(scfg, 'model_type', None)!r}, not llama")
    if getattr(scfg, "attention_bias", False) or getattr(scfg, "mlp_bias", False):
        raise ScaleModelError(f"scale model {role}: the fixture model has biases; the widening handles bias-free Llama only")
    if getattr(scfg, "tie_word_embeddings", False):
        raise ScaleModelError(f"scale model {role}: the fixture model ties its embeddings; the widening needs an untied lm_head")
    sizes = _fixture_sizes(scfg)
    facts = check_shapes(sizes, wide_shape, role)
    ratio, d = facts["ratio"], facts["head_dim"]
    h, inter = sizes["hidden_size"], sizes["intermediate_size"]
    norm_scale = math.isqrt(ratio)  # sqrt of a power of 4: exact
    cfg = wide_config(scfg, wide_shape, ratio, d)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    sd = {k: v.detach().to(device=device, dtype=torch.float32) for k, v in small.state_dict().items()}

    def rand(*shape):
        return torch.empty(*shape, device=device, dtype=torch.float32).normal_(0.0, init_std, generator=gen)

    def zeros(*shape):
        return torch.zeros(*shape, device=device, dtype=torch.float32)

    def padded_norm(w):
        out = torch.ones(cfg.hidden_size, device=device, dtype=torch.float32)
        out[:h] = w / norm_scale
        return out

    h2, q2, kv2, i2 = cfg.hidden_size, cfg.num_attention_heads * d, cfg.num_key_value_heads * d, cfg.intermediate_size
    new: dict = {}
    emb = zeros(cfg.vocab_size, h2)
    emb[:, :h] = sd["model.embed_tokens.weight"]
    new["model.embed_tokens.weight"] = emb
    head = zeros(cfg.vocab_size, h2)
    head[:, :h] = sd["lm_head.weight"]
    new["lm_head.weight"] = head
    new["model.norm.weight"] = padded_norm(sd["model.norm.weight"])
    for layer in range(cfg.num_hidden_layers):
        p = f"model.layers.{layer}."
        q, k, v, gate, up = rand(q2, h2), rand(kv2, h2), rand(kv2, h2), rand(i2, h2), rand(i2, h2)
        o, down = zeros(h2, q2), zeros(h2, i2)
        ln1 = torch.ones(h2, device=device, dtype=torch.float32)
        ln2 = torch.ones(h2, device=device, dtype=torch.float32)
        if layer < sizes["num_hidden_layers"]:
            sq, sk, sv = (sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
            so = sd[p + "self_attn.o_proj.weight"]
            for j, wj in enumerate(facts["head_map"]):
                q[wj * d:(wj + 1) * d] = 0.0
                q[wj * d:(wj + 1) * d, :h] = sq[j * d:(j + 1) * d]
                o[:h, wj * d:(wj + 1) * d] = so[:, j * d:(j + 1) * d]
            for g in range(sizes["num_key_value_heads"]):
                for wide_w, small_w in ((k, sk), (v, sv)):
                    wide_w[g * d:(g + 1) * d] = 0.0
                    wide_w[g * d:(g + 1) * d, :h] = small_w[g * d:(g + 1) * d]
            for wide_w, name in ((gate, "gate"), (up, "up")):
                wide_w[:inter] = 0.0
                wide_w[:inter, :h] = sd[p + f"mlp.{name}_proj.weight"]
            down[:h, :inter] = sd[p + "mlp.down_proj.weight"]
            ln1 = padded_norm(sd[p + "input_layernorm.weight"])
            ln2 = padded_norm(sd[p + "post_attention_layernorm.weight"])
        new.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                    p + "self_attn.v_proj.weight": v, p + "self_attn.o_proj.weight": o,
                    p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up, p + "mlp.down_proj.weight": down,
                    p + "input_layernorm.weight": ln1, p + "post_attention_layernorm.weight": ln2})
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    expected = set(model.state_dict())
    if expected != set(new):
        raise RuntimeError(f"scale model {role}: widened parameters differ from the model's: "
                           f"missing {sorted(expected - set(new))[:5]}, extra {sorted(set(new) - expected)[:5]}")
    model.load_state_dict(new, assign=True)
    with torch.device(device):  # non-persistent buffers (RoPE inverse frequencies) are not in the state dict
        model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg)
    model.to(device)
    left = [n for n, b in model.named_buffers() if b.is_meta] + [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"scale model {role}: tensors left unbuilt: {left[:5]}")
    model.eval()
    construction = {
        "fixture_shape": sizes, "shape": dict(wide_shape), "ratio": ratio, "head_dim": d,
        "head_map": facts["head_map"], "kv_map": list(range(sizes["num_key_value_heads"])),
        "fixture_layers": facts["fixture_layers"],
        "identity_layers": list(range(sizes["num_hidden_layers"], cfg.num_hidden_layers)),
        "norm_weight_divisor": norm_scale, "rms_norm_eps": cfg.rms_norm_eps, "fixture_rms_norm_eps": scfg.rms_norm_eps,
        "init": {"distribution": "normal", "std": init_std, "seed": int(seed),
                 "order": "per layer: q, k, v, gate, up (one torch.Generator on the build device)"},
    }
    return model, construction


# ------------------------------------------------------------------ the function check

def read_prompts(path: str | Path) -> list[dict]:
    """Chat prompts: a built corpus directory / its corpus.json / a prompts.jsonl of ``{prompt_id|id, messages}`` rows."""
    p = Path(path)
    if p.is_dir():
        p = p / "prompts.jsonl"
    elif p.name == "corpus.json":
        p = p.with_name("prompts.jsonl")
    if not p.exists():
        raise ScaleModelError(f"--prompts {path}: no prompts.jsonl there; point it at the built smoke corpus "
                              "(results/corpora/<smoke>/<version>)")
    rows = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("messages"), list) or not row["messages"]:
            raise ScaleModelError(f"{p}:{n}: field 'messages' must be a non-empty list of chat messages")
        rows.append({"id": row.get("prompt_id") or row.get("id") or f"row{n}", "messages": row["messages"]})
    if not rows:
        raise ScaleModelError(f"{p}: no prompts; the function check needs at least one")
    return rows


def smoke_source(spec_path: str | Path) -> str:
    """The bundled source file of the smoke corpus spec (``source.path``, relative to the spec)."""
    import yaml

    spec_path = Path(spec_path)
    spec = yaml.safe_load(spec_path.read_text(encoding="utf-8"))
    src = (spec.get("source") or {}).get("path") if isinstance(spec, dict) else None
    if not src:
        raise ScaleModelError(f"{spec_path}: field 'source.path' is missing; the scale model's function check reads "
                              "the smoke prompts from it")
    path = Path(src) if Path(src).is_absolute() else spec_path.parent / src
    return os.path.relpath(os.path.normpath(path))


def _greedy(model, ids: list[int], n: int, eos: int | None) -> list[int]:
    import torch

    out: list[int] = []
    step = torch.tensor([ids], device=model.device)
    past = None
    with torch.no_grad():
        for _ in range(n):
            res = model(input_ids=step, past_key_values=past, use_cache=True)
            past = res.past_key_values
            tok = int(torch.argmax(res.logits[0, -1]))
            out.append(tok)
            step = torch.tensor([[tok]], device=model.device)
            if eos is not None and tok == eos:
                break
    return out


def function_check(fixture, wide, tokenizer, prompts: list[dict], greedy_tokens: int, tolerance: float) -> dict:
    """fp32 max-abs logit difference and greedy agreement of ``wide`` against ``fixture`` on ``prompts``."""
    import torch

    rows = []
    eos = tokenizer.eos_token_id
    prev_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for prompt in prompts:
            ids = tokenizer.apply_chat_template(prompt["messages"], add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            ids = [int(t) for t in ids]
            ref = _greedy(fixture, ids, greedy_tokens, eos)
            got = _greedy(wide, ids, greedy_tokens, eos)
            with torch.no_grad():
                seq = torch.tensor([ids + ref], device=wide.device)
                a = fixture(input_ids=seq.to(fixture.device)).logits[0].float().to(wide.device)
                b = wide(input_ids=seq).logits[0].float()
            rows.append({"id": prompt["id"], "prompt_tokens": len(ids), "fixture_tokens": len(ref),
                         "greedy_equal": ref == got, "max_abs_logit_diff": float((a - b).abs().max()),
                         "max_abs_logit": float(a.abs().max())})
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev_tf32
    worst = max(r["max_abs_logit_diff"] for r in rows)
    equal = sum(r["greedy_equal"] for r in rows)
    return {"dtype": "float32", "prompts": len(rows), "greedy_tokens": greedy_tokens, "tolerance": tolerance,
            "max_abs_logit_diff": worst, "greedy_equal": equal,
            "passed": bool(worst <= tolerance and equal == len(rows)), "per_prompt": rows}


# ------------------------------------------------------------------ building both

def _fixture_dirs(fixture_dir: Path) -> dict[str, Path]:
    dirs = {role: fixture_dir / role for role in ROLES}
    missing = [str(d) for d in dirs.values() if not (d / "config.json").exists()
               or not any(d.glob("*.safetensors"))]
    if missing:
        raise ScaleModelError(f"scale model: the fixture pair is missing ({', '.join(missing)} has no config.json "
                              f"or weights); build it first: `specstudy fixture-models --out {fixture_dir}` "
                              f"(or `snakemake {fixture_dir}/models.json`)")
    return dirs


def build_scale_models(out: str | Path, fixture_dir: str | Path, prompts: str | Path, *, seed: int = DEFAULTS["seed"],
                       shapes: dict | None = None, device: str = DEFAULTS["device"], dtype: str = DEFAULTS["dtype"],
                       tolerance: float = DEFAULTS["max_abs_logit_diff"], greedy_tokens: int = DEFAULTS["greedy_tokens"],
                       init_std: float = DEFAULTS["init_std"], log=print) -> dict:
    """Build ``out/{target,draft}`` and ``out/scale.json`` from the fixture pair; refuse a failing check."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaForCausalLM

    out, fixture_dir = Path(out), Path(fixture_dir)
    shapes = shapes or {}
    wide_shapes = {role: resolve_shape(shapes.get(role), role) for role in ROLES}
    dirs = _fixture_dirs(fixture_dir)
    save_dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}.get(dtype)
    if save_dtype is None:
        raise ScaleModelError(f"--dtype {dtype!r}: use bfloat16, float16 or float32")
    prompt_rows = read_prompts(prompts)
    dev = _device(device)
    tokenizer = AutoTokenizer.from_pretrained(str(dirs["target"]))
    fixtures = {role: LlamaForCausalLM.from_pretrained(str(d), dtype=torch.float32).to(dev).eval()
                for role, d in dirs.items()}
    tv, dv = fixtures["target"].config.vocab_size, fixtures["draft"].config.vocab_size
    if tv != dv:
        raise ScaleModelError(f"scale model draft: its vocabulary ({dv} tokens, {dirs['draft']}) differs from the "
                              f"target's ({tv}, {dirs['target']}); a draft must share the target's tokenizer: "
                              "rebuild the fixture pair together")
    for role in ROLES:  # every shape refused before any weight is built
        check_shapes(_fixture_sizes(fixtures[role].config), wide_shapes[role], role)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    record = {"schema": SCHEMA, "label": LABEL, "seed": int(seed), "device": dev,
              "device_name": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu",
              "dtype": dtype, "fixture_dir": str(fixture_dir),
              "fixture_record_sha256": atomic.sha256_file(fixture_dir / "models.json") if (fixture_dir / "models.json").exists() else None,
              "torch_version": torch.__version__, "transformers_version": transformers.__version__}
    try:
        for i, role in enumerate(ROLES):
            t0 = time.time()
            role_seed = int(seed) * 2 + i  # distinct streams for target and draft, both from the one seed
            fixture = fixtures[role]
            fixture_files = {p.name: atomic.sha256_file(p) for p in sorted(dirs[role].glob("*.safetensors"))}
            model, construction = widen_model(fixture, wide_shapes[role], role_seed, dev, init_std, role)
            if dev.startswith("cuda"):
                torch.cuda.synchronize()
            built_s = time.time() - t0
            params = sum(p.numel() for p in model.parameters())
            expected = count_parameters(wide_shapes[role], model.config.vocab_size, construction["head_dim"])
            if params != expected:
                raise RuntimeError(f"scale model {role}: {params} parameters built, {expected} expected")
            log(f"scale model {role}: {params:,} parameters widened on {dev} in {built_s:.1f} s; function check")
            check = function_check(fixture, model, tokenizer, prompt_rows, greedy_tokens, tolerance)
            if not check["passed"]:
                raise ScaleModelError(
                    f"scale model {role}: function check failed (max-abs fp32 logit difference "
                    f"{check['max_abs_logit_diff']:.3g} against tolerance {tolerance:g}; greedy continuations equal "
                    f"on {check['greedy_equal']} of {check['prompts']} prompts); refused, nothing written to {out}. "
                    "Fix: the widening or the shape is not function-preserving; check the shape against the "
                    "construction (docs/gpu.md, scale model) and rebuild")
            log(f"scale model {role}: check passed: max-abs logit diff {check['max_abs_logit_diff']:.3g}, "
                f"greedy equal {check['greedy_equal']}/{check['prompts']}")
            t1 = time.time()
            model = model.to(save_dtype)
            model.config.dtype = dtype
            d = tmp / role
            model.save_pretrained(str(d), safe_serialization=True)
            model.generation_config.save_pretrained(str(d))
            tokenizer.save_pretrained(str(d))
            del model
            if dev.startswith("cuda"):
                torch.cuda.empty_cache()
            save_s = time.time() - t1
            files = {p.name: atomic.sha256_file(p) for p in sorted(d.iterdir()) if p.is_file()}
            record[role] = {"path": str(out / role), "seed": role_seed, "parameters": params,
                            "construction": construction, "check": check, "files": files,
                            "fixture_weights_sha256": fixture_files,
                            "build_seconds": round(built_s, 2), "save_seconds": round(save_s, 2),
                            "total_seconds": round(time.time() - t0, 2)}
            log(f"scale model {role}: saved in {save_s:.1f} s ({len(files)} files hashed)")
        from specstudy.core import schemas

        schemas.validate(record, "scale-model", str(out / RECORD_NAME))
        atomic.write_json(tmp / RECORD_NAME, record)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    tmp.replace(out)
    return record


def build_from_config(config_path: str | Path, out: str | Path = "results/models/scale",
                      fixture_dir: str | Path = "results/models/fixture", log=print) -> dict | None:
    """Build the scale model a study config asks for (``scale_model.build``), as rule scale_models does;
    None when the config asks for none. For envs/gpu/lease.sh's prebuild (no Snakemake needed)."""
    import yaml

    cfg = yaml.safe_load(Path(config_path).read_text(encoding="utf-8"))
    section = cfg.get("scale_model") or {}
    if not section.get("build"):
        log(f"{config_path}: scale_model.build is not set; no scale model to build")
        return None
    check = section.get("check") or {}
    shapes = {role: (section.get(role) or {}).get("shape") for role in ROLES}
    return build_scale_models(out, fixture_dir, smoke_source(cfg["corpora"]["smoke"]), seed=section.get("seed", DEFAULTS["seed"]),
                              shapes=shapes, device=section.get("device", DEFAULTS["device"]),
                              dtype=section.get("dtype", DEFAULTS["dtype"]),
                              tolerance=check.get("max_abs_logit_diff", DEFAULTS["max_abs_logit_diff"]),
                              greedy_tokens=check.get("greedy_tokens", DEFAULTS["greedy_tokens"]), log=log)


def wanted(config_path: str | Path) -> bool:
    """Whether a study config asks for a scale model (lease.sh's prebuild asks this)."""
    import yaml

    cfg = yaml.safe_load(Path(config_path).read_text(encoding="utf-8")) or {}
    return bool((cfg.get("scale_model") or {}).get("build"))


def report_note(config: dict, record: str | Path | None) -> str | None:
    """The report's paragraph saying the study ran on the scale model, from its ``record`` (``scale.json``;
    None or absent: the paragraph says it is missing); None when the config has no scale model."""
    if not (config.get("scale_model") or {}).get("build"):
        return None
    text = (f"{LABEL.capitalize()}: the trained fixture pair widened, function-preserving, into an 8B/1B-shaped pair "
            "(docs/gpu.md, \"The scale-model study\"): memory traffic, KV cost and engine behaviour are the wide "
            "pair's; outputs and acceptance are the 6 M fixture pair's.")
    path = Path(record if record is not None else layout.models_dir("scale", RECORD_NAME))
    if record is None or not path.exists():
        return text + f" Its record ({path}) is missing."
    rec = atomic.read_json(path)
    parts = []
    for role in ROLES:
        r, c = rec[role], rec[role]["check"]
        shape = r["construction"]["shape"]
        parts.append(f"{role} {r['parameters']:,} parameters (hidden {shape['hidden_size']}, "
                     f"{shape['num_hidden_layers']} layers, {shape['num_attention_heads']} heads, "
                     f"{shape['num_key_value_heads']} KV heads), fp32 max-abs logit difference "
                     f"{c['max_abs_logit_diff']:.2g}, greedy equal on {c['greedy_equal']} of {c['prompts']} smoke prompts")
    return text + f" Built on {rec['device']} from seed {rec['seed']}: " + "; ".join(parts) + "."


def verify(out: str | Path) -> list[str]:
    """Files under ``out`` whose sha256 differs from the record's (empty: the models are the recorded ones)."""
    out = Path(out)
    record = atomic.read_json(out / RECORD_NAME)
    bad = []
    for role in ROLES:
        for name, sha in record[role]["files"].items():
            p = out / role / name
            if not p.exists() or atomic.sha256_file(p) != sha:
                bad.append(str(p))
    return bad


def _shape_arg(text: str | None):
    if text is None:
        return None
    text = text.strip()
    return json.loads(text) if text[:1] in '{"' else text


def _cmd_build(args) -> int:
    try:
        shapes = {"target": _shape_arg(args.target_shape), "draft": _shape_arg(args.draft_shape)}
        build_scale_models(args.out, args.fixture, args.prompts, seed=args.seed, shapes=shapes, device=args.device,
                           dtype=args.dtype, tolerance=args.tolerance, greedy_tokens=args.greedy_tokens)
    except (ScaleModelError, json.JSONDecodeError) as exc:
        print(f"specstudy scale-model: {exc}")
        return 2
    return 0


def register(sub) -> None:
    p = sub.add_parser("scale-model", help="widen the fixture pair into an 8B-shaped target and 1B-shaped draft (scale model)")
    p.add_argument("--out", required=True, help="output directory (gets target/, draft/, scale.json)")
    p.add_argument("--fixture", required=True, help="the fixture models' directory (with target/ and draft/)")
    p.add_argument("--prompts", required=True, help="the built smoke corpus (directory or prompts.jsonl) for the function check")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="seed of the random q/k/v/gate/up weights")
    p.add_argument("--target-shape", default=None, help=f"a named shape ({', '.join(SHAPES)}) or a JSON object of "
                   f"{', '.join(SHAPE_KEYS)} (default {DEFAULT_SHAPES['target']})")
    p.add_argument("--draft-shape", default=None, help=f"as --target-shape (default {DEFAULT_SHAPES['draft']})")
    p.add_argument("--device", default=DEFAULTS["device"], help="auto (cuda when present, else cpu) | cpu | cuda[:N]")
    p.add_argument("--dtype", default=DEFAULTS["dtype"], choices=["bfloat16", "float16", "float32"], help="dtype the weights are saved in")
    p.add_argument("--tolerance", type=float, default=DEFAULTS["max_abs_logit_diff"], help="largest fp32 max-abs logit difference accepted")
    p.add_argument("--greedy-tokens", type=int, default=DEFAULTS["greedy_tokens"], help="greedy continuation length compared per prompt")
    p.set_defaults(func=_cmd_build)
