"""Training data: a recipe's items as token batches (`TaskData`, `Batch`), and validation exact match.

Every batch is drawn from a generator seeded by (seed, step), so a run resumed from its checkpoint sees exactly the
batches it would have seen; gated (MELT) models are scored with the chunks decoding uses (`Batch.decode_chunks`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from adapters.base import AdapterError
from adapters.engine.families.standard import prefill_chunks
from adapters.engine.model import LoopedLM


@dataclass
class Batch:
    inputs: torch.Tensor  # [B, N] token ids (right-padded)
    targets: torch.Tensor  # [B, N] next tokens
    answer_mask: torch.Tensor  # [B, N] 1 where the target is an answer or stop token
    token_mask: torch.Tensor  # [B, N] 1 where the target is a real token (not padding)
    prompt_length: int | None = None  # set when every row's prompt (with <bos>) has this length

    def decode_chunks(self, chunk_size: int) -> list[int]:
        """Chunk lengths that reproduce MELT decoding on this batch: the prompt in chunks counted back
        from its end (as `adapters.engine.generate` prefills), then every later token alone (as it is decoded)."""
        assert self.prompt_length is not None, "decode-aligned chunks need a batch of one prompt length"
        prefill = [s1 - s0 for s0, s1 in prefill_chunks(self.prompt_length, chunk_size)]
        return prefill + [1] * (self.inputs.shape[1] - self.prompt_length)


class TaskData:
    """Tokenised train items, split into train and a held-out validation slice.

    Each item is `<bos> prompt answer stop`: exactly what the model sees and must produce at
    evaluation (the harness cuts the answer at the stop). The last `val_items` items of each task
    are held out.
    """

    def __init__(
        self, tasks: tuple[str, ...], tokenizer: Any, val_items: int, items: dict[str, list[dict[str, Any]]], stop: str
    ) -> None:
        self.pad_id = tokenizer.pad_token_id
        self.train: list[tuple[list[int], int]] = []  # (ids, prompt length including <bos>)
        self.val: dict[str, list[tuple[list[int], int]]] = {}
        for task in tasks:
            rows = items[task]
            encoded = []
            for row in rows:
                prompt = tokenizer.encode(row["prompt"])
                answer = tokenizer.encode(row["answer"] + stop, add_special_tokens=False)
                encoded.append((prompt + answer, len(prompt)))
            cut = max(0, len(encoded) - val_items)
            self.train += encoded[:cut]
            self.val[task] = encoded[cut:]
        if not self.train:
            raise AdapterError("no training items: check the recipe's tasks and the items given")
        self.longest = (
            max(len(ids) for ids, _ in self.train) - 1
        )  # positions of the longest batch row (inputs drop the last)

    def collate(self, rows: list[tuple[list[int], int]], device: str) -> Batch:
        n = max(len(ids) for ids, _ in rows) - 1
        lengths = {plen for _, plen in rows}
        inputs = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        targets = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        answer = torch.zeros(len(rows), n)
        real = torch.zeros(len(rows), n)
        for i, (ids, plen) in enumerate(rows):
            m = len(ids) - 1
            inputs[i, :m] = torch.tensor(ids[:-1])
            targets[i, :m] = torch.tensor(ids[1:])
            answer[i, plen - 1 : m] = 1
            real[i, :m] = 1
        prompt_length = lengths.pop() if len(lengths) == 1 else None
        return Batch(inputs.to(device), targets.to(device), answer.to(device), real.to(device), prompt_length)

    def batch(self, seed: int, step: int, size: int, device: str, one_prompt_length: bool = False) -> Batch:
        """The batch of `step`: a pure function of (seed, step), which is what makes resuming exact.

        `one_prompt_length` draws every row from the prompt-length group of one random item (so
        groups come up in proportion to their size), for MELT's decode-aligned chunks.
        """
        gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
        if not one_prompt_length:
            idx = torch.randint(len(self.train), (size,), generator=gen).tolist()
            return self.collate([self.train[i] for i in idx], device)
        group = self._by_prompt_length[self.train[int(torch.randint(len(self.train), (1,), generator=gen))][1]]
        idx = torch.randint(len(group), (size,), generator=gen).tolist()
        return self.collate([self.train[group[i]] for i in idx], device)

    @functools.cached_property
    def _by_prompt_length(self) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i, (_, plen) in enumerate(self.train):
            groups.setdefault(plen, []).append(i)
        return groups


@torch.no_grad()
def answer_accuracy(
    model: LoopedLM, data: TaskData, device: str, loops: int | None = None, batch_size: int = 200
) -> dict[str, float]:
    """Validation exact match per task: every answer token (and the stop) is the argmax.

    With teacher forcing this equals greedy decoding's exact match: if each next token is the
    argmax given the correct prefix, greedy decoding produces exactly the answer. Gated (MELT)
    models run with the chunks decoding uses (`Batch.decode_chunks`), rows grouped by prompt
    length, so the figure is their greedy decoding accuracy too.
    """
    model.eval()
    gated = model.config.gated
    accuracy = {}
    for task, rows in data.val.items():
        groups = [rows] if not gated else [[r for r in rows if r[1] == n] for n in sorted({r[1] for r in rows})]
        correct = 0
        for group in groups:
            for i in range(0, len(group), batch_size):
                b = data.collate(group[i : i + batch_size], device)
                chunks = b.decode_chunks(model.config.chunk_size) if gated else None
                pred = model(b.inputs, loops=loops, chunk_size=chunks).logits.argmax(-1)
                ok = ((pred == b.targets) | (b.answer_mask == 0)).all(dim=1)
                correct += int(ok.sum())
        accuracy[task] = correct / max(1, len(rows))
    model.train()
    accuracy["average"] = sum(accuracy.values()) / max(1, len(accuracy))
    return accuracy
