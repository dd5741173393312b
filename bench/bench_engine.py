"""Engine vs transformers decode speed, continuous vs static batching, and (with --gpu --full) full-size memory at 32000 tokens.

CPU mode (default): one tiny Qwen3 config and one set of random weights, loaded both as a
transformers `Qwen3ForCausalLM` and into the engine (through the HF directory loader, so the
weights are the same); the same prompts and sampling (temperature 1.0, top-p 0.7, fixed new-token
count, EOS disabled). Every round times the engine's static and continuous paths at batch 1, 4 and
16 and transformers at batch 1, alternating; prints the best decode tokens/s of each and the
median over rounds of each ratio (engine against transformers at batch 1, continuous against
static at batch 1 and 4, and the continuous step's cost against the static step's at batch 16).

Batching mode (`--batching`): one tiny preset and one workload whose generation lengths are
long-tailed, run with static batches and with the continuous-batching scheduler at the same
concurrency cap, alternating, in one process. The preset's end-of-sequence id is one of ~99 tokens
a random model samples about uniformly, so lengths are geometric (mean ~90, cut at
--new-tokens), and fixed by the seed: both modes produce the same tokens, up to float rounding
(the sequences that differ are counted). `--eos-id` makes another token the end of a sequence:
melt-tiny's random weights sample the preset's EOS rarely (mean length 280 of 512), and
`--eos-id 50`, a token they sample at about 1.8% of steps, gives it the same geometric lengths.
Prints useful
tokens/s (generated tokens over wall time) of both and the ratio, the length distribution, the
peak KV each held, and the largest gap between KV held and KV used seen by a 1 ms reader, in blocks
(at most one per running sequence, so at most the cap).

GPU mode (`--gpu --full`): for each full-size preset (random bf16 weights), prefill batch 1 to
32000 tokens and report weights, KV (allocated), torch-allocated peak and NVML process bytes, then
decode tokens/s at batch 1 and 32 (and transformers' `generate` on the Qwen3 shape, same run), and
`checks`: each target of the engine issue as a ratio: batch-1 decode as measured / bound, where the bound is
the device's bandwidth over the bytes a decode step reads (`bench_slope.bytes_read`: the weights, the shared
layers' once per loop, and the K/V rows at the mean context), with those bytes and the bandwidth beside it
(nominal where the device is known, and measured in the same process); batch 32 against transformers, MELT
against Ouro, NVML against weights + KV + the CUDA context. Needs only torch, transformers and nvidia-ml-py.

    python bench/bench_engine.py                  # CPU, tiny Qwen3
    python bench/bench_engine.py --gpu --full     # GPU, full-size presets
    python bench/bench_engine.py --full --presets qwen3-tiny,melt-tiny --context 300 --new-tokens 16   # CPU dry run
    python bench/bench_engine.py --batching --threads 1 --new-tokens 512   # continuous vs static, CPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import statistics
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_slope beside it, however this file is loaded

import adapters  # noqa: E402
from adapters.base import PAPER_PROTOCOL, Sampling  # noqa: E402
from adapters.engine.adapter import EngineAdapter, load_preset  # noqa: E402
from bench_slope import bytes_read, read_bandwidth  # noqa: E402


def hf_qwen3(name: str, seed: int = 0) -> torch.nn.Module:
    """A transformers `Qwen3ForCausalLM` with a Qwen3 preset's shape and seeded random weights."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from adapters.engine.io.presets import preset

    cfg = preset(name)
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            intermediate_size=cfg.ffn_size,
            num_hidden_layers=cfg.shared_layers,
            num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            max_position_embeddings=cfg.max_position,
            tie_word_embeddings=cfg.tie_embeddings,
            rope_parameters={"rope_theta": cfg.rope_theta, "rope_type": "default"},
            rms_norm_eps=cfg.norm_eps,
        )
    ).eval()


def tiny_qwen3_dir(directory: str, seed: int = 0) -> torch.nn.Module:
    """A random tiny Qwen3 (the qwen3-tiny preset's shape) saved as transformers writes it."""
    hf = hf_qwen3("qwen3-tiny", seed)
    hf.save_pretrained(directory)
    return hf


