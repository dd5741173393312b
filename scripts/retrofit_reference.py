"""Reference outputs of the official retrofitted-recurrence modelling code on a tiny random checkpoint, for the engine's tests.

The official code (`convert_pretrained_model/raven_modeling_minimal_llama.py` and `raven_config_minimal.py` of
mcleish7/retrofitting-recurrence, read from its fork LoopedLMs/retrofitting-recurrence) is read from a folder given on
the command line and never copied into this repository:

    mkdir /tmp/retrofit && for f in raven_config_minimal.py raven_modeling_minimal_llama.py; do
        git -C MIRROR show HEAD:convert_pretrained_model/$f > /tmp/retrofit/$f; done
    python scripts/retrofit_reference.py /tmp/retrofit --commit "$(git -C MIRROR rev-parse HEAD)"

It builds the checkpoint `adapters.testing.save_tiny_retrofit` writes (a Llama-style retrofit: prelude 1, core 2, coda 1,
width 64, 4 heads and 2 KV heads, untied lm_head, Llama 3 RoPE scaling; made from a seed, so
`tests/adapters/engine/families/test_retrofit.py` builds the same one), loads it into the official `RavenForCausalLM` in float32 and
records, as `scripts/huginn_reference.py` does for Huginn-0125 (its `reference` and `main` are reused), at r = 1, 4, 32:
the logits of every position of a few prompts, and greedy continuations decoded token by token through the official
`HuginnDynamicCache`, with the zero initial state (`init_scale=0`), and at r = 4 with the random state drawn after
`torch.manual_seed(SEED)`.

The official code targets transformers 4.51; three shims let it run under transformers 5 without touching its
computation: `_tied_weights_keys` becomes an empty mapping (the checkpoint's lm_head is its own, `tie_embeddings` false;
transformers 5 expects a mapping), the output dataclass is a plain namespace (transformers 5 renames its
`past_key_values` keyword on construction), and the config gains `rope_parameters`, the name under which transformers 5's
`LlamaRotaryEmbedding` reads what 4.51 read from `rope_theta` and `rope_scaling` (the same values; transformers 5's
config would rewrite those two names itself, and fails to for a RavenConfig, which has no `max_position_embeddings` yet).
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import torch

from adapters.testing import TINY_RETROFIT, save_tiny_retrofit
from huginn_reference import Reference, main  # this folder's Huginn-0125 reference: the same runs and fixture

OUT = Path(__file__).resolve().parent.parent / "tests" / "adapters" / "engine" / "data" / "retrofit_reference.json"
REPOSITORY = (
    "LoopedLMs/retrofitting-recurrence"  # the fork of mcleish7/retrofitting-recurrence that the library indexes
)
FILE = "convert_pretrained_model/raven_modeling_minimal_llama.py"


def official_model(folder: Path, checkpoint: Path) -> tuple[types.ModuleType, torch.nn.Module]:
    """The official module and a `RavenForCausalLM` holding the checkpoint's weights (strictly: every tensor used)."""
    from safetensors.torch import load_file

    package = types.ModuleType("retrofit_official")  # the folder as a package, for the modelling file's relative import
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
    config_module = importlib.import_module("retrofit_official.raven_config_minimal")
    modelling = importlib.import_module("retrofit_official.raven_modeling_minimal_llama")
    modelling.RavenForCausalLM._tied_weights_keys = {}
    modelling.CausalLMOutputRecurrentLatents = lambda **fields: types.SimpleNamespace(**fields)
    raw = json.loads((checkpoint / "config.json").read_text())
    rope = (
        "rope_theta",
        "rope_scaling",
    )  # given as transformers 5's `rope_parameters` (its config rewrites these names)
    config = config_module.RavenConfig(
        **{k: v for k, v in raw.items() if k not in ("model_type", "num_attention_heads", *rope)}
    )
    config.rope_parameters = {"rope_theta": raw["rope_theta"], **raw["rope_scaling"]}
    assert (config.num_key_value_heads, config.init_values, config.tie_embeddings) == (
        raw["num_key_value_heads"],
        raw["init_values"],
        False,
    )
    model = modelling.RavenForCausalLM(config).float().eval()
    assert model.emb_scale == 1 and model.transformer.core_block[0].attn.n_kv_heads == raw["num_key_value_heads"]
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=True)
    return modelling, model


RETROFIT = Reference(
    REPOSITORY,
    FILE,
    OUT,
    save_tiny_retrofit,
    TINY_RETROFIT,
    official_model,
    "folder holding raven_modeling_minimal_llama.py and raven_config_minimal.py",
)

if __name__ == "__main__":
    main(RETROFIT, __doc__.split("\n\n")[0])
