"""`.ci/run` runs the numerics tests (`-m numerics`: references, golden outputs, parity) a second time on other kernels,
so that one machine's CI catches a tolerance that holds only on its own CPU's rounding."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CI = (ROOT / ".ci" / "run").read_text()


def capability(env: dict[str, str]) -> str:
    """The ATen CPU capability torch dispatches to under `env`."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return run.stdout.strip()


def test_the_second_run_dispatches_to_other_kernels_than_the_first():
    """The capability `.ci/run` chooses (its own line, run by bash on this machine) is one torch takes, and not the
    one the main run used: the second run rounds differently."""
    choose = next(line for line in CI.splitlines() if line.startswith("if ") and "capability=" in line)
    run = subprocess.run(["bash", "-c", f"{choose}\necho $capability"], capture_output=True, text=True, check=True)
    chosen = run.stdout.strip()
    assert re.search(r"^ATEN_CPU_CAPABILITY=\$capability \S+python -m pytest -q -m numerics$", CI, re.MULTILINE)
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    assert capability({**env, "ATEN_CPU_CAPABILITY": chosen}) == chosen.upper() != capability(env)


def test_the_numerics_marker_selects_references_golden_outputs_and_parity():
    files = [
        "tests/adapters/engine/families/test_huginn.py",
        "tests/adapters/engine/test_golden.py",
        "tests/adapters/engine/test_model.py",
        "tests/adapters/engine/test_memory.py",
    ]
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-n",
            "0",
            "-p",
            "no:cacheprovider",
            "-m",
            "numerics",
            *files,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    selected = {line.split("[")[0] for line in out.splitlines() if "::" in line}
    assert {
        "tests/adapters/engine/families/test_huginn.py::test_huginn_logits_match_the_official_code",
        "tests/adapters/engine/test_golden.py::test_the_model_generates_what_it_generated_before",
        "tests/adapters/engine/test_model.py::test_hf_qwen3_logits_and_greedy_match",
    } <= selected
    assert "tests/adapters/engine/test_memory.py::test_params_match_the_model_for_every_preset" not in selected
