"""The engine as an `Adapter`: specs `preset:NAME`, `qwen3:PATH`, `ouro:PATH`, `melt:PATH`, `huginn:PATH`, `retrofit:PATH`,
`ifm:PATH`.

Generation runs on the continuous-batching engine (`adapters.engine.serving.continuous`) over a paged KV
pool; the adapter also takes a whole workload at once (`generate_requests`, the `Scheduling` extra)
and reports each sample as it finishes. `batching="static"` runs static batches on a preallocated
cache instead: what `loopeval profile` measures (one cache of known size) and the baseline the
continuous engine is benchmarked against.

Overrides (all optional): `loops` (inference r), `dtype` (fp32/bf16/fp16), `device`, `seed`
(random init of presets, and the seed of the recurrent families' initial-state draws), `chunk_size` (MELT prefill chunk), `max_batch` (sequences decoding at
once: the continuous engine's cap, or the static batch), `batching` ("continuous" or "static"),
`kv_budget` (GB of KV pool; default: what the workload needs at the cap without preemption, and on
a GPU at most `paged.KV_FRACTION` of free memory), `block_size` (tokens per KV block), `cuda_graphs`
(default true: on a GPU the engine's decode steps replay as CUDA graphs, `adapters.engine.serving.graphs`), `triton_kernels`
(default true: on a GPU with triton, attention reads the pool's blocks in place, each block's residual add is fused
with the norm after it and q and k are normed and rotated in one kernel, `adapters.engine.kernels`; false: SDPA over
gathered blocks and torch's ops, the CPU's path), `exit_policy`
("none", "fixed", "threshold") with `exit_loop` / `exit_threshold` (default: the checkpoint's
`early_exit_threshold`, see `exit_policy`), `exit_criterion` (gate, kl, entropy) and `exit_fill` ("copy": a decoded token
skips the loops after its exit and leaves its exit loop's K/V in them, the default when a policy is set; "masked":
it skips them and later tokens attend at each loop only to the tokens that ran it; "read": every loop runs, the
exit loop's output is read; `adapters.engine.exits`), `kv_policy` (the KV layout run instead of the model's own:
the names of `adapters.engine.kv.policies`, each a layout of `adapters.engine.kv.layouts`)
and `kv_dtype` (auto, int8, fp8; `adapters.engine.kv.format`), and the loop conditioning fields. They are checked in
`adapters.engine.overrides`, before anything loads.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any
from collections.abc import Callable, Sequence

import torch

from adapters import threads
from adapters.base import AdapterError, Finished, Generation, Prompt, Request, Sampling, dtype_short
from adapters.engine.kv.cache import KVCache
from adapters.engine.config import LoopConfig
from adapters.engine.families import family_of
from adapters.engine.io.presets import PRESETS, preset
from adapters.engine.serving.continuous import continuous_engine
from adapters.engine.exits import ExitPolicy
from adapters.engine.generate import generate_static
from adapters.engine.sampling import check_request
from adapters.engine import kernels
from adapters.engine.memory import analytic_terms, count_params
from adapters.engine.model import LoopedLM, with_conditioning
from adapters.engine.serving.paged import DEFAULT_BLOCK_SIZE, BlockPool
from adapters.engine.serving.sequence import Sequence as Seq
from adapters.engine.streams import prompt_key, stream_key
from adapters.engine.io.tokenizer import token_ids
from adapters.engine.overrides import (
    DEFAULT_MAX_BATCH,
    batching_overrides,
    check_batching,
    check_batching_mode,
    check_exit_support,
    check_flag,
    check_overrides,
    conditioning,
    config_facts,
    exit_policy,
    kv_facts,
    kv_fields,
    resolve_device,
    resolve_dtype,
)
from adapters.registry import register


class KVMeter:
    """The KV bytes `memory()` reports: the live store's while a call runs (a static batch's `KVCache` or the
    continuous engine's `BlockPool`), and the peaks across calls until `reset_peak`.

    Apart from the adapter because the generate thread swaps the live store while a memory sampler reads it: each
    read takes the store once."""

    def __init__(self, weights_bytes: int) -> None:
        self.weights_bytes = weights_bytes
        self.live: KVCache | BlockPool | None = None  # the KV store of the call in progress
        self.peak = self.reserved = 0

    def track(self, cache: KVCache | None) -> None:
        """A static batch's cache begins (preallocated: its bytes are known now), or, with None, the batch ends."""
        self.live = cache
        if cache is not None:
            self.peak = max(self.peak, cache.kv_bytes_allocated)
            self.reserved = max(self.reserved, cache.kv_bytes_reserved)

    def pool_done(self, pool: BlockPool) -> None:
        """A continuous call on `pool` ended: its peak is kept, the pool is no longer live."""
        self.peak = max(self.peak, pool.manager.peak_allocated)
        self.reserved = max(self.reserved, pool.kv_bytes_reserved)
        self.live = None

    def memory(self) -> dict[str, int | None]:
        """`memory()`'s bytes: the weights', and the live store's and the peaks (see the adapter's)."""
        live = self.live  # one read: the generate thread may swap it
        if live is None:
            return {
                "weights_bytes": self.weights_bytes,
                "kv_bytes_allocated": 0,
                "kv_bytes_used": 0,
                "kv_bytes_peak": self.peak,
                "kv_bytes_reserved": 0,
                "kv_bytes_reserved_peak": self.reserved,
            }
        reserved = live.kv_bytes_reserved
        used, allocated, peak = live.accounting()
        return {
            "weights_bytes": self.weights_bytes,
            "kv_bytes_allocated": allocated,
            "kv_bytes_used": used,
            "kv_bytes_peak": max(self.peak, peak),
            "kv_bytes_reserved": reserved,
            "kv_bytes_reserved_peak": max(self.reserved, reserved),
        }

    def reset_peak(self) -> None:
        """The peaks start again from the live store's bytes (0 between calls)."""
        live = self.live
        self.peak = 0 if live is None else live.kv_bytes_allocated
        self.reserved = 0 if live is None else live.kv_bytes_reserved
        if isinstance(live, BlockPool):
            live.reset_peak()


