"""Reference outputs of the official Huginn-0125 modelling code on a tiny random checkpoint, for the engine's fidelity tests.

The official code (`recpre/raven_modeling_minimal.py` and `raven_config_minimal.py` of seal-rg/recurrent-pretraining)
is read from a folder given on the command line and never copied into this repository:

    git -C MIRROR archive HEAD recpre | tar -x -C /tmp/raven
    python scripts/huginn_reference.py /tmp/raven/recpre --commit "$(git -C MIRROR rev-parse HEAD)"

It builds the checkpoint `adapters.testing.save_tiny_huginn` writes (prelude 1, core 2, coda 1, width 64; made
from a seed, so `tests/adapters/engine/families/test_huginn.py` builds the same one), loads it into the official
`RavenForCausalLM` in float32 and records, at r = 1, 4 and 32:
- the logits of every position of a few prompts (one forward, no cache), and
- greedy continuations (8 new tokens), decoded token by token through the official `HuginnDynamicCache`,
both with the official deterministic initial state (`init_scale=0`: the zero state), and, at r = 4, the logits and
continuation with the random initial state drawn after `torch.manual_seed(SEED)` (what the engine draws for the same seed).

Two shims let the official code run under transformers 5 without touching its computation: `_tied_weights_keys`
becomes the mapping transformers 5 expects (lm_head tied to wte, as the code means), and the output dataclass
is replaced by a plain namespace (transformers 5 renames its `past_key_values` keyword on construction).
The retrofitted models (Llama, TinyLlama converted to prelude/recurrent/coda) are not covered here: this modelling
code builds Huginn's `SandwichBlock`s only, whatever the config's `block_class_name` says; `scripts/retrofit_reference.py`
runs their own modelling file (and reuses `logits` and `greedy` from this one).
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from adapters.testing import TINY_HUGINN, save_tiny_huginn

OUT = Path(__file__).resolve().parent.parent / "tests" / "adapters" / "engine" / "data" / "huginn_reference.json"
CHECKPOINT_SEED = 0
STATE_SEED = 7  # the random-initial-state comparison
LOOPS = (1, 4, 32)
NEW_TOKENS = 8
PROMPTS = [[5, 40, 41, 12, 77], [3, 9, 27, 81, 64, 22, 50], [60, 61, 62, 10, 11, 90, 33, 4, 18]]


def official_model(folder: Path, checkpoint: Path) -> tuple[types.ModuleType, torch.nn.Module]:
    """The official module and a `RavenForCausalLM` holding the checkpoint's weights (strictly: every tensor used)."""
    from safetensors.torch import load_file

    package = types.ModuleType(
        "huginn_official"
    )  # the folder as a package, without running its __init__ (it imports training code)
    package.__path__ = [str(folder)]
    sys.modules[package.__name__] = package
    config_module = importlib.import_module("huginn_official.raven_config_minimal")
    modelling = importlib.import_module("huginn_official.raven_modeling_minimal")
    modelling.RavenForCausalLM._tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}
    modelling.CausalLMOutputRecurrentLatents = lambda **fields: types.SimpleNamespace(**fields)
    raw = json.loads((checkpoint / "config.json").read_text())
    config = config_module.RavenConfig(
        **{k: v for k, v in raw.items() if k not in ("model_type", "num_attention_heads", "num_key_value_heads")}
    )
    model = modelling.RavenForCausalLM(config).float().eval()
    state = load_file(str(checkpoint / "model.safetensors"))
    state["freqs_cis"] = model.freqs_cis  # the official RoPE table, computed by the official code
    state["lm_head.weight"] = state["transformer.wte.weight"]
    model.load_state_dict(state, strict=True)
    assert model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    return modelling, model


