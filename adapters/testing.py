"""Local checkpoints made without any download, for trying and testing adapters: a tiny transformers Qwen3, a tiny
Huginn and a tiny retrofitted Llama, and random bf16 weights of any engine config in its family's public layout (`save_public_checkpoint`).

The conformance kit that checks adapters is `harness.conformance.check_adapter`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from adapters.engine.config import LoopConfig


def save_tiny_qwen3(folder: str | Path, *, seed: int = 0, max_position: int = 128) -> Path:
    """Write a tiny random transformers `Qwen3ForCausalLM` and the engine's character tokenizer to `folder`.

    A local checkpoint to try `transformers:PATH` (and `vllm:PATH`) on, made without any download:
    GQA (4 heads, 2 KV heads) and a head dim different from hidden/heads, as in the real Qwen3.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from adapters.engine.io.tokenizer import CHAR_VOCAB_SIZE, char_tokenizer

    tokenizer = char_tokenizer()
    config = Qwen3Config(
        vocab_size=CHAR_VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=24,
        max_position_embeddings=max_position,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    folder = Path(folder)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


TINY_HUGINN = (
    dict(  # Huginn's shape at test size: prelude 1, core 2, coda 1; RavenConfig's names (its defaults fill the rest)
        model_type="huginn_raven",
        n_embd=64,
        n_heads=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        intermediate_size=96,
        n_layers=4,
        n_layers_in_prelude=1,
        n_layers_in_recurrent_block=2,
        n_layers_in_coda=1,
        mean_recurrence=4,
        block_size=128,
        padding_multiple=1,
        tie_embeddings=True,
        bias=False,
        qk_bias=True,
        injection_type="linear",
        rope_base=50_000.0,
        norm_eps=1e-6,
    )
)
TINY_RETROFIT = dict(  # a retrofitted Llama at test size, as convert_llama.py saves one: GQA (4 heads, 2 KV heads), no q/k bias,
    # untied lm_head, embed_scale 1 and the cloned Huginn-0125 state std; Llama 3 RoPE scaling with a short original context
    # (64), so that at these positions all three of its frequency bands differ from plain RoPE
    model_type="huginn_raven",
    n_embd=64,
    n_heads=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=96,
    n_layers=4,
    n_layers_in_prelude=1,
    n_layers_in_recurrent_block=2,
    n_layers_in_coda=1,
    mean_recurrence=4,
    block_size=4096,
    max_position_embeddings=128,
    padding_multiple=1,
    tie_embeddings=False,
    bias=False,
    qk_bias=False,
    injection_type="linear",
    rope_base=500_000.0,
    rope_theta=500_000.0,
    norm_eps=1e-5,
    init_values={"std": (2 / (5 * 5280)) ** 0.5, "embed_scale": 1.0},
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
        "rope_type": "llama3",
    },
)

RETROFIT_STATE_GAIN = 0.35  # `tiny_retrofit_tensors`


