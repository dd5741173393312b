"""The conformance kit: one call checks that an adapter behaves the way loopeval relies on.

It lives in the harness because its last check drives the adapter through the LightEval bridge
(docs/architecture.md: adapters never import harness or suites).

    from harness.conformance import check_adapter
    check_adapter("myarch:tiny")              # raises ConformanceError listing every failure
    report = check_adapter(adapter, strict=False); print(report)

Built-ins and plugins are held to the same rules. Each check is small (a few prompts, at most 64
new tokens), so the kit runs in seconds on a tiny model; every failure names the check, what was
asked, and what came back. The checks:

- protocol: `spec`, `tokenizer`, `max_context`, and the four methods exist;
- greedy: temperature 0 gives the same tokens for different seeds and batchings, and the first
  greedy token of each prompt is the argmax of `forward_logits` (catches an adapter that ignores
  temperature or samples from the wrong logits);
- seed: a seed reproduces at temperature 1; two seeds differ (given enough tokens to tell);
- top_p: a tiny top-p at temperature 1 equals greedy (only the top token is in the nucleus);
- max_new_tokens: never exceeded; "length" means exactly max_new_tokens were generated;
- n: `len(prompts) * n` generations in prompt-major order (sample j of prompt i at i * n + j);
- stop: a stop string taken from a seeded sample ends the same sample there, with reason "stop";
- eos: EOS ends a sequence with reason "eos" and nothing follows it (exercised by sampling at a
  high temperature where the vocabulary is small enough to draw EOS; otherwise reported skipped);
- memory: every MEMORY_KEYS measure is present, weights_bytes matches the parameter bytes where
  the adapter exposes them (a `model` attribute, or `describe()` params x dtype), used <= allocated
  <= peak, allocated <= reserved where the adapter reports `kv_bytes_reserved` (optional), and the
  KV measures grow after a generation;
- errors: an empty prompt and a prompt longer than `max_context` raise AdapterError with a message;
- bridge: LightEval drives the adapter end to end (`harness.evaluation.run_suite` on 2 synthetic docs).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from adapters.base import DTYPE_BYTES, Adapter, AdapterError, Generation, Prompt, Sampling, dtype_short
from measures import MEMORY_KEYS

DEFAULT_PROMPTS: tuple[str, ...] = ("The answer is", "1+1=", "abc")


class ConformanceError(AssertionError):
    """An adapter broke the contract; the message lists every failed check."""


@dataclass
class CheckResult:
    name: str
    status: str  # "pass", "fail" or "skip"
    message: str = ""
    seconds: float = 0.0


@dataclass
class ConformanceReport:
    spec: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == "fail"]

    def status(self, name: str) -> str:
        return next(r.status for r in self.results if r.name == name)

    def __str__(self) -> str:
        lines = [f"conformance of {self.spec}: {'PASS' if self.ok else f'{len(self.failures)} FAILED'}"]
        lines += [f"  [{r.status}] {r.name} ({r.seconds:.1f} s)" + (f": {r.message}" if r.message else "") for r in self.results]
        return "\n".join(lines)


class _Failed(Exception):
    """Raised inside a check with the precise reason."""


class _Skipped(Exception):
    """Raised inside a check that cannot apply to this adapter, with the reason."""


def _expect(condition: bool, message: str) -> None:
    if not condition:
        raise _Failed(message)


class _Kit:
    def __init__(self, adapter: Adapter, prompts: Sequence[Prompt], max_new_tokens: int, logit_tolerance: float):
        self.adapter = adapter
        self.prompts = list(prompts)
        self.max_new = max_new_tokens
        self.tol = logit_tolerance
        self.greedy_outputs: list[Generation] = []  # set by the greedy check, compared with by top_p

    def gen(self, prompts: Sequence[Prompt], **sampling: Any) -> list[Generation]:
        sampling.setdefault("max_new_tokens", self.max_new)
        s = Sampling(**sampling)
        out = self.adapter.generate(list(prompts), s)
        _expect(isinstance(out, list) and len(out) == len(prompts) * s.n,
                f"generate({len(prompts)} prompts, n={s.n}) returned {len(out) if isinstance(out, list) else type(out).__name__} "
                f"generations, expected {len(prompts) * s.n}")
        return out

    # --- checks, in the order they run -------------------------------------------------------------

    def protocol(self) -> None:
        a = self.adapter
        missing = [m for m in ("spec", "tokenizer", "max_context", "forward_logits", "generate", "memory", "describe") if not hasattr(a, m)]
        _expect(not missing, f"missing attributes: {', '.join(missing)}")
        _expect(isinstance(a.max_context, int) and a.max_context > 1, f"max_context must be an int > 1, got {a.max_context!r}")
        _expect(isinstance(a.describe(), dict), "describe() must return a dict")
        if a.tokenizer is None:
            _expect(all(not isinstance(p, str) for p in self.prompts), "adapter has no tokenizer: pass prompts as token-id lists")

    def greedy(self) -> None:
        first = self.gen(self.prompts, temperature=0, seed=1)
        again = self.gen(self.prompts, temperature=0, seed=2)
        for i, (x, y) in enumerate(zip(first, again)):
            _expect(x.token_ids == y.token_ids, f"temperature 0 is not deterministic: prompt {i} gave {x.token_ids[:8]}... with seed 1 "
                    f"and {y.token_ids[:8]}... with seed 2 (is temperature ignored?)")
        alone = self.gen(self.prompts[-1:], temperature=0, seed=1)[0]
        _expect(alone.token_ids == first[-1].token_ids,
                f"greedy output of prompt {len(self.prompts) - 1} depends on batching: {first[-1].token_ids[:8]} in a batch, {alone.token_ids[:8]} alone")
        for prompt, g in zip(self.prompts, first):
            self._first_token_is_argmax(prompt, g)
        self.greedy_outputs = first

    def _first_token_is_argmax(self, prompt: Prompt, g: Generation) -> None:
        """The first greedy token must be the argmax of forward_logits at the prompt's last position.

        Only the first token: later ones come from cached decoding, which for some looped models
        (MELT's chunk-wise prefill vs token-by-token decoding) legitimately differs from a full forward.
        """
        import torch

        ids = self._ids(prompt)
        if not g.token_ids:
            raise _Failed(f"greedy generation of {len(ids)}-token prompt returned no tokens")
        try:
            logits = self.adapter.forward_logits(torch.tensor([ids]))
        except AdapterError:
            return  # an engine without full-sequence logits (vLLM); the seed checks still catch an ignored temperature
        _expect(tuple(logits.shape[:2]) == (1, len(ids)), f"forward_logits([1, {len(ids)}]) returned shape {tuple(logits.shape)}")
        row = logits[0, -1].float()
        best, token = float(row.max()), g.token_ids[0]
        _expect(float(row[token]) >= best - self.tol * (1 + abs(best)),
                f"the first greedy token is {token} (logit {float(row[token]):.4f}) but forward_logits' argmax is {int(row.argmax())} "
                f"(logit {best:.4f}): temperature 0 must pick the most likely token")

    def seed(self) -> None:
        kw = dict(temperature=1.0, top_p=1.0, max_new_tokens=self.max_new)
        a = self.gen(self.prompts, seed=11, **kw)
        b = self.gen(self.prompts, seed=11, **kw)
        for i, (x, y) in enumerate(zip(a, b)):
            _expect(x.token_ids == y.token_ids, f"seed 11 does not reproduce at temperature 1: prompt {i} gave {x.token_ids[:8]}... then {y.token_ids[:8]}...")
        c = self.gen(self.prompts, seed=12, **kw)
        _expect([x.token_ids for x in a] != [x.token_ids for x in c],
                f"seeds 11 and 12 gave identical samples at temperature 1 over {sum(x.generated_tokens for x in a)} tokens "
                "(is the seed or the temperature ignored?)")

    def top_p(self) -> None:
        tiny = self.gen(self.prompts, temperature=1.0, top_p=1e-6, seed=5)
        for i, (x, g) in enumerate(zip(tiny, self.greedy_outputs)):
            _expect(x.token_ids == g.token_ids, f"top_p=1e-6 at temperature 1 must equal greedy (only the top token is in the nucleus): "
                    f"prompt {i} gave {x.token_ids[:8]}..., greedy {g.token_ids[:8]}... (is top_p ignored?)")

    def max_new_tokens(self) -> None:
        for limit in (1, 5):
            for i, g in enumerate(self.gen(self.prompts, temperature=1.0, top_p=1.0, seed=3, max_new_tokens=limit)):
                _expect(g.generated_tokens <= limit and len(g.token_ids) == g.generated_tokens,
                        f"max_new_tokens={limit}: prompt {i} has generated_tokens={g.generated_tokens}, {len(g.token_ids)} token_ids")
                _expect(g.finish_reason != "length" or g.generated_tokens == limit,
                        f"max_new_tokens={limit}: prompt {i} finished 'length' after {g.generated_tokens} tokens")
                _expect(g.finish_reason in ("eos", "stop", "length"), f"unknown finish_reason {g.finish_reason!r}")

    def n_order(self) -> None:
        prompts = self.prompts[:2]
        out = self.gen(prompts, temperature=0, n=2)
        singles = [self.gen([p], temperature=0)[0] for p in prompts]
        for i in range(len(prompts)):
            for j in range(2):
                g = out[i * 2 + j]
                _expect(g.token_ids == singles[i].token_ids and g.prompt_tokens == singles[i].prompt_tokens,
                        f"n=2: generation {i * 2 + j} must be sample {j} of prompt {i} (prompt-major order), "
                        f"got prompt_tokens={g.prompt_tokens} tokens {g.token_ids[:6]}, expected {singles[i].prompt_tokens} {singles[i].token_ids[:6]}")
        sampled = self.gen(prompts, temperature=1.0, top_p=1.0, n=3, seed=4)
        for k, g in enumerate(sampled):
            _expect(g.prompt_tokens == singles[k // 3].prompt_tokens,
                    f"n=3: generation {k} has prompt_tokens={g.prompt_tokens}, expected prompt {k // 3}'s {singles[k // 3].prompt_tokens}")

    def stop(self) -> None:
        if self.adapter.tokenizer is None:
            raise _Skipped("the adapter has no tokenizer, so text stop strings do not apply")
        # A seeded sample (the seed check passed, so it reproduces) has varied text to cut; greedy text of a
        # random-weight model is often one repeated character.
        kw = dict(temperature=1.0, top_p=1.0, seed=7, n=4, max_new_tokens=max(self.max_new, 16))
        for index, base in enumerate(self.gen(self.prompts, **kw)):  # noqa: B007 (the index is read after the break)
            text = base.text or ""
            # a 2-character stop string whose first occurrence is inside the text, not at its start
            starts = [k for k in range(1, len(text) - 2) if text[k:k + 2].strip() and text.find(text[k:k + 2]) == k]
            if starts:
                break
        else:
            raise _Skipped(f"none of {len(self.prompts) * 4} seeded samples had a usable 2-character stop string")
        start = starts[len(starts) // 2]
        stop = text[start:start + 2]
        s = self.gen(self.prompts, stop=(stop,), **kw)[index]
        _expect(s.finish_reason == "stop", f"stop={stop!r} occurs at character {start} of the sampled text {text[:start + 8]!r}... "
                f"but the same sampling with that stop string finished {s.finish_reason!r} with text {(s.text or '')[:start + 8]!r}")
        got = s.text or ""
        _expect(got in (text[:start], text[:start + len(stop)]),
                f"stop={stop!r}: text must end at (or just after) the stop string, i.e. {text[:start]!r}, got {got!r}")
        _expect(s.generated_tokens < base.generated_tokens, f"stop={stop!r}: generated {s.generated_tokens} tokens, as many as without it")

    def eos(self) -> None:
        eos = self._eos_ids()
        if not eos:
            raise _Skipped("the adapter names no EOS token (eos_token_id / tokenizer.eos_token_id)")
        seen = 0
        for seed in range(3):
            out = self.gen(self.prompts[:2], temperature=20.0, top_p=1.0, n=4, seed=100 + seed, max_new_tokens=32)
            for k, g in enumerate(out):
                inner = [pos for pos, t in enumerate(g.token_ids[:-1]) if t in eos]
                if inner:
                    raise _Failed(f"EOS {g.token_ids[inner[0]]} at position {inner[0]} of generation {k} was not honoured: it went on "
                                  f"to {g.generated_tokens} tokens (finish {g.finish_reason!r})")
                if (g.token_ids and g.token_ids[-1] in eos) or g.finish_reason == "eos":
                    _expect(g.finish_reason == "eos", f"generation {k} ends with EOS {g.token_ids[-1]} but finish_reason is {g.finish_reason!r}")
                    seen += 1
            if seen:
                return
        raise _Skipped(f"EOS {eos} never drawn in {3 * 8} samples of 32 tokens at temperature 20 (vocabulary too large to exercise it)")

    def memory(self) -> None:
        problems: list[str] = []
        before = self._memory("before generating", problems)
        if isinstance(before["weights_bytes"], int) and before["weights_bytes"] > 0:
            self._expected_weights(before["weights_bytes"], problems)
        self.gen(self.prompts[:1], temperature=0, max_new_tokens=2)
        short = self._memory("after 2 new tokens", problems)
        self.gen(self.prompts[:1], temperature=0, max_new_tokens=self.max_new)
        long = self._memory(f"after {self.max_new} new tokens", problems)
        if long["kv_bytes_peak"] in (None, 0):
            problems.append(f"kv_bytes_peak is {long['kv_bytes_peak']} after a generation: KV did not grow")
        for earlier, when in ((short, "2"), (before, "0")):
            if earlier["kv_bytes_peak"] is not None and (long["kv_bytes_peak"] or 0) < earlier["kv_bytes_peak"]:
                problems.append(f"kv_bytes_peak fell from {earlier['kv_bytes_peak']} (after {when} new tokens) to {long['kv_bytes_peak']}: a peak never decreases")
        _expect(not problems, "; ".join(dict.fromkeys(problems)))

    def _memory(self, when: str, problems: list[str]) -> dict[str, int | None]:
        m = self.adapter.memory()
        missing = [k for k in MEMORY_KEYS if k not in m]
        _expect(not missing, f"memory() {when} lacks {', '.join(missing)} (required: {', '.join(MEMORY_KEYS)})")
        for k in MEMORY_KEYS:
            if not (m[k] is None or (isinstance(m[k], int) and m[k] >= 0)):
                problems.append(f"memory()[{k!r}] {when} must be bytes (int >= 0) or None, got {m[k]!r}")
                m[k] = None
        if not (isinstance(m["weights_bytes"], int) and m["weights_bytes"] > 0):
            problems.append(f"memory()['weights_bytes'] {when} is {m['weights_bytes']!r}: must be > 0")
        used, alloc, peak = m["kv_bytes_used"], m["kv_bytes_allocated"], m["kv_bytes_peak"]
        if used is not None and alloc is not None and used > alloc:
            problems.append(f"memory() {when}: kv_bytes_used={used} exceeds kv_bytes_allocated={alloc}")
        if peak is not None and alloc is not None and alloc > peak:
            problems.append(f"memory() {when}: kv_bytes_allocated={alloc} exceeds kv_bytes_peak={peak}")
        reserved = m.get("kv_bytes_reserved")  # optional: the KV store reserved now (the engine's pool)
        if isinstance(reserved, int) and isinstance(alloc, int) and alloc > reserved:
            problems.append(f"memory() {when}: kv_bytes_allocated={alloc} exceeds kv_bytes_reserved={reserved}")
        return m

    def _expected_weights(self, weights: int, problems: list[str]) -> None:
        import torch

        model = getattr(self.adapter, "model", None)
        if isinstance(model, torch.nn.Module):
            expected = sum(p.numel() * p.element_size() for p in model.parameters())
            how = "its model's parameters hold"
        else:
            d = self.adapter.describe()
            try:
                size = DTYPE_BYTES[dtype_short(d.get("dtype"))]
            except AdapterError:
                return
            if not isinstance(d.get("params"), int):
                return
            expected, how = d["params"] * size, f"describe() gives params={d['params']} x {d['dtype']}"
        if abs(weights - expected) > 0.01 * expected:
            problems.append(f"memory()['weights_bytes']={weights} but {how} {expected} bytes")

    def errors(self) -> None:
        problems = []
        for what, prompt in (("an empty prompt", "" if self.adapter.tokenizer is not None else []),
                             (f"a prompt of {self.adapter.max_context + 1} tokens (max_context {self.adapter.max_context})",
                              [self._ids(self.prompts[0])[0]] * (self.adapter.max_context + 1))):
            try:
                self.adapter.generate([prompt], Sampling(temperature=0, max_new_tokens=2))
            except AdapterError as exc:
                if not str(exc).strip() or "\n" in str(exc).strip():
                    problems.append(f"{what}: AdapterError must carry a one-line message, got {str(exc)!r}")
            except Exception as exc:
                problems.append(f"{what} raised {type(exc).__name__}: {str(exc)[:120]}; it must raise AdapterError with a clear message")
            else:
                problems.append(f"{what} was accepted; it must raise AdapterError with a clear message")
        _expect(not problems, "; ".join(problems))

    def bridge(self) -> None:
        try:  # lazy: the other checks run where lighteval is not installed (the GPU machine)
            from harness.evaluation import run_suite
            from suites.registry import load_suite
        except ImportError as exc:
            raise _Skipped(f"the LightEval bridge is not importable here ({exc})") from exc
        task = load_suite("synthetic")[0]
        quiet = logging.getLogger("lighteval")
        level, quiet.level = quiet.level, logging.ERROR  # LightEval warns that limited runs are partial; 2 docs are meant
        try:
            result = run_suite(self.adapter, [task], Sampling(temperature=0, max_new_tokens=8), limit=2, batch_size=2, progress=False)
        finally:
            quiet.setLevel(level)
        name = next(iter(result.n_docs), task.name)
        _expect(sum(result.n_docs.values()) == 2, f"the bridge ran task {task.name} with limit 2 but LightEval saw {result.n_docs} docs")
        _expect(len(result.scores) == 2 and all(v in (0.0, 1.0) for v in result.scores.values()),
                f"the bridge scored {len(result.scores)} samples of {name} ({result.scores}); expected 2 scores of 0 or 1")
        _expect("all" in result.metrics, f"the bridge returned no suite average: metrics {sorted(result.metrics)}")

    # --- helpers --------------------------------------------------------------------------------

    def _ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.adapter.tokenizer.encode(prompt))
        return list(prompt)

    def _eos_ids(self) -> list[int]:
        ids = getattr(self.adapter, "eos_token_ids", None) or getattr(self.adapter, "eos_token_id", None)
        if ids is None and self.adapter.tokenizer is not None:
            ids = self.adapter.tokenizer.eos_token_id
        return [ids] if isinstance(ids, int) else list(ids or [])


CHECKS: tuple[str, ...] = ("protocol", "greedy", "seed", "top_p", "max_new_tokens", "n_order", "stop", "eos", "memory", "errors", "bridge")
# top_p compares with the greedy outputs; stop replays a seeded sample
_NEEDS_GREEDY = ("top_p",)


def check_adapter(
    adapter_or_spec: Adapter | str,
    *,
    prompts: Sequence[Prompt] | None = None,
    bridge: bool = True,
    strict: bool = True,
    max_new_tokens: int = 12,
    logit_tolerance: float = 1e-3,
    progress: Callable[[str], None] | None = None,
    **overrides: Any,
) -> ConformanceReport:
    """Run every check on an adapter (or a spec, loaded with `overrides`) and return the report.

    `strict=True` raises ConformanceError listing every failure; `bridge=False` skips the LightEval
    check (it needs lighteval and the synthetic suite). `logit_tolerance` is relative: bf16 models
    on a GPU may need 1e-2, since cached decoding and a full forward differ in rounding.
    """
    from adapters.registry import load

    adapter = load(adapter_or_spec, **overrides) if isinstance(adapter_or_spec, str) else adapter_or_spec
    kit = _Kit(adapter, prompts or DEFAULT_PROMPTS, max_new_tokens, logit_tolerance)
    report = ConformanceReport(str(getattr(adapter, "spec", adapter_or_spec)))
    for name in CHECKS:
        if progress is not None:
            progress(name)
        if name == "bridge" and not bridge:
            report.results.append(CheckResult(name, "skip", "bridge=False"))
            continue
        if name in _NEEDS_GREEDY and report.status("greedy") != "pass":
            report.results.append(CheckResult(name, "skip", "needs the greedy check to pass"))
            continue
        if name == "stop" and report.status("seed") != "pass":
            report.results.append(CheckResult(name, "skip", "needs the seed check to pass"))
            continue
        start = time.perf_counter()
        try:
            getattr(kit, name)()
        except _Failed as exc:
            result = CheckResult(name, "fail", str(exc))
        except _Skipped as exc:
            result = CheckResult(name, "skip", str(exc))
        except Exception as exc:  # an adapter crashing inside a check is a failure of that check, not of the kit
            result = CheckResult(name, "fail", f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        else:
            result = CheckResult(name, "pass")
        result.seconds = time.perf_counter() - start
        report.results.append(result)
    if strict and not report.ok:
        raise ConformanceError(str(report))
    return report
