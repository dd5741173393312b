"""vLLM backend: `vllm:PATH` runs a local checkpoint through vLLM's offline `LLM` API.

vLLM is an optional extra, never part of the default install, because it pins its own torch and
transformers (vLLM 0.33: torch 2.14.0, transformers < 5.21) and loopeval's engine does not need it:

    python -m venv .venv-vllm && .venv-vllm/bin/pip install -e ".[vllm]"   # a separate venv: other torch

vLLM carried an `OuroForCausalLM` (vllm/model_executor/models/ouro.py, vllm-project/vllm pull request 27794)
in releases 0.11.1 through 0.26.0, not before and not from 0.27.0 on (0.34.0 the newest checked; the wheels'
file lists, `scripts/wheel_files.py`, 2026-12-04): the vLLM 0.33 above has none. It kept one KV slot per
(loop, layer) and always ran every loop (no early exit); the KV pool arithmetic below counts the config's
layers (`get_num_layers`), not Ouro's T x layers slots.
Ouro and MELT therefore run on the engine, whose KV accounting is exact per family; this backend is for
Qwen3 and other architectures vLLM supports. This module imports without vLLM: `vllm` is imported only when
an adapter is built, and everything that can be checked without a GPU (the Sampling mapping, the
finish-reason mapping, the KV pool arithmetic, the weight bytes) is a pure function below.

Memory is reported in three separate parts, because a pre-allocating engine would otherwise look as
if it used the whole GPU:

- reserved KV pool (`kv_bytes_allocated`): vLLM carves `num_gpu_blocks` blocks out of
  `gpu_memory_utilization` x GPU memory at start-up; one block holds `block_size` tokens of K and V
  for every layer: `block_size x num_layers x 2 x num_kv_heads x head_dim x dtype bytes`;
- KV actually used (`kv_bytes_used`): vLLM's own gauge `vllm:kv_cache_usage_perc` (a fraction of
  the pool's blocks in use) times the pool bytes, read live from `LLM.get_metrics()`;
  `kv_bytes_peak` is the largest value seen, and at least the blocks the last batch needed;
- NVML totals (`nvml()`): device and process used bytes, which include the whole reserved pool,
  CUDA graphs and the allocator's slack.

With `tensor_parallel_size = T` (the `tensor_parallel_size` override, for a model spread over T GPUs)
each GPU holds its share of the KV heads of every block, and the KV bytes above are the sum over the
T GPUs, like `weights_bytes`.
"""

from __future__ import annotations

import json
import math
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from adapters.engine.config import ENGINE_FORMAT
from adapters.base import DTYPE_BYTES, AdapterError, FinishReason, Generation, Prompt, Sampling, dtype_short
from adapters.files import check_closed
from adapters.registry import register
from measures import MEMORY_KEYS

# The pins of the `vllm` extra (pyproject.toml); vLLM 0.33 brings these torch/transformers versions.
VLLM_PINS: tuple[str, ...] = ("vllm==0.33.0", "torch==2.14.0", "transformers>=4.56,<5.21")
# The `vllm-ouro` extra: the last vLLM that carried Ouro, with the torch it pins (its own environment too).
VLLM_OURO_PINS: tuple[str, ...] = ("vllm==0.26.0", "torch==2.11.0", "transformers>=5.5.3")
# The looped architectures vLLM carried, by config.json name: the releases that had it (first, last). Huginn's
# (RavenForCausalLM) it never had, nor the engine's own checkpoints (MELT, the zoo): they run on the engine.
LOOPED_IN_VLLM = {"OuroForCausalLM": ((0, 11, 1), (0, 26, 0))}
ENGINE_ONLY = {"RavenForCausalLM": "huginn"}


# --- pure arithmetic and mappings (unit-tested without vLLM) -----------------------------------------


@dataclass(frozen=True)
class KVLayout:
    """What fixes the size of one vLLM KV block: its config values, as vLLM reports them."""

    block_size: int  # tokens per block (vLLM's CacheConfig.DEFAULT_BLOCK_SIZE is 16)
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int  # of the KV cache dtype ("auto" means the model dtype; fp8 caches are 1 byte)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def pool_bytes(self, num_gpu_blocks: int) -> int:
        """The reserved KV pool: every block vLLM allocated at start-up, used or not."""
        return num_gpu_blocks * self.block_bytes

    def pool_tokens(self, num_gpu_blocks: int) -> int:
        """vLLM's start-up line "GPU KV cache size: N tokens"."""
        return num_gpu_blocks * self.block_size

    def max_concurrency(self, num_gpu_blocks: int, max_model_len: int) -> float:
        """vLLM's start-up line "Maximum concurrency for L tokens per request: Xx"."""
        return self.pool_tokens(num_gpu_blocks) / max_model_len

    def blocks_for(self, tokens: int) -> int:
        """Blocks one sequence of `tokens` tokens holds (the last block is partly filled)."""
        return math.ceil(tokens / self.block_size)


