"""The contract between loopeval and a model: `Sampling` in, `Generation` out, `Adapter` in between.

Everything in the harness (LightEval bridge, memory sampler, runner) talks to models only through
this file, so a user's adapter that satisfies `Adapter` gets the same treatment as the built-ins.
"""

from __future__ import annotations

import math
import signal
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, runtime_checkable
from collections.abc import Callable, Iterator, Sequence

from measures import DESCRIBED, leaf_problem

if TYPE_CHECKING:
    import torch

# Dtypes by the short names users type, with their sizes; `MODEL_DTYPES` are those a model runs in
# (short name -> torch's name). `_DTYPE_SPELLINGS` maps what configs and libraries write for the same
# types (torch names, safetensors' "BF16", vLLM's "half"), so every backend accepts the same names.
DTYPE_BYTES: dict[str, int] = {
    "fp64": 8,
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "bool": 1,
}
MODEL_DTYPES: dict[str, str] = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
_DTYPE_SPELLINGS: dict[str, str] = {
    "float64": "fp64",
    "float32": "fp32",
    "float": "fp32",
    "f32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "f16": "fp16",
    "fp8_e4m3": "fp8",
    "fp8_e5m2": "fp8",
    "f8_e4m3": "fp8",
    "f8_e5m2": "fp8",
    "f64": "fp64",
    "i64": "int64",
    "i32": "int32",
    "i16": "int16",
    "i8": "int8",
    "u8": "int8",
    "uint8": "int8",
}

MAX_CONTEXT = 1 << 24  # tokens: beyond any released model's context (16.7M); a larger one is a typo or a hostile config
FinishReason = Literal["eos", "stop", "length"]
FINISH_REASONS: tuple[str, ...] = ("eos", "stop", "length")
# How a looped model decides, per generated token, to stop looping early (the `exit_criterion` override; `exit_threshold`
# sets its level): Ouro's learned exit gate (cumulative exit probability reaching the threshold), or the model-free
# tests Huginn uses between consecutive loops' next-token distributions (KL divergence, entropy change below it).
EXIT_CRITERIA: tuple[str, ...] = ("gate", "kl", "entropy")
Prompt = str | Sequence[int]


class AdapterError(ValueError):
    """A problem the user can fix (bad spec, unreadable checkpoint, prompt too long...).

    The CLI prints its message as one line and exits with code 2.
    """


def check_exit_threshold(threshold: Any, criterion: str, name: str = "exit_threshold") -> None:
    """The one range of an exit threshold: a gate threshold is a cumulative probability in [0, 1] (1: no exit, 0: every
    token stops at loop 1); kl and entropy thresholds are finite numbers >= 0. `name` is the setting refused (the
    engine's override, or the flag a user typed)."""
    number = type(threshold) in (int, float) and math.isfinite(threshold)  # NaN and inf too
    if criterion == "gate" and not (number and 0 <= threshold <= 1):
        raise AdapterError(f"{name} must be a number in [0, 1] for the gate criterion, got {threshold!r}")
    if criterion != "gate" and not (number and threshold >= 0):
        raise AdapterError(f"{name} must be a finite number >= 0 for the {criterion} criterion, got {threshold!r}")


class HookError(AdapterError):
    """An adapter's hook raised something other than AdapterError (`hook`): its own failure, where AdapterError is
    its word to the user. The conformance kit tells the two apart; everything else treats both as one line."""


def dtype_short(name: Any, model: bool = False) -> str:
    """The short name (fp32, bf16, ...) of any spelling of a dtype: a torch dtype, "torch.bfloat16", "BF16", "half".

    With `model=True` only the dtypes a model runs in (`MODEL_DTYPES`) are accepted.
    """
    key = str(name).removeprefix("torch.").lower()
    key = _DTYPE_SPELLINGS.get(key, key)
    allowed = MODEL_DTYPES if model else DTYPE_BYTES
    if key not in allowed:
        raise AdapterError(f"dtype {name!r} is not one of {', '.join(allowed)}")
    return key


