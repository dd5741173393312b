"""The engine's load overrides, checked before anything loads: their names, the batching and exit settings they
give, and what a run will be (`config_facts`) from the config alone.

A sweep plans its runs from these facts before any weights are read (`adapters.inspect`), so every override is
checked here, once, for the plan and for the load (`adapters.engine.adapter`) alike; a bad one is an
`AdapterError` naming it.
"""

from __future__ import annotations

from typing import Any

import torch

from adapters.base import MODEL_DTYPES, AdapterError, check_exit_threshold, dtype_short
from adapters.engine.config import CONDITIONING_FIELDS, LoopConfig
from adapters.engine.exits import SKIPPING_FILL, ExitPolicy
from adapters.engine.families import family_of
from adapters.engine.kv.layouts import layout_of
from adapters.engine.memory import analytic_terms, count_params
from adapters.engine.serving.paged import DEFAULT_BLOCK_SIZE

DEFAULT_MAX_BATCH = 64  # sequences decoding at once
BATCHING = ("continuous", "static")
KV_FIELDS = ("kv_policy", "kv_dtype")  # load overrides that are config fields (`LoopConfig`), checked there
OVERRIDES = (
    "loops",
    "dtype",
    "device",
    "seed",
    "chunk_size",
    "max_batch",
    "batching",
    "kv_budget",
    "block_size",
    "cuda_graphs",
    "triton_kernels",
    "exit_policy",
    "exit_loop",
    "exit_threshold",
    "exit_criterion",
    "exit_fill",
    *KV_FIELDS,
    *CONDITIONING_FIELDS,
)


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """bf16 on a GPU and fp32 on the CPU by default (bf16 matmuls crawl on CPUs)."""
    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    chosen: torch.dtype = getattr(torch, MODEL_DTYPES[dtype_short(dtype, model=True)])
    return chosen


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AdapterError(f"device {device!r} requested but CUDA is not available (use device='cpu')")
    return device


def check_batching_mode(batching: Any) -> str:
    if batching not in BATCHING:
        raise AdapterError(f"batching {batching!r} is not one of {', '.join(BATCHING)}")
    return str(batching)


