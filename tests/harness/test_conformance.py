"""The conformance kit: every built-in adapter passes it, and a broken adapter fails with precise messages."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any
from collections.abc import Callable, Sequence

import pytest

import adapters
from adapters import Generation, Sampling
from adapters.testing import save_tiny_qwen3
from harness.conformance import ConformanceError, check_adapter


@pytest.fixture(scope="module")
def transformers_adapter(tmp_path_factory: pytest.TempPathFactory) -> adapters.Adapter:
    return adapters.load(f"transformers:{save_tiny_qwen3(tmp_path_factory.mktemp('tiny-qwen3'))}", device="cpu")


def test_transformers_backend_passes_the_kit_through_the_bridge(transformers_adapter) -> None:
    report = check_adapter(transformers_adapter, max_new_tokens=8)
    assert report.ok and report.status("bridge") == "pass" and report.status("stop") == "pass", str(report)


@pytest.mark.parametrize(
    ("spec", "bridge", "max_new_tokens"),
    [("preset:qwen3-tiny", True, 8), ("preset:ouro-tiny", False, 6), ("preset:melt-tiny", False, 4)],
)
def test_engine_presets_pass_the_kit(spec: str, bridge: bool, max_new_tokens: int) -> None:
    """The bridge is exercised once (on qwen3-tiny); ouro/melt are slower per token, so they run shorter."""
    report = check_adapter(spec, bridge=bridge, max_new_tokens=max_new_tokens, prompts=("1+1=", "abc"), device="cpu")
    assert report.ok and report.status("greedy") == "pass" and report.status("memory") == "pass", str(report)


class BrokenAdapter:
    """Wraps a working adapter but samples at temperature 1 whatever it is asked, and lies about memory."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.spec, self.tokenizer, self.max_context = "broken:demo", inner.tokenizer, inner.max_context
        self.model = inner.model

    def forward_logits(self, input_ids: Any) -> Any:
        return self.inner.forward_logits(input_ids)

    def generate(self, prompts: Sequence[Any], sampling: Sampling) -> list[Generation]:
        return self.inner.generate(prompts, replace(sampling, temperature=1.0, top_p=1.0))

    def memory(self) -> dict[str, int | None]:
        real = self.inner.memory()
        return {**real, "weights_bytes": 1, "kv_bytes_used": (real["kv_bytes_allocated"] or 0) + 1}

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def test_broken_adapter_fails_with_precise_messages(transformers_adapter) -> None:
    report = check_adapter(BrokenAdapter(transformers_adapter), bridge=False, strict=False, max_new_tokens=8)
    failed = {r.name: r.message for r in report.failures}
    assert "temperature 0 is not deterministic" in failed["greedy"] and "is temperature ignored?" in failed["greedy"]
    assert "memory()['weights_bytes']=1 but its model's parameters hold" in failed["memory"]
    assert report.status("top_p") == "skip"  # it compares with greedy outputs, which are not
    assert (
        report.status("seed") == "pass" and report.status("n_order") != "pass"
    )  # seeds still reproduce; greedy n=2 does not repeat
    with pytest.raises(ConformanceError) as raised:
        check_adapter(BrokenAdapter(transformers_adapter), bridge=False, max_new_tokens=8)
    message = str(raised.value)
    assert (
        message.startswith("conformance of broken:demo:") and "[fail] greedy" in message and "[fail] memory" in message
    )


class MemoryLie(BrokenAdapter):
    """Generates honestly; `memory()` is the real reading changed by `lie`."""

    def __init__(self, inner: Any, lie: Callable[[dict[str, int | None]], dict[str, int | None]]) -> None:
        super().__init__(inner)
        self.lie = lie

    def generate(self, prompts: Sequence[Any], sampling: Sampling) -> list[Generation]:
        return self.inner.generate(prompts, sampling)

    def memory(self) -> dict[str, int | None]:
        return self.lie(self.inner.memory())


def test_memory_lie_about_kv_is_named(transformers_adapter) -> None:
    over_used = MemoryLie(
        transformers_adapter, lambda real: {**real, "kv_bytes_used": (real["kv_bytes_allocated"] or 0) + 1}
    )
    report = check_adapter(over_used, bridge=False, strict=False, max_new_tokens=6)
    assert [r.name for r in report.failures] == ["memory"]
    claims = re.findall(r"kv_bytes_used=(\d+) exceeds kv_bytes_allocated=(\d+)", report.failures[0].message)
    assert claims and all(int(used) == int(alloc) + 1 for used, alloc in claims)


def test_reserved_below_allocated_is_named(transformers_adapter) -> None:
    """`kv_bytes_reserved` is optional, but where reported it holds at least what is allocated."""
    under = MemoryLie(
        transformers_adapter, lambda real: {**real, "kv_bytes_reserved": max((real["kv_bytes_allocated"] or 0) - 1, 0)}
    )
    report = check_adapter(under, bridge=False, strict=False, max_new_tokens=6)
    assert [r.name for r in report.failures] == ["memory"]
    claims = re.findall(r"kv_bytes_allocated=(\d+) exceeds kv_bytes_reserved=(\d+)", report.failures[0].message)
    assert claims and all(int(alloc) == int(reserved) + 1 for alloc, reserved in claims)