class EngineAdapter:
    """One engine model behind the Adapter protocol. `loops` may be changed between calls."""

    def __init__(
        self,
        spec: str,
        model: LoopedLM,
        tokenizer: Any | None,
        *,
        loops: int | None = None,
        max_batch: int = DEFAULT_MAX_BATCH,
        exit_policy: ExitPolicy = ExitPolicy(),
        batching: str = "continuous",
        kv_budget: float | None = None,
        block_size: int = DEFAULT_BLOCK_SIZE,
        cuda_graphs: bool = True,
        triton_kernels: bool = True,
    ) -> None:
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.config: LoopConfig = model.config
        self.max_context = self.config.max_position
        self.loops = self.config.loops if loops is None else loops
        self.max_batch, self.batching, self.kv_budget, self.block_size, self.cuda_graphs = check_batching(
            max_batch, batching, kv_budget, block_size, cuda_graphs
        )
        self.exit_policy = check_exit_support(self.config, exit_policy)
        weight = model.model.embed_tokens.weight
        self.dtype, self.device = weight.dtype, weight.device
        self.attention, self.kernel_path = kernels.install(
            model, self.device, check_flag("triton_kernels", triton_kernels)
        )  # the pools' kernel, and which ops the model runs (recorded by `describe`)
        self.meter = KVMeter(sum(p.numel() * p.element_size() for p in model.parameters()))
        self.preemptions = 0  # sequences the engine preempted (and recomputed) so far
        self._lock = threading.Lock()  # one generate at a time: the KV store is per call

    @property
    def loops(self) -> int:
        return self._loops

    @loops.setter
    def loops(self, value: int) -> None:
        self._loops = self.config.check_loops(value)

    @property
    def batching(self) -> str:
        """`continuous` or `static`; may be changed between calls (profiles run static batches), checked as set."""
        return self._batching

    @batching.setter
    def batching(self, value: str) -> None:
        self._batching = check_batching_mode(value)

    # ------------------------------------------------------------------------------- protocol
    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            logits: torch.Tensor = self.model(input_ids.to(self.device), loops=self.loops).logits
            return logits

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        """`len(prompts) * n` generations, prompt-major. Prompt i's samples draw from streams of seed
        `stream_key(sampling.seed, i)`, so they do not depend on the other prompts or the batching."""
        requests = [
            Request(p, dataclasses.replace(sampling, seed=stream_key(sampling.seed, i))) for i, p in enumerate(prompts)
        ]
        results: dict[tuple[int, int], Generation] = {}
        self.generate_requests(requests, lambda done: results.update(((r, j), g) for r, j, g in done))
        return [results[(i, j)] for i in range(len(prompts)) for j in range(sampling.n)]

    def generate_requests(self, requests: Sequence[Request], on_finished: Callable[[list[Finished]], None]) -> None:
        """Generate every requested sample, calling `on_finished` with each group of samples as they finish."""
        sequences = sequences_of(requests, self.model, self.tokenizer, self.spec)
        if not sequences:
            return
        with self._lock:
            if self.batching == "static":
                generate_static(
                    self.model,
                    sequences,
                    on_finished,
                    max_batch=self.max_batch,
                    loops=self.loops,
                    eos_ids=eos_ids(self.config, self.tokenizer),
                    tokenizer=self.tokenizer,
                    exit_policy=self.exit_policy,
                    on_cache=self.meter.track,
                )
            else:
                self._run_continuous(sequences, on_finished)

    def _run_continuous(self, sequences: list[Seq], on_finished: Callable[[list[Finished]], None]) -> None:
        engine = continuous_engine(
            self.model,
            sequences,
            on_finished,
            loops=self.loops,
            policy=self.exit_policy,
            eos_ids=eos_ids(self.config, self.tokenizer),
            tokenizer=self.tokenizer,
            max_seqs=self.max_batch,
            kv_budget=self.kv_budget,
            block_size=self.block_size,
            cuda_graphs=self.cuda_graphs,
            attention=self.attention,
        )
        self.meter.live = engine.pool
        try:
            engine.run(sequences)
        finally:
            self.preemptions += engine.scheduler.preemptions
            self.meter.pool_done(engine.pool)

    def memory(self) -> dict[str, int | None]:
        """The live KV store's bytes, `kv_bytes_reserved` included (the whole pool while a call runs, 0
        between calls); `kv_bytes_peak` and `kv_bytes_reserved_peak` are kept across calls until
        `reset_memory_peak`."""
        return self.meter.memory()

    def reset_memory_peak(self) -> None:
        self.meter.reset_peak()

    def describe(self) -> dict[str, Any]:
        cfg = self.config
        analytic = analytic_terms(cfg, self.loops, dtype_short(self.dtype))
        return {
            "family": cfg.family,
            "params": count_params(cfg),
            "loops": self.loops,
            "trained_loops": cfg.loops,
            "kv_strategy": cfg.kv_strategy,
            **kv_facts(cfg),
            "gate": family_of(cfg).gate_variant,
            "dtype": dtype_short(self.dtype),
            "device": str(self.device),
            "kernels": self.kernel_path,
            "kv_bytes_per_token": analytic["kv_bytes_per_token"],
            "analytic": analytic,
            "exit_policy": dataclasses.asdict(self.exit_policy),
            "batching": {
                "mode": self.batching,
                "max_batch": self.max_batch,
                "block_size": self.block_size,
                "kv_budget": self.kv_budget,
            },
            "config": cfg.to_dict(),
        }


