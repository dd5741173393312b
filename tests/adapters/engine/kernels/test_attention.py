"""`kernels.attention.paged_attention` against the SDPA path, through Triton's interpreter on the CPU
(`tests.support.triton_interpreter`): over every block layout and KV dtype, and in the continuous engine with the
fused norms and RoPE, every call checked on the pool's state.

Each comparison's tolerance is a bound on float32 rounding in the two computations, derived from their arithmetic
(`attention_bound`), never fitted: both sides read the same stored K/V, dequantized by the same float32 product,
so only the order of the sums, the exponentials and the rescalings differ.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from adapters.base import Request, Sampling
from adapters.engine.adapter import load_preset, sequences_of
from adapters.engine.kv.format import KV_FORMATS
from adapters.engine.serving.paged import key_mask
from tests.support.kv_pool import engine_over, pool_for
from tests.support.triton_interpreter import U, add_rms_norm, gamma, paged_attention, qk_rope, with_kernels

pytestmark = pytest.mark.numerics  # parity with the torch path: .ci/run checks the bounds under a second CPU capability

EXP_ULPS = 4  # an exponential's error, in units of the last place (libm's and SIMD float32 exps are within 4)
DTYPES = ["auto", "int8", "fp8"]


def reference(
    q: Tensor, k: Tensor, v: Tensor, blocks: Tensor, positions: Tensor, block_size: int, kv_dtype: str
) -> tuple[Tensor, Tensor]:
    """The SDPA path: every sequence's blocks gathered and dequantized (`PagedStep.update`), masked by position
    (`key_mask`). Returns the output [B, n, H, D] and the bound on its difference from the kernel's."""
    fmt = KV_FORMATS[kv_dtype]

    def gathered(rows: Tensor) -> Tensor:  # [slots, Hkv, W] -> [B, Hkv, L, D]
        table = rows.view(-1, block_size, *rows.shape[1:])[blocks].flatten(1, 2)
        return fmt.unpack(table, q.dtype).transpose(1, 2)

    keys, values = gathered(k), gathered(v)
    mask = key_mask(positions, keys.shape[2])
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True).transpose(1, 2)
    return out, attention_bound(q, keys, values, mask, block_size)


def attention_bound(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, block_size: int) -> Tensor:
    """[B, n, H, 1]: how far two float32 evaluations of softmax(q k^T / sqrt(D)) v may differ, per query row.

    Each evaluation's score s_j errs by at most gamma(D + 5) S (the D-term dot product, the scaling, the
    subtraction of the running max, and of the largest maximum where parts of a split context merge;
    S = max_j sum_i |q_i k_ji| / sqrt(D)), its exponentials (the weight's, a part's merge weight) by 2 EXP_ULPS u
    more, so each weight p_j is off by a relative eps <= gamma(D + 5) S + 2 EXP_ULPS u. A weighted mean with
    weights off by eps moves by at most 2 eps / (1 - eps) max |v|; its two sums over the L visible keys, rescaled
    once per key tile (at most L / block_size + 1 of them for blocks of up to 64 keys), merged over at most 3 parts
    and divided, add gamma(L + L / block_size + 5) max |v| each. The two evaluations differ by at most the sum of
    their two errors."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    d = q.shape[-1]
    seen = mask.expand(q.shape[0], q.shape[1], -1, -1)  # [B, H, n, L]
    s = (q.abs() @ k.abs().transpose(-1, -2) / math.sqrt(d)).masked_fill(~seen, 0).amax(-1)
    v_max = (v.abs().amax(-1)[:, :, None, :] * seen).amax(-1)
    keys = seen.sum(-1)
    eps = gamma(d + 5) * s + 2 * EXP_ULPS * U
    each = v_max * (2 * eps / (1 - eps) + 2 * gamma(keys + keys / block_size + 5))
    return (2 * each).transpose(1, 2)[..., None]


def pool_entry(slots: int, heads: int, d: int, kv_dtype: str, seed: int) -> tuple[Tensor, Tensor]:
    """K and V rows of one entry of a pool, as stored: random values of a spread of magnitudes per row."""
    gen = torch.Generator().manual_seed(seed)
    fmt = KV_FORMATS[kv_dtype]
    rows = torch.randn(2, slots, heads, d, generator=gen) * torch.rand(2, slots, heads, 1, generator=gen).mul(4).exp()
    return fmt.pack(rows[0]), fmt.pack(rows[1])


def run_case(
    lengths: list[int],
    n: int,
    kv_dtype: str,
    *,
    block_size: int = 16,
    heads: int = 4,
    kv_heads: int = 2,
    splits: int | None = None,
    seed: int = 0,
) -> None:
    """Sequences whose last query sits at `lengths[b] - 1`, n queries each (a chunk ending there), over blocks
    scattered through a pool in a shuffled order, the table padded with another sequence's block."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-length // block_size) for length in lengths) + 1  # one padding column past the longest
    num_blocks = len(lengths) * width + 1
    k, v = pool_entry(num_blocks * block_size, kv_heads, 32, kv_dtype, seed)
    blocks = torch.randperm(num_blocks, generator=gen)[: len(lengths) * width].view(len(lengths), width)
    positions = torch.stack([torch.arange(length - n, length).clamp_min(0) for length in lengths])
    q = torch.randn(len(lengths), heads, n, 32, generator=gen)
    out = paged_attention(q, k, v, blocks, positions, block_size=block_size, kv_dtype=kv_dtype, splits=splits)
    expected, bound = reference(q, k, v, blocks, positions, block_size, kv_dtype)
    assert out.shape == expected.shape and out.dtype == q.dtype
    assert bool(((out - expected).abs() <= bound).all()), float((out - expected).abs().max())


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_decode_over_ragged_lengths_at_block_boundaries(kv_dtype):
    """One token per sequence at lengths 1, 15, 16, 17 and 40 (blocks of 16): the edges of a block and a longer one."""
    run_case([1, 15, 16, 17, 40], 1, kv_dtype)


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_decode_split_into_parts(kv_dtype):
    """A context cut into 2 and 3 parts (flash-decoding) gives what one part does, parts past a short sequence's end
    included."""
    for splits in (2, 3):
        run_case([1, 33, 70], 1, kv_dtype, splits=splits, seed=splits)


