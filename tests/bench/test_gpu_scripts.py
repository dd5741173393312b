"""What the GPU scripts do around the GPU, run on the CPU: the GPU check's comparison, the memory benchmark's rows,
and the harness's pipeline that bench/gpu_run.sh runs on cuda.

The CUDA graphs themselves are captured only on a GPU (`bash bench/gpu_run.sh`, figures in docs/benchmarks.md);
here the check's ways all run on the CPU, where every way must give the same tokens, and a way that differs
must be counted and fail the check. The pipeline (`loopeval run --device`, the report, `bench/pipeline_check.py`)
runs here on cpu; only what needs NVML (its memory series and the energy counter) waits for a GPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from harness.errors import UserError
from harness.measurement.sampler import MemorySampler
from harness.planning.sweep import build_request
from tests.support.sqlite import query

pytestmark = (
    pytest.mark.slow
)  # the benchmarks' scripts, as tests/bench's others: the fast tier (-m 'not slow') skips them

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import bench_engine  # noqa: E402
import gpu_check  # noqa: E402
import pipeline_check  # noqa: E402

TASK = "chain2"  # one synthetic task keeps the pipeline's runs short


@pytest.fixture
def cpu_ways(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        gpu_check, "WAYS", {way: {**options, "device": "cpu"} for way, options in gpu_check.WAYS.items()}
    )


def test_every_way_on_the_cpu_gives_the_same_tokens(cpu_ways: None) -> None:
    row = gpu_check.check("melt-tiny", new_tokens=6)
    assert set(row.pop("seconds")) == set(gpu_check.WAYS)  # each way timed
    assert row == {
        "ok": True,
        "greedy": dict.fromkeys(("sdpa", "padded", "eager", "static", "cpu"), "6/6"),
        "sampled": dict.fromkeys(("sdpa", "padded", "eager", "static", "cpu"), "12/12"),
    }


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
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1] == "bench/gpu_check.py needs CUDA"


def test_the_memory_benchmark_reports_a_failing_preset_and_measures_the_others() -> None:
    out = bench_engine.bench_memory("cpu", ["qwen3-tiny", "no-such-preset"], context=40, new_tokens=4, batches=(1, 2))
    assert list(out["models"]["no-such-preset"]) == ["error"]
    assert out["models"]["no-such-preset"]["error"].startswith(
        "AdapterError: unknown preset 'no-such-preset' (known: qwen3-1.7b"
    )
    tiny = out["models"]["qwen3-tiny"]
    assert tiny["kv_bytes"] > 0 and tiny["decode_tok_s_batch1"] > 0 and tiny["decode_tok_s_batch2"] > 0
    assert tiny["weights_bytes"] == tiny["analytic"]["weights_bytes"]
    bound, rest = list(out["checks"].items())[0], list(out["checks"])[1:]
    assert bound[0] == "qwen3-tiny batch-1 decode / bandwidth bound (target >= 0.75)"
    assert rest == ["qwen3-tiny batch-2 decode / transformers (target 5)"]
    # measured / bound, the bound being the bandwidth over the bytes a step reads; no nominal bandwidth for a CPU
    ratio = bound[1]
    assert ratio["bytes_per_step"] == tiny["decode_bytes_read_batch1"] > tiny["weights_bytes"]
    assert ratio["ratio_to_measured_bandwidth"] == round(
        ratio["tok_s"] * ratio["bytes_per_step"] / out["read_bandwidth_measured"], 3
    )
    assert "ratio" not in ratio
    assert json.loads(json.dumps(out)) == out  # the script prints it as JSON


def loopeval(*args: object) -> subprocess.CompletedProcess[str]:
    """The CLI as bench/gpu_run.sh calls it on the GPU machine (no console script there)."""
    argv = [sys.executable, "-c", "from harness.cli import entry; entry()", *map(str, args)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_a_run_on_cuda_without_cuda_is_refused_in_one_line_before_anything_is_written(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the run would start")
    db = tmp_path / "r.sqlite"
    done = loopeval("run", "--device", "cuda", "--db", db)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"loopeval: error: --device cuda: torch {torch.__version__} sees no CUDA device on this machine (use --device cpu)"
    ]
    assert not db.exists()


def test_device_is_every_models_override_where_its_own_sets_none(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        'models = ["zoo:ouro-tiny", {spec = "zoo:melt-tiny", overrides = {device = "cuda"}}]\ndevice = "cpu"\n'
    )
    if not torch.cuda.is_available():  # a model's own device is checked as --device is: cuda needs a CUDA device
        with pytest.raises(UserError, match="^overrides of zoo:melt-tiny: device cuda: torch .* sees no CUDA device"):
            build_request({}, str(sweep))
        sweep.write_text(sweep.read_text().replace('device = "cuda"', 'device = "cpu"').replace('device = "cpu"\n', ""))
    (spec,) = build_request({}, str(sweep)).specs
    own = "cuda" if torch.cuda.is_available() else "cpu"
    assert spec.load_overrides("zoo:melt-tiny") == {"seed": 0, "device": own}, "the model's own override wins"
    assert spec.load_overrides("zoo:ouro-tiny") == ({"seed": 0, "device": "cpu"} if own == "cuda" else {"seed": 0})
    (plain,) = build_request(dict(models=["zoo:ouro-tiny"])).specs
    assert plain.load_overrides("zoo:ouro-tiny") == {"seed": 0}, "no --device: each model's own device"
    with pytest.raises(UserError, match="^--device must be cpu or cuda, got 'gpu'$"):
        build_request(dict(models=["zoo:ouro-tiny"], device="gpu"))


def test_the_gpu_pipeline_on_the_cpu(tmp_path: Path) -> None:
    """gpu_run.sh's pipeline with --device cpu: the run, the report from its store, and the check reading the store,
    which finds everything but what only NVML gives (no NVML here: `test_a_cuda_run_stores_nvml_series_and_energy`)."""
    db = tmp_path / "loopeval.sqlite"
    run = loopeval(
        "run",
        "--device",
        "cpu",
        "--model",
        "zoo:ouro-tiny",
        "--loops",
        "1,2",
        "--tasks",
        TASK,
        "--limit",
        "2",
        "--db",
        db,
        "--no-report",
    )
    assert run.returncode == 0, run.stderr
    assert [json.loads(o) for (o,) in query(db, "SELECT json_extract(spec, '$.model_overrides') FROM runs")] == [
        {"zoo:ouro-tiny": {"device": "cpu"}}
    ] * 2
    report = loopeval("dashboard", "--db", db, "--out", tmp_path / "report.html")
    assert report.returncode == 0, report.stderr
    assert "zoo:ouro-tiny" in (tmp_path / "report.html").read_text()
    result = pipeline_check.check(db)
    runs = result["runs"]
    assert [(r["model"], r["loops"], r["status"], r["device"], r["samples"]) for r in runs] == [
        ("zoo:ouro-tiny", loops, "finished", "cpu", 2 * 2) for loops in (1, 2)
    ]  # 2 docs x the synthetic suite's 2 samples
    assert all(r["ticks"] > 0 for r in runs)
    nvml = MemorySampler().unavailable.get("nvml")
    if nvml is None:
        pytest.skip("NVML is present: test_a_cuda_run_stores_nvml_series_and_energy checks what it gives")
    assert [(r["nvml_ticks"], r["energy_joules"]) for r in runs] == [(0, None)] * 2, "no NVML: NULL, never 0"
    assert result["ok"] is False and result["problems"] == [
        problem
        for r in runs
        for problem in (
            f"run {r['id']} (zoo:ouro-tiny r={r['loops']}): no NVML reading in its {r['ticks']} memory ticks",
            f"run {r['id']} (zoo:ouro-tiny r={r['loops']}): NVML energy None",
        )
    ]


def test_a_cuda_run_stores_nvml_series_and_energy(tmp_path: Path) -> None:
    """On a GPU the run stores NVML's series and energy (nvmlDeviceGetTotalEnergyConsumption's delta) for each run."""
    sampler = MemorySampler()
    if not torch.cuda.is_available() or sampler.unavailable.get("nvml"):
        pytest.skip(
            f"needs CUDA and NVML, absent here ({sampler.unavailable.get('nvml') or 'no CUDA'}): bench/gpu_run.sh "
            "checks it on the GPU (pipeline_check.json)"
        )
    db = tmp_path / "loopeval.sqlite"
    run = loopeval(
        "run",
        "--device",
        "cuda",
        "--model",
        "zoo:ouro-tiny",
        "--loops",
        "1",
        "--tasks",
        TASK,
        "--limit",
        "2",
        "--db",
        db,
        "--no-report",
    )
    assert run.returncode == 0, run.stderr
    result = pipeline_check.check(db)
    assert result["ok"], result["problems"]


def test_gpu_run_fits_one_device_call_with_room_to_start() -> None:
    """Each step's own limit, summed: at most 8 of the device call's 10 minutes."""
    script = (ROOT / "bench" / "gpu_run.sh").read_text()
    limits = [int(n) for n in re.findall(r"(?:timeout |_LIMIT:-|run \S+ )(\d+)", script)]
    assert len(limits) == 11 and sum(limits) <= 480