def check_batching(
    max_batch: Any, batching: Any, kv_budget: Any, block_size: Any, cuda_graphs: Any
) -> tuple[int, str, float | None, int, bool]:
    """The batching overrides, checked: (max_batch, batching, kv_budget in GB or None, block_size, cuda_graphs)."""
    for name, value in (("max_batch", max_batch), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AdapterError(f"{name} must be a positive integer, got {value!r}")
    check_batching_mode(batching)
    if kv_budget is not None and (
        isinstance(kv_budget, bool) or not isinstance(kv_budget, (int, float)) or not 0 < kv_budget < float("inf")
    ):
        raise AdapterError(f"kv_budget must be a positive number of GB, got {kv_budget!r}")
    return (
        max_batch,
        batching,
        None if kv_budget is None else float(kv_budget),
        block_size,
        check_flag("cuda_graphs", cuda_graphs),
    )


def check_flag(name: str, value: Any) -> bool:
    """A true-or-false override, checked."""
    if not isinstance(value, bool):
        raise AdapterError(f"{name} must be true or false, got {value!r}")
    return value


def batching_overrides(overrides: dict[str, Any]) -> tuple[int, str, float | None, int, bool]:
    return check_batching(
        overrides.get("max_batch", DEFAULT_MAX_BATCH),
        overrides.get("batching", "continuous"),
        overrides.get("kv_budget"),
        overrides.get("block_size", DEFAULT_BLOCK_SIZE),
        overrides.get("cuda_graphs", True),
    )


def check_overrides(overrides: dict[str, Any]) -> None:
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise AdapterError(f"unknown override(s) {', '.join(sorted(unknown))} (allowed: {', '.join(OVERRIDES)})")


def conditioning(overrides: dict[str, Any]) -> dict[str, Any]:
    """The loop conditioning fields among load overrides (a loaded model gains them zero-initialised)."""
    return {k: overrides[k] for k in CONDITIONING_FIELDS if overrides.get(k) is not None}


def kv_fields(overrides: dict[str, Any]) -> dict[str, Any]:
    """The KV policy and dtype among load overrides: config fields, which `LoopConfig` checks against the family."""
    return {k: overrides[k] for k in KV_FIELDS if overrides.get(k) is not None}


def kv_facts(cfg: LoopConfig) -> dict[str, str]:
    """The KV policy (the native one named when none was chosen) and dtype a run stores and sweeps by."""
    return {"kv_policy": layout_of(cfg).policy, "kv_dtype": cfg.kv_dtype}


def config_facts(cfg: LoopConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """What `describe()` will say about loops, KV and memory, from the config alone: a sweep plans its
    runs and checks they fit with it before any weights are loaded (`adapters.inspect`), and
    `loopeval estimate` reads the config from it."""
    check_overrides(overrides)
    cfg = cfg.replace(**conditioning(overrides), **kv_fields(overrides))
    if overrides.get("chunk_size") is not None:  # as _build applies it
        cfg = cfg.replace(chunk_size=int(overrides["chunk_size"]))
    loops = cfg.loops if overrides.get("loops") is None else cfg.check_loops(overrides["loops"])
    device = resolve_device(overrides.get("device"))
    dtype = dtype_short(resolve_dtype(overrides.get("dtype"), device))
    check_exit_support(cfg, exit_policy(cfg, overrides))  # a bad exit override fails the plan, before a run is stored
    check_flag("triton_kernels", overrides.get("triton_kernels", True))
    analytic = analytic_terms(cfg, loops, dtype)
    return {
        "family": cfg.family,
        "params": count_params(cfg),
        "kv_strategy": cfg.kv_strategy,
        **kv_facts(cfg),
        "kv_bytes_per_token": analytic["kv_bytes_per_token"],
        "loops": loops,
        "trained_loops": cfg.loops,
        "max_context": cfg.max_position,
        "device": device,
        "dtype": dtype,
        "max_batch": batching_overrides(overrides)[0],
        "kv_budget": batching_overrides(overrides)[2],
        "analytic": analytic,
        "config": cfg.to_dict(),
    }


def exit_policy(cfg: LoopConfig, overrides: dict[str, Any]) -> ExitPolicy:
    """The overrides' exit policy, else the checkpoint's. A threshold (`exit_threshold`, else Ouro's
    `early_exit_threshold`) below 1, or an `exit_criterion`, selects `threshold`, as the official Ouro modelling
    code applies its config's threshold at every forward; 1 (what the Ouro releases ship) with no criterion reads
    the last loop, as `none` does. A policy the overrides set skips the loops after a token's exit (`exit_fill`
    "copy") unless `exit_fill` is "read"; the checkpoint's own threshold is read as the official code reads it,
    every loop run (`adapters.engine.exits`)."""
    criterion, given = overrides.get("exit_criterion"), overrides.get("exit_threshold")
    ExitPolicy(criterion=criterion or "gate")  # an unknown criterion is named before its threshold is checked
    if given is not None:
        check_exit_threshold(given, criterion or "gate")
    elif criterion not in (None, "gate"):
        raise AdapterError(f"exit_criterion {criterion!r} needs an exit_threshold (a finite number >= 0)")
    threshold = cfg.exit_threshold if given is None else given
    threshold = 1.0 if threshold is None else threshold
    kind = overrides.get("exit_policy") or ("threshold" if threshold < 1 or criterion is not None else "none")
    chosen = any(overrides.get(k) is not None for k in ("exit_policy", "exit_threshold", "exit_criterion"))
    fill = overrides.get("exit_fill") or (SKIPPING_FILL if chosen and kind != "none" else "read")
    return ExitPolicy(
        kind=kind, loop=overrides.get("exit_loop"), threshold=threshold, criterion=criterion or "gate", fill=fill
    )


def check_exit_support(cfg: LoopConfig, policy: ExitPolicy) -> ExitPolicy:
    """The policy, if the model can run it: the gate criterion needs an exit gate, exits need looped layers, and
    `read` (an exit loop's state read as the output) needs a model whose output is not the coda's."""
    family, layout = family_of(cfg), layout_of(cfg)
    if policy.kind == "threshold" and policy.criterion == "gate" and not family.has_exit_gate:
        raise AdapterError(
            "exit_policy 'threshold' with the gate criterion needs a model with an exit gate (Ouro); try exit_criterion kl or entropy"
        )
    if policy.skips and policy.fill == "masked" and not layout.grows_with_loops:
        raise AdapterError(
            f"exit_fill 'masked' needs per-loop K/V: kv_policy {layout.policy} keeps one row per layer "
            "and token, which every loop reads"
        )
    if policy.skips and policy.fill == "masked" and layout.reads_latest:
        raise AdapterError(
            f"exit_fill 'masked' is Huginn's 'skip' lookup; kv_policy {layout.policy} reads a skipped loop from the token's "
            "latest one (exit_fill copy)"
        )
    if policy.kind != "none" and cfg.shared_layers == 0:
        raise AdapterError("exit policies need a looped model (shared layers)")
    if policy.kind != "none" and not policy.skips and cfg.coda_layers:
        raise AdapterError("exit_fill 'read' needs a model without coda layers (it reads a loop's state as the output)")
    return policy
