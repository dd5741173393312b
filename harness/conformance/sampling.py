"""The conformance checks of how an adapter samples: greedy decoding, seeds, top-p, the new-token budget, n, stop
strings and EOS, each against what `adapters.base.Sampling` promises."""

from __future__ import annotations

from collections.abc import Sequence

from adapters.base import Adapter, AdapterError, Generation, HookError, Prompt
from harness.conformance.probe import Failed, Probe, Skipped, expect


class SamplingChecks(Probe):
    """The sampling checks, in the order they run. `greedy_outputs` is what the greedy check generated, which top_p
    compares with."""

    def __init__(self, adapter: Adapter, prompts: Sequence[Prompt], max_new_tokens: int, logit_tolerance: float):
        super().__init__(adapter, prompts, max_new_tokens, logit_tolerance)
        self.greedy_outputs: list[Generation] = []  # set by the greedy check, compared with by top_p

    def greedy(self) -> None:
        first = self.gen(self.prompts, temperature=0, seed=1)
        again = self.gen(self.prompts, temperature=0, seed=2)
        for i, (x, y) in enumerate(zip(first, again)):
            expect(
                x.token_ids == y.token_ids,
                f"temperature 0 is not deterministic: prompt {i} gave {x.token_ids[:8]}... with seed 1 "
                f"and {y.token_ids[:8]}... with seed 2 (is temperature ignored?)",
            )
        alone = self.gen(self.prompts[-1:], temperature=0, seed=1)[0]
        expect(
            alone.token_ids == first[-1].token_ids,
            f"greedy output of prompt {len(self.prompts) - 1} depends on batching: {first[-1].token_ids[:8]} in a "
            f"batch, {alone.token_ids[:8]} alone",
        )
        for prompt, g in zip(self.prompts, first):
            self._first_token_is_argmax(prompt, g)
        self.greedy_outputs = first

    def _first_token_is_argmax(self, prompt: Prompt, g: Generation) -> None:
        """The first greedy token must be the argmax of forward_logits at the prompt's last position.

        Only the first token: later ones come from cached decoding, which for some looped models
        (MELT's chunk-wise prefill vs token-by-token decoding) legitimately differs from a full forward.
        """
        import torch

        ids = self.ids(prompt)
        if not g.token_ids:
            raise Failed(f"greedy generation of {len(ids)}-token prompt returned no tokens")
        try:
            logits = self.adapter.forward_logits(torch.tensor([ids]))
        except HookError:
            raise  # the plugin's forward_logits() failed in its own way: that fails the check
        except AdapterError:
            return  # an engine without full-sequence logits (vLLM); the seed checks still catch an ignored temperature
        expect(
            tuple(logits.shape[:2]) == (1, len(ids)),
            f"forward_logits([1, {len(ids)}]) returned shape {tuple(logits.shape)}",
        )
        row = logits[0, -1].float()
        best, token = float(row.max()), g.token_ids[0]
        expect(
            float(row[token]) >= best - self.tol * (1 + abs(best)),
            f"the first greedy token is {token} (logit {float(row[token]):.4f}) but forward_logits' argmax is "
            f"{int(row.argmax())} "
            f"(logit {best:.4f}): temperature 0 must pick the most likely token",
        )

    def seed(self) -> None:
        kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=self.max_new)
        a = self.gen(self.prompts, seed=11, **kw)
        b = self.gen(self.prompts, seed=11, **kw)
        for i, (x, y) in enumerate(zip(a, b)):
            expect(
                x.token_ids == y.token_ids,
                f"seed 11 does not reproduce at temperature 1: prompt {i} gave {x.token_ids[:8]}... then "
                f"{y.token_ids[:8]}...",
            )
        c = self.gen(self.prompts, seed=12, **kw)
        expect(
            [x.token_ids for x in a] != [x.token_ids for x in c],
            f"seeds 11 and 12 gave identical samples at temperature 1 over {sum(x.generated_tokens for x in a)} tokens "
            "(is the seed or the temperature ignored?)",
        )

    def top_p(self) -> None:
        tiny = self.gen(self.prompts, temperature=1.0, top_p=1e-6, seed=5)
        for i, (x, g) in enumerate(zip(tiny, self.greedy_outputs)):
            expect(
                x.token_ids == g.token_ids,
                f"top_p=1e-6 at temperature 1 must equal greedy (only the top token is in the nucleus): "
                f"prompt {i} gave {x.token_ids[:8]}..., greedy {g.token_ids[:8]}... (is top_p ignored?)",
            )

    def max_new_tokens(self) -> None:
        for limit in (1, 5):
            for i, g in enumerate(self.gen(self.prompts, temperature=1.0, top_p=1.0, seed=3, max_new_tokens=limit)):
                expect(
                    g.generated_tokens <= limit and len(g.token_ids) == g.generated_tokens,
                    f"max_new_tokens={limit}: prompt {i} has generated_tokens={g.generated_tokens}, "
                    f"{len(g.token_ids)} token_ids",
                )
                expect(
                    g.finish_reason != "length" or g.generated_tokens == limit,
                    f"max_new_tokens={limit}: prompt {i} finished 'length' after {g.generated_tokens} tokens",
                )
                expect(g.finish_reason in ("eos", "stop", "length"), f"unknown finish_reason {g.finish_reason!r}")

    def n_order(self) -> None:
        prompts = self.prompts[:2]
        out = self.gen(prompts, temperature=0, n=2)
        singles = [self.gen([p], temperature=0)[0] for p in prompts]
        for i in range(len(prompts)):
            for j in range(2):
                g = out[i * 2 + j]
                expect(
                    g.token_ids == singles[i].token_ids and g.prompt_tokens == singles[i].prompt_tokens,
                    f"n=2: generation {i * 2 + j} must be sample {j} of prompt {i} (prompt-major order), "
                    f"got prompt_tokens={g.prompt_tokens} tokens {g.token_ids[:6]}, expected "
                    f"{singles[i].prompt_tokens} {singles[i].token_ids[:6]}",
                )
        sampled = self.gen(prompts, temperature=1.0, top_p=1.0, n=3, seed=4)
        for k, g in enumerate(sampled):
            expect(
                g.prompt_tokens == singles[k // 3].prompt_tokens,
                f"n=3: generation {k} has prompt_tokens={g.prompt_tokens}, expected prompt {k // 3}'s "
                f"{singles[k // 3].prompt_tokens}",
            )

    def stop(self) -> None:
        if self.adapter.tokenizer is None:
            raise Skipped("the adapter has no tokenizer, so text stop strings do not apply")
        # A seeded sample (the seed check passed, so it reproduces) has varied text to cut; greedy text of a
        # random-weight model is often one repeated character.
        kw = dict(temperature=1.0, top_p=1.0, seed=7, n=4, max_new_tokens=max(self.max_new, 16))
        for index, base in enumerate(self.gen(self.prompts, **kw)):  # noqa: B007 (the index is read after the break)
            text = base.text or ""
            # a 2-character stop string whose first occurrence is inside the text, not at its start
            starts = [k for k in range(1, len(text) - 2) if text[k : k + 2].strip() and text.find(text[k : k + 2]) == k]
            if starts:
                break
        else:
            raise Skipped(f"none of {len(self.prompts) * 4} seeded samples had a usable 2-character stop string")
        start = starts[len(starts) // 2]
        stop = text[start : start + 2]
        s = self.gen(self.prompts, stop=(stop,), **kw)[index]
        expect(
            s.finish_reason == "stop",
            f"stop={stop!r} occurs at character {start} of the sampled text {text[: start + 8]!r}... "
            f"but the same sampling with that stop string finished {s.finish_reason!r} with text "
            f"{(s.text or '')[: start + 8]!r}",
        )
        got = s.text or ""
        expect(
            got in (text[:start], text[: start + len(stop)]),
            f"stop={stop!r}: text must end at (or just after) the stop string, i.e. {text[:start]!r}, got {got!r}",
        )
        expect(
            s.generated_tokens < base.generated_tokens,
            f"stop={stop!r}: generated {s.generated_tokens} tokens, as many as without it",
        )

    def eos(self) -> None:
        eos = self.eos_ids()
        if not eos:
            raise Skipped("the adapter names no EOS token (eos_token_id / tokenizer.eos_token_id)")
        seen = 0
        for seed in range(3):
            out = self.gen(self.prompts[:2], temperature=20.0, top_p=1.0, n=4, seed=100 + seed, max_new_tokens=32)
            for k, g in enumerate(out):
                inner = [pos for pos, t in enumerate(g.token_ids[:-1]) if t in eos]
                if inner:
                    raise Failed(
                        f"EOS {g.token_ids[inner[0]]} at position {inner[0]} of generation {k} was not honoured: it "
                        "went on "
                        f"to {g.generated_tokens} tokens (finish {g.finish_reason!r})"
                    )
                if (g.token_ids and g.token_ids[-1] in eos) or g.finish_reason == "eos":
                    expect(
                        g.finish_reason == "eos",
                        f"generation {k} ends with EOS {g.token_ids[-1]} but finish_reason is {g.finish_reason!r}",
                    )
                    seen += 1
            if seen:
                return
        raise Skipped(
            f"EOS {eos} never drawn in {3 * 8} samples of 32 tokens at temperature 20 (vocabulary too large to "
            "exercise it)"
        )