def kv_dtype_bytes(cache_dtype: str, model_dtype: str) -> int:
    """Bytes per KV element: vLLM's `kv_cache_dtype="auto"` stores K/V in the model dtype."""
    name = model_dtype if cache_dtype == "auto" else cache_dtype
    return DTYPE_BYTES[dtype_short(name)]


def used_bytes(usage_fraction: float, pool_bytes: int) -> int:
    """KV bytes in use from vLLM's `kv_cache_usage_perc` gauge, which is a fraction (1.0 = the whole pool)."""
    if not 0.0 <= usage_fraction <= 1.0:
        raise ValueError(f"kv_cache_usage_perc must be a fraction in [0, 1], got {usage_fraction}")
    return round(usage_fraction * pool_bytes)


def sampling_params_kwargs(sampling: Sampling) -> dict[str, Any]:
    """loopeval's Sampling as `vllm.SamplingParams` keyword arguments (the paper protocol maps 1:1).

    Greedy is temperature 0 (vLLM then ignores top_p/top_k); top_k None is vLLM's 0 ("consider all
    tokens"); the seed is per request, so the same call reproduces; EOS stops unless a user asks
    otherwise; stop strings are not kept in the text, as the engine does.
    """
    return {
        "n": sampling.n,
        "temperature": float(sampling.temperature),
        "top_p": 1.0 if sampling.greedy else float(sampling.top_p),
        "top_k": 0 if sampling.greedy or sampling.top_k is None else int(sampling.top_k),
        "max_tokens": sampling.max_new_tokens,
        "seed": sampling.seed,
        "stop": list(sampling.stop) or None,
        "include_stop_str_in_output": False,
        "skip_special_tokens": True,
    }


def finish_reason(vllm_reason: str | None, stop_reason: int | str | None) -> FinishReason:
    """vLLM says "stop" both for EOS (stop_reason None or a stop token id) and for a stop string (str)."""
    if vllm_reason == "length":
        return "length"
    if vllm_reason == "stop":
        return "stop" if isinstance(stop_reason, str) else "eos"
    raise AdapterError(f"vLLM finished a sequence with reason {vllm_reason!r}; expected 'stop' or 'length'")


def safetensors_weight_bytes(folder: str | Path, dtype: str | None = None) -> int:
    """Bytes of the checkpoint's tensors, read from the safetensors headers (no tensor is loaded).

    With `dtype` (the dtype vLLM runs in), floating tensors are counted at that width, since vLLM
    casts them on load; integer (quantised) tensors keep their stored width.
    """
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise AdapterError(f"{folder}: no *.safetensors files to count weights from")
    total = 0
    target = DTYPE_BYTES[dtype_short(dtype)] if dtype is not None else None
    for file in files:
        with open(file, "rb") as fh:
            (length,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(length))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            count = math.prod(info["shape"])
            stored = DTYPE_BYTES[dtype_short(info["dtype"])]
            floating = info["dtype"].startswith(("F", "BF"))
            total += count * (target if target is not None and floating else stored)
    return total


def nvml() -> dict[str, int | None]:
    """NVML's device used/total bytes and this process's used bytes (None where NVML cannot tell)."""
    import os

    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no driver / no NVIDIA GPU: unavailable, never zero
        return {"nvml_device_used": None, "nvml_device_total": None, "nvml_process_used": None}
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
    return {
        "nvml_device_used": int(info.used),
        "nvml_device_total": int(info.total),
        "nvml_process_used": int(mine[0]) if mine and mine[0] else None,
    }


# --- the adapter (needs vLLM and a GPU) ----------------------------------------------------------------


