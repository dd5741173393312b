"""Named shapes: the public models' configs and the CPU-sized tiny ones the tests and zoo use.

`preset(name)` returns a fresh copy; `PRESETS` is the table `loopeval models` lists. `FAMILY_GUIDE` is the
one home of what each family means to a user (its KV strategy, where its checkpoints come from, what `--loops`
does): `loopeval models` prints it and a test checks the README's model table against it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from adapters.base import AdapterError
from adapters.engine.config import LoopConfig

# Token ids of the character tokenizer (adapters/engine/io/tokenizer.py) shared by the tiny presets.
_CHAR: dict[str, Any] = dict(vocab_size=99, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position=512)
_TINY: dict[str, Any] = dict(
    hidden_size=128, num_heads=4, num_kv_heads=2, head_dim=32, ffn_size=384, rope_theta=10_000.0, **_CHAR
)
_OURO: dict[str, Any] = dict(
    family="ouro",
    vocab_size=49152,
    hidden_size=2048,
    num_heads=16,
    num_kv_heads=16,
    head_dim=128,
    ffn_size=5632,
    loops=4,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    tie_embeddings=False,
    norm_layout="sandwich",
    kv_strategy="per_loop",
    exit_gate=True,
    max_position=65536,
    bos_token_id=0,
    eos_token_id=0,
    pad_token_id=0,
)

# What every retrofitted Llama shares (convert_llama.py): the Llama's width 2048 and 32 heads of 64 (both sources), eps
# 1e-5, an untied lm_head, embed_scale 1, and the cloned Huginn-0125 config's mean_recurrence 32 and init_values std
# sqrt(2 / (5 * 5280)) (the state's std, not recomputed for the new width).
_RETROFIT: dict[str, Any] = dict(
    family="retrofit",
    hidden_size=2048,
    num_heads=32,
    head_dim=64,
    loops=32,
    norm_eps=1e-5,
    tie_embeddings=False,
    norm_layout="pre",
    kv_strategy="per_loop",
    state_std=math.sqrt(2 / (5 * 5280)),
)

# The IFM Part II rows (ifm-ai/xllm-loop, xllm/paper_part2/recipes.py): 1 prelude, 2 recurrent and 1 coda Llama block
# of 24 (S) or 48 (M) heads of 64 with 6 or 12 KV heads, SwiGLU 4352 or 8704, the Jais64k vocabulary (64,256),
# rope_base 1e6, eps 1e-6, an untied head, evaluated at R = 5; the RoPE table covers chunk_size 1024 x 16 positions.
# The D4 rows are the same four blocks run once (`dense_model_fields`).
_IFM: dict[str, Any] = dict(
    vocab_size=64256,
    head_dim=64,
    rope_theta=1_000_000.0,
    norm_eps=1e-6,
    tie_embeddings=False,
    norm_layout="pre",
    max_position=16384,
)
_IFM_S: dict[str, Any] = dict(hidden_size=1536, num_heads=24, num_kv_heads=6, ffn_size=4352, **_IFM)
_IFM_M: dict[str, Any] = dict(hidden_size=3072, num_heads=48, num_kv_heads=12, ffn_size=8704, **_IFM)
_IFM_LOOPED: dict[str, Any] = dict(
    family="ifm", prelude_layers=1, shared_layers=2, coda_layers=1, loops=5, kv_strategy="per_loop"
)
_IFM_D4: dict[str, Any] = dict(family="custom", shared_layers=4, loops=1, kv_strategy="standard")


class FamilyGuide(NamedTuple):
    """What a user needs to know about one family the engine runs, in the words of the README's model table."""

    models: str  # the public models of the family
    kv: str  # its KV strategy (`LoopConfig.kv_strategy`) and what one token holds
    checkpoints: str  # where its weights come from: the spec prefixes and the folder layout
    loops: str  # what `--loops` (r) means for it


