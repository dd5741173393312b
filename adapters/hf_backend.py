"""transformers backend: `transformers:PATH` runs any local transformers causal-LM directory.

It is the common fallback for models the engine does not express, and the baseline the engine
benchmark compares against, so it maps `Sampling` onto `generate` as literally as possible:

- temperature 0 -> greedy (`do_sample=False`); otherwise `do_sample=True` with `temperature`,
  `top_p` and `top_k` (None -> 0, i.e. off: transformers would otherwise default to 50);
- `max_new_tokens`; `n` by repeating each prompt row n times (prompt-major, as `Adapter` requires); EOS from the
  checkpoint's generation config and tokenizer, stop strings via `stop_strings` + the tokenizer;
- the checkpoint's own generation config (Qwen3 ships top_k=20, temperature 0.6, ...) is set
  aside so it cannot silently change the protocol; it is kept in `describe()`;
- `seed`: the call runs under `torch.random.fork_rng` seeded with `sampling.seed`, so the same
  prompts and Sampling give the same tokens and the caller's global RNG is untouched.

Memory (`memory()`) is read from the cache object passed to `generate` (`past_key_values`):

- `kv_bytes_allocated`: the `nbytes` of the cache's key and value tensors when `memory()` is
  called. Exact for the tensors the cache holds; a DynamicCache grows by `torch.cat`, whose
  transient copy and allocator slack are not counted (the `torch_allocated` peak and NVML see them).
- `kv_bytes_used`: the positions written so far. For a DynamicCache this equals allocated (its
  tensors are exactly as long as what was written, left padding of shorter prompts included); for
  `cache="static"` (a preallocated StaticCache) it is allocated x written / capacity.
- `kv_bytes_peak`: the largest allocation seen by this adapter.
The cache of the last call is kept (and reported) until the next call replaces it.

Nothing is downloaded: model and tokenizer load with `local_files_only=True`, and code shipped in
the directory runs only with `trust_remote_code=True` (the CLI's `--trust-remote-code`), which
prints a warning.
"""

from __future__ import annotations

import json
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any
from collections.abc import Sequence

from adapters import threads
from adapters.base import MODEL_DTYPES, AdapterError, FinishReason, Generation, Prompt, Sampling, dtype_short
from adapters.config_values import check_vocabulary, first_id, id_count, id_list
from adapters.files import check_closed
from adapters.registry import register
from measures import MEMORY_KEYS

if TYPE_CHECKING:
    import torch

CACHE_KINDS = ("dynamic", "static")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def _resolve_dtype(dtype: Any, checkpoint_dtype: torch.dtype | None, device: str) -> torch.dtype:
    """Default: the checkpoint's dtype on an accelerator, float32 on the CPU (bf16 matmuls crawl there)."""
    import torch

    if dtype is None:
        if device == "cpu" or checkpoint_dtype is None:
            return torch.float32
        return checkpoint_dtype
    if isinstance(dtype, torch.dtype):
        return dtype
    resolved: torch.dtype = getattr(torch, MODEL_DTYPES[dtype_short(dtype, model=True)])
    return resolved


def stop_ids(spec: str, model: Any, tokenizer: Any | None, source_generation_config: dict[str, Any]) -> list[int]:
    """The stop ids the folder names (generation config, config, tokenizer), each read by `adapters.config_values`."""
    ids: list[int] = []
    for where, source in (
        ("generation_config.json", source_generation_config.get("eos_token_id")),
        ("config.json", getattr(model.config, "eos_token_id", None)),
        ("the tokenizer", getattr(tokenizer, "eos_token_id", None)),
    ):
        for i in id_list({"eos_token_id": source}, "eos_token_id", f"{spec}: {where}"):
            if i not in ids:
                ids.append(i)
    return ids


