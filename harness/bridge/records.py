"""What the LightEval bridge hands on: a finished sample's record, the sink it goes to, and the rules both generation
modes and the scorer share (the seed of a doc, a doc's task and gold).

Nothing here imports LightEval (a doc is only read, by attribute), so the runner's store sink takes these types
without the evaluation stack.
"""

from __future__ import annotations

import collections
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lighteval.tasks.requests import Doc

# The sample index of a multiple-choice doc's log-likelihood pick (the choice with the highest
# log-probability); generated samples are 0..n-1, so a task that both generates and ranks choices
# (MMLU-Redux) never stores two records under one key.
LOGLIKELIHOOD_SAMPLE_INDEX = -1
# The finish reason stored for a sample that stopped at the end of the model's context before its
# new-token budget: the adapter reports "length" with fewer than max_new_tokens tokens generated, in a batch
# whose longest prompt plus max_new_tokens does not fit the context.
CONTEXT_LIMIT = "context_limit"


def loops_histogram(loops: list[int] | None) -> dict[str, int] | None:
    """Loops run per generated token -> {loops: tokens}, keys in loop order as strings (JSON object keys); None
    for a model that does not loop."""
    return {str(r): count for r, count in sorted(collections.Counter(loops).items())} if loops else None


@dataclass
class SampleRecord:
    """One finished sample, as the sink stores it. `latency_seconds` is the wall time of its batch (prefill and
    decode), `decode_seconds` the decode time the adapter reported for it; `loops_histogram` counts its generated
    tokens by the loops run for each ({"1": 3, "4": 17}: what an early exit saved, beside the mean)."""

    task: str
    doc_id: str
    sample_index: int
    prompt: str
    output: str
    gold: str | None
    prompt_tokens: int | None
    generated_tokens: int | None
    loops_used: float | None  # mean loops per generated token
    finish_reason: str | None
    latency_seconds: float | None
    loops_histogram: dict[str, int] | None = None
    decode_seconds: float | None = None
    score: float | None = None


# What a resumed run finds of one task: (doc_id, sample_index) -> the stored record.
StoredSamples = dict[tuple[str, int], SampleRecord]


class SampleSink(Protocol):
    """Where finished samples go (the runner's store), and where a resumed run finds them."""

    def finished(self, task: str) -> StoredSamples:
        """(doc_id, sample_index) -> stored record of this run, for resume."""
        ...

    def on_batch_start(self, task: str, batch_index: int, n_prompts: int) -> None:
        """A batch is about to run (the memory sampler tags its phase)."""
        ...

    def on_records(self, records: list[SampleRecord]) -> None:
        """Records of the batch that just finished; none of them was sent before."""
        ...


def batch_seed(run_seed: int, task: str, first_doc_id: str) -> int:
    """The seed of one batch, fixed by the run seed and the batch's first doc (of one doc, for an adapter
    that takes the whole workload: `Scheduling`).

    Batches then draw independent random streams (one shared seed would reuse the same draws for
    every batch), and rerunning with the same seed repeats every batch exactly.
    """
    return zlib.crc32(f"{run_seed}:{task}:{first_doc_id}".encode()) & 0x7FFFFFFF


def task_of(doc: Doc) -> str:
    """The task name of a doc: LightEval's full name without its "|<fewshots>" suffix."""
    return str(doc.task_name).rsplit("|", 1)[0]


def gold_of(doc: Doc) -> str | None:
    """The doc's gold answers as stored beside its samples ("a | b"), None for a doc without choices."""
    golds = [str(g) for g in doc.get_golds()] if doc.choices else []
    return " | ".join(golds) if golds else None
