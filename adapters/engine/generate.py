"""Static batches on a preallocated cache: the baseline the continuous engine is measured and tested against.

`adapters.engine.serving.continuous` is the engine's generation path (continuous batching on paged KV);
this static path stays for what needs one cache of known size: `loopeval profile`'s
single-sequence memory at a given context (the analytic figure, to the byte) and the static
baseline the continuous engine is measured and tested against (`batching="static"`).

Every random draw comes from one random stream per sample (`adapters.engine.streams`; `stream_key`:
the prompt's seed and the sample's index): sampling's noise (`adapters.engine.sampling`: a pure function of
key, step and token id) and the recurrent families' initial state (`Recurrence.keyed_draw`: of key,
the run's seed, the token's position and the channel; a prompt token draws from its prompt's stream,
`prompt_key`, since the prompt's samples share its K/V), so a sample's tokens do not depend on the
batch it runs in, the order it is admitted in, preemption or resume.

`generate` reads as the prefill (`Decoder.prefill`), the decode step (`Decoder.step`: one token per
row through `LoopedLM.step`) and the decode loop that samples, records (`Transcript`) and stops.

Prompts of different lengths are left-padded to a common length; each row keeps its own positions
(0 at its first real token) and a key mask hides the padding, so a row's tokens are the same as if
it ran alone. Gated (MELT) models prefill chunk by chunk (the config's chunk size); the chunks are
counted back from the prompt's last token, so that left padding does not move a row's chunk
boundaries (a 10-token prompt with chunk 4 runs as 2 + 4 + 4).

Exit policies (`adapters.engine.exits`): under the fill `read` every token still runs all r loops and
the policy only picks which loop's output is sampled from; under `copy` a decoded token stops looping at
its exit and its skipped loops' K/V entries are filled. This static path is the reference for the
continuous engine's active set: its decode step is the masked full step (every row computes every loop,
an exited row's state frozen and its K/V writes replaced by the fill), which must give the same tokens.
Prompt tokens run every loop. `loops_used` records, per token, the loops its decode step ran (the first
token: the loop it was read from in the prefill's output, or r on a model with coda layers,
`ExitPolicy.reads_loops`).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from adapters.base import AdapterError, Finished, FinishReason, Generation, Sampling, dtype_short
from adapters.engine.kv.cache import KVCache
from adapters.engine.kv.layouts import layout_of
from adapters.engine.memory import kv_bytes
from adapters.engine.exits import ExitPolicy
from adapters.engine.families.standard import prefill_chunks
from adapters.engine.model import LoopedLM, StepOutput
from adapters.engine.sampling import check_request, int_tensor, is_looped, output_text, read_logits, sample, stop_reason
from adapters.engine.serving.sequence import Sequence as Seq
from adapters.engine.streams import prompt_key, stream_key, stream_rows
from measures import GB


def prefill_mask(valid: Tensor, s0: int, s1: int) -> Tensor:
    """Bool [B,1,n,s1] for prompt slots s0..s1-1: causal over each row's real slots; padded queries
    see themselves, so that their softmax has a key (no NaN)."""
    keys = torch.arange(s1, device=valid.device)[None, :]
    queries = torch.arange(s0, s1, device=valid.device)[:, None]
    return (valid[:, None, None, :s1] & (keys <= queries)) | (keys == queries)


@dataclass
class Prompts:
    """A batch of prompts left-padded to one width; each row keeps its own positions (0 at its first real token)."""

    tokens: Tensor  # [B, width] token ids
    positions: Tensor  # [B, width]
    valid: Tensor  # [B, capacity] bool: False at padding slots (generated slots are never padding)
    lengths: list[int]

    @classmethod
    def left_padded(cls, prompts: Sequence[Sequence[int]], capacity: int, pad_id: int, device: torch.device) -> Prompts:
        lengths = [len(p) for p in prompts]
        width = max(lengths)
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        valid = torch.ones((len(prompts), capacity), dtype=torch.bool)
        for i, p in enumerate(prompts):
            tokens[i, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
            valid[i, : width - len(p)] = False
        offsets = torch.tensor([width - n for n in lengths])
        positions = (torch.arange(width)[None, :] - offsets[:, None]).clamp(min=0)
        return cls(tokens.to(device), positions.to(device), valid.to(device), lengths)

    @property
    def width(self) -> int:
        return self.tokens.shape[1]

    @property
    def padded(self) -> bool:
        return min(self.lengths) < self.width


class Decoder:
    """A batch's model calls on its static cache: `prefill`, then one `step` per token.

    Both return the logits to sample from [B, V] and the 1-based loop each row exits at (None
    unless an exit policy picks one). `streams` [B, 2]: each row's prompt's stream and its own, which a model
    that draws its initial state draws each prompt token's and each generated token's from (`LoopedLM.step`).
    """

    def __init__(
        self,
        model: LoopedLM,
        prompts: Prompts,
        cache: KVCache,
        loops: int,
        policy: ExitPolicy,
        streams: Tensor | None = None,
    ) -> None:
        self.model, self.prompts, self.cache, self.loops, self.policy, self.streams = (
            model,
            prompts,
            cache,
            loops,
            policy,
            streams,
        )
        self.keep_loops = policy.reads_loops(bool(model.coda))
        self.positions = prompts.positions[:, -1:] + 1  # [B, 1] of the next token
        # under the fill `masked`: the loops each slot's token ran (prompt tokens and the token in flight: all)
        self.ran = (
            torch.full(cache.k.shape[1:4:2], loops, device=cache.k.device)
            if policy.skips and policy.fill == "masked"
            else None
        )

    def prefill(self) -> tuple[Tensor, Tensor | None]:
        p = self.prompts
        for s0, s1 in prefill_chunks(p.width, self.cache.chunk):
            mask = prefill_mask(p.valid, s0, s1) if p.padded or s0 > 0 else None
            out = self.model.step(
                p.tokens[:, s0:s1],
                p.positions[:, s0:s1],
                self.cache,
                s0,
                mask,
                loops=self.loops,
                keep_loops=self.keep_loops,
                streams=None if self.streams is None else self.streams[:, :1].expand(-1, s1 - s0),
            )
            self.cache.length = s1
        return self._read(out)

    def step(self, tokens: Tensor) -> tuple[Tensor, Tensor | None]:
        """One more token per row, tokens [B], at the next slot."""
        slot, positions = self.cache.length, self.positions
        mask = self.prompts.valid[:, None, None, : slot + 1] if self.prompts.padded else None
        ran = None if self.ran is None else self.ran[:, : slot + 1]
        out = self.model.step(
            tokens[:, None],
            positions,
            self.cache,
            slot,
            mask,
            loops=self.loops,
            keep_loops=self.keep_loops,
            exits=self.policy,
            active_set=False,
            ran=ran,
            streams=None if self.streams is None else self.streams[:, 1:],
        )
        if ran is not None and out.loops_run is not None:  # a skipping policy reports the loops it ran
            ran[:, slot] = out.loops_run
        self.cache.length, self.positions = slot + 1, positions + 1
        return self._read(out)

    def _read(self, out: StepOutput) -> tuple[Tensor, Tensor | None]:
        return read_logits(self.model, out, self.policy)


class Transcript:
    """What each row of a batch has generated, with the loop it read each token from, and why it stopped."""

    def __init__(self, batch: int, sampling: Sampling, eos_ids: set[int], tokenizer: Any | None) -> None:
        self.sampling, self.eos_ids, self.tokenizer = sampling, eos_ids, tokenizer
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.loops: list[list[int]] = [[] for _ in range(batch)]
        self.finish: list[FinishReason | None] = [None] * batch  # "eos", "stop", or None while running

    def add(self, tokens: list[int], loops: list[int]) -> bool:
        """Record one token per running row; True once every row has finished.

        Finished rows keep decoding with the batch; their tokens are dropped here.
        """
        for row, (token, loop) in enumerate(zip(tokens, loops)):
            if self.finish[row] is None:
                self.tokens[row].append(token)
                self.loops[row].append(loop)
                self.finish[row] = stop_reason(self.tokens[row], self.eos_ids, self.sampling, self.tokenizer)
        return all(f is not None for f in self.finish)

    def generations(
        self, lengths: list[int], looped: bool, prefill_seconds: float, decode_seconds: float
    ) -> list[Generation]:
        return [
            Generation(
                token_ids=ids,
                text=output_text(ids, self.finish[row] or "length", self.sampling, self.tokenizer),
                finish_reason=self.finish[row] or "length",
                prompt_tokens=lengths[row],
                generated_tokens=len(ids),
                loops_used=self.loops[row] if looped else None,
                prefill_seconds=prefill_seconds,
                decode_seconds=decode_seconds,
            )
            for row, ids in enumerate(self.tokens)
        ]


def generate(
    model: LoopedLM,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    *,
    loops: int,
    eos_ids: set[int],
    keys: Sequence[int] | None = None,
    prompt_keys: Sequence[int] | None = None,
    tokenizer: Any | None = None,
    exit_policy: ExitPolicy = ExitPolicy(),
    on_cache: Callable[[KVCache | None], None] = lambda cache: None,
    pad_id: int = 0,
) -> list[Generation]:
    """Generate one continuation per prompt (token ids) in one static batch. `on_cache` sees the live cache.

    Row i samples from stream `keys[i]` (default: `stream_key(sampling.seed, i)`); a model that draws its initial state
    draws its prompt tokens' from `prompt_keys[i]` (default: `prompt_key(sampling.seed)`) and its generated tokens' from `keys[i]`.
    """
    capacity = max(check_request(model, p, sampling, tokenizer) for p in prompts)
    weight = model.model.embed_tokens.weight
    batch = Prompts.left_padded(prompts, capacity, pad_id, weight.device)
    cache = _allocate(model, len(prompts), capacity, loops)
    keys = [stream_key(sampling.seed, i) for i in range(len(prompts))] if keys is None else keys
    prompt_keys = [prompt_key(sampling.seed)] * len(prompts) if prompt_keys is None else prompt_keys
    draws = (
        int_tensor([k for pair in zip(prompt_keys, keys) for k in pair], weight.device).view(-1, 2)
        if model.draws_state
        else None
    )
    decoder = Decoder(model, batch, cache, loops, exit_policy, draws)
    transcript = Transcript(len(prompts), sampling, eos_ids, tokenizer)
    on_cache(cache)
    try:
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits, exit_loop = decoder.prefill()
            t1 = time.perf_counter()
            budget = capacity - batch.width
            for i in range(budget):  # the only host sync per token is reading the sampled ids back
                rows = int_tensor(stream_rows(keys, [i] * len(keys)), weight.device)
                tokens = sample(logits, sampling, rows)
                chosen = [loops] * len(prompts) if exit_loop is None else exit_loop.tolist()
                if transcript.add(tokens.tolist(), chosen) or i + 1 == budget:
                    break
                logits, exit_loop = decoder.step(tokens)
            t2 = time.perf_counter()
    finally:
        on_cache(None)
    return transcript.generations(batch.lengths, is_looped(model, loops), t1 - t0, t2 - t1)


def generate_static(
    model: LoopedLM,
    sequences: list[Seq],
    on_finished: Callable[[list[Finished]], None],
    *,
    max_batch: int,
    **options: Any,
) -> None:
    """Static batches of `max_batch` sequences sharing a Sampling (their streams are their own), each decoding
    until its longest row ends, all its rows reported when it does; `options` go to `generate`."""
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    groups: dict[Sampling, list[Seq]] = {}
    for seq in sequences:
        groups.setdefault(dataclasses.replace(seq.sampling, seed=0), []).append(seq)
    for sampling, group in groups.items():
        for start in range(0, len(group), max_batch):
            batch = group[start : start + max_batch]
            generations = generate(
                model,
                [s.tokens for s in batch],
                sampling,
                keys=[s.key for s in batch],
                prompt_keys=[s.prompt_key for s in batch],
                pad_id=pad,
                **options,
            )
            on_finished([(s.request, s.sample, g) for s, g in zip(batch, generations)])


def _allocate(model: LoopedLM, batch: int, capacity: int, loops: int) -> KVCache:
    """The batch's static cache; on a GPU, a clear error instead of an allocator OOM when it cannot fit."""
    cfg, weight = model.config, model.model.embed_tokens.weight
    if weight.device.type == "cuda":
        need = kv_bytes(cfg, capacity, batch, loops, dtype_short(weight.dtype))
        free = torch.cuda.mem_get_info(weight.device)[0]
        if need > free:
            raise AdapterError(
                f"the KV cache for {batch} sequences x {capacity} tokens needs {need / GB:.2f} GB but {free / GB:.2f} GB is free: "
                "lower max_new_tokens or the batch (max_batch)"
            )
    return KVCache(cfg, layout_of(cfg), batch, capacity, loops, weight.dtype, weight.device)
