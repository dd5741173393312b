"""Post-processing of each step's sampled tokens: record them, apply the stops, retire finished sequences."""

from __future__ import annotations

import time
from typing import Any
from collections.abc import Callable

from adapters.base import Finished, FinishReason, Generation
from adapters.engine.sampling import output_text, stop_reason
from adapters.engine.serving.scheduler import Scheduler
from adapters.engine.serving.sequence import Sequence


class Postprocessor:
    """Appends each sequence's new token and exit loop, and reports the sequences a stop ends as `Generation`s."""

    def __init__(
        self,
        scheduler: Scheduler,
        *,
        loops: int,
        looped: bool,
        eos_ids: set[int],
        tokenizer: Any | None,
        on_finished: Callable[[list[Finished]], None],
    ) -> None:
        self.scheduler, self.loops, self.looped = scheduler, loops, looped
        self.eos_ids, self.tokenizer, self.on_finished = eos_ids, tokenizer, on_finished

    def record(self, seqs: list[Sequence], ids: list[int], exit_loops: list[int] | None) -> None:
        """`ids[i]` is `seqs[i]`'s next token, drawn at loop `exit_loops[i]` (the last loop when None)."""
        loops = [self.loops] * len(seqs) if exit_loops is None else exit_loops
        done: list[Finished] = []
        for seq, token, loop in zip(seqs, ids, loops):
            seq.tokens.append(token)
            seq.loops.append(loop)
            finish = stop_reason(seq.tokens, self.eos_ids, seq.sampling, self.tokenizer, start=seq.prompt_len)
            if finish is None and len(seq.tokens) >= seq.capacity:  # its new tokens or the context used up
                finish = "length"
            seq.finish = finish
            if finish is not None:
                done.append((seq.request, seq.sample, self._retire(seq, finish)))
        if done:
            self.on_finished(done)

    def _retire(self, seq: Sequence, finish: FinishReason) -> Generation:
        self.scheduler.finish(seq)
        ids = seq.tokens[seq.prompt_len :]
        return Generation(
            token_ids=ids,
            text=output_text(ids, finish, seq.sampling, self.tokenizer),
            finish_reason=finish,
            prompt_tokens=seq.prompt_len,
            generated_tokens=len(ids),
            loops_used=seq.loops if self.looped else None,
            prefill_seconds=seq.prefill_seconds,
            decode_seconds=time.perf_counter() - seq.decode_began,
        )