@pytest.mark.parametrize("kv_dtype", DTYPES)
def test_chunked_prefill_is_causal_over_the_context(kv_dtype):
    """Chunks of 6 queries: from slot 0, across a block edge, and after a context of 30 keys."""
    run_case([6, 19, 36], 6, kv_dtype, seed=1)


def test_query_tiles_and_block_sizes():
    """Several query tiles per sequence (40 tokens x 4 heads per KV head: 160 rows, tiles of 64), one KV head (MQA),
    and blocks of 6 tokens (not a power of two: a tile of keys spans several blocks, each key's found in the table)."""
    run_case([40, 45], 40, "auto", heads=4, kv_heads=1, seed=2)
    run_case([1, 5, 6, 7, 20], 1, "int8", block_size=6, seed=3)
    run_case([12], 12, "fp8", block_size=6, seed=4)


class Shadow:
    """The pool's attention kernel, each call also checked against the SDPA path on the same pool state."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (queries per sequence, sequences) of each call

    def __call__(
        self, q: Tensor, k: Tensor, v: Tensor, blocks: Tensor, positions: Tensor, *, block_size: int, kv_dtype: str
    ) -> Tensor:
        out = paged_attention(q, k, v, blocks, positions, block_size=block_size, kv_dtype=kv_dtype)
        expected, bound = reference(q, k, v, blocks, positions, block_size, kv_dtype)
        assert bool(((out - expected).abs() <= bound).all()), float((out - expected).abs().max())
        self.calls.append((q.shape[2], q.shape[0]))
        return out


def generate(name: str, kv_dtype: str, kv_policy: str | None, attention: Shadow | None) -> list[list[int]]:
    """Greedy tokens of two prompts on the continuous engine, attending through `attention` with the fused norms
    (None: SDPA and torch's norms, the CPU's path)."""
    overrides = {"kv_dtype": kv_dtype} | ({"kv_policy": kv_policy} if kv_policy else {})
    loops = 1 if name == "qwen3-tiny" else 2
    adapter = load_preset(name, dtype="fp32", device="cpu", seed=3, loops=loops, block_size=4, **overrides)
    adapter.config.eos_token_id = None
    with_kernels(adapter.model, *((None, None) if attention is None else (add_rms_norm, qk_rope)))
    greedy = Sampling(temperature=0.0, max_new_tokens=3)
    sequences = sequences_of(
        [Request(prompt, greedy) for prompt in ("1+2=", "abcdef")], adapter.model, adapter.tokenizer, adapter.spec
    )
    pool = pool_for(adapter, sequences)
    pool.attention = attention
    finished: list = []
    engine = engine_over(adapter, pool, finished)
    engine.run(sequences)
    return [g.token_ids for _, _, g in sorted(finished, key=lambda f: f[:2])]


@pytest.mark.parametrize(
    ("name", "kv_policy", "kv_dtype"),
    [
        ("qwen3-tiny", None, "auto"),  # standard: one entry per layer
        ("ouro-tiny", None, "auto"),  # per-loop: each loop's own entries
        ("melt-tiny", None, "auto"),  # gated: one row per layer, K/V from the latent h
        ("ouro-tiny", "shared-mean", "auto"),  # shared, folded after each loop's attention
        ("ouro-tiny", None, "int8"),
        ("ouro-tiny", "shared-mean", "fp8"),
        ("melt-tiny", None, "int8"),
    ],
)
def test_engine_attends_through_the_kernel(name, kv_policy, kv_dtype):
    """The continuous engine on the kernels' path: every attention call (prefill and decode, on blocks of 4 with a
    prompt across two blocks) within the rounding bound of the SDPA path on the same pool, and, with the fused norms
    and RoPE, the same tokens as the CPU's path."""
    shadow = Shadow()
    tokens = generate(name, kv_dtype, kv_policy, shadow)
    queries = {n for n, _ in shadow.calls}
    assert 1 in queries and max(queries) > 1  # prompts and decode steps
    assert tokens == generate(name, kv_dtype, kv_policy, None)
