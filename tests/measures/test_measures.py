"""The memory vocabulary (`measures/`): its one analytic formula as every caller evaluates it, the peak rule, the names."""

from __future__ import annotations

import pytest

import adapters
import measures
from adapters.engine.config import LoopConfig
from adapters.engine.memory import analytic_terms, estimate
from analysis.points import analytic_bytes
from harness.measurement.capacity import needed_bytes

# (spec, loops): per-loop KV, gated KV with a chunked latent, a plain model, the same with loop conditioning's history
SPECS = (("preset:ouro-tiny", 2), ("preset:melt-tiny", 2), ("preset:qwen3-tiny", 1), ("preset:ouro-tiny", 3))


@pytest.mark.parametrize(("spec", "loops"), SPECS)
@pytest.mark.parametrize("tokens", [1, 3, 64, 500])
def test_every_caller_evaluates_the_one_formula_as_the_engine_estimates(spec: str, loops: int, tokens: int) -> None:
    """`estimate` (the engine, `loopeval estimate`), `capacity` (will it fit) and the dashboards' analytic measure agree
    byte for byte, at lengths below and above a gated model's latent chunk."""
    overrides = {"history": "dense", "history_window": 2} if loops == 3 else {}
    facts = adapters.inspect(spec, loops=loops, **overrides)
    config = LoopConfig.from_dict(facts["config"])
    expected = estimate(config, tokens, batch=3, loops=loops, dtype=facts["dtype"])
    assert facts["analytic"] == analytic_terms(config, loops, facts["dtype"])
    assert measures.analytic_kv_bytes(facts["analytic"], tokens, 3) == expected.kv_bytes > 0
    assert (
        needed_bytes(facts, tokens, 3) == measures.analytic_bytes(facts["analytic"], tokens, 3) == expected.total_bytes
    )
    single = estimate(config, tokens, batch=1, loops=loops, dtype=facts["dtype"]).total_bytes
    assert analytic_bytes(facts, tokens) == float(single)


def test_a_fixed_size_takes_the_newest_value_and_a_peak_the_largest() -> None:
    assert measures.merged_peak("weights_bytes", 10, 8) == 8
    assert measures.merged_peak("rss", 10, 8) == 10 and measures.merged_peak("rss", 8, 10) == 10
    assert (
        measures.merged_peak("kv_bytes_allocated", None, 5) == 5 and measures.merged_peak("weights_bytes", 5, None) == 5
    )
    assert measures.merged_peak("nvml_process", None, None) is None  # unavailable stays unavailable, never 0


def test_the_lists_derive_from_the_one_table() -> None:
    assert measures.PEAK_MEASURES == tuple(m.name for m in measures.MEASURES)
    assert set(measures.SERIES_MEASURES) == set(measures.PEAK_MEASURES) - {"weights_bytes"}
    assert set(measures.PROFILE_MEASURES) <= set(measures.SERIES_MEASURES)
    assert set(measures.RUN_TABLE_MEASURES) <= set(measures.PEAK_MEASURES)
    assert measures.ADAPTER_PEAKS == {
        "kv_bytes_peak": "kv_bytes_allocated",
        "kv_bytes_reserved_peak": "kv_bytes_reserved",
    }
    assert measures.ADAPTER_SERIES == ("kv_bytes_allocated", "kv_bytes_used", "kv_bytes_reserved")
    assert all(m.label.endswith(("peak", "peak (CPU)")) for m in measures.MEASURES if m.kind == "series")


def test_every_old_name_means_a_measure_of_today() -> None:
    for old, new in measures.ALIASES.items():
        assert old not in measures.PEAK_MEASURES and old not in measures.MEMORY_MEASURES
        assert new in measures.PEAK_MEASURES or new in measures.MEMORY_MEASURES
        assert measures.canonical(old) == new and measures.canonical(new) == new


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "n/a"),
        (float("nan"), "n/a"),
        (0, "0 B"),
        (999, "999 B"),
        (1_280_000, "1.28 MB"),
        (3e9, "3 GB"),
        (12_345, "12.3 KB"),
    ],
)
def test_byte_text_is_decimal_and_never_zero_for_unavailable(value: float | None, text: str) -> None:
    assert measures.byte_text(value) == text
