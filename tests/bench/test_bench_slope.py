"""The slope-and-intercept benchmark: its line fit, the bytes a decode step reads, and a run end to end.

Its times are what it measures on a noisy machine, so the end-to-end test checks only their presence and the
arithmetic around them; the fit and the byte counts are checked exactly.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.presets import preset

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_slope.py"
spec = importlib.util.spec_from_file_location("bench_slope", BENCH)
assert spec is not None and spec.loader is not None
bench_slope = sys.modules["bench_slope"] = importlib.util.module_from_spec(spec)  # its dataclass looks itself up
spec.loader.exec_module(bench_slope)


def test_fit_recovers_a_line_and_reports_the_worst_residual() -> None:
    exact = bench_slope.fit_line([100, 200, 400], [0.011, 0.012, 0.014])  # 10 us a token, 10 ms at no context
    assert exact.slope == pytest.approx(1e-5) and exact.intercept == pytest.approx(0.010)
    assert exact.residual == pytest.approx(0.0, abs=1e-12)
    # y = 1, 3, 2 at x = 0, 1, 2: least squares gives slope 0.5, intercept 1.5; the misses are 0.5 of 1, 1 of 3 and
    # 0.5 of 2, so the worst is half the latency at x = 0
    noisy = bench_slope.fit_line([0, 1, 2], [1.0, 3.0, 2.0])
    assert (noisy.slope, noisy.intercept) == pytest.approx((0.5, 1.5)) and noisy.residual == pytest.approx(0.5)


def _model(**fields: object) -> torch.nn.Module:
    return random_model(replace(preset("ouro-tiny"), **fields), 0, torch.float32, "cpu")


def test_bytes_read_counts_every_loops_weights_and_rows() -> None:
    cfg = preset("ouro-tiny")
    model = _model()
    weights, kv = bench_slope.bytes_read(model, 4)
    shared = sum(p.numel() for layer in model.model.shared for p in layer.parameters())
    norm, head = cfg.hidden_size, cfg.vocab_size * cfg.hidden_size
    assert weights == 4 * (4 * shared + norm + head)  # float32: the shared layers once per loop, the head once
    # every loop of each shared layer reads one K and one V row per head and earlier token
    assert kv == 4 * cfg.shared_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 4


def test_sharing_reads_what_per_loop_reads_and_int8_reads_less() -> None:
    """Sharing cuts the rows held, not the rows a step reads (each loop reads the shared row again)."""
    _, per_loop = bench_slope.bytes_read(_model(), 4)
    _, shared = bench_slope.bytes_read(_model(kv_policy="shared-last"), 4)
    _, int8 = bench_slope.bytes_read(_model(kv_dtype="int8"), 4)
    head_dim = preset("ouro-tiny").head_dim
    assert shared == per_loop and int8 * 4 * head_dim == per_loop * (head_dim + 4)


@pytest.mark.slow
def test_the_benchmark_fits_each_lever_and_gives_both_ratios(tmp_path: Path) -> None:
    out = tmp_path / "slope.json"
    argv = [sys.executable, str(BENCH), "--presets", "qwen3-tiny,ouro-tiny", "--levers", "own,shared-last,int8"]
    argv += ["--contexts", "64,256,512", "--steps", "1", "--layers", "0", "--json", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    levers = [(row["preset"], row["lever"], row["loops"]) for row in figures["rows"]]
    # shared-last applies to the per-loop model only; a plain model runs once
    assert levers == [("qwen3-tiny", "own", 1), ("qwen3-tiny", "int8", 1)] + [
        ("ouro-tiny", lever, 4) for lever in ("own", "shared-last", "int8")
    ]
    assert figures["read_bandwidth_gb_s"] > 0
    for row in figures["rows"]:
        assert sorted(map(int, row["latency_ms"])) == [64, 256, 512] and min(row["latency_ms"].values()) > 0
        bandwidth = figures["read_bandwidth_gb_s"] * 1e9
        assert row["intercept_bound_ms"] == pytest.approx(row["weight_bytes_read"] / bandwidth * 1e3)
        assert row["slope_bound_us_per_token"] == pytest.approx(row["kv_bytes_read_per_token"] / bandwidth * 1e6)
    assert "read bandwidth" in done.stdout and "ouro-tiny   shared-last" in done.stdout
