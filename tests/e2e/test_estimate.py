"""`loopeval estimate` and the analytic memory model behind it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
import torch

from adapters.base import MAX_CONTEXT, Sampling
from adapters.engine.kv.layouts import layout_of
from adapters.engine.kv.cache import KVCache
from adapters.engine.io.checkpoint import read_config
from adapters.engine.serving.paged import BlockPool
from adapters.engine.serving.sequence import Sequence
from adapters.engine.config import LoopConfig
from adapters.engine.io.presets import preset
from adapters.engine.memory import count_params, estimate
from adapters.engine.model import LoopedLM
from adapters.testing import save_tiny_retrofit
from adapters.zoo import zoo_info
from harness.cli import main


def figures(out: str) -> dict[str, int]:
    """The estimate's byte figures of a --json output (without the KV policy facts it also prints)."""
    data = json.loads(out)
    return {k: data[k] for k in ("params", "weights_bytes", "kv_bytes", "total_bytes")}


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["estimate", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_matches_the_analytic_model(capsys):
    code, out, _ = run(capsys, "ouro-1.4b", "--tokens", "32000", "--json")
    assert code == 0
    data = json.loads(out)
    assert data == {
        **estimate(preset("ouro-1.4b"), 32000).__dict__,
        "kv_policy": "per-loop",
        "kv_dtype": "auto",
        "kv_bytes_per_token": 24 * 4 * 2 * 16 * 128 * 2,
    }
    assert data["kv_bytes"] == 24 * 4 * 2 * 16 * 128 * 2 * 32000  # 96 entries x K and V x heads x dim x bf16
    code, out, _ = run(
        capsys, "melt-1.6b", "--tokens", "1000", "--batch", "4", "--loops", "8", "--dtype", "fp32", "--json"
    )
    assert json.loads(out)["kv_bytes"] == estimate(preset("melt-1.6b"), 1000, 4, 8, "fp32").kv_bytes
    code, out, _ = run(capsys, "qwen3-1.7b", "--tokens", "1", "--json")
    assert json.loads(out)["params"] == 1_720_574_976


def test_ouro_2_6b_weights_and_kv(capsys):
    """48 shared layers x 4 loops = 192 KV entries per token, twice Ouro-1.4B's."""
    code, out, _ = run(capsys, "ouro-2.6b", "--tokens", "32000", "--json")
    assert code == 0 and figures(out) == estimate(preset("ouro-2.6b"), 32000).__dict__
    assert json.loads(out)["params"] == 2_667_974_657
    assert json.loads(out)["kv_bytes"] == 48 * 4 * 2 * 16 * 128 * 2 * 32000
    code, out, _ = run(capsys, "ouro-2.6b", "--tokens", "32000")
    assert (
        code == 0
        and "5.336" in out
        and "50.332" in out
        and "192 entries (0 prelude + 48 shared x 4 loops + 0 coda)" in out
    )


@pytest.mark.parametrize("loops", [1, 4, 6])
def test_ouro_2_6b_layer_count_at_tiny_width_allocates_what_the_estimate_says(loops):
    """The 2.6B's 48 layers at tiny width, built for real: its parameters and the cache it allocates (on the CPU,
    real tensors) equal the analytic figures, as the presets' full shapes do on the meta device (test_engine)."""
    cfg = preset("ouro-2.6b").replace(
        hidden_size=64, num_heads=4, num_kv_heads=4, head_dim=16, ffn_size=96, vocab_size=99, max_position=512
    )
    assert cfg.shared_layers == 48 and layout_of(cfg).entries(cfg, loops) == 48 * loops
    assert sum(p.numel() for p in LoopedLM(cfg).parameters()) == count_params(cfg) == estimate(cfg, 1).params
    for dtype, torch_dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        cache = KVCache(cfg, layout_of(cfg), 2, 37, loops, torch_dtype, "cpu")
        assert (
            cache.kv_bytes_allocated
            == estimate(cfg, 37, 2, loops, dtype).kv_bytes
            == 2 * 48 * loops * 2 * 4 * 16 * 37 * torch_dtype.itemsize
        )


def test_table_in_decimal_gb_and_config_files(capsys, tmp_path):
    code, out, _ = run(capsys, "qwen3-1.7b", "--tokens", "32000")
    assert code == 0 and "GB (1e9 bytes)" in out and "3.670" in out and "3.441" in out  # KV and weights
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"format": "loopeval-engine", "config": preset("ouro-tiny").replace(loops=2).to_dict()}))
    code, out, _ = run(capsys, f"ouro:{path}", "--tokens", "100", "--json")
    assert code == 0 and figures(out) == estimate(preset("ouro-tiny").replace(loops=2), 100).__dict__


