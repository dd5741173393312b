"""Reference outputs of the IFM Part II evaluation (ifm-ai/xllm-loop) on tiny random artifacts, for the engine's fidelity
tests (`tests/adapters/engine/families/test_ifm.py`).

The official evaluation is `DepthControlledHuginn.terminal_kv_forward` (xllm/models/looped.py) over the blocks of
xllm/models/transformer.py and the attention, feed-forward, RMSNorm and RoPE modules of `xllm.modules`. Those modules
need the CUDA norm kernel (`xllm_extension`) and the distributed runtime, and the xllm-loop snapshot readable here lacks
`xllm/modules`, so the official package cannot be imported on a CPU. This script computes what those files compute,
operation by operation, on the artifact's own tensors, names and conventions, with none of the engine's code:

- the official state dict as stored (`adapters.testing.save_tiny_ifm`, BF16 cast to float32): RMSNorms multiply by
  their stored weight + 1; RoPE rotates adjacent channel pairs as complex numbers (`apply_rotary_embeddings`), from
  the table `RotaryEmbedding._precompute_until` builds;
- attention as `CausalSoftmaxAttention`'s backend-free path: the cache (k, v, length) concatenated before the chunk's
  rows, GQA by repeating K/V heads, an additive -inf mask `triu(diagonal=cache_len + 1)`, softmax in float32;
- the state `identity_recurrent_state` draws (seed 42, here example id 0 as the engine uses; its float32 sine taken
  correctly rounded, which the official `sin_` approximates to an ulp: `families.ifm.IfmState.initial_state`), the
  diagonal, orthogonal
  and linear injections, the prelude and exit norms, and terminal KV: recurrences before the last attend to the cached
  terminal rows plus their own chunk's (their own chunk only while the cache is empty), the last one appends;
- D4 rows: the plain `Transformer.forward` with its cache.

It records, for each row of `adapters.testing.IFM_VARIANTS`, the logits at every position of each prompt (a prefill
with an empty cache, R = 5) and greedy continuations decoded token by token through the terminal-KV cache, as
`eval_paper_part2.py`'s generation stages do.

    python scripts/ifm_reference.py
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from adapters.testing import IFM_VARIANTS, save_tiny_ifm

OUT = Path(__file__).resolve().parent.parent / "tests" / "adapters" / "engine" / "data" / "ifm_reference.json"
REPOSITORY = "ifm-ai/xllm-loop"
COMMIT = "3af99f493e14fba162625d5dd687abea551a299e"  # the snapshot read
CHECKPOINT_SEED = 0
STATE_SEED, EXAMPLE_ID, MODULUS = 42, 0, 16_777_213
NEW_TOKENS = 8
PROMPTS = [[5, 40, 41, 12, 77], [3, 9, 27, 81, 64, 22, 50], [60, 61, 62, 10, 11, 90, 33, 4, 18]]
Cache = list[tuple[Tensor | None, Tensor | None, int]]


class Official:
    """One artifact's evaluation forward, as the official files compute it (module docstring)."""

    def __init__(self, folder: Path) -> None:
        self.fields = json.loads((folder / "config.json").read_text())["model"]
        self.w = {k: v.float() for k, v in load_file(str(folder / "model-00001-of-00001.safetensors")).items()}
        f = self.fields
        self.d, self.h, self.kv, self.hd = f["model_dim"], f["num_heads"], f["num_kv_heads"], f["head_dim"]
        self.eps, self.layers = f["rmsnorm_eps"], f["num_layers"]
        self.looped = f["arch"] == "huginn"
        self.start = f.get("huginn_prelude_layers", 0)
        self.end = self.start + f.get("huginn_recurrent_layers", 0)
        freqs = 1.0 / torch.tensor([f["rope_base"] ** (j / self.hd) for j in range(0, self.hd, 2)], dtype=torch.float32)
        angles = torch.outer(torch.arange(f["chunk_size"] * 16, dtype=torch.float32), freqs)
        self.freqs_cis = torch.polar(torch.ones_like(angles), angles)

    def norm(self, x: Tensor, weight: str | None) -> Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y if weight is None else y * (self.w[weight] + 1.0)

    def rope(self, x: Tensor, freqs: Tensor) -> Tensor:
        pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(pairs * freqs.unsqueeze(1)).flatten(3).type_as(x)

    def block(self, i: int, x: Tensor, freqs: Tensor, cache: tuple | None) -> tuple[Tensor, tuple | None]:
        p, (b, n, _) = f"layers.{i}.", x.shape
        y = self.norm(x, p + "attention.norm.weight")
        q = (y @ self.w[p + "attention.wq.weight"].T).view(b, n, self.h, self.hd)
        k = (y @ self.w[p + "attention.wk.weight"].T).view(b, n, self.kv, self.hd)
        v = (y @ self.w[p + "attention.wv.weight"].T).view(b, n, self.kv, self.hd)
        q, k = self.rope(q, freqs), self.rope(k, freqs)
        if cache is not None:
            ck, cv, length = cache
            k = k if ck is None else torch.cat([ck, k], dim=1)
            v = v if cv is None else torch.cat([cv, v], dim=1)
            cache = (k, v, length + n)
            past = length
        else:
            past = 0
        k, v = k.repeat_interleave(self.h // self.kv, dim=2), v.repeat_interleave(self.h // self.kv, dim=2)
        mask = torch.triu(torch.full((b, n, n + past), float("-inf")), diagonal=past + 1)
        scores = (q.transpose(1, 2) @ k.permute(0, 2, 3, 1)) / math.sqrt(self.hd) + mask.unsqueeze(1)
        attn = (F.softmax(scores, dim=-1, dtype=torch.float32) @ v.transpose(1, 2)).transpose(1, 2).reshape(b, n, -1)
        x = attn @ self.w[p + "attention.wo.weight"].T + x
        y = self.norm(x, p + "nffn.norm.weight")
        hidden = F.silu(y @ self.w[p + "nffn.fc1.weight"].T) * (y @ self.w[p + "nffn.fc3.weight"].T)
        return hidden @ self.w[p + "nffn.fc2.weight"].T + x, cache

    def state(self, e: Tensor, cache_len: int) -> Tensor:
        b, n, d = e.shape
        mixed = (EXAMPLE_ID * 104_729 + (STATE_SEED % MODULUS) * 130_363) % MODULUS
        phase = torch.full((b,), mixed, dtype=torch.long).to(torch.float32).mul_(2.0 * math.pi / MODULUS).view(-1, 1, 1)
        dim = torch.arange(0, d, dtype=torch.float32).view(1, 1, -1)
        pos = torch.arange(cache_len, cache_len + n, dtype=torch.float32).view(1, -1, 1)
        s = dim.expand(b, n, d).clone()
        s.mul_(0.013579)
        s.add_(pos * 0.021713)
        s.add_(phase)
        s.add_(0.123457)
        s.copy_(s.double().sin())  # correctly rounded: the same bits on every CPU (docstring)
        s.mul_(43758.5453123)
        s.sub_(s.floor())
        s.clamp_(1e-6, 1.0 - 1e-6)
        s.mul_(2.0).sub_(1.0)
        s.erfinv_()
        return s.mul_(math.sqrt(2.0) * (1.0 / (d**0.5))).to(e.dtype)

    def inject(self, h: Tensor, e: Tensor) -> Tensor:
        f, w = self.fields, self.w
        if f.get("huginn_input_injection") == "linear":
            return torch.cat([h, e], dim=-1) @ w["input_injection.adapter.weight"].T + w["input_injection.adapter.bias"]
        update = e @ w["input_injection.input_adapter.weight"].T
        dt = F.softplus(w["input_injection.dt_bias"])
        retained, injected = h * torch.exp(-dt * torch.exp(w["input_injection.A_log"])), dt * update
        if not f.get("huginn_prelude_orthogonal"):
            return retained + injected
        coefficient = (retained * injected).sum(-1, keepdim=True) / (injected.square().sum(-1, keepdim=True) + 1e-6)
        return (retained - coefficient * injected) + injected

    def forward(self, tokens: Tensor, cache: Cache) -> Tensor:
        """Logits at every position of the chunk `tokens` [1, n]; `cache` (one bank per layer) is updated in place."""
        length, n = cache[0][2], tokens.shape[1]
        freqs = self.freqs_cis[length : length + n]
        x = F.embedding(tokens, self.w["embed.weight"])
        if not self.looped:
            for i in range(self.layers):
                x, cache[i] = self.block(i, x, freqs, cache[i])
            return self.head(x)
        for i in range(self.start):
            x, cache[i] = self.block(i, x, freqs, cache[i])
        e = (
            x
            if self.fields.get("huginn_prelude_norm", "none") == "none"
            else self.norm(x, "huginn_prelude_norm_module.weight")
        )
        x = self.state(e, length)
        for step in range(self.fields["loop_times"]):
            last = step + 1 == self.fields["loop_times"]
            x = self.inject(x, e)
            for i in range(self.start, self.end):
                x, kept = self.block(i, x, freqs, cache[i] if last or length > 0 else None)
                if last:
                    cache[i] = kept
            if self.fields.get("huginn_recurrent_exit_norm", "none") == "parameterless_rms":
                x = self.norm(x, None)
        for i in range(self.end, self.layers):
            x, cache[i] = self.block(i, x, freqs, cache[i])
        return self.head(x)

    def head(self, x: Tensor) -> Tensor:
        return self.norm(x, "output.final_norm.weight") @ self.w["output.output.weight"].T

    def empty(self) -> Cache:
        return [(None, None, 0)] * self.layers


@torch.no_grad()
def record(model: Official) -> dict[str, Any]:
    logits, greedy = [], []
    for prompt in PROMPTS:
        rows = model.forward(torch.tensor([prompt]), model.empty())[0]
        logits.append([[round(v, 7) for v in row] for row in rows.tolist()])
        cache, out = model.empty(), []
        step = model.forward(torch.tensor([prompt]), cache)
        while True:
            out.append(int(step[0, -1].argmax()))
            if len(out) == NEW_TOKENS:
                break
            step = model.forward(torch.tensor([[out[-1]]]), cache)
        greedy.append(out)
    return {"logits": logits, "greedy": greedy}


def main() -> None:
    torch.set_num_threads(1)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in IFM_VARIANTS:
            folder = save_tiny_ifm(Path(tmp) / variant, variant=variant, seed=CHECKPOINT_SEED)
            rows[variant] = record(Official(folder))
    fixture = {
        "reference": {
            "repository": REPOSITORY,
            "commit": COMMIT,
            "file": "xllm/models/looped.py",
            "torch": torch.__version__,
        },
        "checkpoint": {"builder": "adapters.testing.save_tiny_ifm", "seed": CHECKPOINT_SEED},
        "state": {"seed": STATE_SEED, "example_id": EXAMPLE_ID},
        "prompts": PROMPTS,
        "new_tokens": NEW_TOKENS,
        "rows": rows,
    }
    OUT.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
