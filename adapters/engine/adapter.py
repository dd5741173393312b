"""The engine as an `Adapter`: specs `preset:NAME`, `qwen3:PATH`, `ouro:PATH`, `melt:PATH`.

Overrides (all optional): `loops` (inference r), `dtype` (fp32/bf16/fp16), `device`, `seed`
(random init of presets), `chunk_size` (MELT prefill chunk), `max_batch` (sequences per generate
batch), `exit_policy` ("none", "fixed", "threshold") with `exit_loop` / `exit_threshold` (default:
the checkpoint's `early_exit_threshold`, see `exit_policy`).
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

import torch

from adapters.base import MODEL_DTYPES, AdapterError, Generation, Prompt, Sampling, dtype_short
from adapters.engine.cache import KVCache
from adapters.engine.config import CONDITIONING_FIELDS, LoopConfig
from adapters.engine.presets import PRESETS, preset
from adapters.engine.generate import ExitPolicy, generate
from adapters.engine.memory import analytic_terms, count_params
from adapters.engine.model import LoopedLM
from adapters.registry import register

DEFAULT_MAX_BATCH = 64  # sequences per generate batch
OVERRIDES = ("loops", "dtype", "device", "seed", "chunk_size", "max_batch", "exit_policy", "exit_loop", "exit_threshold", *CONDITIONING_FIELDS)


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """bf16 on a GPU and fp32 on the CPU by default (bf16 matmuls crawl on CPUs)."""
    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return getattr(torch, MODEL_DTYPES[dtype_short(dtype, model=True)])


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AdapterError(f"device {device!r} requested but CUDA is not available (use device='cpu')")
    return device


class EngineAdapter:
    """One engine model behind the Adapter protocol. `loops` may be changed between calls."""

    def __init__(self, spec: str, model: LoopedLM, tokenizer: Any | None, *, loops: int | None = None, max_batch: int = DEFAULT_MAX_BATCH,
                 exit_policy: ExitPolicy = ExitPolicy()) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.config: LoopConfig = model.config
        self.max_context = self.config.max_position
        self.loops = self.config.loops if loops is None else loops
        if max_batch < 1:
            raise AdapterError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = max_batch
        if exit_policy.kind != "none" and not self.config.exit_gate and exit_policy.kind == "threshold":
            raise AdapterError("exit_policy 'threshold' needs a model with an exit gate (Ouro)")
        self.exit_policy = exit_policy
        weight = model.model.embed_tokens.weight
        self.dtype, self.device = weight.dtype, weight.device
        self._weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._cache: KVCache | None = None
        self._peak = 0
        self._lock = threading.Lock()  # one generate at a time: the cache is per call

    @property
    def loops(self) -> int:
        return self._loops

    @loops.setter
    def loops(self, value: int) -> None:
        self._loops = self.config.check_loops(value)

    # ------------------------------------------------------------------------------- protocol
    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(input_ids.to(self.device), loops=self.loops).logits

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise AdapterError("empty prompt: every prompt needs at least one character or token")
            if self.tokenizer is None:
                raise AdapterError(f"{self.spec} has no tokenizer: pass prompts as lists of token ids")
            return list(self.tokenizer(prompt)["input_ids"])
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise AdapterError(f"token id {bad[0]} outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _eos_ids(self) -> set[int]:
        ids = {self.config.eos_token_id} | set(self.config.extra.get("eos_token_ids", []))
        if self.tokenizer is not None:
            ids.add(self.tokenizer.eos_token_id)
        return {i for i in ids if i is not None}

    def _track(self, cache: KVCache | None) -> None:
        self._cache = cache
        if cache is not None:
            self._peak = max(self._peak, cache.kv_bytes_allocated)

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        """`len(prompts) * n` generations, prompt-major, in batches of at most `max_batch` sequences."""
        encoded = [ids for p in prompts for ids in [self._encode(p)] * sampling.n]
        generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        pad = self.config.pad_token_id if self.config.pad_token_id is not None else 0
        results: list[Generation] = []
        with self._lock:
            for start in range(0, len(encoded), self.max_batch):
                results += generate(
                    self.model, encoded[start : start + self.max_batch], sampling, loops=self.loops, eos_ids=self._eos_ids(),
                    tokenizer=self.tokenizer, exit_policy=self.exit_policy, generator=generator, on_cache=self._track, pad_id=pad,
                )
        return results

    def memory(self) -> dict[str, int | None]:
        cache = self._cache  # one read: the generate thread may swap it
        return {
            "weights_bytes": self._weights_bytes,
            "kv_bytes_allocated": cache.kv_bytes_allocated if cache is not None else 0,
            "kv_bytes_used": cache.kv_bytes_used if cache is not None else 0,
            "kv_bytes_peak": self._peak,
        }

    def reset_memory_peak(self) -> None:
        cache = self._cache
        self._peak = cache.kv_bytes_allocated if cache is not None else 0

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        size = torch.empty(0, dtype=self.dtype).element_size()
        return {
            "family": cfg.family,
            "params": count_params(cfg),
            "loops": self.loops,
            "trained_loops": cfg.loops,
            "kv_strategy": cfg.kv_strategy,
            "gate": cfg.gate_variant if cfg.kv_strategy == "gated" else None,
            "dtype": dtype_short(self.dtype),
            "device": str(self.device),
            "kv_bytes_per_token": 2 * cfg.kv_entries(self.loops) * cfg.num_kv_heads * cfg.head_dim * size,
            "analytic": analytic_terms(cfg, self.loops, dtype_short(self.dtype)),
            "exit_policy": {"kind": self.exit_policy.kind, "loop": self.exit_policy.loop, "threshold": self.exit_policy.threshold},
            "config": cfg.to_dict(),
        }


def _check_overrides(overrides: dict[str, Any]) -> None:
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise AdapterError(f"unknown override(s) {', '.join(sorted(unknown))} (allowed: {', '.join(OVERRIDES)})")


def conditioning(overrides: dict[str, Any]) -> dict[str, Any]:
    """The loop conditioning fields among load overrides (a loaded model gains them zero-initialised)."""
    return {k: overrides[k] for k in CONDITIONING_FIELDS if overrides.get(k) is not None}


def config_facts(cfg: LoopConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """What `describe()` will say about loops, KV and memory, from the config alone: a sweep plans its
    runs and checks they fit with it before any weights are loaded (`adapters.inspect`), and
    `loopeval estimate` reads the config from it."""
    _check_overrides(overrides)
    cfg = cfg.replace(**conditioning(overrides))
    if overrides.get("chunk_size") is not None:  # as _build applies it
        cfg = cfg.replace(chunk_size=int(overrides["chunk_size"]))
    loops = cfg.loops if overrides.get("loops") is None else cfg.check_loops(overrides["loops"])
    device = resolve_device(overrides.get("device"))
    dtype = dtype_short(resolve_dtype(overrides.get("dtype"), device))
    return {"family": cfg.family, "kv_strategy": cfg.kv_strategy, "loops": loops, "trained_loops": cfg.loops,
            "max_context": cfg.max_position, "device": device, "dtype": dtype,
            "max_batch": int(overrides.get("max_batch", DEFAULT_MAX_BATCH)), "analytic": analytic_terms(cfg, loops, dtype),
            "config": cfg.to_dict()}


def _build(spec: str, model_fn: Any, tokenizer_fn: Any, overrides: dict[str, Any]) -> EngineAdapter:
    _check_overrides(overrides)
    device = resolve_device(overrides.get("device"))
    dtype = resolve_dtype(overrides.get("dtype"), device)
    model: LoopedLM = model_fn(dtype, device)
    if overrides.get("chunk_size") is not None:
        model.config = model.config.replace(chunk_size=int(overrides["chunk_size"]))
    if conditioning(overrides):
        model = model.with_conditioning(**conditioning(overrides))
    return EngineAdapter(spec, model, tokenizer_fn(), loops=overrides.get("loops"), max_batch=int(overrides.get("max_batch", DEFAULT_MAX_BATCH)),
                         exit_policy=exit_policy(model.config, overrides))


def exit_policy(cfg: LoopConfig, overrides: dict[str, Any]) -> ExitPolicy:
    """The overrides' exit policy, else the checkpoint's. A threshold (`exit_threshold`, else Ouro's
    `early_exit_threshold`) below 1 selects `threshold`, as the official Ouro modelling code applies its
    config's threshold at every forward; 1 (what the Ouro releases ship) reads the last loop, as `none` does."""
    given = overrides.get("exit_threshold")
    threshold = cfg.exit_threshold if given is None else float(given)
    kind = overrides.get("exit_policy") or ("threshold" if threshold is not None and threshold < 1 else "none")
    return ExitPolicy(kind=kind, loop=overrides.get("exit_loop"), threshold=1.0 if threshold is None else threshold)