def _number(value: Any) -> bool:
    """A finite int or float (not a bool): what a sampling number may be (TOML and the CLI can give inf and nan)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


MAX_STORED_INT = 2**63 - 1  # what a database's integer column holds (a seed is stored in one)
MAX_BYTES = 2**53  # bytes (8 PiB): more memory than any machine holds, and the last count a float still holds exactly

# Each `Sampling` field's rule: what it must be (as errors say it) and the check. The one home of sampling's
# validation: `Sampling` itself, `RunSpec.build` for the CLI options and the sweep file's keys all go through
# `check_sampling`, each naming the value as the user gave it. The upper bounds are far beyond any real run
# (the paper uses n <= 64); they stop a typo or a hostile file from planning an absurd one.
SAMPLING_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "temperature": ("a finite number >= 0", lambda v: _number(v) and v >= 0),
    "top_p": ("a number in (0, 1]", lambda v: _number(v) and 0 < v <= 1),
    "top_k": ("a positive integer or None", lambda v: v is None or _whole(v, 1, MAX_STORED_INT)),
    "max_new_tokens": ("an integer from 1 to 1048576", lambda v: _whole(v, 1, 1 << 20)),
    "n": ("an integer from 1 to 1024", lambda v: _whole(v, 1, 1024)),
    "seed": (f"an integer from 0 to {MAX_STORED_INT}", lambda v: _whole(v, 0, MAX_STORED_INT)),
}


def check_sampling(field: str, value: Any, name: str | None = None) -> None:
    """AdapterError unless `value` suits `Sampling.field`, naming it `name` (a CLI option or a sweep-file key;
    default the field's own name)."""
    what, ok = SAMPLING_RULES[field]
    if not ok(value):
        raise AdapterError(f"{name or field} must be {what}, got {value!r}")


@dataclass(frozen=True)
class Sampling:
    """How to sample. The defaults are neutral: the model's own distribution (temperature 1, no nucleus,
    no top-k), one sample per prompt, up to 256 new tokens; a run's sampling comes from its suite
    (`PAPER_PROTOCOL` for the paper's benchmarks) and the user's options.

    `temperature == 0` means greedy decoding. `n` samples are drawn per prompt. `seed` makes the
    whole call reproducible: same adapter, prompts and Sampling give the same tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_new_tokens: int = 256
    n: int = 1
    seed: int = 0
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in SAMPLING_RULES:
            check_sampling(name, getattr(self, name))
        object.__setattr__(self, "stop", tuple(self.stop))
        for name in ("temperature", "top_p"):  # a sweep file's `temperature = 1` is --temperature 1's 1.0: one set
            object.__setattr__(self, name, float(getattr(self, name)))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


# The MELT paper's protocol: temperature 1.0, top-p 0.7, up to 32k new tokens, pass@1 over n = 4 samples.
PAPER_PROTOCOL = Sampling(temperature=1.0, top_p=0.7, max_new_tokens=32768, n=4)


@dataclass
class Generation:
    """One sampled continuation of one prompt.

    `loops_used` holds, per generated token, how many loops the model ran for it (all equal to r
    unless an Ouro exit policy stopped early); None for models that do not loop.
    `prefill_seconds` and `decode_seconds` are those of the batch this sequence was generated in.
    """

    token_ids: list[int]
    text: str | None
    finish_reason: FinishReason
    prompt_tokens: int
    generated_tokens: int
    loops_used: list[int] | None = None
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tokens_per_second(self) -> float:
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass(frozen=True)
class Request:
    """One prompt of a workload handed over whole (`Scheduling.generate_requests`).

    `sampling.seed` keys this prompt's random streams (sample j draws from its own stream of that
    seed), so a prompt's samples are the same whatever else the workload holds. `samples` are the
    sample indices to generate (default all of 0..n-1: a resumed run asks only for the missing ones).
    """

    prompt: Prompt
    sampling: Sampling
    samples: tuple[int, ...] | None = None

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(range(self.sampling.n)) if self.samples is None else self.samples


# A sample that just finished: (index of its request in the workload, sample index, its generation).
Finished = tuple[int, int, Generation]


@runtime_checkable
class Scheduling(Protocol):
    """An optional adapter extra: take a whole workload at once and report each sample as it finishes.

    The LightEval bridge hands such an adapter every prompt of a task in one call, so a continuous
    batcher keeps its running set full, and commits each group of finished samples as it arrives.
    """

    def generate_requests(self, requests: Sequence[Request], on_finished: Callable[[list[Finished]], None]) -> None: ...


@runtime_checkable
class Adapter(Protocol):
    """What loopeval needs from a model.

    `generate` returns `len(prompts) * sampling.n` generations, prompt-major: element `i * n + j`
    is sample `j` of prompt `i`. `memory()` is called from the memory sampler's thread while
    `generate` runs, so it must be cheap and only read counters.
    """

    spec: str
    tokenizer: Any | None  # a transformers PreTrainedTokenizerBase, or None for token-id-only models
    max_context: int  # prompt + generated tokens the adapter can hold

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Full forward without cache: [batch, length] token ids -> [batch, length, vocab] logits."""
        ...

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]: ...

    def memory(self) -> dict[str, int | None]:
        """Bytes for each of `measures.MEMORY_KEYS` (and any of `OPTIONAL_MEMORY_KEYS`); None where the adapter cannot know."""
        ...

    def describe(self) -> dict[str, Any]:
        """JSON-serialisable facts stored with each run: family, params, loops, kv_strategy, dtype, device, config."""
        ...