def bench_cpu(new_tokens: int, prompt_len: int, rounds: int) -> dict:
    """Decode tokens/s of the engine's continuous and static paths at batch 1, 4 and 16, and of transformers
    at batch 1, on the same weights, prompts and sampling; every round times each once, alternating.

    On a shared machine single timings swing by tens of percent, so each ratio is computed within a
    round (the two paths timed back to back) and the median over rounds is reported beside the best
    figures. The step cost of continuous against static at a batch is the inverse of their tok/s ratio.
    """
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as directory:
        hf = tiny_qwen3_dir(directory)
        engine: EngineAdapter = adapters.load(f"qwen3:{directory}", dtype="fp32", device="cpu")
    sampling = replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens, seed=0)
    engine.config.extra["eos_token_ids"] = []  # the same fixed token count on both sides
    engine.config.eos_token_id = None
    prompts = {
        b: torch.randint(3, engine.config.vocab_size, (b, prompt_len), generator=torch.Generator().manual_seed(b))
        for b in (1, 4, 16)
    }
    tok_s: dict[str, list[float]] = {}
    for _ in range(rounds):
        for batch, tokens in prompts.items():
            for mode in ("static", "continuous"):
                engine.batching = mode
                gens = engine.generate(tokens.tolist(), sampling)
                tok_s.setdefault(f"{mode} {batch}", []).append(
                    sum(g.generated_tokens - 1 for g in gens) / max(g.decode_seconds for g in gens)
                )
        tok_s.setdefault("transformers 1", []).append(_hf_decode_tps(hf, prompts[1], sampling))

    def median_ratio(a: str, b: str) -> float:
        return round(statistics.median(x / y for x, y in zip(tok_s[a], tok_s[b])), 2)

    return {
        "threads": torch.get_num_threads(),
        "new_tokens": new_tokens,
        "prompt_tokens": prompt_len,
        "rounds": rounds,
        "best_decode_tok_s": {key: round(max(values), 1) for key, values in tok_s.items()},
        "engine / transformers at batch 1 (target >= 2)": median_ratio("continuous 1", "transformers 1"),
        "continuous / static tok/s (target >= 1 at batch 1 and 4)": {
            b: median_ratio(f"continuous {b}", f"static {b}") for b in (1, 4)
        },
        "continuous / static step cost at batch 16 (target <= 1.2)": median_ratio("static 16", "continuous 16"),
    }


def _hf_decode_tps(hf: torch.nn.Module, prompts: torch.Tensor, sampling: Sampling) -> float:
    """transformers' decode tokens/s: (generate time - one-token generate time) over the tokens after the first."""
    kwargs = dict(
        do_sample=True,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    with torch.inference_mode():
        t0 = time.perf_counter()
        hf.generate(prompts, max_new_tokens=1, min_new_tokens=1, **kwargs)
        first = time.perf_counter() - t0
        t0 = time.perf_counter()
        out = hf.generate(
            prompts, max_new_tokens=sampling.max_new_tokens, min_new_tokens=sampling.max_new_tokens, **kwargs
        )
        if out.is_cuda:
            torch.cuda.synchronize()
        total = time.perf_counter() - t0
    new = out.shape[1] - prompts.shape[1]
    return prompts.shape[0] * (new - 1) / max(total - first, 1e-9)


BATCH1_GOAL = 0.75  # batch-1 decode as a share of the bandwidth bound (vLLM about 0.70, gpt-fast 0.69)
# nominal HBM bandwidth (bytes/s) by a substring of the device's name: the bound the ratios are quoted against
NOMINAL_BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12}
CONTEXT_BYTES_NOTE = "NVML process bytes after CUDA initialised and nothing else allocated"


