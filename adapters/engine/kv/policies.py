"""The names of the KV axis: the policies (where a token's K/V live) and dtypes (how a row is stored), and the one
check of a policy's text.

Light on purpose (no torch): the config validates its `kv_policy` and `kv_dtype` with these, and the harness's
options, help texts and refusals read the same names, so a policy added here is offered and checked everywhere.
`adapters.engine.kv.layouts` holds the layout each name stands for.
"""

from __future__ import annotations

import math

from adapters.base import AdapterError

KV_DTYPES = ("auto", "int8", "fp8")  # how K/V are stored (`adapters.engine.kv.format`); auto: the model's dtype
EMA = "shared-ema"  # the one policy with a parameter: shared-ema:ALPHA, ALPHA in (0, 1)
SHARED_POLICIES = ("shared-last", "shared-mean", EMA)  # one entry per layer and token on a per-loop model
DEFAULT_EMA_ALPHA = 0.5  # shared-ema's weight on the newest loop: MELT's `ema` gate at its default decay
# the KV policies a model's own KV strategy admits (`LoopConfig.kv_policy`)
KV_POLICIES = {"standard": ("standard",), "gated": ("gated",), "per_loop": ("per-loop", *SHARED_POLICIES, "latest-m4")}
POLICY_NAMES = tuple(policy for policies in KV_POLICIES.values() for policy in policies)
POLICIES_TEXT = f"{', '.join(POLICY_NAMES)} ({EMA}:ALPHA, ALPHA in (0, 1))"  # what help texts offer
POLICY_SCOPE = {
    "standard": "plain stacks (qwen3)",
    "gated": "gated (MELT) models",
    "latest-m4": "the recurrent-depth families (huginn, retrofit)",
    **{p: "looped per-loop families (ouro, huginn, retrofit, ifm)" for p in ("per-loop", *SHARED_POLICIES)},
}


def parse_kv_policy(policy: object, option: str = "kv_policy") -> tuple[str, float | None]:
    """(name, ALPHA) of a known policy: "shared-ema:0.3" -> ("shared-ema", 0.3), "shared-ema" -> its default ALPHA,
    else (policy, None). An unknown name or an ALPHA outside (0, 1) raises an `AdapterError` naming `option` (the
    config field, or the flag a user typed)."""
    if not isinstance(policy, str):
        raise AdapterError(f"{option} must be one of {POLICIES_TEXT}, got {policy!r}")
    name, _, alpha = policy.partition(":")
    if name != EMA:
        if policy not in POLICY_NAMES:
            raise AdapterError(f"{option} must be one of {POLICIES_TEXT}, got {policy!r}")
        return policy, None
    try:
        value = float(alpha) if alpha else DEFAULT_EMA_ALPHA
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise AdapterError(f"{option} {EMA}:ALPHA needs ALPHA in (0, 1) (the newest loop's weight), got {policy!r}")
    return name, value


def admitted(kv_strategy: str, recurrent: bool) -> list[str]:
    """The policies a model of this KV strategy runs (latest-m4 is Huginn's lookup: the recurrent families')."""
    return [p for p in KV_POLICIES[kv_strategy] if p != "latest-m4" or recurrent]


def check_kv_policy(policy: object, kv_strategy: str, family: str, recurrent: bool) -> None:
    """A known policy that the model's own strategy admits (a looped model's sharing, MELT's gate, ...)."""
    name, _ = parse_kv_policy(policy)
    allowed = admitted(kv_strategy, recurrent)
    if name not in allowed:
        raise AdapterError(
            f"kv_policy {name} applies to {POLICY_SCOPE[name]}; this model ({family}, {kv_strategy} KV) "
            f"takes {', '.join(allowed)}"
        )