def test_takes_every_command_s_specs(capsys):
    """preset:NAME, the bare NAME and zoo:NAME, as `run` and `profile` take them."""
    code, bare, _ = run(capsys, "ouro-1.4b", "--tokens", "32000", "--json")
    code2, prefixed, _ = run(capsys, "preset:ouro-1.4b", "--tokens", "32000", "--json")
    assert code == code2 == 0 and bare == prefixed
    code, out, _ = run(capsys, "zoo:melt-tiny", "--tokens", "256", "--loops", "8", "--json")
    shipped = LoopConfig.from_dict(zoo_info("melt-tiny")["config"])
    assert code == 0 and figures(out) == estimate(shipped, 256, loops=8).__dict__
    code, out, _ = run(capsys, "zoo:melt-tiny", "--tokens", "256")
    assert code == 0 and "zoo:melt-tiny: 256 tokens" in out


def beyond_note(tokens: int, spec: str, context: int) -> str:
    """The line `estimate` adds when --tokens exceed the model's context."""
    return f"--tokens {tokens} exceeds {spec}'s context of {context} tokens: a run could not reach it (the figures are the analytic model's)"


def test_beyond_the_context_the_figure_is_printed_with_a_note(capsys):
    """An estimate is arithmetic: past the model's context it is still printed, and one line says a run could not reach it."""
    code, out, err = run(capsys, "huginn-0125", "--tokens", "32000", "--loops", "32")
    expected = estimate(preset("huginn-0125"), 32000, loops=32)
    assert code == 0 and err == "" and f"{expected.kv_bytes:,}" in out and f"{expected.total_bytes:,}" in out
    assert expected.kv_bytes == 2 * (2 + 4 * 32 + 2) * 55 * 96 * 2 * 32000
    assert out.strip().splitlines()[-1] == beyond_note(32000, "preset:huginn-0125", 4096)
    code, out, err = run(capsys, "huginn-0125", "--tokens", "32000", "--loops", "32", "--json")
    assert (
        code == 0
        and figures(out) == expected.__dict__
        and err.strip().splitlines() == [beyond_note(32000, "preset:huginn-0125", 4096)]
    )
    code, out, err = run(capsys, "huginn-0125", "--tokens", "4096", "--loops", "32")
    assert code == 0 and "exceeds" not in out + err


def test_printed_terms_are_the_block_pool_s_exact_accounting(capsys, tmp_path):
    """Past the context of a tiny retrofitted Llama (128 tokens; GQA, 2 of 4 heads keep K/V): the printed KV bytes and
    per-token terms are what a paged pool holding the same sequences accounts, and what its tensors take."""
    folder = save_tiny_retrofit(tmp_path / "retrofit")
    code, out, _ = run(
        capsys, f"retrofit:{folder}", "--tokens", "200", "--batch", "2", "--loops", "4", "--dtype", "fp32"
    )
    kv = int(re.search(r"KV cache\W+([\d,]+)", out).group(1).replace(",", ""))
    terms = re.search(
        r"KV per token: ([\d,]+) bytes = 2 \(K, V\) x (\d+) entries .* x (\d+) KV heads x head dim (\d+) x (\d+) bytes",
        out,
    )
    per_token, entries, heads, head_dim, size = (int(g.replace(",", "")) for g in terms.groups())
    assert (
        code == 0
        and (entries, heads, head_dim, size) == (1 + 2 * 4 + 1, 2, 16, 4)
        and per_token == 2 * entries * heads * head_dim * size
    )
    assert beyond_note(200, f"retrofit:{folder}", 128) in out
    pool = BlockPool(
        read_config(folder),
        layout_of(read_config(folder)),
        4,
        num_blocks=50,
        block_size=8,
        latent_tokens=1,
        dtype=torch.float32,
        device="cpu",
    )
    sequences = [Sequence(i, 0, i, 200, [5] * 200, 200, Sampling()) for i in range(2)]
    for seq in sequences:
        pool.manager.hold(seq, 200)
    pool.manager.wrote(sequences, 200)
    assert pool.manager.bytes_per_token == per_token and pool.manager.latent_bytes_per_token == 0
    assert pool.manager.kv_bytes_used == pool.manager.kv_bytes_allocated == kv == (pool.k.numel() + pool.v.numel()) * 4