class VLLMAdapter:
    """An `Adapter` around `vllm.LLM`. Built by `load_vllm`; see the module docstring for memory."""

    def __init__(self, spec: str, llm: Any, *, path: str):
        self.spec = spec
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        engine = llm.llm_engine
        vconf = engine.vllm_config
        model_config, cache_config, parallel = vconf.model_config, vconf.cache_config, vconf.parallel_config
        self.max_context = int(model_config.max_model_len)
        self.dtype = str(model_config.dtype).removeprefix("torch.")
        self.layout = KVLayout(
            block_size=int(cache_config.block_size),
            num_layers=int(model_config.get_num_layers(parallel))
            * kv_slots_per_layer(json.loads((Path(path) / "config.json").read_text())),
            num_kv_heads=int(model_config.get_num_kv_heads(parallel)),
            head_dim=int(model_config.get_head_size()),
            dtype_bytes=kv_dtype_bytes(str(cache_config.cache_dtype), self.dtype),
        )
        self.num_gpu_blocks: int | None = cache_config.num_gpu_blocks
        self.gpu_memory_utilization = float(cache_config.gpu_memory_utilization)
        self.tensor_parallel_size = int(parallel.tensor_parallel_size)  # GPUs holding this model
        self.weights_bytes = safetensors_weight_bytes(path, self.dtype)
        self._kv_peak = 0

    @property
    def pool_bytes(self) -> int | None:
        """The KV pool over all of the model's GPUs: with tensor parallelism each GPU holds its heads' share of every block."""
        return self.layout.pool_bytes(self.num_gpu_blocks) * self.tensor_parallel_size if self.num_gpu_blocks else None

    def forward_logits(self, input_ids: Any) -> Any:
        raise AdapterError(
            f"{self.spec}: vLLM does not expose full-sequence logits; use transformers:PATH for loglikelihood tasks"
        )

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        from vllm import SamplingParams

        requests: list[Any] = []
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise AdapterError(f"prompt {i} is empty: give at least one character or token")
            ids = self.tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p]
            if len(ids) >= self.max_context:
                raise AdapterError(
                    f"prompt {i} has {len(ids)} tokens but {self.spec} holds at most {self.max_context} (max_model_len)"
                )
            requests.append({"prompt_token_ids": ids})
        kwargs = sampling_params_kwargs(sampling)
        longest = max(len(r["prompt_token_ids"]) for r in requests)
        kwargs["max_tokens"] = min(kwargs["max_tokens"], self.max_context - longest)
        start = time.perf_counter()
        outputs = self.llm.generate(requests, SamplingParams(**kwargs), use_tqdm=False)
        seconds = time.perf_counter() - start
        needed = sum(
            self.layout.blocks_for(len(o.prompt_token_ids) + len(c.token_ids)) for o in outputs for c in o.outputs
        )
        if self.num_gpu_blocks:
            self._kv_peak = max(
                self._kv_peak, min(needed, self.num_gpu_blocks) * self.layout.block_bytes * self.tensor_parallel_size
            )
        return [
            Generation(
                token_ids=list(c.token_ids),
                text=c.text,
                finish_reason=finish_reason(c.finish_reason, c.stop_reason),
                prompt_tokens=len(o.prompt_token_ids),
                generated_tokens=len(c.token_ids),
                decode_seconds=seconds,
            )
            for o in outputs
            for c in sorted(o.outputs, key=lambda c: c.index)
        ]

    def _usage_fraction(self) -> float | None:
        for metric in self.llm.get_metrics():
            if metric.name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
                return float(metric.value)
        return None

    def memory(self) -> dict[str, int | None]:
        pool = self.pool_bytes
        fraction = self._usage_fraction()
        used = used_bytes(fraction, pool) if pool is not None and fraction is not None else None
        if used is not None:
            self._kv_peak = max(self._kv_peak, used)
        values = {
            "weights_bytes": self.weights_bytes,
            "kv_bytes_allocated": pool,
            "kv_bytes_used": used,
            "kv_bytes_peak": self._kv_peak if pool is not None else None,
        }
        return {key: values[key] for key in MEMORY_KEYS}

    def memory_breakdown(self) -> dict[str, dict[str, Any]]:
        """The three measures side by side, as the module docstring explains them."""
        return {
            "reserved_kv_pool": {
                "bytes": self.pool_bytes,
                "num_gpu_blocks": self.num_gpu_blocks,
                "block_bytes": self.layout.block_bytes,
                "block_size": self.layout.block_size,
                "gpu_memory_utilization": self.gpu_memory_utilization,
                "tensor_parallel_size": self.tensor_parallel_size,
            },
            "kv_used": {
                "bytes": self.memory()["kv_bytes_used"],
                "peak_bytes": self._kv_peak,
                "source": "vllm:kv_cache_usage_perc",
            },
            "nvml": nvml(),
        }

    def describe(self) -> dict[str, Any]:
        import vllm

        return {
            "family": "vllm",
            "vllm_version": vllm.__version__,
            "params": None,
            "loops": 1,
            "kv_strategy": "standard",
            "dtype": self.dtype,
            "device": "cuda",
            "max_context": self.max_context,
            "weights_bytes": self.weights_bytes,
            "kv_layout": self.layout.__dict__,
            "num_gpu_blocks": self.num_gpu_blocks,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "tensor_parallel_size": self.tensor_parallel_size,
        }


def _release(version: str) -> tuple[int, ...]:
    """(0, 26, 0) of "0.26.0" or "0.26.0+cu130" (the numbers before any local or pre-release part)."""
    numbers = []
    for part in version.split("+")[0].split("."):
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def kv_slots_per_layer(config: dict[str, Any]) -> int:
    """K/V slots vLLM keeps per layer and token: Ouro's one per loop (`total_ut_steps`), one for every other model."""
    if "OuroForCausalLM" in (config.get("architectures") or []):
        return int(config.get("total_ut_steps", 4))
    return 1


