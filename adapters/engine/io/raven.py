"""Huginn-0125's public checkpoint layout (`RavenForCausalLM`, seal-rg/recurrent-pretraining) read into the engine,
and the retrofitted-recurrence models saved in the same layout.

The official config.json (`model_type` "huginn_raven") names the shape `n_embd`, `n_heads` (or
`num_attention_heads`), `n_layers_in_prelude`, `n_layers_in_recurrent_block`, `n_layers_in_coda`,
`mean_recurrence` (the trained mean of the sampled recurrence, the engine's T) and `block_size`
(the context). Its tensors sit under `transformer.` (`wte`, `prelude.{i}`, `adapter`, `core_block.{i}`,
`coda.{i}`, `ln_f`); each block holds a fused `attn.Wqkv`, `attn.qk_bias` [2, 1, H, D], `attn.proj`,
`mlp.fc` (gate rows, then up rows), `mlp.proj` and `norm_1`..`norm_4`.

The official RoPE rotates adjacent pairs (2j, 2j+1) of each head; the engine rotates (j, j + D/2) with
the same frequency j. Attention scores are sums over the head dimension, so reordering q's and k's
channels the same way (even channels first, then odd) makes the engine's rotation the official one:
the rows of Wqkv and the biases are reordered here, once, at load.

Retrofitted recurrence ("Teaching Pretrained Language Models to Think Deeper with Retrofitted Recurrence",
mcleish7/retrofitting-recurrence, `convert_pretrained_model/convert_llama.py` and `raven_modeling_minimal_llama.py`)
copies layers of a pretrained Llama (Llama-3.2-1B, TinyLlama) into the same RavenConfig and `transformer.*` names,
so both share this module: the conversion clones Huginn-0125's config and overwrites the shape. What differs:
- `qk_bias` false (the mark read here: the released Huginn has q/k biases, a conversion never does), and
  `num_key_value_heads` < `n_heads` (GQA): Wqkv stacks q, k and v of unequal heights;
- each block is the Llama block it was copied from: pre-norm, `norm_1` before attention and `norm_2`
  before the MLP (`input_layernorm`, `post_attention_layernorm`), no norm of the residual sums, and no
  `ln_f` between the recurrence and the coda (the final `ln_f` only);
- RoPE is transformers' Llama rotary embedding (rotate-half already: no reordering), at `rope_theta` with
  Llama 3's `rope_scaling` when the source model has one (Llama-3.2);
- `init_values.embed_scale` is 1 (no sqrt(d) on the embeddings or the initial state), and `init_values.std`,
  the initial state's std, is the cloned Huginn-0125 value sqrt(2 / (5 * 5280)) whatever the width;
- `tie_embeddings` false (the Llama's lm_head is copied), `max_position_embeddings` the Llama's context.
The config's bos/eos/pad ids are not read for a retrofit: the conversion clones Huginn-0125's config, whose ids
(where set: 65504, 65505, 65509) name other tokens in a Llama vocabulary; the folder's tokenizer gives them
(`tokenizer.token_ids`).
OLMo-2 retrofits (`raven_modeling_minimal_olmo.py`: norms after each sublayer, q/k norms over whole
projections) are refused at load by their `attn.q_norm` tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from adapters.base import AdapterError
from adapters.config_values import first_id, flag, number
from adapters.engine.config import ROPE_SCALING_KEYS, LoopConfig

MODEL_TYPE = "huginn_raven"
ROPE_BASE = 50_000.0  # RavenConfig's default `rope_base`; the public config.json does not set it
NORMS = {
    "norm_1": "input_layernorm",
    "norm_2": "input_layernorm_2",
    "norm_3": "post_attention_layernorm",
    "norm_4": "post_attention_layernorm_2",
}
RETROFIT_NORMS = {"norm_1": "input_layernorm", "norm_2": "post_attention_layernorm"}  # the Llama block's two norms


WHERE = "RavenConfig config.json"  # how errors name the file


def is_retrofit(raw: dict[str, Any]) -> bool:
    """Whether a RavenConfig config.json is a retrofitted model's (qk_bias false) rather than Huginn-0125's."""
    return not flag(raw, "qk_bias", True, WHERE)


def huginn_config(raw: dict[str, Any]) -> LoopConfig:
    """LoopConfig of an official config.json (RavenConfig's defaults where a field is absent, as the official code reads it)."""
    d, heads = _raven_shape(raw, "Huginn")
    if is_retrofit(raw):
        raise AdapterError("a retrofitted-recurrence config.json (qk_bias false): load it as retrofit:DIR")
    return LoopConfig(
        family="huginn",
        vocab_size=raw.get("vocab_size", 65536),
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=d // heads,
        ffn_size=raw.get("intermediate_size", 17920),
        prelude_layers=raw.get("n_layers_in_prelude", 2),
        shared_layers=raw.get("n_layers_in_recurrent_block", 4),
        coda_layers=raw.get("n_layers_in_coda", 2),
        loops=raw.get("mean_recurrence", 32),
        rope_theta=number(raw, "rope_base", ROPE_BASE, WHERE),
        norm_eps=raw.get("norm_eps", 1e-6),
        tie_embeddings=flag(raw, "tie_embeddings", True, WHERE),
        norm_layout="sandwich",
        kv_strategy="per_loop",
        max_position=raw.get("block_size", 4096),
        bos_token_id=first_id(raw, "bos_token_id", WHERE),
        eos_token_id=first_id(raw, "eos_token_id", WHERE),
        pad_token_id=first_id(raw, "pad_token_id", WHERE),
    )


def retrofit_config(raw: dict[str, Any]) -> LoopConfig:
    """LoopConfig of a retrofitted model's config.json (the RavenConfig the conversion scripts save; module docstring)."""
    d, heads = _raven_shape(raw, "retrofit")
    if not is_retrofit(raw):
        raise AdapterError("Huginn-0125's config.json (qk_bias true): load it as huginn:DIR")
    init = raw.get("init_values")
    if not isinstance(init, dict) or init.get("embed_scale") != 1 or "std" not in init:
        raise AdapterError(
            f"retrofit config.json: init_values must hold embed_scale 1 and the state's std, as the conversion writes, got {init!r}"
        )
    if raw.get("test_time_noise", 0):
        raise AdapterError("retrofit config.json: test_time_noise must be 0 (the engine adds no noise to the state)")
    return LoopConfig(
        family="retrofit",
        vocab_size=raw.get("padded_vocab_size", raw.get("vocab_size", 65536)),
        hidden_size=d,
        num_heads=heads,
        num_kv_heads=raw.get("num_key_value_heads", heads),
        head_dim=d // heads,
        ffn_size=raw.get("intermediate_size", 17920),
        prelude_layers=raw.get("n_layers_in_prelude", 2),
        shared_layers=raw.get("n_layers_in_recurrent_block", 4),
        coda_layers=raw.get("n_layers_in_coda", 2),
        loops=raw.get("mean_recurrence", 32),
        rope_theta=number(raw, "rope_theta", number(raw, "rope_base", ROPE_BASE, WHERE), WHERE),
        rope_scaling=_llama3_scaling(raw.get("rope_scaling")),
        norm_eps=raw.get("norm_eps", 1e-6),
        tie_embeddings=flag(raw, "tie_embeddings", True, WHERE),
        norm_layout="pre",
        kv_strategy="per_loop",
        state_std=init["std"],
        max_position=raw.get("max_position_embeddings", raw.get("block_size", 4096)),
    )


def _raven_shape(raw: dict[str, Any], name: str) -> tuple[int, int]:
    """(n_embd, n_heads) of a RavenConfig config.json, after the checks both families share."""
    if raw.get("model_type") != MODEL_TYPE:
        raise AdapterError(
            f"not a {name} config.json: model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r}"
        )
    if raw.get("injection_type", "linear") != "linear" or flag(raw, "bias", False, WHERE):
        raise AdapterError(
            f"{name} config.json: only injection_type 'linear' and bias false (the released models) are supported"
        )
    d, heads = raw.get("n_embd", 5280), raw.get("n_heads", raw.get("num_attention_heads", 55))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (d, heads)) or d % heads:
        raise AdapterError(f"{name} config.json: n_embd={d!r} must be a positive multiple of n_heads={heads!r}")
    return d, heads


