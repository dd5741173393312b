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

It also records decoding at r = 4 under the KV policies (`decode`): the first prompt prefilled through the official
cache, then a fixed continuation fed one token a step, the logits of each step kept. `per-loop` uses the official
`UniversalTransformerCache`; `shared-last` and `shared-mean` use `SharedCache`, written here over the official cache's
interface, not from the engine: earlier steps' tokens are read as one row per layer (their last loop's K/V, or the
mean of their loops), the step's own tokens at their current loop. This is the Ouro paper's decode-time sharing and
the MELT paper's averaging baseline, checked against the engine's `kv_policy` independently of its paged layout.
The attention masks are passed in (additive, causal over the cached keys), as transformers 5's mask builder does not
size them from this cache.

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
DECODE_LOOPS = 4
CONTINUATION = [9, 27, 81, 64, 22, 50]
FOLDS = {"per-loop": None, "shared-last": "last", "shared-mean": "mean"}


@functools.cache
def official_modules(folder: Path) -> tuple[types.ModuleType, types.ModuleType]:
    """The official configuration and modelling modules, imported once, with the transformers 5 shims applied."""
    package = types.ModuleType("ouro_official")  # the folder as a package, for the modelling file's relative import
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
    config_module = importlib.import_module("ouro_official.configuration_ouro")
    modelling = importlib.import_module("ouro_official.modeling_ouro")
    modelling.ROPE_INIT_FUNCTIONS = {**modelling.ROPE_INIT_FUNCTIONS, "default": default_rope}
    modelling.OuroRotaryEmbedding.compute_default_rope_parameters = staticmethod(
        default_rope
    )  # where transformers 5 looks
    causal_mask = modelling.create_causal_mask
    modelling.create_causal_mask = lambda input_embeds, past_key_values, cache_position, **kwargs: causal_mask(
        inputs_embeds=input_embeds, cache=past_key_values, allow_is_causal_skip=False, **kwargs
    )  # always a mask, as eager had
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


def shared_cache(modelling: types.ModuleType, layers: int, loops: int, fold: str) -> object:
    """A cache over the official one's interface that shares K/V across loops at decoding (module docstring)."""

    class SharedCache(modelling.UniversalTransformerCache):
        def __init__(self) -> None:
            super().__init__(None)
            self.rows: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * layers  # committed, one per token
            self.step: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(layers)]  # this step's loops

        def update(self, key, value, layer_idx, cache_kwargs=None):
            loop, layer = divmod(layer_idx, layers)
            self.step[layer].append((key, value))
            held = self.rows[layer]
            seen = (key, value) if held is None else (torch.cat([held[0], key], 2), torch.cat([held[1], value], 2))
            if loop == loops - 1:  # the step's last loop: commit its tokens' row
                ks, vs = zip(*self.step[layer])
                row = (ks[-1], vs[-1]) if fold == "last" else (torch.stack(ks).mean(0), torch.stack(vs).mean(0))
                self.rows[layer] = (
                    row if held is None else (torch.cat([held[0], row[0]], 2), torch.cat([held[1], row[1]], 2))
                )
                self.step[layer] = []
            return seen

        def get_seq_length(self, layer_idx=0):
            return 0 if self.rows[0] is None else self.rows[0][0].shape[2]

    return SharedCache()


def causal(queries: int, past: int) -> dict[str, torch.Tensor]:
    """The additive mask of `queries` new tokens over `past` cached ones, as the official layers take it."""
    allowed = torch.ones(queries, past + queries, dtype=torch.bool).tril(past)
    return {"full_attention": torch.zeros(1, 1, queries, past + queries).masked_fill(~allowed, float("-inf"))}


@torch.no_grad()
def decode_logits(folder: Path, checkpoint: Path, fold: str | None) -> list[list[float]]:
    """The prompt's last logits, then each continuation token's, decoded one token a step through a cache."""
    _, modelling = official_modules(folder)
    model = official_model(folder, checkpoint, DECODE_LOOPS)
    layers = model.config.num_hidden_layers
    cache = (
        modelling.UniversalTransformerCache(layers * DECODE_LOOPS)
        if fold is None
        else shared_cache(modelling, layers, DECODE_LOOPS, fold)
    )
    tokens, rows = [PROMPTS[0], *([t] for t in CONTINUATION)], []
    past = 0
    for ids in tokens:
        positions = torch.arange(past, past + len(ids))
        out = model(
            torch.tensor([ids]),
            past_key_values=cache,
            use_cache=True,
            attention_mask=causal(len(ids), past),
            position_ids=positions[None],
            cache_position=positions,
        )
        rows.append([round(v, 7) for v in out.logits[0, -1].tolist()])
        past += len(ids)
    return rows


def reference(folder: Path, source: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = save_tiny_ouro(Path(tmp), seed=CHECKPOINT_SEED)
        by_loops = {str(r): [logits(official_model(folder, checkpoint, r), p) for p in PROMPTS] for r in LOOPS}
        decode = {policy: decode_logits(folder, checkpoint, fold) for policy, fold in FOLDS.items()}
    return {
        "reference": {
            "source": source,
            "files": ["modeling_ouro.py", "configuration_ouro.py"],
            "torch": torch.__version__,
            "transformers": importlib.import_module("transformers").__version__,
        },
        "checkpoint": {"builder": "adapters.testing.save_tiny_ouro", "seed": CHECKPOINT_SEED, "config": TINY_OURO_26B},
        "prompts": PROMPTS,
        "logits": by_loops,
        "decode": {"loops": DECODE_LOOPS, "prompt": PROMPTS[0], "continuation": CONTINUATION, "logits": decode},
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
