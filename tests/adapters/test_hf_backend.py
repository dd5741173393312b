"""transformers backend on a tiny random Qwen3 saved locally: sampling mapped onto `generate`, KV bytes
read from the cache object, and the user errors around loading."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import adapters
from adapters import AdapterError, Sampling
from adapters.hf_backend import generation_config
from adapters.testing import save_tiny_qwen3


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"))


@pytest.fixture(scope="module")
def adapter(tiny_qwen3: Path) -> adapters.Adapter:
    return adapters.load(f"transformers:{tiny_qwen3}", device="cpu")


@pytest.mark.numerics
def test_greedy_equals_transformers_generate_and_batching_is_invisible(adapter, tiny_qwen3: Path) -> None:
    """The reference is transformers' own greedy `generate` on each prompt alone, unpadded."""
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(tiny_qwen3, local_files_only=True, dtype=torch.float32).eval()
    prompts = ["The answer is", "7*8=", "abcdefghij"]
    got = adapter.generate(prompts, Sampling(temperature=0, max_new_tokens=10))
    for prompt, g in zip(prompts, got):
        ids = adapter.tokenizer(prompt, return_tensors="pt").input_ids
        want = reference.generate(ids, do_sample=False, max_new_tokens=10, eos_token_id=2, pad_token_id=0)[
            0, ids.shape[1] :
        ].tolist()
        cut = want.index(2) + 1 if 2 in want else len(want)
        assert g.token_ids == want[:cut]
        assert g.prompt_tokens == ids.shape[1] and g.generated_tokens == len(g.token_ids)
    assert adapter.forward_logits(ids).shape == (1, ids.shape[1], adapter.tokenizer.vocab_size)


def test_seeded_sampling_reproduces_and_n_is_prompt_major(adapter) -> None:
    s = Sampling(temperature=1.0, top_p=1.0, max_new_tokens=8, n=3, seed=5)
    a = adapter.generate(["x=", "hello world"], s)
    b = adapter.generate(["x=", "hello world"], s)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    assert [g.prompt_tokens for g in a] == [3, 3, 3, 12, 12, 12]
    assert len({tuple(g.token_ids) for g in a}) > 1
    rng_before = torch.random.get_rng_state()
    adapter.generate(["x="], s)
    assert torch.equal(torch.random.get_rng_state(), rng_before), "generate must not move the caller's global RNG"


def test_top_k_none_means_off_not_transformers_default_50(adapter) -> None:
    def config_of(sampling: Sampling):
        return generation_config(sampling, 4, adapter.eos_token_ids, adapter.pad_token_id)

    config = config_of(Sampling(top_p=0.7, top_k=None))
    assert config.top_k == 0 and config.top_p == 0.7 and config.temperature == 1.0 and config.do_sample
    assert config_of(Sampling(top_k=3)).top_k == 3
    assert not config_of(Sampling(temperature=0)).do_sample


def test_stop_strings_match_generated_text_only(adapter) -> None:
    """transformers' own stop_strings would stop at once here: the prompt already ends with the stop string."""
    free = adapter.generate(["ab\n"], Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3))[0]
    text = free.text
    stop = next(
        text[k : k + 2] for k in range(1, len(text) - 2) if text.find(text[k : k + 2]) == k and text[k : k + 2].strip()
    )
    stopped = adapter.generate(
        ["ab" + stop], Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, stop=(stop,))
    )[0]
    assert stopped.generated_tokens >= 1  # not stopped by the stop string sitting in the prompt
    again = adapter.generate(["ab\n"], Sampling(temperature=1.0, top_p=1.0, max_new_tokens=16, seed=3, stop=(stop,)))[0]
    assert again.finish_reason == "stop" and again.text == text[: text.find(stop)]
    assert again.token_ids == free.token_ids[: len(again.token_ids)]


def _kv_bytes_per_position(config, batch: int) -> int:
    return config.num_hidden_layers * 2 * batch * config.num_key_value_heads * config.head_dim * 4  # float32


def test_kv_bytes_are_read_from_the_dynamic_cache(adapter) -> None:
    prompts = ["abc", "abcdefg"]  # 4 and 8 tokens with <bos>: left padded to 8
    adapter.generate(prompts, Sampling(temperature=0, max_new_tokens=5))
    m = adapter.memory()
    # the last generated token is never fed back, so the cache holds prompt + new - 1 positions
    expected = _kv_bytes_per_position(adapter.model.config, 2) * (8 + 5 - 1)
    assert m["kv_bytes_allocated"] == m["kv_bytes_used"] == expected
    assert m["kv_bytes_peak"] >= expected
    assert m["weights_bytes"] == sum(p.numel() * 4 for p in adapter.model.parameters())


def test_static_cache_reports_allocated_and_used_apart(tiny_qwen3: Path) -> None:
    static = adapters.load(f"transformers:{tiny_qwen3}", device="cpu", cache="static")
    static.generate(["abc"], Sampling(temperature=0, max_new_tokens=6))
    m = static.memory()
    per_position = _kv_bytes_per_position(static.model.config, 1)
    assert m["kv_bytes_allocated"] == per_position * (4 + 6)
    assert m["kv_bytes_used"] == per_position * (4 + 6 - 1)


def test_load_errors_are_one_line_user_errors(tiny_qwen3: Path, tmp_path: Path) -> None:
    with pytest.raises(AdapterError, match="no such directory"):
        adapters.load(f"transformers:{tmp_path / 'missing'}")
    with pytest.raises(AdapterError, match="no config.json"):
        adapters.load(f"transformers:{tmp_path}")
    with pytest.raises(AdapterError, match="loops must be 1"):
        adapters.load(f"transformers:{tiny_qwen3}", loops=4)
    with pytest.raises(AdapterError, match="dtype 'int4' is not one of"):
        adapters.load(f"transformers:{tiny_qwen3}", dtype="int4")
    with pytest.raises(AdapterError, match="cache 'paged' is not supported"):
        adapters.load(f"transformers:{tiny_qwen3}", cache="paged")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_qwen3, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(AdapterError, match="cannot load the model"):
        adapters.load(f"transformers:{broken}")


def test_remote_code_needs_the_flag_and_warns(
    tiny_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory that ships its own modeling code runs only with trust_remote_code=True, with a warning."""
    remote = tmp_path / "remote"
    shutil.copytree(tiny_qwen3, remote)
    (remote / "modeling_tinyremote.py").write_text(
        "from transformers import Qwen3ForCausalLM\n\n\nclass TinyRemoteForCausalLM(Qwen3ForCausalLM):\n    marker = 'ran-remote-code'\n"
    )
    config = json.loads((remote / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_tinyremote.TinyRemoteForCausalLM"}
    (remote / "config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError, match="--trust-remote-code"):
        adapters.load(f"transformers:{remote}")
    loaded = adapters.load(f"transformers:{remote}", trust_remote_code=True)
    assert type(loaded.model).marker == "ran-remote-code"
    assert "warning: trust_remote_code=True runs Python code shipped in" in capsys.readouterr().err