@torch.no_grad()
def greedy(
    modelling: types.ModuleType, model: torch.nn.Module, prompt: list[int], loops: int, init_scale: float
) -> list[int]:
    """NEW_TOKENS greedy tokens: the prompt in one call, then one token per call, through the official cache."""
    cache, ids, out = modelling.HuginnDynamicCache(), torch.tensor([prompt]), []
    logits = model(
        ids,
        num_steps=loops,
        init_scale=init_scale,
        past_key_values=cache,
        use_cache=True,
        position_ids=torch.arange(len(prompt))[None],
    ).logits
    for position in range(len(prompt), len(prompt) + NEW_TOKENS):
        out.append(int(logits[0, -1].argmax()))
        if len(out) == NEW_TOKENS:
            break
        logits = model(
            torch.tensor([[out[-1]]]),
            num_steps=loops,
            init_scale=init_scale,
            past_key_values=cache,
            use_cache=True,
            position_ids=torch.tensor([[position]]),
        ).logits
    return out


@torch.no_grad()
def logits(model: torch.nn.Module, prompt: list[int], loops: int, init_scale: float) -> list[list[float]]:
    return [
        [round(v, 7) for v in row]
        for row in model(torch.tensor([prompt]), num_steps=loops, init_scale=init_scale).logits[0].tolist()
    ]


@dataclass(frozen=True)
class Reference:
    """One official modelling file and the tiny checkpoint run through it (this script's, and the retrofit script's)."""

    repository: str
    file: str
    out: Path
    save: Callable[..., Path]  # the `adapters.testing` builder of the tiny checkpoint, from a seed
    config: dict
    official_model: Callable[[Path, Path], tuple[types.ModuleType, torch.nn.Module]]
    folder_help: str


def reference(ref: Reference, folder: Path, commit: str) -> dict:
    """The fixture: logits and greedy continuations at every r in LOOPS from the zero state, and at r = 4 from the
    random state drawn after `torch.manual_seed(STATE_SEED)`."""
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = ref.save(Path(tmp), seed=CHECKPOINT_SEED)
        modelling, model = ref.official_model(folder, checkpoint)
        zero = {
            str(r): {
                "logits": [logits(model, p, r, 0.0) for p in PROMPTS],
                "greedy": [greedy(modelling, model, p, r, 0.0) for p in PROMPTS],
            }
            for r in LOOPS
        }
        torch.manual_seed(STATE_SEED)
        seeded_logits = logits(model, PROMPTS[0], 4, 1.0)
        torch.manual_seed(STATE_SEED)
        seeded_greedy = greedy(modelling, model, PROMPTS[0], 4, 1.0)
    return {
        "reference": {
            "repository": ref.repository,
            "commit": commit,
            "file": ref.file,
            "torch": torch.__version__,
            "transformers": importlib.import_module("transformers").__version__,
        },
        "checkpoint": {
            "builder": f"adapters.testing.{ref.save.__name__}",
            "seed": CHECKPOINT_SEED,
            "config": ref.config,
        },
        "prompts": PROMPTS,
        "new_tokens": NEW_TOKENS,
        "zero_state": zero,
        "seeded_state": {"seed": STATE_SEED, "loops": 4, "prompt": 0, "logits": seeded_logits, "greedy": seeded_greedy},
    }


def main(ref: Reference, description: str) -> None:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("official", type=Path, help=ref.folder_help)
    parser.add_argument("--commit", help="the reference's commit (default: git rev-parse HEAD in that folder)")
    parser.add_argument("--out", type=Path, default=ref.out)
    args = parser.parse_args()
    commit = (
        args.commit
        or subprocess.run(
            ["git", "-C", str(args.official), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    torch.set_num_threads(1)
    args.out.write_text(json.dumps(reference(ref, args.official.resolve(), commit), separators=(",", ":")) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


HUGINN = Reference(
    "seal-rg/recurrent-pretraining",
    "recpre/raven_modeling_minimal.py",
    OUT,
    save_tiny_huginn,
    TINY_HUGINN,
    official_model,
    "folder holding raven_modeling_minimal.py and raven_config_minimal.py",
)

if __name__ == "__main__":
    main(HUGINN, __doc__.split("\n\n")[0])