def bench_memory(device: str, names: list[str], context: int, new_tokens: int, batches: tuple[int, ...]) -> dict:
    """Prefill batch 1 to `context` tokens per preset and account its memory, then decode speed per batch
    size (and transformers' on the Qwen3 shapes), and check each figure against its target."""
    cuda = device.startswith("cuda")
    nvml = _nvml_process_bytes() if cuda else None
    if cuda:
        torch.zeros(1, device=device)
    out = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "context": context,
        "new_tokens": new_tokens,
        "cuda_context_bytes": nvml() if nvml else None,
        "read_bandwidth_measured": read_bandwidth(torch.device(device)),
        "models": {},
    }
    for name in names:
        if cuda:
            gc.collect()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        try:
            out["models"][name] = _memory_row(name, device, context, new_tokens, batches, nvml)
        except Exception as error:  # noqa: BLE001 (one device run measures every preset it can: report this one's failure)
            out["models"][name] = {"error": f"{type(error).__name__}: {error}"}
        print(name, json.dumps(out["models"][name]), file=sys.stderr, flush=True)
    out["checks"] = _checks(out, batches)
    return out


def _memory_row(
    name: str,
    device: str,
    context: int,
    new_tokens: int,
    batches: tuple[int, ...],
    nvml: Callable[[], int | None] | None,
) -> dict:
    """One preset's figures: memory after prefilling `context` tokens, decode speed at it and per batch size."""
    from adapters.engine.memory import estimate

    cuda = device.startswith("cuda")
    adapter = load_preset(name, dtype="bf16", device=device, max_batch=max(batches))
    adapter.config.eos_token_id = None  # fixed token counts
    adapter.config.extra["eos_token_ids"] = []
    vocab = adapter.config.vocab_size
    weights_read, kv_per_token = bytes_read(adapter.model, adapter.loops)
    row: dict = {
        "analytic": estimate(adapter.config, context + new_tokens, 1, dtype="bf16").__dict__,
        # what one batch-1 decode step from a 64-token prompt reads, at the decode's mean context
        "decode_bytes_read_batch1": weights_read + kv_per_token * (64 + new_tokens // 2),
    }
    prompt = torch.randint(3, vocab, (context,)).tolist()
    gen = adapter.generate([prompt], replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens))[0]
    mem = adapter.memory()
    row.update(
        weights_bytes=mem["weights_bytes"],
        kv_bytes=mem["kv_bytes_peak"],
        prefill_seconds=round(gen.prefill_seconds, 3),
        decode_tok_s_at_context=round((gen.generated_tokens - 1) / gen.decode_seconds, 1),
        torch_allocated_peak=torch.cuda.max_memory_allocated() if cuda else None,
        nvml_process=nvml() if nvml else None,
    )
    for batch in batches:
        prompts = torch.randint(3, vocab, (batch, 64)).tolist()
        gens = adapter.generate(prompts, replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens))
        row[f"decode_tok_s_batch{batch}"] = round(sum(g.generated_tokens - 1 for g in gens) / gens[0].decode_seconds, 1)
    del adapter, gen, gens
    if name.startswith("qwen3"):
        row.update(_transformers_decode(name, device, vocab, new_tokens, batches))
    return row


def _transformers_decode(name: str, device: str, vocab: int, new_tokens: int, batches: tuple[int, ...]) -> dict:
    """transformers' decode tok/s on the same shape (its own random weights: speed does not depend on them)."""
    hf = hf_qwen3(name).to(device=device, dtype=torch.bfloat16)
    sampling = replace(PAPER_PROTOCOL, n=1, max_new_tokens=new_tokens)
    row = {
        f"transformers_decode_tok_s_batch{batch}": round(
            _hf_decode_tps(hf, torch.randint(3, vocab, (batch, 64), device=device), sampling), 1
        )
        for batch in batches
    }
    del hf
    return row


def bound_ratios(tok_s: float, step_bytes: int, nominal: float | None, measured: float) -> dict:
    """Measured tok/s against the bound (bandwidth / bytes a step reads), with the bytes and bandwidths beside it."""
    ratios = {"tok_s": tok_s, "bytes_per_step": step_bytes, "bandwidth_measured": measured}
    ratios["ratio_to_measured_bandwidth"] = round(tok_s * step_bytes / measured, 3)
    if nominal is not None:
        ratios.update(bandwidth_nominal=nominal, ratio=round(tok_s * step_bytes / nominal, 3))
    return ratios


