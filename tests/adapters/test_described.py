"""What an adapter's `describe()` must hold where the views compute with it (`measures.DESCRIBED`): checked as the
harness takes it (`adapters.base.checked_description`), by the same rule the store reads it back with (`db.stored`),
so a run loopeval stored is never one it later calls damaged."""

from __future__ import annotations

import pytest

import adapters
from adapters.base import AdapterError, checked_description


@pytest.fixture(scope="module")
def described() -> dict:
    return adapters.load("preset:ouro-tiny", device="cpu").describe()


def test_a_real_description_passes(described: dict) -> None:
    assert checked_description("preset:ouro-tiny", described) is described


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"kv_bytes_per_token": "lots"}, "holds 'lots' at kv_bytes_per_token, not a finite number"),
        ({"trained_loops": 4.5}, "holds 4.5 at trained_loops, not a whole number"),
        ({"loops": True}, "holds True at loops, not a whole number"),
        ({"analytic": "big"}, "holds 'big' at analytic, not a JSON object"),
        ({"kv_policy": 3}, "holds 3 at kv_policy, not text"),
    ],
)
def test_a_value_the_views_cannot_compute_with_is_refused_in_one_line(
    described: dict, change: dict, fragment: str
) -> None:
    with pytest.raises(AdapterError) as caught:
        checked_description("plug:x", {**described, **change})
    assert str(caught.value) == f"plug:x: describe() {fragment}"


def test_a_nested_value_is_checked_by_its_path(described: dict) -> None:
    config = {**described["config"], "shared_layers": "two"}
    with pytest.raises(AdapterError, match=r"holds 'two' at config.shared_layers, not a whole number"):
        checked_description("plug:x", {**described, "config": config})
    assert checked_description("plug:x", {**described, "kv_bytes_per_token": None})  # None: unknown, never computed