# --- what an adapter hands back, checked before the harness stores it -------------------------------
# A plugin adapter is someone else's code: a negative or infinite byte count would rank on the Pareto
# frontier, a string would poison an integer column. The harness checks every value at the boundary
# (`harness.execution.runner.TimedAdapter`, `harness.measurement.sampler`) and fails the run with the reason instead.


T = TypeVar("T")


def hook(spec: str, name: str, call: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`call(*args, **kwargs)`, one of an adapter's hooks (`memory()`, `generate()`, its `loops` setter...), whatever it
    raises turned into one AdapterError naming the adapter and the hook. A plugin is someone else's code: its failure
    fails its run with that line as the reason, or is refused before the run, never a traceback, and never the end of
    the process: `sys.exit()`, GeneratorExit, a KeyboardInterrupt it raises itself and any other BaseException are a
    failure like any exception. AdapterError, the adapter's own word to the user, passes unchanged; the user's Ctrl-C
    or SIGTERM, arriving while the hook ran, still interrupts (`interrupted_by_signal`)."""
    signals = signals_seen()
    try:
        return call(*args, **kwargs)
    except AdapterError:
        raise
    except Exception as exc:
        raise HookError(f"{spec}: {name} raised {type(exc).__name__}: {one_line(str(exc))}") from exc
    except BaseException as exc:
        if interrupted_by_signal(exc, signals):
            raise
        said = one_line(str(exc))
        raise HookError(f"{spec}: {name} raised {type(exc).__name__}" + (f": {said}" if said else "")) from exc


# --- the user's interrupt, told apart from a plugin's own -----------------------------------------------------------
_signals_seen = 0  # SIGINT and SIGTERM this process has received through `interrupt`


def interrupt(signum: int, frame: Any) -> None:
    """The handler of Ctrl-C (SIGINT) and SIGTERM while loopeval works: counts the signal, then stops the work in hand
    as Ctrl-C does. The count is how `hook` tells the user's interrupt, which stops the run (stored as interrupted, to
    be resumed), from a plugin raising KeyboardInterrupt itself, which fails it."""
    global _signals_seen
    _signals_seen += 1
    raise KeyboardInterrupt() if signum == signal.SIGINT else KeyboardInterrupt(f"signal {signum}")


def signals_seen() -> int:
    """How many SIGINT and SIGTERM signals `interrupt` has handled in this process: a hook notes it before it runs."""
    return _signals_seen


def interrupted_by_signal(exc: BaseException, signals_before: int) -> bool:
    """Whether `exc`, raised while a hook ran, is the user's interrupt: a KeyboardInterrupt while a signal arrived, or
    while a Ctrl-C handler other than `interrupt` is in place (Python's own: loopeval used as a library), where the two
    cannot be told apart and an interrupt stays an interrupt. With Ctrl-C counted or ignored, a KeyboardInterrupt no
    signal brought is the plugin's own, as is anything else that is not an Exception (SystemExit, GeneratorExit...)."""
    if not isinstance(exc, KeyboardInterrupt) or threading.current_thread() is not threading.main_thread():
        return False  # only the main thread receives signals: elsewhere an interrupt is the plugin's own
    uncounted = signal.getsignal(signal.SIGINT) not in (interrupt, signal.SIG_IGN, signal.SIG_DFL)
    return signals_seen() != signals_before or uncounted


@contextmanager
def interrupts_counted() -> Iterator[None]:
    """Ctrl-C handled by `interrupt` inside the block (a whole CLI command), where Python's own handler had it. A
    Ctrl-C that is ignored (a job started in the background) stays ignored; off the main thread nothing changes."""
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    signal.signal(signal.SIGINT, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def one_line(text: str) -> str:
    """`text` on one line (its whitespace runs as single spaces), as errors are printed and stored."""
    return " ".join(text.split())


def _count(value: Any) -> bool:
    return (type(value) is int or type(value) is float and value.is_integer()) and 0 <= value <= MAX_BYTES


def checked_memory(spec: str, values: Any) -> dict[str, int | None]:
    """`memory()`'s values as stored: None or a whole number of bytes from 0 to MAX_BYTES each; AdapterError otherwise."""
    if not isinstance(values, dict):
        raise AdapterError(f"{spec}: memory() must return a dict of byte counts, got {type(values).__name__}")
    for name, value in values.items():
        if value is not None and not _count(value):
            raise AdapterError(
                f"{spec}: memory()[{name!r}] is {value!r}; byte counts must be whole numbers from 0 to "
                f"2**53 (more than any machine holds) or None"
            )
    return {name: None if value is None else int(value) for name, value in values.items()}


def checked_context(spec: str, value: Any) -> int:
    """An adapter's `max_context`: a positive integer up to MAX_CONTEXT; AdapterError otherwise."""
    if type(value) is not int or not 1 <= value <= MAX_CONTEXT:
        raise AdapterError(f"{spec}: max_context must be an integer from 1 to {MAX_CONTEXT} (tokens), got {value!r}")
    return value


def checked_generation(spec: str, generation: Any) -> Generation:
    """One `Generation` as stored: a known finish reason, whole non-negative token counts, text or None."""
    if not isinstance(generation, Generation):
        raise AdapterError(f"{spec}: generate() must return Generation objects, got {type(generation).__name__}")
    g, problems = generation, []
    if g.finish_reason not in FINISH_REASONS:
        problems.append(f"finish_reason {g.finish_reason!r} is not one of {', '.join(FINISH_REASONS)}")
    for name in ("prompt_tokens", "generated_tokens"):  # at most any model's context, and what an integer column holds
        if type(getattr(g, name)) is not int or not 0 <= getattr(g, name) <= MAX_CONTEXT:
            problems.append(f"{name} {getattr(g, name)!r} is not a whole number from 0 to {MAX_CONTEXT}")
    if g.text is not None and not isinstance(g.text, str):
        problems.append(f"text is a {type(g.text).__name__}, not a string or None")
    if g.loops_used is not None and not (
        isinstance(g.loops_used, list) and all(type(r) is int and 1 <= r <= MAX_CONTEXT for r in g.loops_used)
    ):
        problems.append(f"loops_used is not None or a list of whole numbers from 1 to {MAX_CONTEXT}")
    for name in ("prefill_seconds", "decode_seconds"):
        if type(getattr(g, name)) not in (int, float) or not 0 <= getattr(g, name) < math.inf:
            problems.append(f"{name} {getattr(g, name)!r} is not a finite number >= 0")
    if problems:
        raise AdapterError(f"{spec}: generate() returned a Generation whose {'; '.join(problems)}")
    return g


def checked_description(spec: str, description: Any) -> dict[str, Any]:
    """`describe()`: a dict that is standard JSON (no NaN or infinity, which Postgres refuses), whose keys the views
    compute with hold what they need (`measures.DESCRIBED`: a number for `kv_bytes_per_token`, ...); AdapterError
    otherwise. The store reads it back under the same rule, so a run it wrote is never a damaged one."""
    import json

    try:
        if not isinstance(description, dict):
            raise TypeError(f"a {type(description).__name__}, not a dict")
        json.dumps(description, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise AdapterError(f"{spec}: describe() must return a dict of standard JSON values: {exc}") from None
    problem = leaf_problem(description, DESCRIBED)
    if problem:
        raise AdapterError(f"{spec}: describe() {problem}")
    return description