def sequences_of(requests: Sequence[Request], model: LoopedLM, tokenizer: Any | None, spec: str) -> list[Seq]:
    """One sequence per requested sample, every request checked before anything runs (`spec` names the model in errors)."""
    sequences = []
    for r, request in enumerate(requests):
        ids = encode(request.prompt, tokenizer, model.config.vocab_size, spec)
        capacity = check_request(model, ids, request.sampling, tokenizer)
        for j in request.indices:
            sequences.append(
                Seq(
                    r,
                    j,
                    stream_key(request.sampling.seed, j),
                    len(ids),
                    list(ids),
                    capacity,
                    request.sampling,
                    prompt_key(request.sampling.seed),
                )
            )
    return sequences


def encode(prompt: Prompt, tokenizer: Any | None, vocab_size: int, spec: str) -> list[int]:
    """A prompt's token ids: text through the tokenizer, ids checked against the vocabulary."""
    if isinstance(prompt, str):
        if not prompt:
            raise AdapterError("empty prompt: every prompt needs at least one character or token")
        if tokenizer is None:
            raise AdapterError(f"{spec} has no tokenizer: pass prompts as lists of token ids")
        return list(tokenizer(prompt)["input_ids"])
    ids = [int(t) for t in prompt]
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise AdapterError(f"token id {bad[0]} outside the vocabulary [0, {vocab_size})")
    return ids


def eos_ids(config: LoopConfig, tokenizer: Any | None) -> set[int]:
    """The token ids that end a sample: the config's and its extra `eos_token_ids` (as `tokenizer.token_ids` set them), the tokenizer's."""
    ids = {config.eos_token_id} | set(config.extra.get("eos_token_ids", []))
    if tokenizer is not None:
        ids.add(tokenizer.eos_token_id)
    return {i for i in ids if i is not None}


