"""The LightEval model: any `Adapter` as the `LightevalModel` that LightEval's Pipeline calls.

LightEval prepares the docs (prompt functions, few-shot, `--limit`), calls this model and scores with
its own metrics (`harness.evaluation` runs the Pipeline and reads the scores back); this module only
turns docs into `Adapter.generate` / `forward_logits` calls and reports what finished to a `SampleSink`,
so the runner can store samples as they finish and resume an interrupted run without generating or
storing anything twice.

The adapter gets the run's `Sampling` with the doc's needs merged in: `n` = the doc's
`num_samples` (what its metrics need), `max_new_tokens` capped by the doc's `generation_size`, the
doc's `stop_sequences` added to the run's, and a seed derived from the run seed (`batch_seed`).
An adapter that schedules a whole workload itself (`adapters.base.Scheduling`: the engine) gets
every unfinished doc of a task in one call, each with its own seed, and asks only for the samples
not stored yet; each group of samples is sent to the sink as the adapter reports it finished.
Other adapters get `batch_size` docs per `generate` call, and each batch is sent when it returns.
"""

from __future__ import annotations

import collections
import dataclasses
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from lighteval.models.abstract_model import LightevalModel, ModelConfig
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.prompt_manager import PromptManager
from lighteval.tasks.requests import Doc
from rich.progress import Progress

from adapters.base import Adapter, AdapterError, Finished, Generation, Request, Sampling, Scheduling


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


class SampleSink(Protocol):
    """Where finished samples go (the runner's store), and where a resumed run finds them."""

    def finished(self, task: str) -> dict[tuple[str, int], SampleRecord]:
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
    return doc.task_name.rsplit("|", 1)[0]


def _gold(doc: Doc) -> str | None:
    golds = [str(g) for g in doc.get_golds()] if doc.choices else []
    return " | ".join(golds) if golds else None


