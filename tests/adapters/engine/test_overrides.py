"""`adapters.engine.overrides`: load overrides are checked before anything loads, one bad value one `AdapterError`
naming it, and the facts a sweep plans with (`config_facts`) are what the loaded adapter then describes."""

from __future__ import annotations

import pytest
import torch

from adapters.base import AdapterError
from adapters.engine.adapter import load_preset
from adapters.engine.exits import SKIPPING_FILL, ExitPolicy
from adapters.engine.io.presets import preset
from adapters.engine.overrides import (
    OVERRIDES,
    check_batching,
    check_exit_support,
    check_flag,
    check_overrides,
    config_facts,
    exit_policy,
    resolve_device,
    resolve_dtype,
)


def test_an_unknown_override_is_named_with_the_allowed_ones() -> None:
    with pytest.raises(AdapterError, match="unknown override.*loopz.*allowed: loops"):
        check_overrides({"loopz": 2})
    check_overrides(dict.fromkeys(OVERRIDES))  # every declared override passes


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, "continuous", None, 16, True), "max_batch must be a positive integer"),
        ((True, "continuous", None, 16, True), "max_batch must be a positive integer"),
        ((8, "continuous", None, 0, True), "block_size must be a positive integer"),
        ((8, "paged", None, 16, True), "batching 'paged' is not one of continuous, static"),
        ((8, "continuous", float("inf"), 16, True), "kv_budget must be a positive number of GB"),
        ((8, "continuous", True, 16, True), "kv_budget must be a positive number of GB"),
        ((8, "continuous", None, 16, "yes"), "cuda_graphs must be true or false"),
    ],
)
def test_bad_batching_overrides_are_refused(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(AdapterError, match=message):
        check_batching(*args)


def test_good_batching_overrides_come_back_with_the_budget_as_a_float() -> None:
    assert check_batching(8, "static", 2, 16, False) == (8, "static", 2.0, 16, False)
    assert check_flag("triton_kernels", False) is False


def test_dtype_and_device_defaults() -> None:
    assert resolve_dtype(None, "cpu") == torch.float32  # bf16 matmuls crawl on CPUs
    assert resolve_dtype(None, "cuda") == torch.bfloat16
    assert resolve_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(AdapterError, match="CUDA is not available"):
            resolve_device("cuda")


def test_the_exit_policy_comes_from_the_overrides_else_the_checkpoint() -> None:
    cfg = preset("ouro-tiny")
    assert exit_policy(cfg, {}) == ExitPolicy()  # no threshold anywhere: the last loop, every loop run
    set_here = exit_policy(cfg, {"exit_threshold": 0.5})
    assert (set_here.kind, set_here.threshold, set_here.fill) == ("threshold", 0.5, SKIPPING_FILL)
    own = exit_policy(cfg.replace(exit_threshold=0.9), {})  # the checkpoint's: read as the official code reads it
    assert (own.kind, own.threshold, own.fill) == ("threshold", 0.9, "read")
    with pytest.raises(AdapterError, match="exit_criterion 'kl' needs an exit_threshold"):
        exit_policy(cfg, {"exit_criterion": "kl"})


def test_a_policy_the_model_cannot_run_is_refused() -> None:
    gate = ExitPolicy(kind="threshold", threshold=0.5)
    assert check_exit_support(preset("ouro-tiny"), gate) is gate
    with pytest.raises(AdapterError, match="needs a model with an exit gate"):
        check_exit_support(preset("coreloop-tiny"), gate)
    with pytest.raises(AdapterError, match="exit_fill 'read' needs a model without coda layers"):
        check_exit_support(preset("coreloop-tiny"), ExitPolicy(kind="fixed", loop=2))


@pytest.mark.parametrize(
    "overrides", [{}, {"loops": 2, "dtype": "bf16", "max_batch": 4}, {"kv_policy": "shared-last", "kv_dtype": "int8"}]
)
def test_the_planned_facts_are_what_the_loaded_adapter_describes(overrides: dict[str, object]) -> None:
    facts = config_facts(preset("ouro-tiny"), dict(overrides))
    described = load_preset("ouro-tiny", device="cpu", **overrides).describe()
    for key in ("family", "params", "loops", "trained_loops", "kv_policy", "kv_dtype", "kv_bytes_per_token", "dtype"):
        assert facts[key] == described[key], key
    assert facts["max_batch"] == described["batching"]["max_batch"]
    # the fields, but for the notes loading adds: the tokenizer's end tokens (`tokenizer.token_ids`)
    assert {**facts["config"], "extra": {}} == {**described["config"], "extra": {}}