def pad_id(spec: str, tokenizer: Any | None, source_generation_config: dict[str, Any], eos_ids: list[int]) -> int:
    """The tokenizer's pad id, else the generation config's, else the first EOS id (0 without one)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = first_id(source_generation_config, "pad_token_id", f"{spec}: generation_config.json")
    return (eos_ids[0] if eos_ids else 0) if pad is None else pad


def generation_config(sampling: Sampling, max_new_tokens: int, eos_ids: list[int], pad: int) -> Any:
    """The `GenerationConfig` of one call: exactly `sampling` (top_k None is 0, off, not transformers' default 50)."""
    from transformers import GenerationConfig

    common = dict(max_new_tokens=max_new_tokens, eos_token_id=eos_ids or None, pad_token_id=pad)
    if sampling.greedy:
        return GenerationConfig(do_sample=False, **common)
    return GenerationConfig(
        do_sample=True,
        temperature=float(sampling.temperature),
        top_p=sampling.top_p,
        top_k=sampling.top_k or 0,
        **common,
    )


def stop_criteria(spec: str, tokenizer: Any | None, stops: tuple[str, ...], prompt_len: int) -> Any:
    """Stop a row once its *generated* text contains a stop string.

    transformers' own `stop_strings` also match across the prompt boundary (a prompt ending in
    "\n" with stop "\n\n" would stop at the first generated newline); the engine and LightEval
    look at the generated text only, so this criterion does too. A stop string first appears at
    the end of the text, so decoding a short window of the newest tokens is enough.
    """
    from transformers import StoppingCriteria, StoppingCriteriaList

    if not stops:
        return None
    if tokenizer is None:
        raise AdapterError(f"{spec} has no tokenizer, so it cannot match stop strings {list(stops)}")
    window, decode = max(len(s) for s in stops) + 4, tokenizer.batch_decode

    class StopOnGeneratedText(StoppingCriteria):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            import torch

            tails = decode(input_ids[:, max(prompt_len, input_ids.shape[1] - window) :], skip_special_tokens=True)
            return torch.tensor([any(s in t for s in stops) for t in tails], device=input_ids.device)

    return StoppingCriteriaList([StopOnGeneratedText()])


def cut_row_at_stop(tokenizer: Any, body: list[int], text: str, stops: tuple[str, ...]) -> tuple[list[int], str] | None:
    """A row cut at its first stop string, None where none occurs: the text just before it, and the shortest token
    prefix whose text contains it (decoding is monotone in the prefix)."""
    hits = [(text.find(s), s) for s in stops]
    hits = [h for h in hits if h[0] >= 0]
    if not hits:
        return None
    cut, stop = min(hits)
    lo, hi = 1, len(body)
    while lo < hi:
        mid = (lo + hi) // 2
        if stop in tokenizer.decode(body[:mid], skip_special_tokens=True):
            hi = mid
        else:
            lo = mid + 1
    return body[:lo], text[:cut]


def left_padded(rows: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input ids and attention mask of `rows`, left padded so every row's next token sits in the last column."""
    import torch

    longest = max(len(x) for x in rows)
    input_ids = torch.full((len(rows), longest), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for row, x in enumerate(rows):
        input_ids[row, longest - len(x) :] = torch.tensor(x)
        attention_mask[row, longest - len(x) :] = 1
    return input_ids, attention_mask


def kv_bytes(cache: Any | None) -> int:
    """The `nbytes` of the key and value tensors a cache holds now."""
    if cache is None:
        return 0
    return sum(
        layer.keys.nbytes + layer.values.nbytes
        for layer in list(cache.layers)
        if getattr(layer, "keys", None) is not None and layer.keys.numel()
    )


class CacheCall:
    """One generate call's cache, and what its forwards did to it: the positions written (a static cache's tensors
    cannot tell) and when the first forward, the prefill, ended. `on_forward` is the model's forward hook."""

    def __init__(self, model_config: Any, kind: str, length: int) -> None:
        from transformers import DynamicCache, StaticCache

        self.kind = kind
        self.cache: Any = (
            StaticCache(config=model_config, max_cache_len=length)
            if kind == "static"
            else DynamicCache(config=model_config)
        )
        self.written = 0
        self.prefill_end: float | None = None

    def on_forward(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        step = kwargs.get("input_ids")
        self.written += int(step.shape[-1]) if step is not None else 0
        if self.prefill_end is None:
            self.prefill_end = time.perf_counter()

    def kv_used(self, allocated: int) -> int:
        """Bytes of the positions written: all of a DynamicCache (its tensors are as long as what was written, left
        padding included), allocated x written / capacity of a StaticCache."""
        if self.kind != "static" or not allocated:
            return allocated
        capacity = next(layer.keys.shape[-2] for layer in self.cache.layers if getattr(layer, "keys", None) is not None)
        return allocated * min(self.written, capacity) // capacity


class TransformersAdapter:
    """An `Adapter` around a transformers `PreTrainedModel` and its tokenizer."""

    def __init__(
        self,
        spec: str,
        model: Any,
        tokenizer: Any | None,
        *,
        max_context: int,
        cache: str,
        source_generation_config: dict[str, Any],
    ):
        self.spec = spec
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.cache_kind = cache
        self._source_generation_config = source_generation_config
        self.eos_token_ids = stop_ids(spec, model, tokenizer, source_generation_config)
        self.pad_token_id = pad_id(spec, tokenizer, source_generation_config, self.eos_token_ids)
        vocab = model.get_input_embeddings().num_embeddings
        check_vocabulary(
            spec,
            vocab,
            {"eos id": self.eos_token_ids, "pad id": self.pad_token_id},
            tokens=None if tokenizer is None else id_count(tokenizer),
        )
        self._call: CacheCall | None = None  # the current or last generate call, whose cache memory() reports
        self._kv_peak = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # --- Adapter protocol ----------------------------------------------------------------------

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        import torch

        with torch.inference_mode():
            return self.model(input_ids=input_ids.to(self.device), use_cache=False).logits

    def encode(self, index: int, prompt: Prompt) -> list[int]:
        """Token ids of one prompt; empty prompts and prompts that fill the context are user errors."""
        if len(prompt) == 0:  # checked before tokenizing: a BOS-adding tokenizer would hide it
            raise AdapterError(f"prompt {index} is empty: give at least one character or token")
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise AdapterError(f"{self.spec} has no tokenizer: pass prompt {index} as token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if len(ids) >= self.max_context:
            raise AdapterError(
                f"prompt {index} has {len(ids)} tokens but {self.spec} holds at most {self.max_context} "
                "(prompt + generated): shorten the prompt"
            )
        return ids

    def generate(self, prompts: Sequence[Prompt], sampling: Sampling) -> list[Generation]:
        import torch

        ids = [self.encode(i, p) for i, p in enumerate(prompts)]
        if not ids:
            return []
        longest = max(len(x) for x in ids)
        # One batch shares one length: every row may generate until the longest prompt fills the context.
        max_new = min(sampling.max_new_tokens, self.max_context - longest)
        device = self.device
        rows = [
            x for x in ids for _ in range(sampling.n)
        ]  # prompt-major; greedy generate refuses num_return_sequences > 1
        input_ids, attention_mask = left_padded(rows, self.pad_token_id)

        self._call = None  # release the previous call's cache before allocating the next
        call = self._call = CacheCall(self.model.config, self.cache_kind, longest + max_new)
        hook = self.model.register_forward_hook(call.on_forward, with_kwargs=True)
        fork_devices = [device] if device.type == "cuda" else []
        start = time.perf_counter()
        try:
            with torch.inference_mode(), torch.random.fork_rng(devices=fork_devices), warnings.catch_warnings():
                # `past_key_values` is renamed `cache` in recent transformers; the old name works everywhere until 6.0
                warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
                torch.manual_seed(sampling.seed)
                out = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention_mask.to(device),
                    generation_config=generation_config(sampling, max_new, self.eos_token_ids, self.pad_token_id),
                    past_key_values=call.cache,
                    stopping_criteria=stop_criteria(self.spec, self.tokenizer, sampling.stop, longest),
                )
        finally:
            hook.remove()
        end = time.perf_counter()
        self._kv_peak = max(self._kv_peak, kv_bytes(call.cache))
        prefill_end = call.prefill_end if call.prefill_end is not None else end
        new_tokens = out[:, longest:].tolist()
        return [
            self._finish(row, rows[i], sampling, max_new, prefill_end - start, end - prefill_end)
            for i, row in enumerate(new_tokens)
        ]

    def _finish(
        self, row: list[int], prompt: list[int], sampling: Sampling, max_new: int, prefill_s: float, decode_s: float
    ) -> Generation:
        """Cut one output row at EOS or at the token completing a stop string; classify why it ended.

        Conventions (shared with the engine): an EOS token stays in `token_ids` and is counted, but not
        in `text`; a stop string ends `text` just before it, while `token_ids` keep the tokens up to
        the one that completed it.
        """
        eos_at = next((k for k, t in enumerate(row) if t in self.eos_token_ids), None)
        tokens = row[: eos_at + 1] if eos_at is not None else row
        body = row[:eos_at] if eos_at is not None else row
        tokenizer = self.tokenizer
        text = tokenizer.decode(body, skip_special_tokens=True) if tokenizer is not None else None
        reason: FinishReason = "eos" if eos_at is not None else "length"
        stopped = None if tokenizer is None or text is None else cut_row_at_stop(tokenizer, body, text, sampling.stop)
        if stopped is not None:
            tokens, text = stopped
            reason = "stop"
        elif eos_at is None and len(row) < max_new:
            reason = "stop"  # generate ended this row early without EOS: only a stop string does that
        return Generation(
            token_ids=tokens,
            text=text,
            finish_reason=reason,
            prompt_tokens=len(prompt),
            generated_tokens=len(tokens),
            prefill_seconds=prefill_s,
            decode_seconds=decode_s,
        )

    def memory(self) -> dict[str, int | None]:
        call = self._call
        allocated = kv_bytes(None if call is None else call.cache)
        used = allocated if call is None else call.kv_used(allocated)
        values = {
            "weights_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters()),
            "kv_bytes_allocated": allocated,
            "kv_bytes_used": used,
            "kv_bytes_peak": max(self._kv_peak, allocated),
        }
        return {key: values[key] for key in MEMORY_KEYS}

    def describe(self) -> dict[str, Any]:
        config = self.model.config
        text = config.get_text_config(decoder=True)
        return {
            "family": "transformers",
            "model_type": config.model_type,
            "architectures": list(config.architectures or []),
            "params": sum(p.numel() for p in self.model.parameters()),
            "loops": 1,
            "kv_strategy": "standard",
            "kv_cache": self.cache_kind,
            "dtype": str(next(self.model.parameters()).dtype).removeprefix("torch."),
            "device": str(self.device),
            "num_layers": getattr(text, "num_hidden_layers", None),
            "max_context": self.max_context,
            "config": json.loads(config.to_json_string(use_diff=False)),
            "checkpoint_generation_config": self._source_generation_config,
        }


def _max_context(config: Any, override: int | None, path: str) -> int:
    if override is not None:
        return int(override)
    text = config.get_text_config(decoder=True)
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, name, None)
        if isinstance(value, int) and value > 0:
            return value
    raise AdapterError(
        f"transformers:{path}: config.json names no context length (max_position_embeddings); pass max_context=N"
    )


@register("transformers", "any local transformers causal-LM directory (AutoModelForCausalLM, local files only)")
def load_transformers(
    path: str,
    *,
    dtype: Any = None,
    device: str | None = None,
    loops: int | None = None,
    seed: int | None = None,
    trust_remote_code: bool = False,
    cache: str = "dynamic",
    max_context: int | None = None,
) -> TransformersAdapter:
    """Load `transformers:PATH`. `seed` is accepted for the common override set (weights are loaded, not drawn)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    spec = f"transformers:{path}"
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise AdapterError(f"{spec}: no such directory")
    if not (folder / "config.json").is_file():
        raise AdapterError(f"{spec}: not a transformers model directory (no config.json)")
    check_closed(folder)  # transformers opens what the folder holds: no FIFO, device or shard outside it
    if loops not in (None, 1):
        raise AdapterError(f"{spec}: a transformers model does not loop; loops must be 1, got {loops}")
    if cache not in CACHE_KINDS:
        raise AdapterError(f"cache {cache!r} is not supported (allowed: {', '.join(CACHE_KINDS)})")
    if trust_remote_code:
        print(f"loopeval: warning: trust_remote_code=True runs Python code shipped in {folder}", file=sys.stderr)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        hint = (
            " (the directory ships its own code: pass --trust-remote-code to run it)"
            if "trust_remote_code" in str(exc)
            else ""
        )
        raise AdapterError(f"{spec}: cannot read config.json: {str(exc).splitlines()[0]}{hint}") from exc
    if getattr(config, "auto_map", None) and not trust_remote_code:
        raise AdapterError(
            f"{spec}: the model's code ships in the directory (auto_map); pass --trust-remote-code to run it"
        )
    torch_dtype = _resolve_dtype(dtype, getattr(config, "dtype", None), torch.device(device).type)
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(
            folder, config=config, dtype=torch_dtype, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except (
        Exception
    ) as exc:  # corrupt or mismatched files fail in many ways (SafetensorError, RuntimeError, OSError...)
        raise AdapterError(
            f"{spec}: cannot load the model: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        ) from exc
    model.to(device).eval()
    threads.ensure(sum(p.numel() for p in model.parameters()))
    source_generation_config = model.generation_config.to_diff_dict() if model.generation_config is not None else {}
    model.generation_config = GenerationConfig()  # neutral: only the Sampling we are given applies
    tokenizer = None
    if any((folder / name).is_file() for name in _TOKENIZER_FILES):
        try:
            tokenizer = AutoTokenizer.from_pretrained(
                folder, local_files_only=True, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise AdapterError(f"{spec}: cannot load the tokenizer: {str(exc).splitlines()[0]}") from exc
    return TransformersAdapter(
        spec,
        model,
        tokenizer,
        max_context=_max_context(config, max_context, path),
        cache=cache,
        source_generation_config=source_generation_config,
    )
