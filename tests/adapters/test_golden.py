"""The engine's outputs, token for token, against those recorded before its speed work (scripts/engine_golden.py).

Every tiny preset and zoo model, at two loop counts, greedy and with the paper's sampling, through the
continuous scheduler (two caps and block sizes) and the static path: a faster engine that changes one
token anywhere fails here, naming the model and case.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import engine_golden  # noqa: E402


@pytest.mark.slow
def test_every_preset_and_zoo_model_generates_what_it_generated_before():
    golden = json.loads(engine_golden.GOLDEN.read_text())["outputs"]
    assert set(golden) == set(engine_golden.specs())  # a new zoo model is recorded before it is trusted
    now = engine_golden.record()
    differ = [f"{spec} {case}" for spec in golden for case in golden[spec] if now[spec][case] != golden[spec][case]]
    assert not differ, f"outputs changed: {differ}"
    # the three batching paths agree with each other, so about a third of the cases are distinct outputs
    assert len({h for cases in golden.values() for h in cases.values()}) > 50