FAMILY_GUIDE: dict[str, FamilyGuide] = {
    "qwen3": FamilyGuide(
        "Qwen3-1.7B (standard transformer)",
        "`standard`: one entry per layer",
        "`qwen3:DIR` (what `Qwen3ForCausalLM.save_pretrained` writes), `preset:qwen3-1.7b`",
        "ignored: a plain model runs once",
    ),
    "ouro": FamilyGuide(
        "Ouro-1.4B, Ouro-1.4B-Thinking, Ouro-2.6B (LoopLM)",
        "`per_loop`: one entry per (loop, shared layer)",
        "`ouro:DIR` (the HF Ouro folder, read without its remote code), `preset:ouro-1.4b`, `preset:ouro-2.6b`",
        "loop passes over the 24 (2.6B: 48) shared layers; trained T = 4",
    ),
    "melt": FamilyGuide(
        "MELT-1.6B (Ouro plus gated KV)",
        "`gated`: one row per shared layer, overwritten at every loop",
        "`melt:DIR` (an engine checkpoint, or an Ouro folder plus `melt_gate` tensors), `preset:melt-1.6b`",
        "loop passes, each rewriting the token's one gated row; KV does not grow with r",
    ),
    "huginn": FamilyGuide(
        "Huginn-0125 (recurrent depth)",
        "`per_loop`: prelude, one entry per (step, core layer), coda",
        "`huginn:DIR` (the official config.json and `transformer.*` safetensors), `preset:huginn-0125`",
        "recurrence steps of the 4-layer core; the paper evaluates at 32",
    ),
    "retrofit": FamilyGuide(
        "retrofitted Llama-3.2-1B, TinyLlama-1.1B (retrofitted recurrence)",
        "`per_loop`: prelude, one entry per (step, core layer), coda; GQA (8 and 4 KV heads)",
        "`retrofit:DIR` (the conversion's RavenConfig config.json and `transformer.*` safetensors), "
        "`preset:retrofit-llama-3.2-1b`, `preset:retrofit-tinyllama-1.1b`",
        "recurrence steps of the core (Llama-3.2-1B 2-4-2: 4 layers; TinyLlama 4-8-4: 8); the config's T = 32 is Huginn's, copied",
    ),
    "ifm": FamilyGuide(
        "IFM Looped Models Done Right Part II: looped S and M rows (fixed R = 5, sampled depths, learned depth "
        "priors, Table 3 injections) and the D4 dense rows",
        "`per_loop` run as terminal KV (`shared-last`, its own): one entry per physical layer; the D4 rows: `standard`",
        "`ifm:DIR` (the released artifact: artifact_manifest.json, config.json, BF16 shards), `preset:ifm-s`, "
        "`preset:ifm-m`, `preset:ifm-d4-s`, `preset:ifm-d4-m`",
        "recurrences of the 2-layer recurrent block; the release evaluates at R = 5",
    ),
}

