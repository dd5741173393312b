"""The KV axis's names and the one check of a policy's text: what it parses, what it refuses and how it names the
setting, which policies a model's strategy admits, and that every name has its layout."""

from __future__ import annotations

import pytest

from adapters.base import AdapterError
from adapters.engine.config import LoopConfig
from adapters.engine.io.presets import preset
from adapters.engine.kv.layouts import policy_layout
from adapters.engine.kv.policies import (
    DEFAULT_EMA_ALPHA,
    KV_POLICIES,
    POLICIES_TEXT,
    POLICY_NAMES,
    admitted,
    check_kv_policy,
    parse_kv_policy,
)


def test_a_policy_parses_to_its_name_and_alpha():
    assert parse_kv_policy("shared-last") == ("shared-last", None)
    assert parse_kv_policy("shared-ema") == ("shared-ema", DEFAULT_EMA_ALPHA)
    assert parse_kv_policy("shared-ema:0.3") == ("shared-ema", 0.3)
    assert parse_kv_policy("shared-ema:.25") == ("shared-ema", 0.25)  # the number as given, not its canonical text


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ("shared-max", "kv_policy must be one of standard, gated, per-loop, shared-last, shared-mean, shared-ema, "),
        ("shared-last:0.5", "kv_policy must be one of"),  # only shared-ema takes a parameter
        (3, "kv_policy must be one of"),
        ("shared-ema:1", "kv_policy shared-ema:ALPHA needs ALPHA in (0, 1)"),
        ("shared-ema:0", "needs ALPHA in (0, 1)"),
        ("shared-ema:nan", "needs ALPHA in (0, 1)"),
        ("shared-ema:half", "needs ALPHA in (0, 1)"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_setting(policy, message):
    with pytest.raises(AdapterError) as refused:
        parse_kv_policy(policy)
    assert message in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(AdapterError, match="^--kv-policy "):  # a flag's name where the harness asks
        parse_kv_policy(policy, "--kv-policy")


def test_the_names_are_each_strategy_s_and_offered_in_one_text():
    assert POLICY_NAMES == ("standard", "gated", "per-loop", "shared-last", "shared-mean", "shared-ema", "latest-m4")
    assert sorted(POLICY_NAMES) == sorted(p for policies in KV_POLICIES.values() for p in policies)
    assert POLICIES_TEXT.startswith(", ".join(POLICY_NAMES)) and "shared-ema:ALPHA" in POLICIES_TEXT
    assert [policy_layout(name).policy for name in POLICY_NAMES] == list(POLICY_NAMES)  # every name has its layout


def test_a_strategy_admits_its_own_policies_and_latest_m4_only_when_recurrent():
    assert admitted("standard", False) == ["standard"] and admitted("gated", False) == ["gated"]
    assert admitted("per_loop", False) == ["per-loop", "shared-last", "shared-mean", "shared-ema"]
    assert admitted("per_loop", True)[-1] == "latest-m4"
    check_kv_policy("shared-ema:0.3", "per_loop", "ouro", False)
    with pytest.raises(AdapterError, match=r"kv_policy latest-m4 applies to the recurrent-depth families"):
        check_kv_policy("latest-m4", "per_loop", "ouro", False)
    with pytest.raises(AdapterError, match=r"kv_policy gated applies to gated \(MELT\) models; this model \(ouro"):
        check_kv_policy("gated", "per_loop", "ouro", False)


def test_the_config_refuses_with_the_same_check():
    """`LoopConfig` runs `check_kv_policy`: its refusal is the checker's, word for word."""
    with pytest.raises(AdapterError) as direct:
        parse_kv_policy("shared-ema:2")
    with pytest.raises(AdapterError) as config:
        preset("ouro-tiny").replace(kv_policy="shared-ema:2")
    assert str(config.value) == str(direct.value)
    with pytest.raises(AdapterError, match="kv_policy shared-last applies to looped per-loop families"):
        LoopConfig(kv_policy="shared-last")  # a plain stack