def _build(spec: str, model_fn: Any, tokenizer_fn: Any, overrides: dict[str, Any]) -> EngineAdapter:
    check_overrides(overrides)
    device = resolve_device(overrides.get("device"))
    dtype = resolve_dtype(overrides.get("dtype"), device)
    model: LoopedLM = model_fn(dtype, device)
    threads.ensure(count_params(model.config))
    if overrides.get("chunk_size") is not None:
        model.config = model.config.replace(chunk_size=int(overrides["chunk_size"]))
    model.config = model.config.replace(**kv_fields(overrides))
    if conditioning(overrides):
        model = with_conditioning(model, **conditioning(overrides))
    max_batch, batching, kv_budget, block_size, cuda_graphs = batching_overrides(overrides)
    tokenizer = tokenizer_fn()
    model.config = token_ids(model.config, tokenizer)
    return EngineAdapter(
        spec,
        model,
        tokenizer,
        loops=overrides.get("loops"),
        max_batch=max_batch,
        exit_policy=exit_policy(model.config, overrides),
        batching=batching,
        kv_budget=kv_budget,
        block_size=block_size,
        cuda_graphs=cuda_graphs,
        triton_kernels=overrides.get("triton_kernels", True),
    )


def inspect_preset(name: str, **overrides: Any) -> dict[str, Any]:
    """Config facts, plus whether the preset can read text: only the tiny presets share the character
    tokenizer; the real-size shapes exist for memory and speed and take token ids only."""
    return {**config_facts(preset(name), overrides), "has_tokenizer": _tiny(name)}


def _tiny(name: str) -> bool:
    return name.endswith("-tiny")


@register(
    "preset",
    "engine preset with seeded random weights (qwen3-tiny, ouro-tiny, melt-tiny, qwen3-1.7b, ...)",
    inspect=inspect_preset,
    names=lambda: PRESETS,
)
def load_preset(name: str, **overrides: Any) -> EngineAdapter:
    from adapters.engine.io.checkpoint import random_model
    from adapters.engine.io.tokenizer import char_tokenizer

    cfg = preset(name)
    seed = int(overrides.pop("seed", 0))
    return _build(
        f"preset:{name}",
        lambda dtype, device: state_seeded(random_model(cfg, seed, dtype, device), seed),
        char_tokenizer if _tiny(name) else (lambda: None),
        overrides,
    )


def state_seeded(model: LoopedLM, seed: int) -> LoopedLM:
    """The model with the recurrent families' initial-state draws seeded by the run's seed (no-op for other families)."""
    model.seed_state(seed)
    return model


def _checkpoint_factory(family: str) -> Any:
    def load(path: str, **overrides: Any) -> EngineAdapter:
        from pathlib import Path

        from adapters.engine.io.checkpoint import load_model
        from adapters.engine.io.xllm import TOKENIZER_DIR
        from adapters.engine.io.tokenizer import load_tokenizer

        seed = int(
            overrides.pop("seed", 0)
        )  # weights come from the checkpoint; it seeds a recurrent family's initial state
        return _build(
            f"{family}:{path}",
            lambda dtype, device: state_seeded(load_model(path, family, dtype, device), seed),
            lambda: load_tokenizer(Path(path) / TOKENIZER_DIR if family == "ifm" else Path(path)),
            overrides,
        )

    load.__doc__ = f"Engine adapter for a {family} checkpoint directory (engine format or HF)."
    return load


def _checkpoint_inspector(family: str) -> Any:
    def inspect(path: str, **overrides: Any) -> dict[str, Any]:
        """Facts from the config, with the folder's tokenizer checked against it (`token_ids`: every id it can
        produce within the vocabulary) as the load checks it: a sweep refuses the model before storing a run."""
        from pathlib import Path

        from adapters.engine.io.checkpoint import read_config
        from adapters.engine.io.tokenizer import load_tokenizer

        overrides.pop("seed", None)
        cfg = read_config(path, family)
        token_ids(cfg, load_tokenizer(Path(path)))
        return config_facts(cfg, overrides)

    return inspect


for _family, _description in (
    ("qwen3", "Qwen3 checkpoint: HF directory (save_pretrained) or engine checkpoint"),
    ("ouro", "Ouro checkpoint: HF-format directory (no remote code) or engine checkpoint"),
    ("melt", "MELT checkpoint: engine checkpoint or Ouro-format directory plus gate tensors"),
    (
        "huginn",
        "Huginn-0125 (recurrent depth) checkpoint: the official layout (config.json + safetensors) or engine checkpoint",
    ),
    (
        "retrofit",
        "retrofitted recurrence (a Llama cut into prelude, core and coda): the official RavenConfig layout or engine checkpoint",
    ),
    ("ifm", "IFM Part II looped or D4 row: the released artifact (manifest-checked BF16 safetensors, config.json)"),
):
    register(_family, _description, inspect=_checkpoint_inspector(_family))(_checkpoint_factory(_family))