def _checks(out: dict, batches: tuple[int, ...]) -> dict:
    """Each target of the GPU benchmark against the figures measured: the ratio, and whether it is met."""
    models, checks = {name: row for name, row in out["models"].items() if "error" not in row}, {}
    nominal = next((bw for key, bw in NOMINAL_BANDWIDTH.items() if key in out["device"]), None)
    for name, row in models.items():
        checks[f"{name} batch-1 decode / bandwidth bound (target >= {BATCH1_GOAL})"] = bound_ratios(
            row["decode_tok_s_batch1"], row["decode_bytes_read_batch1"], nominal, out["read_bandwidth_measured"]
        )
    big = max(batches)
    for name, row in models.items():
        if f"transformers_decode_tok_s_batch{big}" in row:
            checks[f"{name} batch-{big} decode / transformers (target 5)"] = round(
                row[f"decode_tok_s_batch{big}"] / row[f"transformers_decode_tok_s_batch{big}"], 2
            )
        if row["nvml_process"] is not None and out["cuda_context_bytes"] is not None:
            bound = 1.05 * (row["weights_bytes"] + row["kv_bytes"]) + out["cuda_context_bytes"]
            checks[f"{name} NVML process / (1.05 x (weights + KV) + context) (target <= 1)"] = round(
                row["nvml_process"] / bound, 3
            )
    if "melt-1.6b" in models and "ouro-1.4b" in models:
        checks["melt-1.6b / ouro-1.4b batch-1 decode (target >= 0.95)"] = round(
            models["melt-1.6b"]["decode_tok_s_batch1"] / models["ouro-1.4b"]["decode_tok_s_batch1"], 2
        )
    return checks


