"""The exits benchmark runs end to end: its calibrated threshold runs fewer loops than fixed depth, near the target.

Its decode times are what it measures on a noisy machine, so only their presence is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a benchmark, end to end: the fast tier (-m 'not slow') skips it

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_exits.py"


def test_bench_exits_skips_loops_near_the_target() -> None:
    argv = [
        sys.executable,
        str(BENCH),
        "--width",
        "128",
        "--batch",
        "4",
        "--new-tokens",
        "8",
        "--rounds",
        "1",
        "--threads",
        "1",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["mean_loops_fixed"] == out["loops"] == 8
    assert 0.4 < out["loop_fraction"] < 0.8 and out["mean_loops_exits"] < out["loops"]
    assert out["decode_time_ratio"] > 0 and out["decode_tps_fixed"] > 0 and out["decode_tps_exits"] > 0
