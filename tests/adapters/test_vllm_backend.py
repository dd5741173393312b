"""vLLM backend: the Sampling mapping and the KV-pool arithmetic, checked against figures vLLM itself
logged (quoted below with their source), plus an integration test that runs only where vLLM and a GPU are.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import adapters
from adapters import AdapterError, Sampling
from adapters.base import PAPER_PROTOCOL
from adapters.vllm_backend import (
    VLLM_OURO_PINS,
    check_served,
    kv_slots_per_layer,
    VLLM_PINS,
    KVLayout,
    finish_reason,
    kv_dtype_bytes,
    safetensors_weight_bytes,
    sampling_params_kwargs,
    used_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
GiB = 1024**3

# Llama-3.1-8B: 32 layers, 8 KV heads, head dim 128, bf16; vLLM's default block_size 16
# (CacheConfig.DEFAULT_BLOCK_SIZE in vllm/config/cache.py).
LLAMA_8B = KVLayout(block_size=16, num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from adapters.testing import save_tiny_qwen3

    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


def test_block_bytes_follow_vllm_page_size_formula() -> None:
    # vllm/v1/kv_cache_interface.py, AttentionSpec.real_page_size_bytes, is per layer:
    # 2 * block_size * num_kv_heads * head_size * dtype_size; a block spans all layers.
    per_layer = 2 * 16 * 8 * 128 * 2
    assert LLAMA_8B.block_bytes == 32 * per_layer == 2 * 1024 * 1024


def test_pool_matches_vllm_startup_log_on_an_rtx_3090() -> None:
    # vllm-project/vllm issue 10517, meta-llama/Llama-3.1-8B-Instruct on an RTX 3090, gpu_memory_utilization 0.90:
    #   "kv_cache_size=3.81GiB ... GPU blocks: 1952 ... Maximum concurrency for 20000 tokens per request: 1.56x"
    #   "kv_cache_size=2.89GiB ... # GPU blocks: 1478 ... Maximum concurrency for 29000 tokens per request: 0.82x"
    #   "... the maximum number of tokens that can be stored in KV cache (23648)"
    assert f"{LLAMA_8B.pool_bytes(1952) / GiB:.2f}" == "3.81"
    assert f"{LLAMA_8B.max_concurrency(1952, 20000):.2f}" == "1.56"
    assert f"{LLAMA_8B.pool_bytes(1478) / GiB:.2f}" == "2.89"
    assert f"{LLAMA_8B.max_concurrency(1478, 29000):.2f}" == "0.82"
    assert LLAMA_8B.pool_tokens(1478) == 23648


def test_pool_tokens_match_vllm_v1_log_line() -> None:
    # vllm-project/vllm pull request 13596 (V1): "# GPU blocks: 127626" became
    # "GPU KV cache size: 2,042,016 tokens" and "Maximum concurrency for 2,048 tokens per request: 997.08x"
    assert f"{LLAMA_8B.pool_tokens(127626):,}" == "2,042,016"
    assert f"{LLAMA_8B.max_concurrency(127626, 2048):.2f}" == "997.08"


def test_qwen3_block_and_used_kv_agree_with_the_design_measurement() -> None:
    # Qwen3-1.7B (docs/benchmarks.md): 28 layers, 8 KV heads, head dim 128, bf16; measured KV at 32000 tokens: 3.67 GB.
    qwen3 = KVLayout(
        block_size=16, num_layers=28, num_kv_heads=8, head_dim=128, dtype_bytes=kv_dtype_bytes("auto", "bfloat16")
    )
    assert qwen3.block_bytes == 1_835_008
    blocks = qwen3.blocks_for(32000)
    assert blocks == 2000 and f"{blocks * qwen3.block_bytes / 1e9:.2f}" == "3.67"
    assert qwen3.blocks_for(32001) == 2001  # a partly filled last block still counts whole
    pool = qwen3.pool_bytes(10_000)
    assert used_bytes(0.2, pool) == blocks * qwen3.block_bytes  # the usage gauge is a fraction of the pool's blocks
    assert used_bytes(0.0, pool) == 0 and used_bytes(1.0, pool) == pool
    with pytest.raises(ValueError, match="fraction"):
        used_bytes(20.0, pool)  # a percentage passed by mistake


def test_kv_dtype_bytes() -> None:
    assert kv_dtype_bytes("auto", "bfloat16") == 2
    assert kv_dtype_bytes("auto", "torch.float16") == 2
    assert kv_dtype_bytes("fp8_e4m3", "bfloat16") == 1
    with pytest.raises(AdapterError, match="dtype 'int3' is not one of"):
        kv_dtype_bytes("int3", "bfloat16")


def test_sampling_maps_to_sampling_params() -> None:
    # Field names as vllm.SamplingParams documents them (docs.vllm.ai, Inference Parameters).
    documented = {
        "n",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "max_tokens",
        "include_stop_str_in_output",
        "skip_special_tokens",
    }
    paper = sampling_params_kwargs(PAPER_PROTOCOL)
    assert set(paper) <= documented
    assert (paper["temperature"], paper["top_p"], paper["max_tokens"], paper["n"], paper["seed"]) == (
        1.0,
        0.7,
        32768,
        4,
        0,
    )
    assert paper["top_k"] == 0 and paper["stop"] is None  # 0: "consider all tokens"
    greedy = sampling_params_kwargs(
        Sampling(temperature=0, top_p=0.5, top_k=5, max_new_tokens=7, n=3, seed=9, stop=("\n\n", "END"))
    )
    assert greedy["temperature"] == 0.0 and greedy["top_p"] == 1.0 and greedy["top_k"] == 0
    assert (greedy["max_tokens"], greedy["n"], greedy["seed"], greedy["stop"]) == (7, 3, 9, ["\n\n", "END"])
    assert sampling_params_kwargs(Sampling(top_k=20))["top_k"] == 20


def test_finish_reasons() -> None:
    assert finish_reason("length", None) == "length"
    assert finish_reason("stop", None) == "eos"
    assert finish_reason("stop", 151645) == "eos"  # a stop token id (Qwen3's <|im_end|>)
    assert finish_reason("stop", "\n\n") == "stop"
    with pytest.raises(AdapterError, match="'abort'"):
        finish_reason("abort", None)


def test_weight_bytes_from_safetensors_headers(tiny_qwen3: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3, local_files_only=True, dtype=torch.float32)
    stored = sum(p.numel() * p.element_size() for p in model.parameters())
    assert safetensors_weight_bytes(tiny_qwen3) == stored
    assert safetensors_weight_bytes(tiny_qwen3, "bfloat16") == stored // 2
    with pytest.raises(AdapterError, match="no \\*.safetensors"):
        safetensors_weight_bytes(tiny_qwen3 / "nowhere")


def test_extra_pins_match_the_documented_ones() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert tuple(project["optional-dependencies"]["vllm"]) == VLLM_PINS
    assert not any(dep.startswith("vllm") for dep in project["dependencies"]), (
        "vLLM must never be in the default install"
    )
    doc = (ROOT / "docs" / "adding-adapters.md").read_text()
    assert all(pin in doc for pin in VLLM_PINS), "docs/adding-adapters.md must list the vllm extra's pins"


def test_module_imports_without_vllm_and_says_how_to_install(tiny_qwen3: Path) -> None:
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # vLLM unimportable, as on this machine and the GPU machine
        "import adapters\n"
        "assert 'vllm' in [e.prefix for e in adapters.available()]\n"
        "try:\n"
        f"    adapters.load('vllm:{tiny_qwen3}')\n"
        "except adapters.AdapterError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "vLLM is not installed" in out.stdout and "loopeval[vllm]" in out.stdout


def test_bad_vllm_arguments_are_user_errors(tiny_qwen3: Path, tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="no config.json"):
        adapters.load(f"vllm:{tmp_path}")
    with pytest.raises(AdapterError, match="gpu_memory_utilization must be in \\(0, 1\\]"):
        adapters.load(f"vllm:{tiny_qwen3}", gpu_memory_utilization=1.5)
    with pytest.raises(AdapterError, match="loops must be 1"):
        adapters.load(f"vllm:{tiny_qwen3}", loops=4)
    with pytest.raises(AdapterError, match="tensor_parallel_size must be a positive integer"):
        adapters.load(f"vllm:{tiny_qwen3}", tensor_parallel_size=0)


def test_a_sweep_plans_a_vllm_model_without_loading_it(tiny_qwen3: Path) -> None:
    """The submitter of a Ray sweep may have neither vLLM nor a GPU: the spec is checked from its folder."""
    from harness.planning.plan import prepare_sweep
    from harness.planning.spec import RunSpec

    spec = f"vllm:{tiny_qwen3}"
    assert adapters.inspect(spec, tensor_parallel_size=2)["tensor_parallel_size"] == 2
    plan = prepare_sweep(
        RunSpec.build(
            models=[spec], tasks=["lookup"], loops=[1, 4], model_overrides={spec: {"tensor_parallel_size": 2}}
        )
    )
    assert [(r.model, r.loops) for r in plan.runs] == [
        (spec, None)
    ] and plan.loaded == {}  # a vLLM model does not loop (no r, no exit threshold), and nothing was loaded
    with pytest.raises(AdapterError, match="tensor_parallel_size must be a positive integer"):
        adapters.inspect(spec, tensor_parallel_size=1.5)


def _vllm_and_gpu() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (optional extra loopeval[vllm]; it pins torch 2.14.0)"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU: vLLM needs one"
    return None


@pytest.mark.skipif(_vllm_and_gpu() is not None, reason=_vllm_and_gpu() or "")
def test_vllm_integration_passes_the_kit(tiny_qwen3: Path) -> None:
    from harness.conformance import check_adapter

    adapter = adapters.load(f"vllm:{tiny_qwen3}", gpu_memory_utilization=0.2, max_model_len=128)
    report = check_adapter(adapter, bridge=False)
    assert report.ok, str(report)
    parts = adapter.memory_breakdown()
    pool = parts["reserved_kv_pool"]
    assert pool["bytes"] == pool["num_gpu_blocks"] * adapter.layout.block_bytes
    assert adapter.memory()["kv_bytes_peak"] <= pool["bytes"]
    if parts["nvml"]["nvml_process_used"] is not None:
        assert parts["nvml"]["nvml_process_used"] > pool["bytes"]  # NVML sees the whole reserved pool and more


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("version", "served"),
    [
        ("0.11.0", False),
        ("0.11.1", True),
        ("0.26.0", True),
        ("0.26.0+cu130", True),
        ("0.27.0", False),
        ("0.33.0", False),
    ],
)
def test_ouro_is_served_only_by_the_vllm_releases_that_carried_it(tmp_path: Path, version: str, served: bool) -> None:
    folder = _folder(tmp_path, {"architectures": ["OuroForCausalLM"]})
    if served:
        check_served(folder, "vllm:x", version)
        return
    with pytest.raises(AdapterError) as refused:
        check_served(folder, "vllm:x", version)
    assert str(refused.value) == (
        f"vllm:x: vLLM {version} does not serve OuroForCausalLM (vLLM carried it in 0.11.1 to 0.26.0): run it on the "
        f"engine as ouro:{folder}, or install the vllm-ouro extra (vLLM 0.26.0) in an environment of its own"
    )


def test_huginn_and_engine_checkpoints_are_sent_to_the_engine_and_plain_models_pass(tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match=r"vLLM does not serve RavenForCausalLM; run it on the engine as huginn:"):
        check_served(_folder(tmp_path, {"architectures": ["RavenForCausalLM"]}), "vllm:x", "0.26.0")
    with pytest.raises(AdapterError, match=r"a loopeval engine checkpoint; vLLM does not serve it: run it as melt:"):
        check_served(_folder(tmp_path, {"format": "loopeval-engine", "config": {}}), "vllm:x", "0.33.0")
    check_served(_folder(tmp_path, {"architectures": ["Qwen3ForCausalLM"]}), "vllm:x", "0.33.0")


def test_the_ouro_extra_pins_the_last_vllm_with_ouro_and_is_documented() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert tuple(extras["vllm-ouro"]) == VLLM_OURO_PINS and "vllm==0.26.0" in VLLM_OURO_PINS
    for doc in ("README.md", "docs/adding-adapters.md"):
        assert "vllm-ouro" in (ROOT / doc).read_text(), doc


def test_the_pool_counts_ouros_slot_per_loop_as_vllm_holds_it() -> None:
    assert kv_slots_per_layer({"architectures": ["OuroForCausalLM"], "total_ut_steps": 4}) == 4
    assert kv_slots_per_layer({"architectures": ["Qwen3ForCausalLM"], "total_ut_steps": 4}) == 1
    assert kv_slots_per_layer({}) == 1