def inspect_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """Config facts, plus whether the preset can read text: only the tiny presets share the character
    tokenizer; the real-size shapes exist for memory and speed and take token ids only."""
    return {**config_facts(preset(name), overrides), "has_tokenizer": _tiny(name)}


def _tiny(name: str) -> bool:
    return name.endswith("-tiny")


@register("preset", "engine preset with seeded random weights (qwen3-tiny, ouro-tiny, melt-tiny, qwen3-1.7b, ...)", inspect=inspect_preset,
          names=lambda: PRESETS)
def load_preset(name: str, **overrides: Any) -> EngineAdapter:
    from adapters.engine.checkpoint import random_model
    from adapters.engine.tokenizer import char_tokenizer

    cfg = preset(name)
    seed = int(overrides.pop("seed", 0))
    return _build(f"preset:{name}", lambda dtype, device: random_model(cfg, seed, dtype, device), char_tokenizer if _tiny(name) else (lambda: None), overrides)


def _checkpoint_factory(family: str) -> Any:
    def load(path: str, **overrides: Any) -> EngineAdapter:
        from pathlib import Path

        from adapters.engine.checkpoint import load_model
        from adapters.engine.tokenizer import load_tokenizer

        overrides.pop("seed", None)  # weights come from the checkpoint
        return _build(f"{family}:{path}", lambda dtype, device: load_model(path, family, dtype, device), lambda: load_tokenizer(Path(path)), overrides)

    load.__doc__ = f"Engine adapter for a {family} checkpoint directory (engine format or HF)."
    return load


def _checkpoint_inspector(family: str) -> Any:
    def inspect(path: str, **overrides: Any) -> dict[str, Any]:
        from adapters.engine.checkpoint import read_config

        overrides.pop("seed", None)
        return config_facts(read_config(path, family), overrides)

    return inspect


for _family, _description in (
    ("qwen3", "Qwen3 checkpoint: HF directory (save_pretrained) or engine checkpoint"),
    ("ouro", "Ouro checkpoint: HF-format directory (no remote code) or engine checkpoint"),
    ("melt", "MELT checkpoint: engine checkpoint or Ouro-format directory plus gate tensors"),
):
    register(_family, _description, inspect=_checkpoint_inspector(_family))(_checkpoint_factory(_family))
