"""A tiny local transformers Qwen3 checkpoint, made without any download, for trying and testing adapters.

The conformance kit that checks adapters is `harness.conformance.check_adapter`.
"""

from __future__ import annotations

from pathlib import Path


def save_tiny_qwen3(folder: str | Path, *, seed: int = 0, max_position: int = 128) -> Path:
    """Write a tiny random transformers `Qwen3ForCausalLM` and the engine's character tokenizer to `folder`.

    A local checkpoint to try `transformers:PATH` (and `vllm:PATH`) on, made without any download:
    GQA (4 heads, 2 KV heads) and a head dim different from hidden/heads, as in the real Qwen3.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from adapters.engine.tokenizer import CHAR_VOCAB_SIZE, char_tokenizer

    tokenizer = char_tokenizer()
    config = Qwen3Config(vocab_size=CHAR_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=24, max_position_embeddings=max_position, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    folder = Path(folder)
    Qwen3ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
