"""The conformance checks of the rest of the contract: the protocol's attributes, the memory accounting, the
errors a bad prompt raises, and LightEval driving the adapter through the bridge."""

from __future__ import annotations

import logging

from adapters.base import DTYPE_BYTES, AdapterError, HookError, Prompt, Sampling, dtype_short
from harness.conformance.probe import Probe, Skipped, expect
from measures import MEMORY_KEYS


class ContractChecks(Probe):
    """The contract checks, in the order they run."""

    def protocol(self) -> None:
        a = self.adapter
        missing = [
            m
            for m in ("spec", "tokenizer", "max_context", "forward_logits", "generate", "memory", "describe")
            if not hasattr(a, m)
        ]
        expect(not missing, f"missing attributes: {', '.join(missing)}")
        expect(
            isinstance(a.max_context, int) and a.max_context > 1,
            f"max_context must be an int > 1, got {a.max_context!r}",
        )
        expect(isinstance(a.describe(), dict), "describe() must return a dict")
        if a.tokenizer is None:
            expect(
                all(not isinstance(p, str) for p in self.prompts),
                "adapter has no tokenizer: pass prompts as token-id lists",
            )

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
            peak = earlier["kv_bytes_peak"]
            if peak is not None and (long["kv_bytes_peak"] or 0) < peak:
                problems.append(
                    f"kv_bytes_peak fell from {peak} (after {when} new tokens) to {long['kv_bytes_peak']}: a peak "
                    "never decreases"
                )
        expect(not problems, "; ".join(dict.fromkeys(problems)))

    def _memory(self, when: str, problems: list[str]) -> dict[str, int | None]:
        m = self.adapter.memory()
        missing = [k for k in MEMORY_KEYS if k not in m]
        expect(not missing, f"memory() {when} lacks {', '.join(missing)} (required: {', '.join(MEMORY_KEYS)})")
        for k in MEMORY_KEYS:
            value = m[k]
            if not (value is None or (isinstance(value, int) and value >= 0)):
                problems.append(f"memory()[{k!r}] {when} must be bytes (int >= 0) or None, got {value!r}")
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
        empty: Prompt = "" if self.adapter.tokenizer is not None else []
        for what, prompt in (
            ("an empty prompt", empty),
            (
                f"a prompt of {self.adapter.max_context + 1} tokens (max_context {self.adapter.max_context})",
                [self.ids(self.prompts[0])[0]] * (self.adapter.max_context + 1),
            ),
        ):
            try:
                self.adapter.generate([prompt], Sampling(temperature=0, max_new_tokens=2))
            except HookError as exc:  # a plugin's generate() failed in its own way, not with AdapterError
                problems.append(f"{what}: {exc}; it must raise AdapterError with a clear message")
            except AdapterError as exc:
                if not str(exc).strip() or "\n" in str(exc).strip():
                    problems.append(f"{what}: AdapterError must carry a one-line message, got {str(exc)!r}")
            except Exception as exc:
                problems.append(
                    f"{what} raised {type(exc).__name__}: {str(exc)[:120]}; it must raise AdapterError with a clear "
                    "message"
                )
            else:
                problems.append(f"{what} was accepted; it must raise AdapterError with a clear message")
        expect(not problems, "; ".join(problems))

    def bridge(self) -> None:
        try:  # lazy: the other checks run where lighteval is not installed (the GPU machine)
            from harness.bridge.evaluation import run_suite
            from suites.registry import load_suite
        except ImportError as exc:
            raise Skipped(f"the LightEval bridge is not importable here ({exc})") from exc
        task = load_suite("synthetic")[0]
        quiet = logging.getLogger("lighteval")
        level, quiet.level = (
            quiet.level,
            logging.ERROR,
        )  # LightEval warns that limited runs are partial; 2 docs are meant
        try:
            result = run_suite(
                self.adapter, [task], Sampling(temperature=0, max_new_tokens=8), limit=2, batch_size=2, progress=False
            )
        finally:
            quiet.setLevel(level)
        name = next(iter(result.n_docs), task.name)
        expect(
            sum(result.n_docs.values()) == 2,
            f"the bridge ran task {task.name} with limit 2 but LightEval saw {result.n_docs} docs",
        )
        expect(
            len(result.scores) == 2 and all(v in (0.0, 1.0) for v in result.scores.values()),
            f"the bridge scored {len(result.scores)} samples of {name} ({result.scores}); expected 2 scores of 0 or 1",
        )
        expect("all" in result.metrics, f"the bridge returned no suite average: metrics {sorted(result.metrics)}")
