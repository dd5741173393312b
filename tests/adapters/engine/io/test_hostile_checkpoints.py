"""Hostile checkpoint contents, refused by name at load (one line), never read kindly or found mid-run as a traceback.

- Every config value is checked by type in every loader (HF Qwen3/Ouro, Huginn, retrofit, generation_config.json):
  a boolean written as text is refused, not truthy (`"tie_word_embeddings": "false"` dropped the folder's own lm_head),
  a number written as text is refused (`float("1e6")` read it), token id lists hold integers only.
- Each family's tensors are checked by name and shape before they are split or reordered (Huginn's, the retrofit's).
- The tokenizer's ids and size are checked against the model's vocabulary at load (engine and transformers).

The folders are real: tiny checkpoints written here (`adapters.testing`), configs changed one field at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

import adapters
from adapters.base import AdapterError
from adapters.engine.io.checkpoint import random_model, save_checkpoint
from adapters.engine.io.tokenizer import char_tokenizer
from adapters.testing import save_tiny_huginn, save_tiny_qwen3, save_tiny_retrofit


def _ouro(path: Path, **changes: Any) -> Path:
    """ouro-tiny in the HF release's layout (config.json, model.safetensors, the character tokenizer), config `changes` applied."""
    model = random_model("ouro-tiny", 3, torch.float32, "cpu")
    cfg = model.config
    path.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    config = {
        "model_type": "ouro",
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.ffn_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.shared_layers,
        "vocab_size": cfg.vocab_size,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position,
        "total_ut_steps": cfg.loops,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
    }
    (path / "config.json").write_text(json.dumps({**config, **changes}))
    char_tokenizer().save_pretrained(str(path))
    return path


def _with_config(save: Callable[[Path], Path], **changes: Any) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        folder = save(path)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, **changes}))
        return folder

    return make


CONFIG_CASES: list[tuple[str, str, Callable[[Path], Path], str]] = [
    (
        "ouro-tie-as-text",
        "ouro",
        lambda p: _ouro(p, tie_word_embeddings="false"),
        "tie_word_embeddings must be true or false, got 'false'",
    ),
    (
        "ouro-rope-theta-as-text",
        "ouro",
        lambda p: _ouro(p, rope_theta="1e6"),
        "rope_theta must be a finite number > 0, got '1e6'",
    ),
    (
        "ouro-nested-rope-theta-as-text",
        "ouro",
        lambda p: _ouro(p, rope_parameters={"rope_theta": "big"}),
        "rope_theta must be a finite number > 0, got 'big'",
    ),
    (
        "ouro-eos-list-with-text",
        "ouro",
        lambda p: _ouro(p, eos_token_id=[2, "</s>"]),
        "eos_token_id must be a token id",
    ),
    (
        "ouro-eos-list-with-object",
        "ouro",
        lambda p: _ouro(p, eos_token_id=[{"id": 2}]),
        "eos_token_id must be a token id",
    ),
    ("ouro-bos-as-text", "ouro", lambda p: _ouro(p, bos_token_id="1"), "bos_token_id must be a token id"),
    ("ouro-eos-negative", "ouro", lambda p: _ouro(p, eos_token_id=-2), "eos_token_id must be a token id"),
    (
        "ouro-heads-as-text",
        "ouro",
        lambda p: _ouro(p, num_attention_heads="4"),
        "num_attention_heads must be a positive integer, got '4'",
    ),
    (
        "huginn-rope-base-as-text",
        "huginn",
        _with_config(save_tiny_huginn, rope_base="50000"),
        "rope_base must be a finite number > 0",
    ),
    (
        "huginn-rope-base-a-boolean",
        "huginn",
        _with_config(save_tiny_huginn, rope_base=True),
        "rope_base must be a finite number > 0",
    ),
    (
        "huginn-tie-as-text",
        "huginn",
        _with_config(save_tiny_huginn, tie_embeddings="true"),
        "tie_embeddings must be true or false",
    ),
    (
        "huginn-bias-as-text",
        "huginn",
        _with_config(save_tiny_huginn, bias="false"),
        "bias must be true or false, got 'false'",
    ),
    (
        "huginn-eos-as-object",
        "huginn",
        _with_config(save_tiny_huginn, eos_token_id={"id": 2}),
        "eos_token_id must be a token id",
    ),
    (
        "retrofit-qk-bias-as-text",
        "retrofit",
        _with_config(save_tiny_retrofit, qk_bias="false"),
        "qk_bias must be true or false",
    ),
    (
        "retrofit-rope-theta-as-text",
        "retrofit",
        _with_config(save_tiny_retrofit, rope_theta="500000"),
        "rope_theta must be a finite number",
    ),
]


