"""Reference logits of the official Ouro modelling code on a tiny checkpoint of Ouro-2.6B's 48 layers, for the engine's
fidelity test (`tests/adapters/engine/families/test_ouro.py`).

The official code (`modeling_ouro.py` and `configuration_ouro.py`, shipped with the ByteDance/Ouro checkpoints on the
model hub) is read from a folder given on the command line and never copied into this repository. The hub is not
reachable from here; the copies used are public GitHub ones (the script records which):

    git -C EAGLE_MIRROR show d4f815e:modeling_ouro.py > /tmp/ouro/modeling_ouro.py           # Eagle4398/ouro-nixpkgs
    git -C OURO_RL_MIRROR show 3bad4c1:ouro_rl/modeling/configuration_ouro.py > /tmp/ouro/configuration_ouro.py
    python scripts/ouro_reference.py /tmp/ouro --source "..."

Two shims let the official code run under transformers 5 without touching its computation: the "default" RoPE
initialiser it looks up, which transformers 5 no longer lists (and seeks on the rotary module when initialising
weights), is given back as transformers 4 computed it, and `create_causal_mask` gets its arguments under their transformers 5 names (`inputs_embeds`, `cache`; the cache
position it no longer takes dropped) and always returns a mask, as it did for eager attention before.

It builds the checkpoint `adapters.testing.save_tiny_ouro` writes (48 layers, width 64, 4 trained loops; made from a
seed, so the test builds the same one), loads it into the official `OuroForCausalLM` in float32 and records the
logits of every position of a few prompts (one forward, no cache) at r = 1, 4 and 6 (`total_ut_steps` set to r),
with no exit threshold, so the official code reads the last loop, as the engine does by default.

The checkpoint's sandwich output norms are drawn near 0.2 (`adapters.testing.BRANCH_NORM`). With them near 1, 192 to
288 random layer passes grow float32 rounding into logit differences of 2e-4 (r = 4) to 3e-3 (r = 6) between the
engine and the official code, although both agree to 1e-10 when every operation runs in float64 (the official code's
own eager and SDPA attention differ by 3e-5 at r = 4 there): the comparison would then test rounding, not the model.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

from adapters.testing import TINY_OURO_26B, save_tiny_ouro

OUT = Path(__file__).resolve().parent.parent / "tests" / "adapters" / "engine" / "data" / "ouro_reference.json"
CHECKPOINT_SEED = 0
LOOPS = (1, 4, 6)
PROMPTS = [[5, 40, 41, 12, 77], [3, 9, 27, 81, 64, 22, 50, 11]]


@functools.cache
def official_modules(folder: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """The official configuration and modelling modules, imported once, with the transformers 5 shims applied."""
    package = types.ModuleType("ouro_official")  # the folder as a package, for the modelling file's relative import
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
    config_module = importlib.import_module("ouro_official.configuration_ouro")
    modelling = importlib.import_module("ouro_official.modeling_ouro")
    modelling.ROPE_INIT_FUNCTIONS = {**modelling.ROPE_INIT_FUNCTIONS, "default": default_rope}
    modelling.OuroRotaryEmbedding.compute_default_rope_parameters = staticmethod(default_rope)  # where transformers 5 looks
    causal_mask = modelling.create_causal_mask
    modelling.create_causal_mask = lambda input_embeds, past_key_values, cache_position, **kwargs: causal_mask(
        inputs_embeds=input_embeds, cache=past_key_values, allow_is_causal_skip=False, **kwargs)  # always a mask, as eager had
    return config_module, modelling


def official_model(folder: Path, checkpoint: Path, loops: int) -> torch.nn.Module:
    """An official `OuroForCausalLM` at `loops` holding the checkpoint's weights (strictly: every tensor used)."""
    from safetensors.torch import load_file

    config_module, modelling = official_modules(folder)
    raw = json.loads((checkpoint / "config.json").read_text())
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "model_type")}
    config = config_module.OuroConfig(**{**fields, "total_ut_steps": loops, "early_exit_threshold": None})
    config._attn_implementation = "eager"
    model = modelling.OuroForCausalLM(config).float().eval()
    model.load_state_dict(load_file(str(checkpoint / "model.safetensors")), strict=True)
    return model


def default_rope(config: object, device: torch.device | None = None, *_: object) -> tuple[torch.Tensor, float]:
    """transformers 4's "default" RoPE (inverse frequencies base^(-2i/dim), no scaling), which transformers 5 no longer
    lists under that name; the official code looks it up there when the config names no RoPE scaling."""
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 1.0 / config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim), 1.0


@torch.no_grad()
def logits(model: torch.nn.Module, prompt: list[int]) -> list[list[float]]:
    out = model(torch.tensor([prompt]), use_cache=False).logits[0]
    return [[round(v, 7) for v in row] for row in out.tolist()]


def reference(folder: Path, source: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = save_tiny_ouro(Path(tmp), seed=CHECKPOINT_SEED)
        by_loops = {str(r): [logits(official_model(folder, checkpoint, r), p) for p in PROMPTS] for r in LOOPS}
    return {
        "reference": {"source": source, "files": ["modeling_ouro.py", "configuration_ouro.py"], "torch": torch.__version__,
                      "transformers": importlib.import_module("transformers").__version__},
        "checkpoint": {"builder": "adapters.testing.save_tiny_ouro", "seed": CHECKPOINT_SEED, "config": TINY_OURO_26B},
        "prompts": PROMPTS, "logits": by_loops,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("official", type=Path, help="folder holding modeling_ouro.py and configuration_ouro.py")
    parser.add_argument("--source", required=True, help="where the two files came from (repository, commit, path)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    args.out.write_text(json.dumps(reference(args.official.resolve(), args.source), separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