def tiny_huginn_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny Huginn's tensors under the official names (`RavenForCausalLM.state_dict()` less the `freqs_cis` buffer
    and the tied `lm_head`), every one random (`_tiny_raven_tensors`)."""
    from adapters.engine.io.raven import huginn_config

    return _tiny_raven_tensors(huginn_config(_with_char_vocab(TINY_HUGINN)), seed)


def tiny_retrofit_tensors(seed: int = 0) -> dict[str, torch.Tensor]:
    """A tiny retrofitted Llama's tensors under the official names (what `save_pretrained` writes), every one random.

    The adapter's columns that read the state are scaled by `RETROFIT_STATE_GAIN`: the recurrence then contracts, as a
    trained one does (the state settles over the steps), instead of being chaotic, where float32 rounding (the engine's
    and the official code's differ by ~1e-7) grows past 1e-5 in the logits by step 32 (at gain 1: 4e-5). The steps still
    matter: at r = 32 one more step moves the logits by ~6e-3.
    """
    from adapters.engine.io.raven import retrofit_config

    cfg = retrofit_config(_with_char_vocab(TINY_RETROFIT))
    tensors = _tiny_raven_tensors(cfg, seed)
    tensors["transformer.adapter.weight"][:, : cfg.hidden_size] *= RETROFIT_STATE_GAIN
    return tensors


def _with_char_vocab(config: dict[str, Any]) -> dict[str, Any]:
    from adapters.engine.io.tokenizer import CHAR_VOCAB_SIZE

    return {**config, "vocab_size": CHAR_VOCAB_SIZE}


def _tiny_raven_tensors(cfg: LoopConfig, seed: int) -> dict[str, torch.Tensor]:
    """Random tensors of the official layout's shapes, drawn in order from `seed` so that each one matters: norm weights
    near 1, the q/k biases and embeddings small, matrices scaled by 1 / sqrt(fan in)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in _raven_shapes(cfg).items():
        scale, base = (
            (0.1, 1.0)
            if len(shape) == 1
            else (0.1, 0.0)
            if name.endswith("qk_bias")
            else (0.15, 0.0)
            if name == "transformer.wte.weight"
            else (shape[1] ** -0.5, 0.0)
        )
        tensors[name] = base + scale * torch.randn(shape, generator=gen)
    return tensors


def save_tiny_huginn(folder: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random Huginn in the official layout (config.json + model.safetensors) and the character tokenizer.

    Made from `seed` alone, so a test and `scripts/huginn_reference.py` (which runs the official modelling code on it)
    build the same checkpoint. The vocabulary is the engine's character tokenizer's, so text prompts work too.
    """
    return _save_raven(folder, TINY_HUGINN, tiny_huginn_tensors(seed))


def save_tiny_retrofit(folder: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random retrofitted Llama in the official layout and the character tokenizer, from `seed` alone
    (`scripts/retrofit_reference.py` runs the official modelling code on the same checkpoint)."""
    return _save_raven(folder, TINY_RETROFIT, tiny_retrofit_tensors(seed))


def _save_raven(folder: str | Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Path:
    import json

    from safetensors.torch import save_file

    from adapters.engine.io.tokenizer import char_tokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(_with_char_vocab(config), indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    char_tokenizer().save_pretrained(str(folder))
    return folder


TINY_OURO_26B: dict[str, Any] = (
    dict(  # Ouro-2.6B's 48 shared layers and 4 loops at test width, in the HF release's config names
        architectures=["OuroForCausalLM"],
        model_type="ouro",
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=4,
        num_hidden_layers=48,
        total_ut_steps=4,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        hidden_act="silu",
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
)


BRANCH_NORM = 0.2  # the sandwich's output norms (`*_2`) near this, not 1: each of the 192 layer passes then moves the
# residual stream by a fifth of its size, which keeps float32 rounding from growing into the logits


def save_tiny_ouro(folder: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random Ouro of Ouro-2.6B's layer count in the HF release's layout (config.json + model.safetensors).

    Made from `seed` alone (normal draws; the norms at 1 + noise so each of the sandwich's four norms shows), so a test
    and `scripts/ouro_reference.py` (which runs the official modelling code on it) read the same checkpoint.
    """
    import json

    import torch
    from safetensors.torch import save_file

    from adapters.engine.io.tokenizer import CHAR_VOCAB_SIZE

    cfg, folder = {**TINY_OURO_26B, "vocab_size": CHAR_VOCAB_SIZE}, Path(folder)
    d, ffn, vocab, gen = (
        cfg["hidden_size"],
        cfg["intermediate_size"],
        cfg["vocab_size"],
        torch.Generator().manual_seed(seed),
    )

    def rand(*shape: int, scale: float, base: float = 0.0) -> torch.Tensor:
        return base + scale * torch.randn(*shape, generator=gen)

    tensors = {
        "model.embed_tokens.weight": rand(vocab, d, scale=1.0),
        "lm_head.weight": rand(vocab, d, scale=d**-0.5),
        "model.norm.weight": rand(d, scale=0.1, base=1.0),
        "model.early_exit_gate.weight": rand(1, d, scale=d**-0.5),
        "model.early_exit_gate.bias": rand(1, scale=0.1),
    }
    for i in range(cfg["num_hidden_layers"]):
        layer = f"model.layers.{i}."
        tensors.update({layer + f"self_attn.{p}_proj.weight": rand(d, d, scale=d**-0.5) for p in "qkvo"})
        tensors.update(
            {
                layer + "mlp.gate_proj.weight": rand(ffn, d, scale=d**-0.5),
                layer + "mlp.up_proj.weight": rand(ffn, d, scale=d**-0.5),
                layer + "mlp.down_proj.weight": rand(d, ffn, scale=ffn**-0.5),
            }
        )
        tensors.update(
            {
                layer + f"{norm}.weight": rand(d, scale=0.1, base=1.0)
                for norm in ("input_layernorm", "post_attention_layernorm")
            }
        )
        tensors.update(
            {
                layer + f"{norm}.weight": rand(d, scale=0.02, base=BRANCH_NORM)
                for norm in ("input_layernorm_2", "post_attention_layernorm_2")
            }
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def public_config(cfg: LoopConfig) -> dict[str, Any]:
    """The config.json a public release of `cfg`'s family ships (Qwen3, Ouro, RavenConfig names for Huginn-0125 and retrofits)."""
    if cfg.recurrent:
        return _raven_config(cfg)
    config = {
        "model_type": cfg.family,
        "architectures": ["Qwen3ForCausalLM" if cfg.family == "qwen3" else "OuroForCausalLM"],
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "num_hidden_layers": cfg.shared_layers,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
        "torch_dtype": "bfloat16",
    }
    return config if cfg.family == "qwen3" else {**config, "total_ut_steps": cfg.loops, "early_exit_threshold": 1.0}


def _raven_config(cfg: LoopConfig) -> dict[str, Any]:
    """RavenConfig's config.json of a huginn or retrofit config (a retrofit's fields as convert_llama.py writes them)."""
    config = {
        "model_type": "huginn_raven",
        "n_embd": cfg.hidden_size,
        "n_heads": cfg.num_heads,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.ffn_size,
        "n_layers_in_prelude": cfg.prelude_layers,
        "n_layers_in_recurrent_block": cfg.shared_layers,
        "n_layers_in_coda": cfg.coda_layers,
        "mean_recurrence": cfg.loops,
        "vocab_size": cfg.vocab_size,
        "tie_embeddings": cfg.tie_embeddings,
        "norm_eps": cfg.norm_eps,
        "torch_dtype": "bfloat16",
    }
    if cfg.huginn:
        return {**config, "block_size": cfg.max_position}
    scaling = None if cfg.rope_scaling is None else {**cfg.rope_scaling, "rope_type": "llama3"}
    return {
        **config,
        "num_key_value_heads": cfg.num_kv_heads,
        "qk_bias": False,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": scaling,
        "max_position_embeddings": cfg.max_position,
        "init_values": {"std": cfg.state_std, "embed_scale": 1.0},
    }


def public_shapes(cfg: LoopConfig) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of a public checkpoint of `cfg` (HF names; RavenConfig's `transformer.*` names), from a meta model."""
    import torch

    from adapters.engine.model import LoopedLM

    if not cfg.recurrent:
        with torch.device("meta"):
            return {name: tuple(t.shape) for name, t in LoopedLM(cfg).state_dict().items()}
    return _raven_shapes(cfg)


def _raven_shapes(cfg: LoopConfig) -> dict[str, tuple[int, ...]]:
    """The official `transformer.*` tensors of a huginn or retrofit config, in `RavenForCausalLM`'s order: Huginn-0125's
    blocks carry q/k biases and four norms, a retrofit's (Llama blocks, GQA) two norms; an untied lm_head comes last."""
    d, ffn, heads, kv, hd = cfg.hidden_size, cfg.ffn_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    shapes = {
        "transformer.wte.weight": (cfg.vocab_size, d),
        "transformer.adapter.weight": (d, 2 * d),
        "transformer.ln_f.weight": (d,),
    }
    for group, count in (("prelude", cfg.prelude_layers), ("core_block", cfg.shared_layers), ("coda", cfg.coda_layers)):
        for i in range(count):
            block = f"transformer.{group}.{i}."
            shapes[block + "attn.Wqkv.weight"] = ((heads + 2 * kv) * hd, d)
            if cfg.huginn:
                shapes[block + "attn.qk_bias"] = (2, 1, heads, hd)
            shapes.update(
                {
                    block + "attn.proj.weight": (d, heads * hd),
                    block + "mlp.fc.weight": (2 * ffn, d),
                    block + "mlp.proj.weight": (d, ffn),
                    **{f"{block}norm_{k}.weight": (d,) for k in range(1, 5 if cfg.huginn else 3)},
                }
            )
    return shapes if cfg.tie_embeddings else {**shapes, "lm_head.weight": (cfg.vocab_size, d)}


def save_public_checkpoint(
    folder: str | Path, cfg: LoopConfig, *, seed: int = 0, shard_bytes: int = 2_000_000_000
) -> Path:
    """Write random bf16 weights of `cfg` in its family's public layout: config.json plus safetensors shards and their index.

    Tensors are drawn one at a time straight in bf16 and written a shard at a time, so a full-size
    model (Huginn-0125: 7.1 GB) never sits in memory whole, nor in float32. Norm weights are 1.
    """
    import json

    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in public_shapes(cfg).items():
        nbytes = 2 * torch.Size(shape).numel()
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    gen, weight_map, total = torch.Generator().manual_seed(seed), {}, 0
    for i, shard in enumerate(shards, 1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {name: _draw(name, shape, gen) for name, shape in shard}
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        total += sum(t.numel() * 2 for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, file))
        del tensors
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map})
    )
    (folder / "config.json").write_text(json.dumps(public_config(cfg), indent=2))
    return folder


def _draw(name: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    import torch

    tensor = torch.empty(shape, dtype=torch.bfloat16)
    return tensor.fill_(1.0) if "norm" in name and len(shape) == 1 else tensor.normal_(0.0, 0.02, generator=gen)


# The IFM Part II rows at test size, in the release's `ModelConf` field names (xllm/paper_part2/recipes.py's
# `huginn_model_fields` at width 64: 4 heads of 16, 2 KV heads; prelude 1, recurrent 2, coda 1; R = 5).
TINY_IFM: dict[str, Any] = dict(
    arch="huginn",
    huginn_depth_control=True,
    num_layers=4,
    model_dim=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    ffn_hidden_dim=96,
    swiglu=True,
    apply_bias_term=True,
    apply_rmsnorm=True,
    rmsnorm_eps=1e-6,
    attn_gate_func="silu",
    rope_base=1_000_000.0,
    rope_head_dim=16,
    chunk_size=32,
    causal_attn_backend="flash",
    fused_block=False,
    init_mode="gaussian",
    init_std=0.02,
    loop_times=5,
    loop_start_layer=1,
    loop_end_layers=3,
    huginn_prelude_layers=1,
    huginn_recurrent_layers=2,
    huginn_coda_layers=1,
    huginn_state_init="normal",
    huginn_input_injection="diagonal",
    huginn_sampling_scheme="fixed",
    huginn_backprop_depth=5,
)
_PLN5: dict[str, Any] = dict(
    huginn_sampling_scheme="poisson-lognormal-capped",
    huginn_poisson_lognormal_target_mean=5.0,
    huginn_poisson_lognormal_sigma=0.5,
    huginn_poisson_lognormal_max=64,
    huginn_backprop_depth=10,
)
# The released rows' model fields beyond TINY_IFM (recipes.py): Table 2's depth schemes, Table 3's injections, D4.
IFM_VARIANTS: dict[str, dict[str, Any]] = {
    "fixed-r5": {},
    "learned-entropy0p01": {**_PLN5, "huginn_depth_prior": "learned", "huginn_depth_prior_entropy": 0.01},
    "huginn-linear": {
        **_PLN5,
        "huginn_input_injection": "linear",
        "huginn_recurrent_exit_norm": "parameterless_rms",
    },
    "parcae": {**_PLN5, "huginn_diagonal_dt_init": 0.5 * 1.6094379124341003, "huginn_prelude_norm": "rms"},
    "orthoinj": {**_PLN5, "huginn_diagonal_dt_init": 0.5 * 1.6094379124341003, "huginn_prelude_orthogonal": True},
    "d4": {"arch": "transformer"},
}


def tiny_ifm_fields(variant: str) -> dict[str, Any]:
    """The model fields of a tiny IFM row (`IFM_VARIANTS`): D4 drops the looped fields, as `dense_model_fields` does."""
    from adapters.engine.io.tokenizer import CHAR_VOCAB_SIZE

    fields = {**TINY_IFM, "vocab_size": CHAR_VOCAB_SIZE, **IFM_VARIANTS[variant]}
    if variant == "d4":
        fields = {k: v for k, v in fields.items() if not k.startswith(("huginn_", "loop_"))}
    return fields


def tiny_ifm_tensors(fields: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """Random BF16 tensors under the official names and shapes of `fields`, drawn in order from `seed`: norms' stored
    weights (weight - 1) near 0, A_log and dt_bias near the recipes' initial values, matrices scaled by 1 / sqrt(fan in),
    embeddings small. Drawn in float64: a float32 draw moves by an ulp between CPU kernels (AVX512, AVX2, scalar),
    enough to flip some BF16 roundings, so the artifact would differ from the one the reference was computed on."""
    import math

    import torch

    d, h, kv, hd, ffn = (fields[k] for k in ("model_dim", "num_heads", "num_kv_heads", "head_dim", "ffn_hidden_dim"))
    shapes: dict[str, tuple[int, ...]] = {"embed.weight": (fields["vocab_size"], d)}
    for i in range(fields["num_layers"]):
        shapes |= {
            f"layers.{i}.attention.norm.weight": (d,),
            f"layers.{i}.attention.wq.weight": (h * hd, d),
            f"layers.{i}.attention.wk.weight": (kv * hd, d),
            f"layers.{i}.attention.wv.weight": (kv * hd, d),
            f"layers.{i}.attention.wo.weight": (d, h * hd),
            f"layers.{i}.nffn.norm.weight": (d,),
            f"layers.{i}.nffn.fc1.weight": (ffn, d),
            f"layers.{i}.nffn.fc2.weight": (d, ffn),
            f"layers.{i}.nffn.fc3.weight": (ffn, d),
        }
    shapes |= {"output.final_norm.weight": (d,), "output.output.weight": (fields["vocab_size"], d)}
    if fields["arch"] == "huginn":
        if fields.get("huginn_input_injection") == "linear":
            shapes |= {"input_injection.adapter.weight": (d, 2 * d), "input_injection.adapter.bias": (d,)}
        else:
            shapes |= {"input_injection.input_adapter.weight": (d, d), "input_injection.A_log": (d,)}
            shapes["input_injection.dt_bias"] = (d,)
        if fields.get("huginn_prelude_norm") == "rms":
            shapes["huginn_prelude_norm_module.weight"] = (d,)
    dt = fields.get("huginn_diagonal_dt_init", 1.0)
    base = {"input_injection.A_log": 0.0, "input_injection.dt_bias": dt + math.log(-math.expm1(-dt))}
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        scale = 0.1 if len(shape) == 1 else 0.15 if name == "embed.weight" else shape[1] ** -0.5
        draw = torch.randn(shape, generator=gen, dtype=torch.float64)  # in float64: no CPU kernel moves a BF16 rounding
        tensors[name] = (base.get(name, 0.0) + scale * draw).to(torch.bfloat16)
    return tensors


def save_tiny_ifm(folder: str | Path, *, variant: str = "fixed-r5", seed: int = 0) -> Path:
    """Write a tiny random IFM Part II artifact in the released layout (`adapters.engine.io.xllm`): config.json,
    one BF16 shard and its index, the character tokenizer in tokenizer/, the documents, and artifact_manifest.json
    listing every file's size and SHA-256. Made from `variant` and `seed` alone, so a test and
    `scripts/ifm_reference.py` (which runs the official modelling code on it) build the same artifact."""
    import json

    from safetensors.torch import save_file

    from adapters.engine.io.xllm import INDEX, MANIFEST, TOKENIZER_DIR, TOKENIZER_FILES, manifest_digest, sha256_file
    from adapters.engine.io.tokenizer import char_tokenizer

    def dump(value: object) -> str:
        return json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"

    root = Path(folder)
    (root / TOKENIZER_DIR).mkdir(parents=True, exist_ok=True)
    fields = tiny_ifm_fields(variant)
    tensors = tiny_ifm_tensors(fields, seed)
    shard = "model-00001-of-00001.safetensors"
    save_file(tensors, str(root / shard))
    size = sum(t.numel() * t.element_size() for t in tensors.values())
    (root / INDEX).write_text(dump({"metadata": {"total_size": size}, "weight_map": dict.fromkeys(tensors, shard)}))
    tokenizer = {"type": "huggingface", "path": TOKENIZER_DIR}
    (root / "config.json").write_text(dump({"model": fields, "tokenizer": tokenizer}))
    char_tokenizer().save_pretrained(str(root / TOKENIZER_DIR))
    for path in (root / TOKENIZER_DIR).iterdir():
        if path.name not in TOKENIZER_FILES:
            path.unlink()
    for name in TOKENIZER_FILES:
        if not (root / TOKENIZER_DIR / name).exists():
            (root / TOKENIZER_DIR / name).write_text("{}\n")
    for name in ("README.md", "LICENSE", "NOTICE"):
        (root / name).write_text(f"tiny IFM Part II {variant} artifact for tests: {name}\n")
    files = [
        {"path": p.relative_to(root).as_posix(), "sha256": sha256_file(p), "size_bytes": p.stat().st_size}
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != MANIFEST  # a manifest written before into the same folder lists no file
    ]
    manifest: dict[str, Any] = {
        "schema_version": 1,
        "release": "paper-part2",
        "format": "xllm-native-bf16-safetensors",
        "source": {"builder": "adapters.testing.save_tiny_ifm", "variant": variant, "seed": seed},
        "model": {"dtype": "bfloat16", "index": INDEX, "tensor_count": len(tensors), "shards": 1},
        "files": files,
    }
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (root / MANIFEST).write_text(dump(manifest))
    return root
