"""Continuous batching, the engine's generation path: admission, prefill, and the decode loop.

`ContinuousEngine.run` alternates admitting waiting sequences (prefilled together) and decoding one
token for every running one, until none is left. Each step reads top to bottom through the four parts,
laid out as nano-vllm lays them out: the policy (`adapters.engine.serving.scheduler`: queues, admission,
preemption, no tensors), the block manager beside the pool's tensors (`block_manager`, `paged`), the
model runner (`model_runner`: inputs, the model call, CUDA graphs, sampling) and post-processing
(`postprocess`: stops, retirement, reports).

Prompts prefill chunk by chunk (MELT: chunks counted back from each prompt's end, exactly as the
static path; otherwise the whole prompt is one chunk), the k-th chunks of all admitted prompts in one
step per chunk length, so a MELT admission of many prompts costs about as many steps as its longest
prompt has chunks. A prompt holds its blocks as its chunks fill them.
"""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

import torch
from torch import Tensor

from adapters.base import Finished
from adapters.engine.exits import ExitPolicy
from adapters.engine.sampling import is_looped
from adapters.engine.serving.graphs import DecodeGraphs
from adapters.engine.families import family_of
from adapters.engine.families.standard import prefill_chunks
from adapters.engine.kv.layouts import layout_of
from adapters.engine.model import LoopedLM
from adapters.engine.serving.model_runner import ModelRunner, sample_next
from adapters.engine.serving.paged import BlockPool, PagedAttention
from adapters.engine.serving.postprocess import Postprocessor
from adapters.engine.serving.scheduler import Scheduler
from adapters.engine.serving.sequence import Sequence, setting


class ContinuousEngine:
    """Runs sequences to completion on one block pool, reporting each step's finished samples."""

    def __init__(
        self,
        model: LoopedLM,
        pool: BlockPool,
        *,
        loops: int,
        policy: ExitPolicy,
        eos_ids: set[int],
        tokenizer: Any | None,
        max_seqs: int,
        on_finished: Callable[[list[Finished]], None],
        graphs: DecodeGraphs | None = None,
    ) -> None:
        self.pool, self.manager = pool, pool.manager
        self.chunk = family_of(model.config).prefill_chunk
        self.runner = ModelRunner(model, pool, loops=loops, policy=policy, graphs=graphs)
        self.scheduler = Scheduler(pool.manager, max_seqs, on_leave=self.runner.leave)
        self.post = Postprocessor(
            self.scheduler,
            loops=loops,
            looped=is_looped(model, loops),
            eos_ids=eos_ids,
            tokenizer=tokenizer,
            on_finished=on_finished,
        )
        self.one_setting = True  # every sequence samples with the same temperature, top-p and top-k

    def run(self, sequences: list[Sequence]) -> None:
        scheduler = self.scheduler
        scheduler.waiting.extend(sequences)
        self.one_setting = len({setting(seq.sampling) for seq in sequences}) == 1
        self.runner.use_rows(min(scheduler.max_seqs, len(sequences)), max(seq.capacity for seq in sequences))
        with torch.inference_mode():
            while scheduler.waiting or scheduler.running:
                if scheduler.waiting:
                    self.admit()
                if scheduler.running:
                    self.decode()

    def admit(self) -> None:
        """The groups the policy admits, prefilled together, join the running set."""
        groups = self.scheduler.admit()
        if groups:
            self._prefill(groups)

    def _prefill(self, groups: list[list[Sequence]]) -> None:
        """Prefill each group's prompt once into its first sequence's blocks, all groups together (the k-th
        chunks of all prompts in one step per chunk length); then every sequence joins the running set, and
        the fresh ones draw their first tokens in one call."""
        began, runner = time.perf_counter(), self.runner
        firsts = [group[0] for group in groups]
        plans = [prefill_chunks(seq.prompt_len, self.chunk or seq.prompt_len) for seq in firsts]
        last: dict[int, tuple[Tensor, Tensor | None]] = {}  # group -> its prompt's next-token logits and exit loop
        for k in range(max(len(plan) for plan in plans)):
            by_length: dict[int, list[int]] = {}
            for i, plan in enumerate(plans):
                if k < len(plan):
                    by_length.setdefault(plan[k][1] - plan[k][0], []).append(i)
            for length, members in by_length.items():
                for part in self.pool.rows_per_step(members, length):
                    for i in part:
                        self.manager.hold(firsts[i], plans[i][k][1])
                    out = runner.step([firsts[i] for i in part], [firsts[i].tokens[slice(*plans[i][k])] for i in part])
                    ending = [row for row, i in enumerate(part) if k == len(plans[i]) - 1]
                    if ending:
                        logits, exit_loop = runner.logits(out)
                        last.update(
                            {part[row]: (logits[row], None if exit_loop is None else exit_loop[row]) for row in ending}
                        )
        ready, rows = [], []  # the first tokens of every group, drawn in one call
        for i, group in enumerate(groups):
            self._join(group, began)
            fresh = [seq for seq in group if seq.fresh]  # a readmitted sequence replays its tokens first
            ready += fresh
            rows += [i] * len(fresh)
        if ready:
            loops = [last[i][1] for i in rows]  # every group's, or none (one policy)
            exit_loop = None if last[0][1] is None else torch.stack([loop for loop in loops if loop is not None])
            self._sample(ready, torch.stack([last[i][0] for i in rows]), exit_loop)

    def _join(self, group: list[Sequence], began: float) -> None:
        """The group's siblings take its first sequence's prompt (`BlockPool.fork`); each joins the running set
        (its prefill ends and its decode begins there)."""
        for seq in group[1:]:
            self.pool.fork(group[0], seq)
        for seq in group:
            self.runner.start(len(self.scheduler.running), seq)
            self.scheduler.start(seq)
            seq.decode_began = time.perf_counter()
            seq.prefill_seconds = seq.decode_began - began

    def decode(self) -> None:
        """One token per running sequence: the one after its written ones, sampled from or replayed."""
        self.scheduler.provision()
        seqs = list(self.scheduler.running)
        out = self.runner.decode(seqs)
        if not self.scheduler.preemptions or not any(seq.replaying for seq in seqs):  # every sequence samples
            self.runner.advance(self._sample(seqs, *self.runner.logits(out)))
            return
        self.runner.advance(None)
        ready = [i for i, seq in enumerate(seqs) if not seq.replaying]
        if ready:
            logits, exit_loop = self.runner.logits(out)
            rows = self.runner.tensor(ready)
            self._sample([seqs[i] for i in ready], logits[rows], None if exit_loop is None else exit_loop[rows])

    def _sample(self, seqs: list[Sequence], logits: Tensor, exit_loop: Tensor | None) -> Tensor:
        """Draw each sequence's next token, record it and retire the finished ones; the ids [B]."""
        ids = sample_next(seqs, logits, self.one_setting, self.runner.device)
        self.post.record(seqs, ids.tolist(), None if exit_loop is None else exit_loop.tolist())
        return ids