def _llama3_scaling(raw: Any) -> dict[str, Any] | None:
    """A config.json's `rope_scaling` as `LoopConfig.rope_scaling`: None, or Llama 3's four numbers (other kinds refused)."""
    if raw is None:
        return None
    kind = raw.get("rope_type", raw.get("type")) if isinstance(raw, dict) else None
    if kind != "llama3":
        raise AdapterError(f"retrofit config.json: rope_scaling must be null or of rope_type 'llama3', got {raw!r}")
    return {key: raw.get(key) for key in ROPE_SCALING_KEYS}


def rope_order(head_dim: int) -> torch.Tensor:
    """Channel order within a head that turns pair-wise RoPE into rotate-half: even channels, then odd."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def official_shapes(cfg: LoopConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor the official layout of `cfg` holds, with its shape (the lm_head only when untied; a tied one is
    dropped at load)."""
    d, h, kv, hd, ffn = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.ffn_size
    shapes = {
        "transformer.wte.weight": (cfg.vocab_size, d),
        "transformer.ln_f.weight": (d,),
        "transformer.adapter.weight": (d, 2 * d),
    }
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, d)
    for part, count in (("prelude", cfg.prelude_layers), ("core_block", cfg.shared_layers), ("coda", cfg.coda_layers)):
        for i in range(count):
            block = f"transformer.{part}.{i}."
            shapes |= {f"{block}{norm}.weight": (d,) for norm in (NORMS if cfg.huginn else RETROFIT_NORMS)}
            shapes |= {
                f"{block}attn.Wqkv.weight": ((h + 2 * kv) * hd, d),
                f"{block}attn.proj.weight": (d, h * hd),
                f"{block}mlp.fc.weight": (2 * ffn, d),
                f"{block}mlp.proj.weight": (d, ffn),
            }
            if cfg.huginn:
                shapes[f"{block}attn.qk_bias"] = (2, 1, h, hd)
    return shapes


