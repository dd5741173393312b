"""Shared pytest fixtures. Tests run on the CPU with real tensors, real SQLite files and the real LightEval pipeline."""

from __future__ import annotations

import os

import pytest
import torch

# Two cores: keep torch from oversubscribing them when pytest runs several heavy tests.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may download at run time: make any accidental hub access fail fast."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _grad_enabled() -> None:
    """LightEval 0.13 calls torch.set_grad_enabled(False) at import; tests that train need autograd back."""
    torch.set_grad_enabled(True)
