"""Checkpoints: engine round trip, HF Ouro-format and MELT directories written here, and clear errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import adapters
from adapters.base import AdapterError, Sampling
from adapters.engine.io.checkpoint import random_model, save_checkpoint
from adapters.files import COMPLETE_MARKER
from adapters.engine.io.presets import preset
from adapters.engine.io.tokenizer import char_tokenizer

GREEDY = Sampling(temperature=0, max_new_tokens=8)
IDS = torch.tensor([[1, 40, 41, 42, 43, 44]])


@pytest.mark.numerics
def test_engine_round_trip(tmp_path):
    source = adapters.load("preset:melt-tiny", seed=7, dtype="fp32", device="cpu")
    save_checkpoint(source.model, tmp_path / "ckpt", source.tokenizer)
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        COMPLETE_MARKER,
    }
    loaded = adapters.load(f"melt:{tmp_path / 'ckpt'}", dtype="fp32", device="cpu")
    assert loaded.config == source.config
    torch.testing.assert_close(loaded.forward_logits(IDS), source.forward_logits(IDS), rtol=0, atol=0)
    assert loaded.generate(["12+3="], GREEDY)[0].token_ids == source.generate(["12+3="], GREEDY)[0].token_ids
    assert loaded.tokenizer.decode(loaded.tokenizer("a+b")["input_ids"], skip_special_tokens=True) == "a+b"
    bf16 = adapters.load(f"melt:{tmp_path / 'ckpt'}", dtype="bf16", device="cpu")
    assert bf16.describe()["dtype"] == "bf16" and bf16.memory()["weights_bytes"] * 2 == loaded.memory()["weights_bytes"]


def _write_ouro_dir(path, model, gates: bool = False, **fields) -> None:
    """An Ouro checkpoint as the HF release lays it out: Qwen2-style config + total_ut_steps (+ `fields`), HF tensor names."""
    cfg = model.config
    path.mkdir()
    tensors = {k: v.contiguous() for k, v in model.state_dict().items() if gates or "melt_gate" not in k}
    save_file(tensors, str(path / "model.safetensors"))
    config = {
        "architectures": ["OuroForCausalLM"],
        "model_type": "ouro",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.shared_layers,
        "vocab_size": cfg.vocab_size,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "tie_word_embeddings": False,
        "total_ut_steps": cfg.loops,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32",
        **fields,
    }
    if gates:
        config["melt_gate_variant"] = cfg.gate_variant
        config["melt_chunk_size"] = cfg.chunk_size
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.numerics
def test_hf_ouro_directory_loads_and_runs(tmp_path):
    engine = random_model("ouro-tiny", 3, torch.float32, "cpu")
    names = set(engine.state_dict())
    assert {
        "model.layers.1.input_layernorm_2.weight",
        "model.layers.0.post_attention_layernorm_2.weight",
        "model.early_exit_gate.bias",
        "lm_head.weight",
        "model.norm.weight",
    } <= names
    _write_ouro_dir(tmp_path / "ouro", engine)
    char_tokenizer().save_pretrained(str(tmp_path / "ouro"))
    ouro = adapters.load(f"ouro:{tmp_path / 'ouro'}", dtype="fp32", device="cpu", loops=3)
    d = ouro.describe()
    assert (d["family"], d["kv_strategy"], d["trained_loops"], d["loops"]) == ("ouro", "per_loop", 4, 3)
    with torch.no_grad():
        torch.testing.assert_close(
            ouro.forward_logits(IDS), engine(IDS, loops=3).logits, rtol=0, atol=0
        )  # same arithmetic
    gen = ouro.generate(["7*6="], GREEDY)[0]
    assert gen.generated_tokens >= 1 and gen.loops_used == [3] * gen.generated_tokens and isinstance(gen.text, str)


@pytest.mark.numerics
@pytest.mark.parametrize("threshold,loop", [(0.75, 2), (0.8, 3), (1.0, 4), (None, 4)])
def test_ouro_early_exit_threshold_reads_the_loop_the_reference_does(tmp_path, threshold, loop):
    """config.json's early_exit_threshold is the default exit policy, applied as the official Ouro code does.

    With the exit gate's weight and bias at 0 every loop's lambda is 1/2: exit probabilities 1/2, 1/4,
    1/8, 1/8, running sums 0.5, 0.75, 0.875, 1. Each token is read from the first loop whose running sum
    reaches the threshold (0.75: loop 2, at the boundary; 0.8: loop 3); 1 and no threshold read the last.
    """
    engine = random_model("ouro-tiny", 3, torch.float32, "cpu")
    with torch.no_grad():
        engine.model.early_exit_gate.weight.zero_()
        engine.model.early_exit_gate.bias.zero_()
    _write_ouro_dir(tmp_path / "ouro", engine, **({} if threshold is None else {"early_exit_threshold": threshold}))
    ouro = adapters.load(f"ouro:{tmp_path / 'ouro'}", dtype="fp32", device="cpu")
    ouro.config.eos_token_id, ouro.config.extra["eos_token_ids"] = None, []  # all 8 tokens
    assert ouro.config.exit_threshold == threshold
    assert ouro.describe()["exit_policy"]["kind"] == ("threshold" if loop < 4 else "none")
    prompt = [1, 40, 41, 42]
    gen = ouro.generate([prompt], GREEDY)[0]
    assert gen.loops_used == [loop] * 8
    with torch.no_grad():
        out = engine(torch.tensor([prompt + gen.token_ids]), return_loop_logits=True)
    assert out.exit_probs[:, 0, 0].tolist() == [0.5, 0.25, 0.125, 0.125]
    greedy = [z[0, len(prompt) - 1 : -1].argmax(-1).tolist() for z in out.loop_logits]
    assert greedy[loop - 1] == gen.token_ids and any(g != gen.token_ids for g in greedy)
    if loop < 4:  # an explicit policy overrides the checkpoint's
        assert (
            adapters.load(f"ouro:{tmp_path / 'ouro'}", dtype="fp32", device="cpu", exit_policy="none").describe()[
                "exit_policy"
            ]["kind"]
            == "none"
        )


@pytest.mark.numerics
def test_melt_from_ouro_directory_with_gate_tensors(tmp_path):
    melt = random_model(preset("melt-tiny").replace(chunk_size=2), 4, torch.float32, "cpu")
    _write_ouro_dir(tmp_path / "melt", melt, gates=True)
    loaded = adapters.load(f"melt:{tmp_path / 'melt'}", dtype="fp32", device="cpu")
    assert loaded.tokenizer is None and loaded.config.kv_strategy == "gated" and loaded.config.chunk_size == 2
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward_logits(IDS), melt(IDS).logits, rtol=0, atol=0)  # same arithmetic
    assert loaded.generate([[1, 5, 6]], GREEDY)[0].text is None
    _write_ouro_dir(tmp_path / "gateless", random_model("ouro-tiny", 4, torch.float32, "cpu"))
    cfg = json.loads((tmp_path / "gateless" / "config.json").read_text())
    (tmp_path / "gateless" / "config.json").write_text(json.dumps({**cfg, "melt_gate_variant": "elementwise"}))
    with pytest.raises(AdapterError, match="melt_gate"):
        adapters.load(f"melt:{tmp_path / 'gateless'}", device="cpu")


def test_unreadable_checkpoints_name_the_path(tmp_path):
    with pytest.raises(AdapterError, match="missing.*not a directory"):
        adapters.load(f"qwen3:{tmp_path / 'missing'}", device="cpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="empty.*config.json"):
        adapters.load(f"ouro:{tmp_path / 'empty'}", device="cpu")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(AdapterError, match="bad.*JSON"):
        adapters.load(f"qwen3:{bad}", device="cpu")
    noweights = tmp_path / "noweights"
    save_checkpoint(random_model("qwen3-tiny", 0, torch.float32, "cpu"), noweights)
    (noweights / "model.safetensors").unlink()
    with pytest.raises(AdapterError, match="noweights.*safetensors"):
        adapters.load(f"qwen3:{noweights}", device="cpu")
    (noweights / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(AdapterError, match="cannot read safetensors"):
        adapters.load(f"qwen3:{noweights}", device="cpu")
    wrong = tmp_path / "wrong"
    save_checkpoint(random_model("qwen3-tiny", 0, torch.float32, "cpu"), wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    cfg["config"]["ffn_size"] = 128
    (wrong / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AdapterError, match="shape"):
        adapters.load(f"qwen3:{wrong}", device="cpu")
    with pytest.raises(AdapterError, match="kv_strategy"):
        adapters.load(f"melt:{noweights.parent / 'wrong'}", device="cpu")