def continuous_engine(
    model: LoopedLM,
    sequences: list[Sequence],
    on_finished: Callable[[list[Finished]], None],
    *,
    loops: int,
    policy: ExitPolicy,
    eos_ids: set[int],
    tokenizer: Any | None,
    max_seqs: int,
    kv_budget: float | None,
    block_size: int,
    cuda_graphs: bool,
    attention: PagedAttention | None,
) -> ContinuousEngine:
    """An engine for `sequences` on a pool sized for their capacities (`BlockPool.for_workload`, within `kv_budget`
    GB when given), its decode steps replayed as CUDA graphs where `cuda_graphs` asks for them and they can run."""
    weight = model.model.embed_tokens.weight
    # a graph replays one fixed-depth step: with loops skipped per token the decode runs eagerly. A model that draws its
    # initial state runs eagerly too: its keyed draw (`Recurrence.keyed_draw`) is a pure function of the positions and the
    # rows' stream keys, so it could be captured, but the graphs' static inputs carry no keys and no capture of it is tested
    capture = cuda_graphs and weight.device.type == "cuda" and not model.draws_state and not policy.skips
    pool = BlockPool.for_workload(
        model.config,
        layout_of(model.config),
        loops,
        [s.capacity for s in sequences],
        max_seqs=max_seqs,
        kv_budget=kv_budget,
        block_size=block_size,
        dtype=weight.dtype,
        device=weight.device,
        spare=capture,
        attention=attention,
    )
    graphs = None
    if capture:
        graphs = DecodeGraphs(
            model,
            pool,
            loops=loops,
            keep_loops=policy.reads_loops(bool(model.coda)),
            max_seqs=max_seqs,
            max_blocks=pool.manager.blocks_for(max(s.capacity for s in sequences)),
            capture=True,
        )
    return ContinuousEngine(
        model,
        pool,
        loops=loops,
        policy=policy,
        eos_ids=eos_ids,
        tokenizer=tokenizer,
        max_seqs=max_seqs,
        on_finished=on_finished,
        graphs=graphs,
    )
