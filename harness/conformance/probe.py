"""What every conformance check stands on: the adapter under test called with small samplings, and the outcomes a
check ends in (`Failed` with the precise reason, `Skipped` where it cannot apply)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from adapters.base import Adapter, Generation, Prompt, Sampling


class Failed(Exception):
    """Raised inside a check with the precise reason."""


class Skipped(Exception):
    """Raised inside a check that cannot apply to this adapter, with the reason."""


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise Failed(message)


class Probe:
    """The adapter under test, the prompts every check asks with, the new-token budget and the relative logit
    tolerance of the argmax check."""

    def __init__(self, adapter: Adapter, prompts: Sequence[Prompt], max_new_tokens: int, logit_tolerance: float):
        self.adapter = adapter
        self.prompts = list(prompts)
        self.max_new = max_new_tokens
        self.tol = logit_tolerance

    def gen(self, prompts: Sequence[Prompt], **sampling: Any) -> list[Generation]:
        """`adapter.generate` with a `Sampling` of these fields (the kit's budget unless given); fails unless it
        returns one generation per prompt and sample."""
        sampling.setdefault("max_new_tokens", self.max_new)
        s = Sampling(**sampling)
        out = self.adapter.generate(list(prompts), s)
        expect(
            isinstance(out, list) and len(out) == len(prompts) * s.n,
            f"generate({len(prompts)} prompts, n={s.n}) returned "
            f"{len(out) if isinstance(out, list) else type(out).__name__} "
            f"generations, expected {len(prompts) * s.n}",
        )
        return out

    def ids(self, prompt: Prompt) -> list[int]:
        if not isinstance(prompt, str):
            return list(prompt)
        if self.adapter.tokenizer is None:
            raise Failed(f"prompt {prompt!r} is text but the adapter has no tokenizer: pass prompts as token-id lists")
        return list(self.adapter.tokenizer.encode(prompt))

    def eos_ids(self) -> list[int]:
        ids = getattr(self.adapter, "eos_token_ids", None) or getattr(self.adapter, "eos_token_id", None)
        if ids is None and self.adapter.tokenizer is not None:
            ids = self.adapter.tokenizer.eos_token_id
        return [ids] if isinstance(ids, int) else list(ids or [])