@pytest.mark.parametrize(("what", "family", "make", "fragment"), CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_config_value_of_the_wrong_type_is_refused_by_field(
    what: str, family: str, make: Callable[[Path], Path], fragment: str, tmp_path: Path
) -> None:
    folder = make(tmp_path / "ckpt")
    for call in (
        lambda: adapters.inspect(f"{family}:{folder}"),
        lambda: adapters.load(f"{family}:{folder}", device="cpu"),
    ):
        with pytest.raises(AdapterError) as caught:
            call()
        assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


def test_a_real_false_keeps_the_checkpoint_s_own_head(tmp_path: Path) -> None:
    """The loader reads JSON false as false: the untied lm_head in the folder is the one evaluated."""
    folder = _ouro(tmp_path / "ckpt")
    adapter = adapters.load(f"ouro:{folder}", device="cpu", dtype="fp32")
    assert not adapter.config.tie_embeddings
    assert torch.equal(adapter.model.lm_head.weight, load_file(str(folder / "model.safetensors"))["lm_head.weight"])


def _tensors(save: Callable[..., Path], change: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        folder = save(path)
        tensors = load_file(str(folder / "model.safetensors"))
        change(tensors)
        save_file(tensors, str(folder / "model.safetensors"))
        return folder

    return make


def _reshaped(name: str, shape: tuple[int, ...]) -> Callable[[dict[str, torch.Tensor]], None]:
    def change(tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = torch.zeros(shape)

    return change


TENSOR_CASES: list[tuple[str, str, Callable[[Path], Path], str]] = [
    (
        "huginn-no-embedding",
        "huginn",
        _tensors(save_tiny_huginn, lambda t: t.pop("transformer.wte.weight")),
        "huginn checkpoint lacks tensor transformer.wte.weight",
    ),
    (
        "huginn-no-core-qkv",
        "huginn",
        _tensors(save_tiny_huginn, lambda t: t.pop("transformer.core_block.1.attn.Wqkv.weight")),
        "lacks tensor transformer.core_block.1.attn.Wqkv.weight",
    ),
    (
        "huginn-no-adapter",
        "huginn",
        _tensors(save_tiny_huginn, lambda t: t.pop("transformer.adapter.weight")),
        "lacks tensor transformer.adapter.weight",
    ),
    (
        "huginn-qk-bias-misshapen",
        "huginn",
        _tensors(save_tiny_huginn, _reshaped("transformer.prelude.0.attn.qk_bias", (2, 1, 3))),
        "tensor transformer.prelude.0.attn.qk_bias has shape (2, 1, 3)",
    ),
    (
        "huginn-fc-odd-rows",
        "huginn",
        _tensors(save_tiny_huginn, _reshaped("transformer.coda.0.mlp.fc.weight", (5, 64))),
        "tensor transformer.coda.0.mlp.fc.weight has shape (5, 64)",
    ),
    (
        "retrofit-qkv-misshapen",
        "retrofit",
        _tensors(save_tiny_retrofit, _reshaped("transformer.core_block.0.attn.Wqkv.weight", (7, 64))),
        "retrofit checkpoint: tensor transformer.core_block.0.attn.Wqkv.weight has shape (7, 64)",
    ),
    (
        "retrofit-no-head",
        "retrofit",
        _tensors(save_tiny_retrofit, lambda t: t.pop("lm_head.weight")),
        "lacks tensor lm_head.weight",
    ),
]


@pytest.mark.parametrize(("what", "family", "make", "fragment"), TENSOR_CASES, ids=[c[0] for c in TENSOR_CASES])
def test_a_missing_or_misshapen_official_tensor_is_refused_by_name(
    what: str, family: str, make: Callable[[Path], Path], fragment: str, tmp_path: Path
) -> None:
    folder = make(tmp_path / "ckpt")
    with pytest.raises(AdapterError) as caught:
        adapters.load(f"{family}:{folder}", device="cpu")
    assert fragment in str(caught.value) and str(folder) in str(caught.value) and "\n" not in str(caught.value), str(
        caught.value
    )


def _generation_eos(ids: Any) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        folder = _ouro(path)
        (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": ids}))
        return folder

    return make


def _sparse_tokenizer(path: Path) -> Path:
    """A tiny Huginn (official layout) whose tokenizer.json maps the letter "a" to id 500."""
    folder = save_tiny_huginn(path)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    tokenizer["model"]["vocab"]["a"] = 500
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


VOCABULARY_CASES: list[tuple[str, Callable[[Path], Path], str]] = [
    (
        "generation-eos-past-the-vocabulary",
        _generation_eos([2, 500]),
        "stop id 500 is outside the model's vocabulary of 99 tokens",
    ),
    (
        "generation-eos-as-text",
        _generation_eos(["</s>"]),
        "generation_config.json field eos_token_id must be a token id",
    ),
    ("config-eos-list-past-the-vocabulary", lambda p: _ouro(p, eos_token_id=[2, 4000]), "stop id 4000 is outside"),
    (
        "tokenizer-larger-than-the-vocabulary",
        lambda p: _ouro(p, vocab_size=64),
        "the tokenizer's ids run to 98, past the model's vocabulary of 64 (ids 0 to 63)",
    ),
    (  # 99 tokens, as many as the vocabulary, but one of them at id 500: its size alone would pass
        "tokenizer-id-past-the-vocabulary",
        _sparse_tokenizer,
        "the tokenizer's ids run to 500, past the model's vocabulary of 99 (ids 0 to 98)",
    ),
]


@pytest.mark.parametrize(("what", "make", "fragment"), VOCABULARY_CASES, ids=[c[0] for c in VOCABULARY_CASES])
def test_token_ids_past_the_vocabulary_are_refused_at_load(
    what: str, make: Callable[[Path], Path], fragment: str, tmp_path: Path
) -> None:
    """A stop id or tokenizer token past the model's vocabulary would index no embedding mid-run: refused when loading."""
    folder = make(tmp_path / "ckpt")
    if (
        what == "tokenizer-larger-than-the-vocabulary"
    ):  # weights of the smaller vocabulary, so only the tokenizer is wrong
        tensors = load_file(str(folder / "model.safetensors"))
        save_file(
            {
                k: v[:64].contiguous() if k in ("model.embed_tokens.weight", "lm_head.weight") else v
                for k, v in tensors.items()
            },
            str(folder / "model.safetensors"),
        )
    family = "huginn" if what == "tokenizer-id-past-the-vocabulary" else "ouro"
    for check in (adapters.load, adapters.inspect):  # the plan's check (no weights read) and the load alike
        with pytest.raises(AdapterError) as caught:
            check(f"{family}:{folder}", device="cpu")
        assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        ("x", "config field extra must be a table of notes, got 'x'"),
        ({"eos_token_ids": [2, "</s>"]}, "config extra field eos_token_ids must be a token id"),
        ({"generation_eos_ids": [4000]}, "stop id 4000 is outside the model's vocabulary of 99 tokens"),
    ],
)
def test_an_engine_checkpoint_s_notes_are_checked_too(extra: Any, fragment: str, tmp_path: Path) -> None:
    """The engine's own config.json carries free-form notes; the stop ids loading reads from them are checked the same way."""
    source = adapters.load("preset:ouro-tiny", device="cpu", dtype="fp32")
    folder = save_checkpoint(source.model, tmp_path / "ckpt", source.tokenizer)
    config = json.loads((folder / "config.json").read_text())
    config["config"]["extra"] = extra
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(AdapterError) as caught:
        adapters.load(f"ouro:{folder}", device="cpu")
    assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("generation", "fragment"),
    [
        ({"eos_token_id": ["</s>"]}, "generation_config.json field eos_token_id must be a token id"),
        ({"eos_token_id": [2, 5000]}, "eos id 5000 is outside the model's vocabulary of 99 tokens"),
    ],
)
def test_a_transformers_folder_s_stop_ids_are_read_by_type_and_checked_at_load(
    generation: dict, fragment: str, tmp_path: Path
) -> None:
    """The transformers backend reads the same ids through the same readers (`adapters.config_values`)."""
    folder = save_tiny_qwen3(tmp_path / "qwen3")
    (folder / "generation_config.json").write_text(json.dumps(generation))
    with pytest.raises(AdapterError) as caught:
        adapters.load(f"transformers:{folder}", device="cpu")
    assert fragment in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