PRESETS: dict[str, LoopConfig] = {
    "qwen3-1.7b": LoopConfig(
        family="qwen3",
        vocab_size=151936,
        hidden_size=2048,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        ffn_size=6144,
        shared_layers=28,
        loops=1,
        rope_theta=1_000_000.0,
        norm_eps=1e-6,
        tie_embeddings=True,
        norm_layout="pre",
        qk_norm=True,
        kv_strategy="standard",
        max_position=40960,
        bos_token_id=151643,
        eos_token_id=151645,
        pad_token_id=151643,
    ),
    "ouro-1.4b": LoopConfig(shared_layers=24, **_OURO),
    "ouro-1.4b-thinking": LoopConfig(shared_layers=24, **_OURO),
    # Ouro-2.6B(-Thinking): 48 shared layers (num_hidden_layers), every other value Ouro-1.4B's: width 2048, 16 heads
    # of 128, intermediate_size 5632, vocab 49152, total_ut_steps 4, rope_theta 1e6, 65536 positions, untied, sandwich
    # norms (the public shapes of docs/architecture.md; arXiv 2510.25741, the Ouro paper, lists 1.4B and 2.6B at 24 and 48).
    "ouro-2.6b": LoopConfig(shared_layers=48, **_OURO),
    "melt-1.6b": LoopConfig(shared_layers=24, **{**_OURO, "family": "melt", "kv_strategy": "gated"}),
    # Huginn-0125 (recurrent depth, 3.5B): recpre/raven_config_minimal.json of seal-rg/recurrent-pretraining
    # (n_embd 5280, 55 heads of 96, intermediate_size 17920, vocab 65536, prelude 2, core 4, coda 2,
    # mean_recurrence 32, norm_eps 1e-6, tied embeddings, block_size 4096); rope_base 50000 and the
    # bos/eos/pad ids 65504/65505/65509 are RavenConfig's defaults in recpre/raven_config_minimal.py.
    "huginn-0125": LoopConfig(
        family="huginn",
        vocab_size=65536,
        hidden_size=5280,
        num_heads=55,
        num_kv_heads=55,
        head_dim=96,
        ffn_size=17920,
        prelude_layers=2,
        shared_layers=4,
        coda_layers=2,
        loops=32,
        rope_theta=50_000.0,
        norm_eps=1e-6,
        tie_embeddings=True,
        norm_layout="sandwich",
        kv_strategy="per_loop",
        max_position=4096,
        bos_token_id=65504,
        eos_token_id=65505,
        pad_token_id=65509,
    ),
    # Llama-3.2-1B retrofitted at 2-4-2 (smcleish/Recurrent-Llama-3.2-2-4-2-untrained, shells/llama.sh of
    # mcleish7/retrofitting-recurrence: layers [0, 1], [10..13], [14, 15] of the 16): Llama-3.2-1B's 32 heads and 8 KV
    # heads of 64, intermediate 8192, vocab 128256, rope_theta 5e5 with Llama 3 scaling (factor 32, 1, 4, 8192), 131072
    # positions, bos/eos 128000/128001.
    "retrofit-llama-3.2-1b": LoopConfig(
        vocab_size=128256,
        num_kv_heads=8,
        ffn_size=8192,
        prelude_layers=2,
        shared_layers=4,
        coda_layers=2,
        rope_theta=500_000.0,
        rope_scaling={
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        max_position=131072,
        bos_token_id=128000,
        eos_token_id=128001,
        **_RETROFIT,
    ),
    # TinyLlama-1.1B (3T) retrofitted at 4-8-4, the constants of convert_llama.py's main (layers [0..3], [10..17],
    # [18..21] of the 22): TinyLlama's 4 KV heads, intermediate 5632, vocab 32000, rope_theta 1e4, 2048 positions, bos/eos 1/2.
    "retrofit-tinyllama-1.1b": LoopConfig(
        vocab_size=32000,
        num_kv_heads=4,
        ffn_size=5632,
        prelude_layers=4,
        shared_layers=8,
        coda_layers=4,
        rope_theta=10_000.0,
        max_position=2048,
        bos_token_id=1,
        eos_token_id=2,
        **_RETROFIT,
    ),
    "ifm-s": LoopConfig(**_IFM_LOOPED, **_IFM_S),
    "ifm-m": LoopConfig(**_IFM_LOOPED, **_IFM_M),
    "ifm-d4-s": LoopConfig(**_IFM_D4, **_IFM_S),
    "ifm-d4-m": LoopConfig(**_IFM_D4, **_IFM_M),
    "qwen3-tiny": LoopConfig(
        family="qwen3",
        shared_layers=4,
        loops=1,
        tie_embeddings=True,
        norm_layout="pre",
        qk_norm=True,
        kv_strategy="standard",
        **_TINY,
    ),
    "ouro-tiny": LoopConfig(
        family="ouro",
        shared_layers=2,
        loops=4,
        norm_layout="sandwich",
        kv_strategy="per_loop",
        exit_gate=True,
        **_TINY,
    ),
    # The recurrence study's CoreLoop shape p + s x T + c at tiny width: 1 + 2 x 4 + 1, pre-norm, LoopLM cache.
    "coreloop-tiny": LoopConfig(
        family="custom",
        prelude_layers=1,
        shared_layers=2,
        coda_layers=1,
        loops=4,
        norm_layout="pre",
        kv_strategy="per_loop",
        **_TINY,
    ),
    "melt-tiny": LoopConfig(
        family="melt",
        shared_layers=2,
        loops=4,
        norm_layout="sandwich",
        kv_strategy="gated",
        exit_gate=True,
        chunk_size=16,
        **_TINY,
    ),
}


def family_table() -> list[str]:
    """The README's model table (markdown lines): one row per family of `FAMILY_GUIDE`."""
    rows = [
        "| family | models | KV strategy | checkpoints (spec) | what `--loops` means |",
        "| --- | --- | --- | --- | --- |",
    ]
    return rows + [f"| {name} | {' | '.join(family)} |" for name, family in FAMILY_GUIDE.items()]


def preset(name: str) -> LoopConfig:
    """A fresh copy of a preset config (callers may mutate it)."""
    if name not in PRESETS:
        raise AdapterError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})")
    scaling = PRESETS[name].rope_scaling
    return dataclasses.replace(
        PRESETS[name], extra=dict(PRESETS[name].extra), rope_scaling=None if scaling is None else dict(scaling)
    )
