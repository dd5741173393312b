"""Huginn-0125's public checkpoint layout (`RavenForCausalLM`, seal-rg/recurrent-pretraining) read into the engine.

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
"""

from __future__ import annotations

from typing import Any

import torch

from adapters.base import AdapterError
from adapters.engine.config import LoopConfig

MODEL_TYPE = "huginn_raven"
ROPE_BASE = 50_000.0  # RavenConfig's default `rope_base`; the public config.json does not set it
NORMS = {"norm_1": "input_layernorm", "norm_2": "input_layernorm_2", "norm_3": "post_attention_layernorm",
         "norm_4": "post_attention_layernorm_2"}


def huginn_config(raw: dict[str, Any]) -> LoopConfig:
    """LoopConfig of an official config.json (RavenConfig's defaults where a field is absent, as the official code reads it)."""
    if raw.get("model_type") != MODEL_TYPE:
        raise AdapterError(f"not a Huginn config.json: model_type is {raw.get('model_type')!r}, expected {MODEL_TYPE!r}")
    if raw.get("injection_type", "linear") != "linear" or raw.get("bias", False) or not raw.get("qk_bias", True):
        raise AdapterError("Huginn config.json: only injection_type 'linear', bias false and qk_bias true (the released model) are supported")
    d, heads = raw.get("n_embd", 5280), raw.get("n_heads", raw.get("num_attention_heads", 55))
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (d, heads)) or d % heads:
        raise AdapterError(f"Huginn config.json: n_embd={d!r} must be a positive multiple of n_heads={heads!r}")
    return LoopConfig(
        family="huginn", vocab_size=raw.get("vocab_size", 65536), hidden_size=d, num_heads=heads, num_kv_heads=heads,
        head_dim=d // heads, ffn_size=raw.get("intermediate_size", 17920), prelude_layers=raw.get("n_layers_in_prelude", 2),
        shared_layers=raw.get("n_layers_in_recurrent_block", 4), coda_layers=raw.get("n_layers_in_coda", 2),
        loops=raw.get("mean_recurrence", 32), rope_theta=float(raw.get("rope_base", ROPE_BASE)), norm_eps=raw.get("norm_eps", 1e-6),
        tie_embeddings=bool(raw.get("tie_embeddings", True)), norm_layout="sandwich", kv_strategy="per_loop",
        max_position=raw.get("block_size", 4096), bos_token_id=raw.get("bos_token_id"), eos_token_id=raw.get("eos_token_id"),
        pad_token_id=raw.get("pad_token_id"),
    )


def rope_order(head_dim: int) -> torch.Tensor:
    """Channel order within a head that turns pair-wise RoPE into rotate-half: even channels, then odd."""
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def engine_tensors(tensors: dict[str, torch.Tensor], cfg: LoopConfig) -> dict[str, torch.Tensor]:
    """The official state dict under the engine's names (`LoopedLM.state_dict()`), q and k reordered for rotate-half RoPE."""
    out = {"model.embed_tokens.weight": tensors.pop("transformer.wte.weight"), "model.norm.weight": tensors.pop("transformer.ln_f.weight"),
           "model.recurrence.adapter.weight": tensors.pop("transformer.adapter.weight")}
    tensors.pop("freqs_cis", None)  # the official RoPE table, a buffer; the engine computes its own from rope_theta
    if "lm_head.weight" in tensors:
        out["lm_head.weight"] = tensors.pop("lm_head.weight")
    offsets = {"prelude": 0, "core_block": cfg.prelude_layers, "coda": cfg.prelude_layers + cfg.shared_layers}
    order = rope_order(cfg.head_dim)
    for name in list(tensors):
        parts = name.split(".", 3)
        if len(parts) != 4 or parts[0] != "transformer" or parts[1] not in offsets or not parts[2].isdigit():
            continue  # left for load_model to report as unexpected
        prefix = f"model.layers.{offsets[parts[1]] + int(parts[2])}."
        out.update({prefix + k: v for k, v in _block_tensors(parts[3], tensors.pop(name), cfg, order).items()})
    out.update(tensors)
    return out


def _block_tensors(name: str, tensor: torch.Tensor, cfg: LoopConfig, order: torch.Tensor) -> dict[str, torch.Tensor]:
    """One official block tensor (name within the block) as the engine's tensors."""
    h, hd = cfg.num_heads, cfg.head_dim
    if name.split(".")[0] in NORMS:
        return {f"{NORMS[name.split('.')[0]]}.weight": tensor}
    if name == "attn.Wqkv.weight":
        q, k, v = tensor.split((h * hd, h * hd, h * hd))
        return {"self_attn.q_proj.weight": _per_head(q, h, order), "self_attn.k_proj.weight": _per_head(k, h, order), "self_attn.v_proj.weight": v}
    if name == "attn.qk_bias":
        return {"self_attn.qk_bias": tensor[..., order]}
    if name == "mlp.fc.weight":
        gate, up = tensor.chunk(2)
        return {"mlp.gate_proj.weight": gate, "mlp.up_proj.weight": up}
    renamed = {"attn.proj.weight": "self_attn.o_proj.weight", "mlp.proj.weight": "mlp.down_proj.weight"}
    if name not in renamed:
        raise AdapterError(f"Huginn checkpoint: unexpected block tensor {name!r}")
    return {renamed[name]: tensor}


def _per_head(rows: torch.Tensor, heads: int, order: torch.Tensor) -> torch.Tensor:
    """A projection's rows [heads * head_dim, d] with each head's rows taken in `order`."""
    return rows.view(heads, len(order), -1)[:, order].reshape(rows.shape)
