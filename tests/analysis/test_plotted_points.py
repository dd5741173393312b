"""The derived measures of a point (`analysis.points`): the analytic memory from the coefficients an engine adapter
stores, the same as `loopeval estimate` computes from the config."""

from __future__ import annotations

import pytest

from analysis.points import analytic_bytes


@pytest.mark.parametrize("spec,loops", [("preset:melt-tiny", 3), ("preset:ouro-tiny", 8), ("preset:qwen3-tiny", None)])
def test_analytic_coefficients_reproduce_the_estimate(spec: str, loops: int | None) -> None:
    """The analysis layer evaluates the stored coefficients; at every context (below and above MELT's
    chunk) they give exactly what `loopeval estimate` computes from the config."""
    import adapters
    from adapters.engine.memory import estimate

    adapter = adapters.load(spec, loops=loops) if loops else adapters.load(spec)
    described = adapter.describe()
    for tokens in (1, 5, 16, 17, 1024, 32768):
        expected = estimate(adapter.config, tokens, 1, loops, described["dtype"]).total_bytes
        assert analytic_bytes(described, tokens) == expected, (spec, tokens)
