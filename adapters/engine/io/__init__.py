"""What the engine reads and writes: checkpoints (the engine's, HF Ouro/Qwen3 and RavenConfig folders), presets, tokenizers."""
