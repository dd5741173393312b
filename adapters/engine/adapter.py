"""The engine as an `Adapter`: specs `preset:NAME`, `qwen3:PATH`, `ouro:PATH`, `melt:PATH`, `huginn:PATH`, `retrofit:PATH`.

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
per-loop, shared-last, shared-mean, shared-ema[:ALPHA], latest-m4, gated, standard; `adapters.engine.families.sharing`)
and `kv_dtype` (auto, int8, fp8; `adapters.engine.kvformat`), and the loop conditioning fields.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any
from collections.abc import Callable, Sequence

import torch

from adapters import threads
from adapters.base import MODEL_DTYPES, AdapterError, Finished, Generation, Prompt, Request, Sampling, dtype_short
from adapters.engine.cache import KVCache
from adapters.engine.config import CONDITIONING_FIELDS, LoopConfig
from adapters.engine.families import family_of
from adapters.engine.io.presets import PRESETS, preset
from adapters.engine.serving.continuous import ContinuousEngine
from adapters.engine.exits import SKIPPING_FILL, ExitPolicy, check_threshold
from adapters.engine.generate import generate_static
from adapters.engine.sampling import check_request
from adapters.engine.serving.graphs import DecodeGraphs
from adapters.engine import kernels
from adapters.engine.memory import analytic_terms, count_params
from adapters.engine.model import LoopedLM
from adapters.engine.serving.paged import DEFAULT_BLOCK_SIZE, BlockPool
from adapters.engine.serving.sequence import Sequence as Seq
from adapters.engine.streams import prompt_key, stream_key
from adapters.engine.io.tokenizer import token_ids
from adapters.registry import register

DEFAULT_MAX_BATCH = 64  # sequences decoding at once
BATCHING = ("continuous", "static")
KV_FIELDS = ("kv_policy", "kv_dtype")  # load overrides that are config fields (`LoopConfig`), checked there
OVERRIDES = (
    "loops",
    "dtype",
    "device",
    "seed",
    "chunk_size",
    "max_batch",
    "batching",
    "kv_budget",
    "block_size",
    "cuda_graphs",
    "triton_kernels",
    "exit_policy",
    "exit_loop",
    "exit_threshold",
    "exit_criterion",
    "exit_fill",
    *KV_FIELDS,
    *CONDITIONING_FIELDS,
)


def resolve_dtype(dtype: str | torch.dtype | None, device: str) -> torch.dtype:
    """bf16 on a GPU and fp32 on the CPU by default (bf16 matmuls crawl on CPUs)."""
    if dtype is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    chosen: torch.dtype = getattr(torch, MODEL_DTYPES[dtype_short(dtype, model=True)])
    return chosen


def resolve_device(device: str | None) -> str:
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise AdapterError(f"device {device!r} requested but CUDA is not available (use device='cpu')")
    return device


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
        self.attention = kernels.install(
            model, self.device, check_flag("triton_kernels", triton_kernels)
        )  # the pools' kernel
        self._weights_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        self._live: KVCache | BlockPool | None = None  # the KV store of the call in progress
        self._peak = self._reserved = 0
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
        sequences = self._sequences(requests)
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
                    on_cache=self._track,
                )
            else:
                self._run_continuous(sequences, on_finished)

    def _sequences(self, requests: Sequence[Request]) -> list[Seq]:
        """One sequence per requested sample, every request checked before anything runs."""
        sequences = []
        for r, request in enumerate(requests):
            ids = encode(request.prompt, self.tokenizer, self.config.vocab_size, self.spec)
            capacity = check_request(self.model, ids, request.sampling, self.tokenizer)
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

    def _run_continuous(self, sequences: list[Seq], on_finished: Callable[[list[Finished]], None]) -> None:
        # a graph replays one fixed-depth step: with loops skipped per token the decode runs eagerly. A model that draws its
        # initial state runs eagerly too: its keyed draw (`Recurrence.keyed_draw`) is a pure function of the positions and the
        # rows' stream keys, so it could be captured, but the graphs' static inputs carry no keys and no capture of it is tested
        capture, graphs = (
            self.cuda_graphs
            and self.device.type == "cuda"
            and not self.model.draws_state
            and not self.exit_policy.skips,
            None,
        )
        pool = BlockPool.for_workload(
            self.config,
            self.loops,
            [s.capacity for s in sequences],
            max_seqs=self.max_batch,
            kv_budget=self.kv_budget,
            block_size=self.block_size,
            dtype=self.dtype,
            device=self.device,
            spare=capture,
            attention=self.attention,
        )
        if capture:
            graphs = DecodeGraphs(
                self.model,
                pool,
                loops=self.loops,
                keep_loops=self.exit_policy.reads_loops(bool(self.model.coda)),
                max_seqs=self.max_batch,
                max_blocks=pool.manager.blocks_for(max(s.capacity for s in sequences)),
                capture=True,
            )
        engine = ContinuousEngine(
            self.model,
            pool,
            loops=self.loops,
            policy=self.exit_policy,
            eos_ids=eos_ids(self.config, self.tokenizer),
            tokenizer=self.tokenizer,
            max_seqs=self.max_batch,
            on_finished=on_finished,
            graphs=graphs,
        )
        self._live = pool
        try:
            engine.run(sequences)
        finally:
            self.preemptions += engine.scheduler.preemptions
            self._peak = max(self._peak, pool.manager.peak_allocated)
            self._reserved = max(self._reserved, pool.kv_bytes_reserved)
            self._live = None

    def _track(self, cache: KVCache | None) -> None:
        self._live = cache
        if cache is not None:
            self._peak = max(self._peak, cache.kv_bytes_allocated)
            self._reserved = max(self._reserved, cache.kv_bytes_reserved)

    def memory(self) -> dict[str, int | None]:
        """The live KV store's bytes, `kv_bytes_reserved` included (the whole pool while a call runs, 0
        between calls); `kv_bytes_peak` and `kv_bytes_reserved_peak` are kept across calls until
        `reset_memory_peak`."""
        live = self._live  # one read: the generate thread may swap it
        if live is None:
            return {
                "weights_bytes": self._weights_bytes,
                "kv_bytes_allocated": 0,
                "kv_bytes_used": 0,
                "kv_bytes_peak": self._peak,
                "kv_bytes_reserved": 0,
                "kv_bytes_reserved_peak": self._reserved,
            }
        reserved = live.kv_bytes_reserved
        used, allocated, peak = live.accounting()
        return {
            "weights_bytes": self._weights_bytes,
            "kv_bytes_allocated": allocated,
            "kv_bytes_used": used,
            "kv_bytes_peak": max(self._peak, peak),
            "kv_bytes_reserved": reserved,
            "kv_bytes_reserved_peak": max(self._reserved, reserved),
        }

    def reset_memory_peak(self) -> None:
        live = self._live
        self._peak = 0 if live is None else live.kv_bytes_allocated
        self._reserved = 0 if live is None else live.kv_bytes_reserved
        if isinstance(live, BlockPool):
            live.reset_peak()

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


def check_batching_mode(batching: Any) -> str:
    if batching not in BATCHING:
        raise AdapterError(f"batching {batching!r} is not one of {', '.join(BATCHING)}")
    return str(batching)


def check_batching(
    max_batch: Any, batching: Any, kv_budget: Any, block_size: Any, cuda_graphs: Any
) -> tuple[int, str, float | None, int, bool]:
    """The batching overrides, checked: (max_batch, batching, kv_budget in GB or None, block_size, cuda_graphs)."""
    for name, value in (("max_batch", max_batch), ("block_size", block_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise AdapterError(f"{name} must be a positive integer, got {value!r}")
    check_batching_mode(batching)
    if kv_budget is not None and (
        isinstance(kv_budget, bool) or not isinstance(kv_budget, (int, float)) or not 0 < kv_budget < float("inf")
    ):
        raise AdapterError(f"kv_budget must be a positive number of GB, got {kv_budget!r}")
    return (
        max_batch,
        batching,
        None if kv_budget is None else float(kv_budget),
        block_size,
        check_flag("cuda_graphs", cuda_graphs),
    )


def check_flag(name: str, value: Any) -> bool:
    """A true-or-false override, checked."""
    if not isinstance(value, bool):
        raise AdapterError(f"{name} must be true or false, got {value!r}")
    return value


def _batching_overrides(overrides: dict[str, Any]) -> tuple[int, str, float | None, int, bool]:
    return check_batching(
        overrides.get("max_batch", DEFAULT_MAX_BATCH),
        overrides.get("batching", "continuous"),
        overrides.get("kv_budget"),
        overrides.get("block_size", DEFAULT_BLOCK_SIZE),
        overrides.get("cuda_graphs", True),
    )


def _check_overrides(overrides: dict[str, Any]) -> None:
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise AdapterError(f"unknown override(s) {', '.join(sorted(unknown))} (allowed: {', '.join(OVERRIDES)})")


def conditioning(overrides: dict[str, Any]) -> dict[str, Any]:
    """The loop conditioning fields among load overrides (a loaded model gains them zero-initialised)."""
    return {k: overrides[k] for k in CONDITIONING_FIELDS if overrides.get(k) is not None}


def kv_fields(overrides: dict[str, Any]) -> dict[str, Any]:
    """The KV policy and dtype among load overrides: config fields, which `LoopConfig` checks against the family."""
    return {k: overrides[k] for k in KV_FIELDS if overrides.get(k) is not None}


def kv_facts(cfg: LoopConfig) -> dict[str, str]:
    """The KV policy (the native one named when none was chosen) and dtype a run stores and sweeps by."""
    return {"kv_policy": family_of(cfg).kv.policy, "kv_dtype": cfg.kv_dtype}


def config_facts(cfg: LoopConfig, overrides: dict[str, Any]) -> dict[str, Any]:
    """What `describe()` will say about loops, KV and memory, from the config alone: a sweep plans its
    runs and checks they fit with it before any weights are loaded (`adapters.inspect`), and
    `loopeval estimate` reads the config from it."""
    _check_overrides(overrides)
    cfg = cfg.replace(**conditioning(overrides), **kv_fields(overrides))
    if overrides.get("chunk_size") is not None:  # as _build applies it
        cfg = cfg.replace(chunk_size=int(overrides["chunk_size"]))
    loops = cfg.loops if overrides.get("loops") is None else cfg.check_loops(overrides["loops"])
    device = resolve_device(overrides.get("device"))
    dtype = dtype_short(resolve_dtype(overrides.get("dtype"), device))
    check_exit_support(cfg, exit_policy(cfg, overrides))  # a bad exit override fails the plan, before a run is stored
    check_flag("triton_kernels", overrides.get("triton_kernels", True))
    analytic = analytic_terms(cfg, loops, dtype)
    return {
        "family": cfg.family,
        "params": count_params(cfg),
        "kv_strategy": cfg.kv_strategy,
        **kv_facts(cfg),
        "kv_bytes_per_token": analytic["kv_bytes_per_token"],
        "loops": loops,
        "trained_loops": cfg.loops,
        "max_context": cfg.max_position,
        "device": device,
        "dtype": dtype,
        "max_batch": _batching_overrides(overrides)[0],
        "kv_budget": _batching_overrides(overrides)[2],
        "analytic": analytic,
        "config": cfg.to_dict(),
    }


def _build(spec: str, model_fn: Any, tokenizer_fn: Any, overrides: dict[str, Any]) -> EngineAdapter:
    _check_overrides(overrides)
    device = resolve_device(overrides.get("device"))
    dtype = resolve_dtype(overrides.get("dtype"), device)
    model: LoopedLM = model_fn(dtype, device)
    threads.ensure(count_params(model.config))
    if overrides.get("chunk_size") is not None:
        model.config = model.config.replace(chunk_size=int(overrides["chunk_size"]))
    model.config = model.config.replace(**kv_fields(overrides))
    if conditioning(overrides):
        model = model.with_conditioning(**conditioning(overrides))
    max_batch, batching, kv_budget, block_size, cuda_graphs = _batching_overrides(overrides)
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


def exit_policy(cfg: LoopConfig, overrides: dict[str, Any]) -> ExitPolicy:
    """The overrides' exit policy, else the checkpoint's. A threshold (`exit_threshold`, else Ouro's
    `early_exit_threshold`) below 1, or an `exit_criterion`, selects `threshold`, as the official Ouro modelling
    code applies its config's threshold at every forward; 1 (what the Ouro releases ship) with no criterion reads
    the last loop, as `none` does. A policy the overrides set skips the loops after a token's exit (`exit_fill`
    "copy") unless `exit_fill` is "read"; the checkpoint's own threshold is read as the official code reads it,
    every loop run (`adapters.engine.exits`)."""
    criterion, given = overrides.get("exit_criterion"), overrides.get("exit_threshold")
    ExitPolicy(criterion=criterion or "gate")  # an unknown criterion is named before its threshold is checked
    if given is not None:
        check_threshold(given, criterion or "gate")
    elif criterion not in (None, "gate"):
        raise AdapterError(f"exit_criterion {criterion!r} needs an exit_threshold (a finite number >= 0)")
    threshold = cfg.exit_threshold if given is None else given
    threshold = 1.0 if threshold is None else threshold
    kind = overrides.get("exit_policy") or ("threshold" if threshold < 1 or criterion is not None else "none")
    chosen = any(overrides.get(k) is not None for k in ("exit_policy", "exit_threshold", "exit_criterion"))
    fill = overrides.get("exit_fill") or (SKIPPING_FILL if chosen and kind != "none" else "read")
    return ExitPolicy(
        kind=kind, loop=overrides.get("exit_loop"), threshold=threshold, criterion=criterion or "gate", fill=fill
    )


def check_exit_support(cfg: LoopConfig, policy: ExitPolicy) -> ExitPolicy:
    """The policy, if the model can run it: the gate criterion needs an exit gate, exits need looped layers, and
    `read` (an exit loop's state read as the output) needs a model whose output is not the coda's."""
    family = family_of(cfg)
    if policy.kind == "threshold" and policy.criterion == "gate" and not family.has_exit_gate:
        raise AdapterError(
            "exit_policy 'threshold' with the gate criterion needs a model with an exit gate (Ouro); try exit_criterion kl or entropy"
        )
    if policy.skips and policy.fill == "masked" and not family.kv.grows_with_loops:
        raise AdapterError(
            f"exit_fill 'masked' needs per-loop K/V: kv_policy {family.kv.policy} keeps one row per layer "
            "and token, which every loop reads"
        )
    if policy.skips and policy.fill == "masked" and family.kv.reads_latest:
        raise AdapterError(
            f"exit_fill 'masked' is Huginn's 'skip' lookup; kv_policy {family.kv.policy} reads a skipped loop from the token's "
            "latest one (exit_fill copy)"
        )
    if policy.kind != "none" and cfg.shared_layers == 0:
        raise AdapterError("exit policies need a looped model (shared layers)")
    if policy.kind != "none" and not policy.skips and cfg.coda_layers:
        raise AdapterError("exit_fill 'read' needs a model without coda layers (it reads a loop's state as the output)")
    return policy


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
        from adapters.engine.io.tokenizer import load_tokenizer

        seed = int(
            overrides.pop("seed", 0)
        )  # weights come from the checkpoint; it seeds a recurrent family's initial state
        return _build(
            f"{family}:{path}",
            lambda dtype, device: state_seeded(load_model(path, family, dtype, device), seed),
            lambda: load_tokenizer(Path(path)),
            overrides,
        )

    load.__doc__ = f"Engine adapter for a {family} checkpoint directory (engine format or HF)."
    return load


def _checkpoint_inspector(family: str) -> Any:
    def inspect(path: str, **overrides: Any) -> dict[str, Any]:
        from adapters.engine.io.checkpoint import read_config

        overrides.pop("seed", None)
        return config_facts(read_config(path, family), overrides)

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
):
    register(_family, _description, inspect=_checkpoint_inspector(_family))(_checkpoint_factory(_family))