def check_official(tensors: dict[str, torch.Tensor], cfg: LoopConfig) -> None:
    """AdapterError naming the first tensor of the official layout that is missing or misshapen: checked before any is
    split or reordered, which would otherwise fail as an index error."""
    for name, shape in official_shapes(cfg).items():
        if name not in tensors:
            raise AdapterError(f"{cfg.family} checkpoint lacks tensor {name} (shape {shape})")
        if tuple(tensors[name].shape) != shape:
            raise AdapterError(
                f"{cfg.family} checkpoint: tensor {name} has shape {tuple(tensors[name].shape)}, "
                f"the config expects {shape}"
            )


def engine_tensors(tensors: dict[str, torch.Tensor], cfg: LoopConfig) -> dict[str, torch.Tensor]:
    """The official state dict under the engine's names (`LoopedLM.state_dict()`); Huginn-0125's q and k reordered for
    rotate-half RoPE (a retrofit's are rotate-half already). Each tensor's name and shape is checked first."""
    check_official(tensors, cfg)
    out = {
        "model.embed_tokens.weight": tensors.pop("transformer.wte.weight"),
        "model.norm.weight": tensors.pop("transformer.ln_f.weight"),
        "model.recurrence.adapter.weight": tensors.pop("transformer.adapter.weight"),
    }
    tensors.pop("freqs_cis", None)  # the official RoPE table, a buffer; the engine computes its own from rope_theta
    if "lm_head.weight" in tensors:
        out["lm_head.weight"] = tensors.pop("lm_head.weight")
    offsets = {"prelude": 0, "core_block": cfg.prelude_layers, "coda": cfg.prelude_layers + cfg.shared_layers}
    order = rope_order(cfg.head_dim) if cfg.huginn else None
    for name in list(tensors):
        parts = name.split(".", 3)
        if len(parts) != 4 or parts[0] != "transformer" or parts[1] not in offsets or not parts[2].isdigit():
            continue  # left for load_model to report as unexpected
        prefix = f"model.layers.{offsets[parts[1]] + int(parts[2])}."
        out.update({prefix + k: v for k, v in _block_tensors(parts[3], tensors.pop(name), cfg, order).items()})
    out.update(tensors)
    return out


def _block_tensors(
    name: str, tensor: torch.Tensor, cfg: LoopConfig, order: torch.Tensor | None
) -> dict[str, torch.Tensor]:
    """One official block tensor (name within the block) as the engine's tensors; q and k rows taken in `order` when given."""
    h, kv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    norms = NORMS if cfg.huginn else RETROFIT_NORMS
    if name.endswith(".weight") and name[: -len(".weight")] in norms:
        return {f"{norms[name[: -len('.weight')]]}.weight": tensor}
    if name == "attn.Wqkv.weight":
        q, k, v = tensor.split((h * hd, kv * hd, kv * hd))
        if order is not None:
            q, k = _per_head(q, h, order), _per_head(k, kv, order)
        return {"self_attn.q_proj.weight": q, "self_attn.k_proj.weight": k, "self_attn.v_proj.weight": v}
    if name == "attn.qk_bias" and cfg.huginn:
        return {"self_attn.qk_bias": tensor[..., order]}
    if name == "mlp.fc.weight":
        gate, up = tensor.chunk(2)
        return {"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up}
    renamed = {"attn.proj.weight": "self_attn.o_proj.weight", "mlp.proj.weight": "mlp.down_proj.weight"}
    if name in ("attn.q_norm.weight", "attn.k_norm.weight"):
        raise AdapterError(
            "an OLMo-2 retrofit (attn.q_norm: q/k norms over whole projections, norms after each sublayer) is not "
            "supported; the engine reads Llama-style retrofits (Llama-3.2, TinyLlama)"
        )
    if name not in renamed:
        raise AdapterError(f"{cfg.family} checkpoint: unexpected block tensor {name!r}")
    return {renamed[name]: tensor}


def _per_head(rows: torch.Tensor, heads: int, order: torch.Tensor) -> torch.Tensor:
    """A projection's rows [heads * head_dim, d] with each head's rows taken in `order`."""
    return rows.view(heads, len(order), -1)[:, order].reshape(rows.shape)
