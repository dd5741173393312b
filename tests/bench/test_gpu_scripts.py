"""What the GPU scripts do around the GPU, run on the CPU: the GPU check's comparison, the memory benchmark's rows.

The CUDA graphs themselves are captured only on a GPU (`bash bench/gpu_run.sh`, figures in docs/benchmarks.md);
here the check's ways all run on the CPU, where every way must give the same tokens, and a way that differs
must be counted and fail the check.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # the benchmarks' scripts, as tests/bench's others: the fast tier (-m 'not slow') skips them

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_engine  # noqa: E402
import gpu_check  # noqa: E402


@pytest.fixture
def cpu_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gpu_check, "WAYS", {way: {**options, "device": "cpu"} for way, options in gpu_check.WAYS.items()})


def test_every_way_on_the_cpu_gives_the_same_tokens(cpu_ways: None) -> None:
    row = gpu_check.check("melt-tiny", new_tokens=6)
    assert row == {"ok": True, "greedy": dict.fromkeys(("padded", "eager", "static", "cpu"), "6/6"),
                   "sampled": dict.fromkeys(("padded", "eager", "static", "cpu"), "12/12")}


def test_a_way_that_differs_is_counted_and_fails_the_check(cpu_ways: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = gpu_check.generate

    def padded_differs(model, way, prompts, greedy, new_tokens):
        ids = real(model, way, prompts, greedy, new_tokens)
        return [ids[0][:-1] + [ids[0][-1] + 1]] + ids[1:] if way == "padded" else ids

    monkeypatch.setattr(gpu_check, "generate", padded_differs)
    row = gpu_check.check("qwen3-tiny", new_tokens=4)
    assert row["ok"] is False
    assert row["greedy"]["padded"] == "5/6" and row["sampled"]["padded"] == "11/12" and row["greedy"]["cpu"] == "6/6"


def test_the_gpu_check_says_it_needs_cuda_without_one() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the check would run")
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == "bench/gpu_check.py needs CUDA"


def test_the_memory_benchmark_reports_a_failing_preset_and_measures_the_others() -> None:
    out = bench_engine.bench_memory("cpu", ["qwen3-tiny", "no-such-preset"], context=40, new_tokens=4, batches=(1, 2))
    assert list(out["models"]["no-such-preset"]) == ["error"]
    assert out["models"]["no-such-preset"]["error"].startswith("AdapterError: unknown preset 'no-such-preset' (known: qwen3-1.7b")
    tiny = out["models"]["qwen3-tiny"]
    assert tiny["kv_bytes"] > 0 and tiny["decode_tok_s_batch1"] > 0 and tiny["decode_tok_s_batch2"] > 0
    assert tiny["weights_bytes"] == tiny["analytic"]["weights_bytes"]
    assert list(out["checks"]) == ["qwen3-tiny batch-2 decode / transformers (target 5)"]
    assert json.loads(json.dumps(out)) == out  # the script prints it as JSON
