"""The bridge's two generation modes, and the per-doc sampling and records they share.

The adapter gets the run's `Sampling` with the doc's needs merged in: `n` = the doc's `num_samples` (what its
metrics need), `max_new_tokens` capped by the doc's `generation_size`, the doc's `stop_sequences` added to the
run's, and a seed derived from the run seed (`batch_seed`). An adapter that schedules a whole workload itself
(`adapters.base.Scheduling`: the engine) gets every doc of a task in one call, each with its own seed (`Workload`);
each group of samples is sent to the sink as the adapter reports it finished. Other adapters get `batch_size` docs
per `generate` call (`Generator.generate_batch`), and each batch is sent when it returns.

A resumed run generates a task that is partly stored again in the same batches as an unbroken run, and stores only
the samples it lacks. A sample's numbers depend, in the last bits, on which other samples share its batch (a matrix
product of 1 row is not rounded as one of 2 or 8: the kernels differ with the row count), and a threshold decision,
a token's exit loop or its draw, can fall on either side of them: a resumed run that batched only the missing docs
once ran one token a loop longer than the unbroken run (`tests/harness/test_resume_batches.py`). Generated in the
unbroken run's batches, every sample gets the same arithmetic, so its tokens and exit loops are the unbroken run's.
The cost is the stored part of the one task a run was stopped in, generated again and thrown away; the tasks it
finished or had not started cost nothing more.
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from lighteval.models.model_output import ModelResponse
from lighteval.tasks.prompt_manager import PromptManager
from lighteval.tasks.requests import Doc

from adapters.base import Adapter, AdapterError, Finished, Generation, Request, Sampling, Scheduling
from harness.bridge.records import (
    CONTEXT_LIMIT,
    SampleRecord,
    SampleSink,
    StoredSamples,
    batch_seed,
    gold_of,
    loops_histogram,
)

# One slot per doc LightEval asked for, filled as the doc's samples are all known.
Responses = list[ModelResponse | None]
# A progress bar over `total` steps (`lighteval_model.Bars.bar`): a context giving the function that advances it.
Bar = Callable[[str, int], AbstractContextManager[Callable[[], None]]]


@dataclass
class Pending:
    """A task's docs (`docs`: positions in the docs LightEval gave), those that still need samples (`todo`) and what
    is stored of the task (`stored`), so a resumed run stores nothing twice."""

    task: str
    docs: list[int]
    todo: list[int]
    stored: StoredSamples


def chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """Text before the first stop sequence: LightEval's metrics expect the stop itself removed."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


class Generator:
    """Generates the docs' samples with an adapter and sends their records to the sink. `context_cut` counts the
    samples that stopped at the model's context (finish reason CONTEXT_LIMIT)."""

    def __init__(
        self, adapter: Adapter, sampling: Sampling, prompts: PromptManager, sink: SampleSink | None, batch_size: int
    ) -> None:
        self.adapter = adapter
        self.sampling = sampling  # the run's; each doc's is derived from it (`sampling_for`)
        self.prompts = prompts
        self.sink = sink
        self.batch_size = batch_size
        self.context_cut = 0

    def run(self, docs: list[Doc], pending: list[Pending], responses: Responses, bar: Bar) -> None:
        """Fill `responses` for every pending doc: one workload per task on a `Scheduling` adapter, else batches."""
        adapter = self.adapter
        if isinstance(adapter, Scheduling):
            with bar("generating", sum(len(p.todo) for p in pending)) as advance:
                for task in pending:
                    if task.todo:
                        Workload(self, task, docs, responses, advance).generate(adapter)
            return
        batches = [  # an unbroken run's batches, those with a doc to generate (see the module's docstring)
            (p, chunk) for p in pending for chunk in self._batches(docs, p.docs) if not set(chunk).isdisjoint(p.todo)
        ]
        batch_numbers: collections.Counter[str] = collections.Counter()
        with bar("generating", len(batches)) as advance:
            for task, chunk in batches:
                self.generate_batch(task, batch_numbers[task.task], docs, chunk, responses)
                batch_numbers[task.task] += 1
                advance()

    def _batches(self, docs: list[Doc], todo: list[int]) -> Iterator[list[int]]:
        """Docs of one task share their generation settings; group anyway so a batch has one Sampling."""
        groups = collections.defaultdict(list)
        for i in todo:
            groups[(docs[i].num_samples, docs[i].generation_size, tuple(docs[i].stop_sequences or ()))].append(i)
        for group in groups.values():
            yield from chunks(group, self.batch_size)

    def sampling_for(self, doc: Doc, task: str) -> Sampling:
        run = self.sampling
        max_new = run.max_new_tokens if doc.generation_size is None else min(run.max_new_tokens, doc.generation_size)
        stops = tuple(dict.fromkeys(s for s in (*run.stop, *(doc.stop_sequences or ())) if s))
        seed = batch_seed(run.seed, task, doc.id)
        return dataclasses.replace(run, n=doc.num_samples, max_new_tokens=max_new, stop=stops, seed=seed)

    def batch_started(self, task: str, batch_index: int, n_prompts: int) -> None:
        if self.sink is not None:
            self.sink.on_batch_start(task, batch_index, n_prompts)

    def send(self, records: list[SampleRecord]) -> None:
        if self.sink is not None and records:
            self.sink.on_records(records)

    def generate_batch(
        self, pending: Pending, batch_index: int, docs: list[Doc], slots: list[int], responses: Responses
    ) -> None:
        """Generate for `docs[slots]` in one `generate` call, fill their `responses` and send the new records."""
        task, batch = pending.task, [docs[i] for i in slots]
        self.batch_started(task, batch_index, len(batch))
        sampling = self.sampling_for(batch[0], task)
        prompts = [self.prompts.prepare_prompt(doc) for doc in batch]
        began = time.perf_counter()
        generations = self.adapter.generate(prompts, sampling)
        latency = time.perf_counter() - began
        n = sampling.n
        if len(generations) != len(prompts) * n:
            raise AdapterError(
                f"{self.adapter.spec} returned {len(generations)} generations for {len(prompts)} prompts x n={n}"
            )
        longest = max(g.prompt_tokens for g in generations)
        records = []
        for k, (doc, prompt, slot) in enumerate(zip(batch, prompts, slots)):
            texts = []
            for j, generation in enumerate(generations[k * n : (k + 1) * n]):
                stored = pending.stored.get((doc.id, j))
                if stored is not None:  # a partly finished doc keeps what was stored
                    texts.append(stored.output)
                    continue
                text, record = self.sample(task, doc, j, prompt, generation, sampling, longest, latency)
                texts.append(text)
                records.append(record)
            token_ids = [list(g.token_ids) for g in generations[k * n : (k + 1) * n]]
            responses[slot] = ModelResponse(input=prompt, text=texts, output_tokens=token_ids)
        self.send(records)

    def sample(
        self,
        task: str,
        doc: Doc,
        index: int,
        prompt: str,
        generation: Generation,
        sampling: Sampling,
        longest: int,
        latency: float,
    ) -> tuple[str, SampleRecord]:
        """A generated sample's text (cut at the first stop) and record.

        A sample that stopped at "length" before its budget, where the context cannot hold the longest
        prompt it ran with (`longest`, the batch's in a static batch) plus the budget, stopped at the
        context: its finish reason is CONTEXT_LIMIT.
        """
        if generation.text is None:
            raise AdapterError(f"{self.adapter.spec} returned no text; LightEval tasks need adapters with a tokenizer")
        text = cut_at_stop(generation.text, sampling.stop)
        cut = (
            longest + sampling.max_new_tokens > self.adapter.max_context
            and generation.finish_reason == "length"
            and generation.generated_tokens < sampling.max_new_tokens
        )
        self.context_cut += cut
        return text, generated_record(task, doc, index, prompt, text, generation, latency, cut)