def bench_batching(
    name: str, prompts: int, samples: int, cap: int, new_tokens: int, repeats: int, eos_id: int | None
) -> dict:
    """Useful tokens/s of static and continuous batching at the same cap on one long-tailed workload."""
    adapter = load_preset(name, dtype="fp32", device="cpu", max_batch=cap)
    if eos_id is not None:
        adapter.config.eos_token_id, adapter.tokenizer = eos_id, None  # the token that ends a sequence, and no other
    rng = torch.Generator().manual_seed(0)
    workload = [
        [1]
        + torch.randint(
            5, adapter.config.vocab_size, (int(torch.randint(16, 33, (1,), generator=rng)),), generator=rng
        ).tolist()
        for _ in range(prompts)
    ]
    sampling = replace(PAPER_PROTOCOL, max_new_tokens=new_tokens, n=samples, seed=0)
    runs: dict[str, list[dict]] = {"static": [], "continuous": []}
    outputs: dict[str, list[list[int]]] = {}
    for _ in range(repeats):
        for mode in runs:
            adapter.batching = mode
            adapter.reset_memory_peak()
            seen: list[dict] = []
            stop = threading.Event()
            reader = threading.Thread(target=_read_memory, args=(adapter, seen, stop))
            reader.start()
            began = time.perf_counter()
            gens = adapter.generate(workload, sampling)
            wall = time.perf_counter() - began
            stop.set()
            reader.join()
            outputs[mode] = [g.token_ids for g in gens]
            memory = adapter.memory()
            runs[mode].append(
                {
                    "wall": wall,
                    "tokens": sum(g.generated_tokens for g in gens),
                    "kv_peak": memory["kv_bytes_peak"],
                    "kv_reserved": memory["kv_bytes_reserved_peak"],
                    "slack": max((m["kv_bytes_allocated"] - m["kv_bytes_used"] for m in seen), default=0),
                }
            )
    lengths = sorted(len(ids) for ids in outputs["continuous"])
    block_bytes = adapter.block_size * adapter.describe()["kv_bytes_per_token"]
    best = {mode: max(r["tokens"] / r["wall"] for r in rs) for mode, rs in runs.items()}
    return {
        "preset": name,
        "eos_id": adapter.config.eos_token_id,
        "threads": torch.get_num_threads(),
        "cap": cap,
        "sequences": prompts * samples,
        "new_tokens": new_tokens,
        "lengths": {
            "mean": round(statistics.mean(lengths), 1),
            "median": lengths[len(lengths) // 2],
            "p90": lengths[int(0.9 * len(lengths))],
            "max": lengths[-1],
        },
        "sequences_differing_from_static": sum(a != b for a, b in zip(outputs["static"], outputs["continuous"])),
        "useful_tok_s": {mode: [round(r["tokens"] / r["wall"], 1) for r in rs] for mode, rs in runs.items()},
        "ratio_best": round(best["continuous"] / best["static"], 2),
        "ratio_per_round": [
            round((c["tokens"] / c["wall"]) / (s["tokens"] / s["wall"]), 2)
            for s, c in zip(runs["static"], runs["continuous"])
        ],
        "kv_peak_bytes": {mode: rs[0]["kv_peak"] for mode, rs in runs.items()},
        "kv_reserved_bytes": {mode: rs[0]["kv_reserved"] for mode, rs in runs.items()},
        "continuous_max_held_minus_used_blocks": round(
            max(r["slack"] for r in runs["continuous"]) / block_bytes, 2
        ),  # <= sequences running <= cap
        "preemptions": adapter.preemptions,
    }


def _read_memory(adapter: EngineAdapter, seen: list[dict], stop: threading.Event) -> None:
    while not stop.wait(0.001):
        seen.append(adapter.memory())


def _nvml_process_bytes():
    """A function returning this process's GPU memory as NVML reports it (None where NVML is unavailable)."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    except Exception:  # noqa: BLE001 (no driver or no nvidia-ml-py: report None, measure the rest)
        return None

    def read() -> int | None:
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                return int(proc.usedGpuMemory or 0)
        return None

    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run on CUDA")
    parser.add_argument("--full", action="store_true", help="full-size presets at a long context (GPU)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--context", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=3, help="--batching: rounds")
    parser.add_argument("--rounds", type=int, default=9, help="CPU mode: alternating rounds")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--presets", default="qwen3-1.7b,ouro-1.4b,ouro-2.6b,melt-1.6b", help="--full: comma-separated presets"
    )
    parser.add_argument(
        "--device", default=None, help="--full without --gpu: run the memory path on this device (a dry run)"
    )
    parser.add_argument(
        "--batching", action="store_true", help="continuous vs static batching on a long-tailed workload (CPU)"
    )
    parser.add_argument("--preset", default="qwen3-tiny", help="--batching: the tiny preset")
    parser.add_argument("--prompts", type=int, default=32, help="--batching: prompts in the workload")
    parser.add_argument("--samples", type=int, default=4, help="--batching: samples per prompt")
    parser.add_argument("--cap", type=int, default=16, help="--batching: sequences decoding at once (both modes)")
    parser.add_argument(
        "--eos-id", type=int, default=None, help="--batching: the token id that ends a sequence (default: the preset's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batching:
        print(
            json.dumps(
                bench_batching(
                    args.preset, args.prompts, args.samples, args.cap, args.new_tokens, args.repeats, args.eos_id
                ),
                indent=2,
            )
        )
    elif args.full:
        if args.gpu and not torch.cuda.is_available():
            parser.error("--gpu needs CUDA")
        device = "cuda" if args.gpu else (args.device or "cpu")
        batches = (1, 32) if args.gpu else (1, 4)
        print(
            json.dumps(bench_memory(device, args.presets.split(","), args.context, args.new_tokens, batches), indent=2)
        )
    elif args.gpu:
        parser.error("GPU mode is --gpu --full")
    else:
        print(json.dumps(bench_cpu(args.new_tokens, args.prompt_tokens, args.rounds), indent=2))


if __name__ == "__main__":
    main()
