"""Counter-based random streams: every random draw of a generation is a hash of who draws and where.

A sample's stream is a 32-bit key (`stream_key`: the prompt's seed and the sample's index); its prompt
tokens, which its prompt's samples share, draw from the prompt's (`prompt_key`). A draw
is a pure function of that key, a counter (the token index for sampling noise, the token's position
for the recurrent families' initial state) and an index within the draw (the token id, the channel),
so a row needs no generator state and a batch of rows is one set of kernels, whatever the batch
holds: a sample's draws do not depend on the batch it runs in, the order it is admitted in,
preemption or resume. `adapters.engine.sampling.exponential_noise` (sampling) and
`adapters.engine.families.recurrence.Recurrence` (the state Huginn's recurrence starts from) draw from here.
"""

from __future__ import annotations

import functools
import zlib
from typing import TypeVar
from collections.abc import Sequence

import torch
from torch import Tensor

T = TypeVar("T", int, Tensor)
M32 = 0xFFFFFFFF


def stream_key(seed: int, index: int) -> int:
    """The 32-bit key of one random stream: sample `index` of the prompt (or request) seeded `seed`."""
    return zlib.crc32(f"{seed}:{index}".encode())


def prompt_key(seed: int) -> int:
    """The stream of the prompt seeded `seed` itself, apart from its samples': what its prompt tokens' draws (the recurrent
    families' initial states) come from, since the samples of a prompt share the prompt's K/V (one prefill, forked)."""
    return zlib.crc32(f"{seed}:prompt".encode())


def mix32(x: T) -> T:
    """A 32-bit integer hash (two xorshift-multiply rounds) on values in [0, 2**32): Python ints or int64 tensors.

    The multipliers are odd and below 2**31, so every product stays below 2**63 and int64 never
    overflows on any device; each round is a bijection of the 32-bit values. Python ints and tensors
    give the same values, so the per-row half of the hash is computed on the host (`stream_rows`).
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & M32
    return x ^ (x >> 16)


def stream_rows(keys: Sequence[int], steps: Sequence[int]) -> list[int]:
    """The row half of the noise hash for streams `keys` at token indices `steps`: a few integer
    operations per row on the host, where as tensor kernels they were a tenth of a tiny model's decode step."""
    return [mix32(key ^ mix32(step & M32)) for key, step in zip(keys, steps)]


@functools.lru_cache(maxsize=8)
def index_hashes(size: int, device: torch.device) -> Tensor:
    """The index half of a draw's hash (token ids, channels 0..size-1): the same at every step, so computed once per size and device."""
    with torch.inference_mode(False):  # an ordinary tensor, usable in and out of inference mode
        return mix32(mix32(torch.arange(size, device=device)))


def uniform(rows: Tensor, size: int) -> Tensor:
    """Uniform draws in (0, 1) [..., size] for rows whose stream and counter hash to `rows` [...] (int64).

    The top 24 bits of hash(row, index) give (k + 0.5) / 2**24, exactly representable in float32 and
    symmetric about 1/2 (so a map odd about 1/2, like the inverse normal CDF, gives draws of mean exactly 0 in law).
    """
    bits = mix32(rows[..., None] ^ index_hashes(size, rows.device))
    return ((bits >> 8).float() + 0.5) * 2.0**-24
