"""A sweep's request resolved before it is planned: a KV policy's number kept as given, each model once however it is
named, the run-count guard counting settings rather than spellings, and the db layer's names of a model's own KV in
step with the engine's. Built from flags and sweep files as `loopeval run` builds them; planning reads real configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.engine.kv.layouts import FAMILY_NATIVE, policy_layout
from adapters.engine.kv.policies import DEFAULT_EMA_ALPHA, KV_POLICIES
from db.models import Run
from db.sets import (
    EMA,
    EMA_ALPHA,
    KV_POLICY_LENGTH,
    OWN_KV_DTYPE,
    OWN_KV_POLICY,
    OWN_KV_POLICY_OF_FAMILY,
    kv_policy_text,
    resolved_kv,
)
from harness.errors import UserError
from harness.planning.plan import prepare_sweep
from harness.planning.sweep import MAX_RUNS, build_request

ZOO_OURO = Path(__file__).resolve().parents[2] / "adapters" / "zoo_data" / "ouro-tiny" / "config.json"


@pytest.mark.parametrize(
    ("given", "stored"),
    [
        ("shared-ema:0.1234567", "shared-ema:0.1234567"),
        ("shared-ema:0.9999999", "shared-ema:0.9999999"),
        ("shared-ema:1e-7", "shared-ema:1e-07"),
        ("shared-ema:.50", "shared-ema:0.5"),
        ("shared-ema", "shared-ema:0.5"),
    ],
)
def test_a_policys_number_is_kept_as_given_and_checked_as_given(given: str, stored: str) -> None:
    (spec,) = build_request(dict(models=["zoo:ouro-tiny"], kv_policies=[given])).specs
    assert spec.kv_policies == (stored,)
    assert policy_layout(stored).fold.__self__.alpha == float(stored.partition(":")[2])  # type: ignore[attr-defined]


def test_a_policy_too_long_to_store_is_refused_in_one_line() -> None:
    with pytest.raises(UserError, match=f"over {KV_POLICY_LENGTH}: give ALPHA with fewer digits"):
        build_request(dict(models=["zoo:ouro-tiny"], kv_policies=["shared-ema:1.2345678901234567e-05"]))


def test_a_model_named_bare_and_prefixed_is_one_model_with_its_overrides() -> None:
    (spec,) = build_request(dict(models=["qwen3-tiny-small", "zoo:qwen3-tiny-small"])).specs
    assert spec.models == ("zoo:qwen3-tiny-small",)
    (spec,) = build_request(
        dict(models=["lab-baseloop"], model_overrides={"zoo:lab-baseloop": {"kv_policy": "shared-ema"}})
    ).specs  # overrides may key a model by its full spec where it is named bare
    assert spec.models == ("zoo:lab-baseloop",)
    assert spec.model_overrides == {"zoo:lab-baseloop": {"kv_policy": "shared-ema:0.5"}}, "the policy in its one text"


def test_the_same_overrides_spelled_two_ways_name_one_model(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'models = [{spec = "lab-baseloop", overrides = {kv_policy = "shared-ema"}}, '
        '{spec = "zoo:lab-baseloop", overrides = {kv_policy = "shared-ema:0.5"}}]\n'
    )
    (spec,) = build_request({}, str(sweep)).specs
    assert spec.models == ("zoo:lab-baseloop",)
    assert spec.model_overrides == {"zoo:lab-baseloop": {"kv_policy": "shared-ema:0.5"}}


def test_the_run_count_guard_counts_settings_not_spellings() -> None:
    """51 loop counts x 100 seeds x 2 spellings of one model x 2 of one policy would be 20,400 runs; it is 5,100."""
    flags = dict(
        models=["lab-baseloop", "zoo:lab-baseloop"],
        loops=list(range(1, 52)),
        seeds=list(range(100)),
        kv_policies=["shared-ema", "shared-ema:0.5"],
    )
    specs = build_request(flags).specs
    assert (
        len(specs) == 100 and specs[0].models == ("zoo:lab-baseloop",) and specs[0].kv_policies == ("shared-ema:0.5",)
    )
    with pytest.raises(UserError, match=f"over the limit of {MAX_RUNS:,}"):
        build_request(flags | {"kv_policies": ["shared-ema", "shared-last"]})


def test_a_config_carrying_its_own_kv_setting_refuses_the_axis(tmp_path: Path) -> None:
    """Its own policy is not the one the runs' identity leaves out (`db.sets.OWN_KV_POLICY`): refused, not misread."""
    config = json.loads(ZOO_OURO.read_text())
    config["config"]["kv_policy"] = "shared-last"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    (spec,) = build_request(dict(models=[f"ouro:{path}"], kv_policies=["per-loop"], limit=1)).specs
    with pytest.raises(UserError, match=r"its config sets its own KV \(shared-last, auto\)"):
        prepare_sweep(spec)
    (plain,) = build_request(dict(models=[f"ouro:{path}"], limit=1)).specs
    assert [run.kv_policy for run in prepare_sweep(plain).runs] == [None] * 4, "naming nothing still runs it"


def test_the_stored_names_of_a_models_own_kv_are_the_engines() -> None:
    assert OWN_KV_POLICY == {strategy: policies[0] for strategy, policies in KV_POLICIES.items()}
    assert OWN_KV_DTYPE == "auto" and EMA_ALPHA == DEFAULT_EMA_ALPHA and EMA in KV_POLICIES["per_loop"]
    assert Run.__table__.c.kv_policy.type.length == KV_POLICY_LENGTH
    assert kv_policy_text("shared-ema:x") == "shared-ema:x", "text that is no number is the adapter's to refuse"
    assert resolved_kv({"kv_policy": "per-loop", "kv_dtype": "auto"}, "per_loop") == {}
    assert resolved_kv({"kv_policy": "per-loop"}, None) == {"kv_policy": "per-loop"}, "unknown strategy: kept"
    assert resolved_kv({"kv_policy": "gated", "kv_dtype": "int8"}, "per_loop") == {
        "kv_policy": "gated",
        "kv_dtype": "int8",
    }


def test_a_family_trained_for_another_layout_has_that_layout_as_its_own() -> None:
    """The IFM rows decode with terminal KV: shared-last named is none named, per-loop named is a lever."""
    assert {family: layout.policy for family, layout in FAMILY_NATIVE.items()} == OWN_KV_POLICY_OF_FAMILY
    assert resolved_kv({"kv_policy": "shared-last"}, "per_loop", "ifm") == {}
    assert resolved_kv({"kv_policy": "per-loop"}, "per_loop", "ifm") == {"kv_policy": "per-loop"}
    assert resolved_kv({"kv_policy": "shared-last"}, "per_loop", "ouro") == {"kv_policy": "shared-last"}
