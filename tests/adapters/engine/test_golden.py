"""The engine's outputs, token for token, against those recorded before its speed work (scripts/engine_golden.py).

Every tiny preset and zoo model, at two loop counts, greedy and with the paper's sampling, through the
continuous scheduler (two caps and block sizes) and the static path: a faster engine that changes one
token anywhere fails here, naming the model and case. One test per model, so that the models spread over
the test run's processes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))

import engine_golden  # noqa: E402

pytestmark = pytest.mark.numerics  # exact tokens: run again under a second ATen CPU capability by .ci/run

GOLDEN = json.loads(engine_golden.GOLDEN.read_text())["outputs"]


def test_every_preset_and_zoo_model_is_recorded() -> None:
    assert set(GOLDEN) == set(engine_golden.specs())  # a new zoo model is recorded before it is trusted
    # the three batching paths agree with each other, so about a third of the cases are distinct outputs
    assert len({h for cases in GOLDEN.values() for h in cases.values()}) > 50


@pytest.mark.slow
@pytest.mark.parametrize("spec", engine_golden.specs())
def test_the_model_generates_what_it_generated_before(spec: str) -> None:
    now = {case: engine_golden.fingerprint(out) for case, out in engine_golden.case_outputs(spec).items()}
    assert set(now) == set(GOLDEN[spec])
    differ = [case for case in GOLDEN[spec] if now[case] != GOLDEN[spec][case]]
    assert not differ, f"outputs of {spec} changed: {differ}"
