"""Will it fit? Token counts against the model's context, and a run's weights and KV cache against the
memory the machine has, checked before anything is loaded, measured or written.

The figures come from the adapter's config alone (`adapters.inspect`: the analytic memory model's
coefficients at the run's loops and dtype), so `--loops 1000` on a per-loop cache, or a batch of a
billion sequences, is one clear line instead of an allocator failure halfway through a sweep.
Adapters that cannot describe themselves without loading are not checked here. Every command that
that runs a model on token counts (`profile --lengths`) checks them with `check_context`; `estimate --tokens`, an analytic
figure, prints itself beyond the context and says so (`context_excess`).
"""

from __future__ import annotations

from typing import Any

from harness.errors import UserError
from harness.measurement.cgroup import cgroup_available
from measures import GB, analytic_bytes


def available_bytes(device: str) -> tuple[int, str]:
    """Memory a new allocation can take on `device`, and where that figure comes from: free GPU memory, or the host's
    available RAM, or less where this process's cgroups allow less (a container's limit: `harness.measurement.cgroup`),
    which the kernel enforces by killing the process."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.mem_get_info(torch.device(device))[0], f"on {device}"
    import psutil

    host, limited = psutil.virtual_memory().available, cgroup_available()
    if limited is not None and limited < host:
        return limited, f"on {device} under this process's cgroup memory limit"
    return host, f"on {device}"


def needed_bytes(facts: dict[str, Any], tokens: int, sequences: int) -> int | None:
    """Weights plus the KV cache of `sequences` sequences of `tokens` tokens, or plus the whole KV pool a
    `kv_budget` (GB) asks for, which the engine allocates up front; None without analytic terms."""
    terms = facts.get("analytic")
    if not terms:
        return None
    if facts.get("kv_budget") is not None:
        return terms["weights_bytes"] + int(facts["kv_budget"] * GB)
    return analytic_bytes(terms, tokens, sequences)


def check_fits(what: str, facts: dict[str, Any], tokens: int, sequences: int, hint: str) -> None:
    """UserError when `what` (a model at some loops) cannot fit the machine; `hint` names the options to lower."""
    need = needed_bytes(facts, tokens, sequences)
    if need is None:
        return
    budget = facts.get("kv_budget")
    kv = (
        f"the KV pool of kv_budget = {budget:g} GB"
        if budget is not None
        else f"the KV cache of {sequences} sequences x {tokens} tokens"
    )
    check_memory(
        f"{what}: weights and {kv}", need, facts.get("device", "cpu"), "kv_budget" if budget is not None else hint
    )


def check_memory(what: str, need: int, device: str, hint: str) -> None:
    """UserError when `need` bytes for `what` are more than `device` has free; `hint` names what to lower. The one
    comparison every command that runs or trains a model makes before allocating (`check_fits`, `zoo train`, `zoo convert`)."""
    free, where = available_bytes(device)
    if need > free:
        raise UserError(f"{what} need {need / GB:.3g} GB, but {free / GB:.3g} GB is free {where}: lower {hint}")


def context_excess(spec: str, facts: dict[str, Any], option: str, tokens: int, generated: int = 0) -> str | None:
    """The clause saying that `tokens` given by `option`, plus `generated` new tokens, exceed the model's context
    (`max_context` of its facts), or None when they fit or the facts name no context."""
    context = facts.get("max_context")
    if context is None or tokens + generated <= context:
        return None
    plus = f" plus {generated} generated tokens" if generated else ""
    return f"{option} {tokens}{plus} exceeds {spec}'s context of {context} tokens"


def check_context(spec: str, facts: dict[str, Any], option: str, tokens: int, generated: int = 0) -> None:
    """UserError when `tokens` given by `option`, plus `generated` new tokens, exceed the model's context
    (`context_excess`), naming the most that fits."""
    excess = context_excess(spec, facts, option, tokens, generated)
    if excess is not None:
        raise UserError(
            f"{excess}: at most {facts['max_context'] - generated} fits "
            "(`loopeval models` and `loopeval zoo list` show each model's context)"
        )
