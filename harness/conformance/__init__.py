"""The conformance kit: one call checks that an adapter behaves the way loopeval relies on.

It lives in the harness because its last check drives the adapter through the LightEval bridge
(docs/architecture.md: adapters never import harness or suites). This module runs the checks and reports;
`sampling.py` holds the checks of how the adapter samples, `contract.py` the rest, both on `probe.Probe`.

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
- bridge: LightEval drives the adapter end to end (`harness.bridge.evaluation.run_suite` on 2 synthetic docs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any
from collections.abc import Callable, Sequence

from adapters.base import Adapter, HookError, Prompt
from harness.conformance.contract import ContractChecks
from harness.conformance.probe import Failed, Skipped
from harness.conformance.sampling import SamplingChecks

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
        lines += [
            f"  [{r.status}] {r.name} ({r.seconds:.1f} s)" + (f": {r.message}" if r.message else "")
            for r in self.results
        ]
        return "\n".join(lines)


CHECKS: tuple[str, ...] = (
    "protocol",
    "greedy",
    "seed",
    "top_p",
    "max_new_tokens",
    "n_order",
    "stop",
    "eos",
    "memory",
    "errors",
    "bridge",
)
# top_p compares with the greedy outputs; stop replays a seeded sample
_NEEDS_GREEDY = ("top_p",)
# the checks of `SamplingChecks` (harness/conformance/sampling.py); the others are `ContractChecks`'
_SAMPLING_CHECKS = ("greedy", "seed", "top_p", "max_new_tokens", "n_order", "stop", "eos")


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
    args = (adapter, prompts or DEFAULT_PROMPTS, max_new_tokens, logit_tolerance)
    sampling, contract = SamplingChecks(*args), ContractChecks(*args)
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
            getattr(sampling if name in _SAMPLING_CHECKS else contract, name)()
        except Failed as exc:
            result = CheckResult(name, "fail", str(exc))
        except Skipped as exc:
            result = CheckResult(name, "skip", str(exc))
        except HookError as exc:  # a plugin's hook failed (its sys.exit() included): the line names the hook
            result = CheckResult(name, "fail", str(exc))
        except Exception as exc:  # an adapter crashing inside a check is a failure of that check, not of the kit
            result = CheckResult(
                name, "fail", f"raised {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            )
        else:
            result = CheckResult(name, "pass")
        result.seconds = time.perf_counter() - start
        report.results.append(result)
    if strict and not report.ok:
        raise ConformanceError(str(report))
    return report
