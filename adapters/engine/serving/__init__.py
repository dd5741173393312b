"""Continuous batching on a paged KV pool, split as nano-vllm splits it (docs/architecture.md, "The engine's files")."""