@pytest.mark.parametrize(
    "args,needle",
    [
        (["nope", "--tokens", "5"], "unknown model 'nope'"),
        (["ouro-1.4c", "--tokens", "5"], "close: ouro-1.4b"),
        (["melt-tiny", "--tokens", "5"], "ambiguous: give one of preset:melt-tiny, zoo:melt-tiny"),
        (["qwen3-1.7b", "--tokens", str(MAX_CONTEXT + 1)], f"--tokens must be from 1 to {MAX_CONTEXT}"),
        (["transformers:/nowhere", "--tokens", "5"], "estimate reads an engine config"),
        (["qwen3-1.7b", "--tokens", "0"], "--tokens"),
        (["qwen3-1.7b", "--tokens", "many"], "--tokens"),
        (["qwen3-1.7b"], "--tokens"),
        (["qwen3-1.7b", "--tokens", "5", "--batch", "0"], "--batch"),
        (["ouro-1.4b", "--tokens", "5", "--loops", "0"], "--loops"),
        (["qwen3-1.7b", "--tokens", "5", "--loops", "2"], "standard"),
        (["qwen3-1.7b", "--tokens", "5", "--dtype", "int8"], "bf16, fp16, fp32"),
        (["ouro:/no/such/config.json", "--tokens", "5"], "/no/such/config.json"),
        (["/no/such/config.json", "--tokens", "5"], "unknown model '/no/such/config.json'"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(capsys, args, needle):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and needle in err


def test_estimate_imports_no_evaluation_stack():
    """The GPU machine's Python has torch but not lighteval, sqlalchemy, dash or vllm."""
    code = (
        "import sys; from harness.cli import main; rc = main(['estimate', 'melt-1.6b', '--tokens', '64', '--json']);"
        "heavy = [m for m in ('lighteval', 'sqlalchemy', 'pandas', 'dash', 'vllm') if m in sys.modules]; print(rc, heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "0 []"


def test_kv_policy_and_dtype(capsys):
    """--kv-policy and --kv-dtype reach the analytic model: shared-last is a quarter of Ouro-1.4B's per-loop KV at
    r = 4, int8 is a byte and the float32 scale per token and head; a policy the family cannot run exits 2 in one line."""
    code, out, _ = run(capsys, "ouro-1.4b", "--tokens", "32000", "--kv-policy", "shared-last", "--json")
    data = json.loads(out)
    assert code == 0 and data["kv_bytes"] == 24 * 2 * 16 * 128 * 2 * 32000 <= 6.5e9
    assert (data["kv_policy"], data["kv_dtype"], data["kv_bytes_per_token"]) == (
        "shared-last",
        "auto",
        24 * 2 * 16 * 128 * 2,
    )
    code, out, _ = run(
        capsys, "ouro-1.4b", "--tokens", "10", "--kv-policy", "shared-mean", "--kv-dtype", "int8", "--json"
    )
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 24 * 2 * 16 * (128 + 4)
    code, out, _ = run(capsys, "huginn-0125", "--tokens", "4096", "--loops", "32", "--kv-policy", "latest-m4", "--json")
    assert code == 0 and json.loads(out)["kv_bytes_per_token"] == 2 * (2 + 4 * 32 + 2) * 55 * 96 * 2
    code, out, err = run(capsys, "zoo:qwen3-tiny-small", "--tokens", "10", "--kv-policy", "shared-last")
    assert (
        code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "applies to looped per-loop families" in err
    )
    code, out, err = run(capsys, "ouro-1.4b", "--tokens", "10", "--kv-dtype", "int4")
    assert code == 2 and "--kv-dtype must be one of auto, int8, fp8" in err
    code, out, err = run(capsys, "ouro-1.4b", "--tokens", "10", "--kv-policy", "latest-m4")
    assert code == 2 and "applies to the recurrent-depth families" in err