class Workload:
    """One task's samples handed whole to a `Scheduling` adapter, the stored ones too (the unbroken run's workload:
    see the module's docstring), and what has come back of each doc: `texts[r][j]` is sample j of request r (None
    until it finishes; the stored output when stored), so a doc's response is whole when its last sample is."""

    def __init__(
        self, generator: Generator, pending: Pending, docs: list[Doc], responses: Responses, advance: Callable[[], None]
    ) -> None:
        self.generator, self.task, self.responses, self.advance = generator, pending.task, responses, advance
        self.slots, self.stored = pending.docs, pending.stored
        self.docs = [docs[i] for i in self.slots]
        self.prompts = [generator.prompts.prepare_prompt(doc) for doc in self.docs]
        self.samplings = [generator.sampling_for(doc, self.task) for doc in self.docs]
        self.texts: list[list[str | None]] = [
            [stored.output if stored else None for stored in (pending.stored.get((doc.id, j)) for j in range(s.n))]
            for doc, s in zip(self.docs, self.samplings)
        ]
        self.tokens: list[list[list[int]]] = [[[] for _ in range(s.n)] for s in self.samplings]

    def generate(self, adapter: Scheduling) -> None:
        """Hand every sample of the task to the adapter at once; new samples are stored as they finish (`finished`)."""
        self.generator.batch_started(self.task, 0, len(self.slots))
        adapter.generate_requests([Request(p, s) for p, s in zip(self.prompts, self.samplings)], self.finished)

    def finished(self, done: list[Finished]) -> None:
        """The adapter's report of finished samples: record the new ones, complete the docs they complete, send them."""
        records = []
        for r, j, generation in done:
            if (self.docs[r].id, j) in self.stored:  # generated again only to batch as the unbroken run did
                continue
            text, record = self.generator.sample(
                self.task,
                self.docs[r],
                j,
                self.prompts[r],
                generation,
                self.samplings[r],
                generation.prompt_tokens,
                generation.prefill_seconds + generation.decode_seconds,
            )
            self.texts[r][j], self.tokens[r][j] = text, list(generation.token_ids)
            records.append(record)
            texts = [t for t in self.texts[r] if t is not None]
            if len(texts) == len(self.texts[r]):
                self.responses[self.slots[r]] = ModelResponse(
                    input=self.prompts[r], text=texts, output_tokens=self.tokens[r]
                )
                self.advance()
        if self.generator.sink is not None:
            self.generator.sink.on_records(records)


def generated_record(
    task: str, doc: Doc, index: int, prompt: str, text: str, generation: Generation, latency: float, cut: bool
) -> SampleRecord:
    """A generated sample's record; `cut`: the context ended it before its budget (finish reason CONTEXT_LIMIT)."""
    loops = generation.loops_used
    return SampleRecord(
        task=task,
        doc_id=doc.id,
        sample_index=index,
        prompt=prompt,
        output=text,
        gold=gold_of(doc),
        prompt_tokens=generation.prompt_tokens,
        generated_tokens=generation.generated_tokens,
        loops_used=sum(loops) / len(loops) if loops else None,
        loops_histogram=loops_histogram(loops),
        finish_reason=CONTEXT_LIMIT if cut else generation.finish_reason,
        latency_seconds=latency,
        decode_seconds=generation.decode_seconds,
    )
