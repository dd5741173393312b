"""A `Sequence`: one sample of one request as the continuous engine tracks it, from the queue to retirement."""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.base import FinishReason, Sampling


@dataclass(eq=False, slots=True)
class Sequence:
    """One sample of one request: its tokens (prompt, then generated), its blocks and how far they are written."""

    request: int  # index of its request in the workload
    sample: int  # sample index within the request
    key: int  # its random stream (`stream_key(request seed, sample)`)
    prompt_len: int
    tokens: list[int]
    capacity: int  # prompt + new tokens it may reach (within the context)
    sampling: Sampling
    prompt_key: int = (
        0  # the stream its prompt tokens draw from (`streams.prompt_key(request seed)`), its prompt's samples' too
    )
    blocks: list[int] = field(default_factory=list)  # its block table
    written: int = 0  # tokens whose K/V the blocks hold
    order: int = -1  # admission order: the largest is the youngest, preempted first
    loops: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    prefill_seconds: float = 0.0
    decode_began: float = 0.0

    @property
    def fresh(self) -> bool:
        """Nothing generated yet: a first admission, which may share its prompt's prefill with its siblings."""
        return len(self.tokens) == self.prompt_len

    @property
    def replaying(self) -> bool:
        """Its next token is one it decoded before a preemption: fed back, not sampled."""
        return self.written < len(self.tokens)

    def draw_key(self, position: int) -> int:
        """The stream the draws of its token at `position` come from: its prompt's for a prompt token, its own after."""
        return self.prompt_key if position < self.prompt_len else self.key


def setting(sampling: Sampling) -> tuple[float, float, int | None]:
    """What one `sample` call must share: sequences with other settings are drawn in calls of their own."""
    return sampling.temperature, sampling.top_p, sampling.top_k
