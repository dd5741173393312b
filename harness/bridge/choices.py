"""The bridge's log-likelihood path: multiple-choice docs ranked by the log-probability of each choice after the
prompt, from the adapter's uncached `forward_logits`."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence

import torch
from lighteval.models.model_output import ModelResponse
from lighteval.tasks.prompt_manager import PromptManager
from lighteval.tasks.requests import Doc

from adapters.base import Adapter, AdapterError
from harness.bridge.generation import Bar, Pending, Responses, chunks
from harness.bridge.records import LOGLIKELIHOOD_SAMPLE_INDEX, SampleRecord, SampleSink, gold_of

# (prompt, choices) -> (context ids, continuation ids) per choice: LightEval's `tok_encode_pair`, pairwise.
EncodePair = Callable[[str, list[str]], tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]]


class ChoiceRanker:
    """Ranks the choices of `batch_size` docs at a time and sends each doc's pick to the sink."""

    def __init__(
        self,
        adapter: Adapter,
        prompts: PromptManager,
        encode_pair: EncodePair,
        sink: SampleSink | None,
        batch_size: int,
    ) -> None:
        self.adapter = adapter
        self.prompts = prompts
        self.encode_pair = encode_pair
        self.sink = sink
        self.batch_size = batch_size

    def run(self, docs: list[Doc], pending: list[Pending], responses: Responses, bar: Bar) -> None:
        """Fill `responses` with every doc's choice log-probabilities; records go to the sink for the docs whose pick
        is not stored yet (a resumed run ranks every doc again: LightEval scores from every doc's response)."""
        batches = [(task, chunk) for task in pending for chunk in chunks(task.todo, self.batch_size)]
        batch_numbers: collections.Counter[str] = collections.Counter()
        with bar("ranking choices", len(batches)) as advance:
            for task, chunk in batches:
                if self.sink is not None:
                    self.sink.on_batch_start(task.task, batch_numbers[task.task], len(chunk))
                began = time.perf_counter()
                scored = self.score([docs[i] for i in chunk])
                latency = time.perf_counter() - began
                records = []
                for i, (prompt, response) in zip(chunk, scored):
                    responses[i] = response
                    if (docs[i].id, LOGLIKELIHOOD_SAMPLE_INDEX) not in task.stored:
                        records.append(choice_record(task.task, docs[i], prompt, response, latency))
                if self.sink is not None and records:
                    self.sink.on_records(records)
                batch_numbers[task.task] += 1
                advance()

    def score(self, docs: list[Doc]) -> list[tuple[str, ModelResponse]]:
        """Each doc's prompt and response: the summed log-probability of each choice, whether greedy decoding would
        produce it, and its tokens. Sequences longer than the context keep their tail."""
        rows = []  # (doc position, context ids, continuation ids)
        prompts = []
        for position, doc in enumerate(docs):
            prompt = self.prompts.prepare_prompt(doc)
            prompts.append(prompt)
            contexts, continuations = self.encode_pair(prompt, doc.choices)
            for context, continuation in zip(contexts, continuations):
                if not context or not continuation:
                    raise AdapterError(f"doc {doc.id} of {doc.task_name}: empty prompt or choice after tokenization")
                rows.append((position, list(context), list(continuation)))
        limit = self.adapter.max_context + 1  # the last token is only a target
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


def choice_record(task: str, doc: Doc, prompt: str, response: ModelResponse, latency: float) -> SampleRecord:
    """The record of a doc's pick: the choice with the highest log-probability, under LOGLIKELIHOOD_SAMPLE_INDEX."""
    best = max(range(len(response.logprobs)), key=response.logprobs.__getitem__)
    return SampleRecord(
        task=task,
        doc_id=doc.id,
        sample_index=LOGLIKELIHOOD_SAMPLE_INDEX,
        prompt=prompt,
        output=doc.choices[best],
        gold=gold_of(doc),
        prompt_tokens=None,
        generated_tokens=None,
        loops_used=None,
        finish_reason=None,
        latency_seconds=latency,
    )
