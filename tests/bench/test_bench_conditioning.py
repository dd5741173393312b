"""The conditioning-cost benchmark runs end to end and its parameter and byte figures are the formulas'.

Its decode speeds are what it measures on a noisy machine, so only their presence is checked.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a benchmark, end to end: the fast tier (-m 'not slow') skips it

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_conditioning.py"
D, T, SHARED = 128, 4, 2  # coreloop-tiny, the bench's default: hidden size, loops, shared layers


def test_bench_conditioning_counts_what_each_option_adds() -> None:
    """The cost table of docs/lab.md, one round: with 64 new tokens after 32 prompt tokens the peak is at the end of
    decoding, where the history buffer holds one token per sequence (the prefill's w x 32 x d is gone by then)."""
    argv = [sys.executable, str(BENCH), "--batches", "1,2", "--new-tokens", "64", "--rounds", "1", "--threads", "1"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    variants = json.loads(done.stdout)["variants"]
    added = {name: v["params_added"] for name, v in variants.items()}
    assert added["plain"] == 0 and added["injection scalar"] == 1 and added["injection dense"] == D * D
    assert added["history channel w=2"] == 2 * D and added["history dense w=2"] == 2 * D * D
    assert added["loop gate"] == T * 8 and added["branch gate"] == T * SHARED * 2 * 8
    assert added["history channel w=2 + loop gate"] == 2 * D + T * 8
    for name, v in variants.items():
        assert v["weights_bytes_added"] == 4 * v["params_added"]  # fp32
        history = 2 if "w=2" in name else 4 if "w=4" in name else 0
        for batch in (1, 2):  # the history buffer: w loop differences of d floats per sequence in flight
            assert v[f"batch {batch}"]["decode_bytes_added"] == history * D * 4 * batch, name
            assert v[f"batch {batch}"]["decode_tok_s_best"] > 0