def _cut_at_stop(text: str, stops: tuple[str, ...]) -> str:
    """Text before the first stop sequence: LightEval's metrics expect the stop itself removed."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=len(text))
    return text[:cut]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _NoSampleCache:
    """Stands in for LightEval's on-disk `SampleCache`, which `Pipeline` wires to the model.

    That cache would write parquet files under ~/.cache and replay outputs keyed by a config hash;
    here finished work is the sink's business, so the pipeline gets nothing to cache into.
    """

    def _init_registry(self, registry: Any) -> None:
        return None


class _Bars:
    """Progress bars over batches on a given rich `Progress` (they stay there, one per call), on our own, or none."""

    def __init__(self, progress: bool | Progress | None, label: str) -> None:
        self.progress = progress
        self.label = label

    @contextmanager
    def bar(self, description: str, total: int) -> Iterator[Callable[[], None]]:
        if not self.progress or total == 0:
            yield lambda: None
            return
        owned = not isinstance(self.progress, Progress)
        progress = Progress(transient=True) if owned else self.progress
        with progress if owned else nullcontext():
            task_id = progress.add_task(f"{self.label}: {description}", total=total)
            yield lambda: progress.advance(task_id)


class AdapterModel(LightevalModel):
    """A LightEval model that generates with `adapter.generate` and ranks choices with `adapter.forward_logits`.

    It uses the tokenizer's chat template when it has one (as LightEval's own transformers model does).
    """

    def __init__(
        self,
        adapter: Adapter,
        sampling: Sampling,
        *,
        batch_size: int = 8,
        sink: SampleSink | None = None,
        progress: bool | Progress | None = True,
    ) -> None:
        if batch_size < 1:
            raise AdapterError(f"batch_size must be >= 1, got {batch_size}")
        self.adapter = adapter
        self.sampling = sampling
        self.batch_size = batch_size
        self.sink = sink
        self.bars = _Bars(progress, adapter.spec)
        self.context_cut = 0
        self.config = ModelConfig(model_name=adapter.spec)
        self._cache = _NoSampleCache()
        template = getattr(adapter.tokenizer, "chat_template", None)
        self.prompt_manager = PromptManager(use_chat_template=template is not None, tokenizer=adapter.tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self.adapter.tokenizer

    @property
    def add_special_tokens(self) -> bool:
        return True  # like the adapters' own prompt encoding (a tokenizer adds BOS if it has one)

    @property
    def max_length(self) -> int:
        return self.adapter.max_context

    def _finished(self, task: str) -> dict[tuple[str, int], SampleRecord]:
        return self.sink.finished(task) if self.sink is not None else {}

    def _sampling_for(self, doc: Doc, task: str) -> Sampling:
        run = self.sampling
        max_new = run.max_new_tokens if doc.generation_size is None else min(run.max_new_tokens, doc.generation_size)
        stops = tuple(dict.fromkeys(s for s in (*run.stop, *(doc.stop_sequences or ())) if s))
        seed = batch_seed(run.seed, task, doc.id)
        return dataclasses.replace(run, n=doc.num_samples, max_new_tokens=max_new, stop=stops, seed=seed)

    # ------------------------------------------------------------------------------------- generation
    def greedy_until(self, docs: list[Doc]) -> list[ModelResponse]:
        """Sample every doc `num_samples` times (greedy when the run's temperature is 0), skipping finished docs."""
        responses: list[ModelResponse | None] = [None] * len(docs)
        workloads: list[tuple[str, list[int], dict[tuple[str, int], SampleRecord]]] = []
        for task, indices in self._by_task(docs).items():
            finished = self._finished(task)
            todo = []
            for i in indices:
                stored = [finished.get((docs[i].id, j)) for j in range(docs[i].num_samples)]
                if all(stored):
                    prompt = self.prompt_manager.prepare_prompt(docs[i])
                    responses[i] = ModelResponse(input=prompt, text=[r.output for r in stored])
                else:
                    todo.append(i)
            workloads.append((task, todo, finished))
        if isinstance(self.adapter, Scheduling):
            with self.bars.bar("generating", sum(len(todo) for _, todo, _ in workloads)) as advance:
                for task, todo, finished in workloads:
                    if todo:
                        self._generate_workload(task, docs, todo, finished, responses, advance)
            return responses  # type: ignore[return-value]  (every slot is filled above)

        batches = []
        for task, todo, finished in workloads:
            # Docs of one task share their generation settings; group anyway so a batch has one Sampling.
            groups = collections.defaultdict(list)
            for i in todo:
                groups[(docs[i].num_samples, docs[i].generation_size, tuple(docs[i].stop_sequences or ()))].append(i)
            batches += [(task, chunk, finished) for group in groups.values() for chunk in _chunks(group, self.batch_size)]
        batch_numbers: collections.Counter[str] = collections.Counter()
        with self.bars.bar("generating", len(batches)) as advance:
            for task, chunk, finished in batches:
                self._generate_batch(task, batch_numbers[task], docs, chunk, finished, responses)
                batch_numbers[task] += 1
                advance()
        return responses  # type: ignore[return-value]  (every slot is filled above)

    def _generate_workload(
        self,
        task: str,
        docs: list[Doc],
        todo: list[int],
        finished: dict[tuple[str, int], SampleRecord],
        responses: list[ModelResponse | None],
        advance: Callable[[], None],
    ) -> None:
        """Hand every unfinished sample of `docs[todo]` to the adapter at once; store samples as they finish."""
        if self.sink is not None:
            self.sink.on_batch_start(task, 0, len(todo))
        prompts = [self.prompt_manager.prepare_prompt(docs[i]) for i in todo]
        samplings = [self._sampling_for(docs[i], task) for i in todo]
        texts = [[stored.output if stored else None for stored in (finished.get((docs[i].id, j)) for j in range(s.n))]
                 for i, s in zip(todo, samplings)]
        tokens: list[list[list[int]]] = [[[] for _ in range(s.n)] for s in samplings]
        requests = [Request(prompt, sampling, samples=tuple(j for j, text in enumerate(done) if text is None))
                    for prompt, sampling, done in zip(prompts, samplings, texts)]

        def on_finished(done: list[Finished]) -> None:
            records = []
            for r, j, generation in done:
                doc = docs[todo[r]]
                text, record = self._sample(task, doc, j, prompts[r], generation, samplings[r], generation.prompt_tokens,
                                            generation.prefill_seconds + generation.decode_seconds)
                texts[r][j], tokens[r][j] = text, list(generation.token_ids)
                records.append(record)
                if all(t is not None for t in texts[r]):
                    responses[todo[r]] = ModelResponse(input=prompts[r], text=texts[r], output_tokens=tokens[r])
                    advance()
            if self.sink is not None:
                self.sink.on_records(records)

        self.adapter.generate_requests(requests, on_finished)

    @staticmethod
    def _by_task(docs: list[Doc]) -> dict[str, list[int]]:
        by_task: dict[str, list[int]] = collections.defaultdict(list)
        for i, doc in enumerate(docs):
            by_task[task_of(doc)].append(i)
        return by_task

    def _generate_batch(
        self,
        task: str,
        batch_index: int,
        docs: list[Doc],
        slots: list[int],
        finished: dict[tuple[str, int], SampleRecord],
        responses: list[ModelResponse | None],
    ) -> None:
        """Generate for `docs[slots]`, fill their `responses` and send the new records to the sink."""
        batch = [docs[i] for i in slots]
        if self.sink is not None:
            self.sink.on_batch_start(task, batch_index, len(batch))
        sampling = self._sampling_for(batch[0], task)
        prompts = [self.prompt_manager.prepare_prompt(doc) for doc in batch]
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
                stored = finished.get((doc.id, j))
                if stored is not None:  # a partly finished doc keeps what was stored
                    texts.append(stored.output)
                    continue
                text, record = self._sample(task, doc, j, prompt, generation, sampling, longest, latency)
                texts.append(text)
                records.append(record)
            token_ids = [list(g.token_ids) for g in generations[k * n : (k + 1) * n]]
            responses[slot] = ModelResponse(input=prompt, text=texts, output_tokens=token_ids)
        if self.sink is not None and records:
            self.sink.on_records(records)

    def _sample(self, task: str, doc: Doc, index: int, prompt: str, generation: Generation, sampling: Sampling, longest: int,
                latency: float) -> tuple[str, SampleRecord]:
        """A generated sample's text (cut at the first stop) and record.

        A sample that stopped at "length" before its budget, where the context cannot hold the longest
        prompt it ran with (`longest`, the batch's in a static batch) plus the budget, stopped at the
        context: its finish reason is CONTEXT_LIMIT.
        """
        text = _cut_at_stop(self._text(generation), sampling.stop)
        cut = (longest + sampling.max_new_tokens > self.max_length and generation.finish_reason == "length"
               and generation.generated_tokens < sampling.max_new_tokens)
        self.context_cut += cut
        return text, self._record(task, doc, index, prompt, text, generation, latency, cut)

    def _text(self, generation: Generation) -> str:
        if generation.text is None:
            raise AdapterError(f"{self.adapter.spec} returned no text; LightEval tasks need adapters with a tokenizer")
        return generation.text

    @staticmethod
    def _record(
        task: str, doc: Doc, index: int, prompt: str, text: str, generation: Generation, latency: float, cut: bool
    ) -> SampleRecord:
        """The sample's record; `cut`: the context ended it before its budget (finish reason CONTEXT_LIMIT)."""
        loops = generation.loops_used
        return SampleRecord(
            task=task,
            doc_id=doc.id,
            sample_index=index,
            prompt=prompt,
            output=text,
            gold=_gold(doc),
            prompt_tokens=generation.prompt_tokens,
            generated_tokens=generation.generated_tokens,
            loops_used=sum(loops) / len(loops) if loops else None,
            loops_histogram=loops_histogram(loops),
            finish_reason=CONTEXT_LIMIT if cut else generation.finish_reason,
            latency_seconds=latency,
            decode_seconds=generation.decode_seconds,
        )

    # ---------------------------------------------------------------------------------- log-likelihood
    def loglikelihood(self, docs: list[Doc]) -> list[ModelResponse]:
        """Sum of log-probabilities of each choice after the prompt, from uncached forwards.

        A batch of `batch_size` docs (all their choices) runs as one forward per sequence length
        (`_logprobs`); sequences longer than the context keep their tail.
        """
        if self.tokenizer is None:
            raise AdapterError(f"{self.adapter.spec} has no tokenizer: multiple-choice tasks need one")
        responses: list[ModelResponse | None] = [None] * len(docs)
        batches = [
            (task, chunk, self._finished(task))
            for task, indices in self._by_task(docs).items()
            for chunk in _chunks(indices, self.batch_size)
        ]
        batch_numbers: collections.Counter[str] = collections.Counter()
        with self.bars.bar("ranking choices", len(batches)) as advance:
            for task, chunk, finished in batches:
                if self.sink is not None:
                    self.sink.on_batch_start(task, batch_numbers[task], len(chunk))
                began = time.perf_counter()
                scored = self._score_choices([docs[i] for i in chunk])
                latency = time.perf_counter() - began
                records = []
                for i, (prompt, response) in zip(chunk, scored):
                    responses[i] = response
                    if (docs[i].id, LOGLIKELIHOOD_SAMPLE_INDEX) not in finished:
                        records.append(self._choice_record(task, docs[i], prompt, response, latency))
                if self.sink is not None and records:
                    self.sink.on_records(records)
                batch_numbers[task] += 1
                advance()
        return responses  # type: ignore[return-value]

    def _score_choices(self, docs: list[Doc]) -> list[tuple[str, ModelResponse]]:
        rows = []  # (doc position, context ids, continuation ids)
        prompts = []
        for position, doc in enumerate(docs):
            prompt = self.prompt_manager.prepare_prompt(doc)
            prompts.append(prompt)
            contexts, continuations = self.tok_encode_pair(prompt, doc.choices, pairwise=True)
            for context, continuation in zip(contexts, continuations):
                if not context or not continuation:
                    raise AdapterError(f"doc {doc.id} of {doc.task_name}: empty prompt or choice after tokenization")
                rows.append((position, list(context), list(continuation)))
        limit = self.max_length + 1  # the last token is only a target
        sequences = [(context + continuation)[-limit:] for _, context, continuation in rows]
        logprobs = self._logprobs(sequences)

        per_doc: list[list[tuple[float, bool, list[int]]]] = [[] for _ in docs]
        for row, ((position, _, continuation), sequence) in enumerate(zip(rows, sequences)):
            k = min(len(continuation), len(sequence) - 1)
            targets = torch.tensor(sequence[-k:], dtype=torch.long)
            scored = logprobs[row][-k:]
            picked = scored.gather(-1, targets[:, None]).sum().item()
            greedy = bool((scored.argmax(-1) == targets).all())
            per_doc[position].append((picked, greedy, continuation))
        return [
            (prompt, ModelResponse(
                input=prompt,
                logprobs=[lp for lp, _, _ in choices],
                argmax_logits_eq_gold=[greedy for _, greedy, _ in choices],
                output_tokens=[ids for _, _, ids in choices],
            ))
            for prompt, choices in zip(prompts, per_doc)
        ]  # fmt: skip

    def _logprobs(self, sequences: list[list[int]]) -> list[torch.Tensor]:
        """[len - 1, vocab] log-probabilities of each sequence's next tokens, one forward per length.

        No row is padded: padding would change what a MELT model computes for the real tokens, whose
        chunks are counted back from the sequence's last token (as generation's prefill counts them).
        """
        by_length: dict[int, list[int]] = collections.defaultdict(list)
        for row, sequence in enumerate(sequences):
            by_length[len(sequence)].append(row)
        out: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
        for rows in by_length.values():
            input_ids = torch.tensor([sequences[row][:-1] for row in rows], dtype=torch.long)
            logprobs = torch.log_softmax(self.adapter.forward_logits(input_ids).float(), dim=-1).cpu()
            for row, values in zip(rows, logprobs):
                out[row] = values
        return out

    @staticmethod
    def _choice_record(task: str, doc: Doc, prompt: str, response: ModelResponse, latency: float) -> SampleRecord:
        best = max(range(len(response.logprobs)), key=response.logprobs.__getitem__)
        return SampleRecord(
            task=task,
            doc_id=doc.id,
            sample_index=LOGLIKELIHOOD_SAMPLE_INDEX,
            prompt=prompt,
            output=doc.choices[best],
            gold=_gold(doc),
            prompt_tokens=None,
            generated_tokens=None,
            loops_used=None,
            finish_reason=None,
            latency_seconds=latency,
        )

    def loglikelihood_rolling(self, docs: list[Doc]) -> list[ModelResponse]:
        raise NotImplementedError("perplexity tasks are not part of loopeval's suites")