def check_served(folder: Path, spec: str, vllm_version: str) -> None:
    """Refuse a looped checkpoint the installed vLLM does not serve, naming where it runs instead."""
    config = json.loads((folder / "config.json").read_text())
    if not isinstance(config, dict):
        return  # vLLM's own loader says what is wrong with it
    if config.get("format") == ENGINE_FORMAT:
        raise AdapterError(f"{spec}: a loopeval engine checkpoint; vLLM does not serve it: run it as melt:{folder}")
    names = config.get("architectures") or []
    for name in names if isinstance(names, list) else []:
        if name in ENGINE_ONLY:
            raise AdapterError(
                f"{spec}: vLLM does not serve {name}; run it on the engine as {ENGINE_ONLY[name]}:{folder}"
            )
        if name in LOOPED_IN_VLLM and not LOOPED_IN_VLLM[name][0] <= _release(vllm_version) <= LOOPED_IN_VLLM[name][1]:
            first, last = (".".join(map(str, v)) for v in LOOPED_IN_VLLM[name])
            raise AdapterError(
                f"{spec}: vLLM {vllm_version} does not serve {name} (vLLM carried it in {first} to {last}): run it on "
                f"the engine as ouro:{folder}, or install the vllm-ouro extra (vLLM {last}) in an environment of its own"
            )


def inspect_vllm(
    path: str,
    *,
    dtype: str | None = None,
    device: str | None = None,
    loops: int | None = None,
    seed: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    trust_remote_code: bool = False,
    tensor_parallel_size: int = 1,
) -> dict[str, Any]:
    """Check a `vllm:PATH` spec and its overrides without vLLM or a GPU: a vLLM model never loops.

    Planning a sweep then never loads the model in the submitting process, which on a Ray cluster
    may have neither.
    """
    spec = f"vllm:{path}"
    if not (Path(path).expanduser() / "config.json").is_file():
        raise AdapterError(f"{spec}: not a model directory (no config.json)")
    check_closed(Path(path).expanduser())  # vLLM opens what the folder holds: no FIFO, device or shard outside it
    if loops not in (None, 1):
        raise AdapterError(f"{spec}: a vLLM model does not loop; loops must be 1, got {loops}")
    if device not in (None, "cuda"):
        raise AdapterError(f"{spec}: the vLLM backend runs on CUDA only, got device={device!r}")
    if not 0 < gpu_memory_utilization <= 1:
        raise AdapterError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise AdapterError(
            f"tensor_parallel_size must be a positive integer (GPUs for one model), got {tensor_parallel_size!r}"
        )
    return {
        "family": "vllm",
        "loops": 1,
        "kv_strategy": "standard",
        "device": "cuda",
        "tensor_parallel_size": tensor_parallel_size,
    }


@register(
    "vllm",
    "a local checkpoint through vLLM, GPU only: plain models such as Qwen3 (extra loopeval[vllm], vLLM 0.33); Ouro only "
    "with loopeval[vllm-ouro] (vLLM 0.26); no Huginn or MELT",
    inspect=inspect_vllm,
)
def load_vllm(
    path: str,
    *,
    dtype: str | None = None,
    device: str | None = None,
    loops: int | None = None,
    seed: int | None = None,
    gpu_memory_utilization: float = 0.9,
    max_model_len: int | None = None,
    trust_remote_code: bool = False,
    tensor_parallel_size: int = 1,
) -> VLLMAdapter:
    """Load `vllm:PATH`. `gpu_memory_utilization`, `max_model_len` and `tensor_parallel_size` (GPUs that
    share one model) go straight to `vllm.LLM`."""
    spec = f"vllm:{path}"
    inspect_vllm(
        path,
        loops=loops,
        device=device,
        gpu_memory_utilization=gpu_memory_utilization,
        tensor_parallel_size=tensor_parallel_size,
    )
    try:
        import vllm
        from vllm import LLM
    except ImportError as exc:
        raise AdapterError(
            f"{spec}: vLLM is not installed; install the optional extra: pip install 'loopeval[vllm]' ({exc})"
        ) from exc
    check_served(Path(path).expanduser(), spec, vllm.__version__)
    if trust_remote_code:
        print(f"loopeval: warning: trust_remote_code=True runs Python code shipped in {path}", file=sys.stderr)
    llm = LLM(
        model=str(Path(path).expanduser()),
        dtype=dtype or "auto",
        seed=seed or 0,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        trust_remote_code=trust_remote_code,
        tensor_parallel_size=tensor_parallel_size,
        disable_log_stats=False,
    )
    return VLLMAdapter(spec, llm, path=str(Path(path).expanduser()))
