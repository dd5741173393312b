"""Token ids as the Ouro release ships them: config files that say 0, a tokenizer that says 1 and 2."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

import adapters
from adapters.base import Sampling
from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.tokenizer import CHARS

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2 in Ouro's tokenizer
PROMPT = [1, 40, 41, 42, 43, 44]
STEPS = 8


def _ouro_tokenizer(path) -> None:
    """tokenizer.json + tokenizer_config.json with bos <|im_start|> (1), eos <|im_end|> (2), pad <|endoftext|> (0)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(vocab={t: i for i, t in enumerate(SPECIALS + CHARS)}, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIALS))
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>", pad_token="<|endoftext|>"
    ).save_pretrained(str(path))


def _greedy(model, ids: list[int], steps: int) -> list[int]:
    out = list(ids)
    with torch.no_grad():
        for _ in range(steps):
            out.append(int(model(torch.tensor([out])).logits[0, -1].argmax()))
    return out[len(ids) :]


def _swap_vocab(model, swaps: dict[int, int]) -> None:
    """Rename token ids (embedding and output rows together): the same model, whose greedy tokens are renamed alike."""
    order = list(range(model.config.vocab_size))
    for a, b in swaps.items():
        order[a], order[b] = order[b], order[a]
    with torch.no_grad():
        for weight in (model.model.embed_tokens.weight, model.lm_head.weight):
            weight.copy_(weight[order])


def _released_folder(path) -> tuple[list[int], int]:
    """An Ouro folder laid out as released whose model greedily emits 0 (<|endoftext|>) before it first emits 2 (<|im_end|>).

    Returns the greedy tokens and the step of the first 2. config.json and generation_config.json carry
    bos/eos/pad 0, as the public release does (its generation_config.json is derived from config.json).
    """
    model = random_model("ouro-tiny", 5, torch.float32, "cpu")
    tokens = _greedy(model, PROMPT, STEPS)
    a = tokens[0]
    stop = next(i for i, t in enumerate(tokens) if t not in tokens[:i] + PROMPT and i > 0)
    assert a not in PROMPT and {a, tokens[stop]}.isdisjoint({0, 2}), tokens
    _swap_vocab(model, {a: 0, tokens[stop]: 2})
    tokens = _greedy(model, PROMPT, STEPS)
    assert tokens[0] == 0 and tokens[stop] == 2 and 2 not in tokens[:stop]
    cfg = model.config
    path.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
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
                "bos_token_id": 0,
                "eos_token_id": 0,
                "pad_token_id": 0,
                "torch_dtype": "float32",
            }
        )
    )
    (path / "generation_config.json").write_text(
        json.dumps({"_from_model_config": True, "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0})
    )
    _ouro_tokenizer(path)
    return tokens, stop


def test_a_released_ouro_folder_stops_on_the_tokenizers_eos(tmp_path):
    tokens, stop = _released_folder(tmp_path / "ouro")
    ouro = adapters.load(f"ouro:{tmp_path / 'ouro'}", dtype="fp32", device="cpu")
    gen = ouro.generate([PROMPT], Sampling(temperature=0, max_new_tokens=STEPS))[0]
    assert (
        gen.token_ids == tokens[: stop + 1] and gen.finish_reason == "eos"
    )  # not at the first token, 0: the old rule stopped there
    cfg = ouro.config
    assert (cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id, cfg.extra["eos_token_ids"]) == (1, 2, 0, [2])


def test_a_generation_config_that_names_the_tokenizers_eos_is_kept(tmp_path):
    """Qwen3's generation_config.json lists <|im_end|> and <|endoftext|> (its pad): both stop a sample."""
    _released_folder(tmp_path / "ouro")
    (tmp_path / "ouro" / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    cfg = adapters.load(f"ouro:{tmp_path / 'ouro'}", dtype="fp32", device="cpu").config
    assert (cfg.eos_token_id, cfg.extra["eos_token_ids"]) == (2, [0, 2])
