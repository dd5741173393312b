"""A plugin API that does not move: `harness.plugin_api` holds every name a plugin may import (the contract, the
registry, the character tokenizer, the conformance kit), each documented there; the scaffold imports loopeval's names
from it alone, and a plugin that imports nothing else of loopeval's loads from LOOPEVAL_ADAPTERS and passes the kit.
"""

from __future__ import annotations

import ast
from pathlib import Path
from string import Template

import pytest

import harness.plugin_api as api
from adapters import registry

ROOT = Path(__file__).resolve().parents[2]
OWN = ("adapters", "harness", "training", "suites", "db", "measures", "analysis", "dashboards")  # loopeval's packages

# A token-level plugin on the API alone: its model is the tiny Qwen3 preset, its tokenizer the character tokenizer.
PLUGIN = '''
"""`apionly:tiny`: imports nothing of loopeval's but harness.plugin_api."""
from harness.plugin_api import CHAR_VOCAB_SIZE, MEMORY_KEYS, AdapterError, Generation, Sampling, char_tokenizer, load, register


class ApiOnly:
    def __init__(self, inner):
        self.inner, self.spec, self.tokenizer = inner, "apionly:tiny", char_tokenizer()
        self.max_context = inner.max_context
        if len(self.tokenizer) != CHAR_VOCAB_SIZE:
            raise AdapterError("the character tokenizer changed its size")

    def forward_logits(self, input_ids):
        return self.inner.forward_logits(input_ids)

    def generate(self, prompts, sampling: Sampling) -> list[Generation]:
        if any(len(prompt) == 0 for prompt in prompts):
            raise AdapterError("an empty prompt: give at least one character")
        return self.inner.generate(prompts, sampling)

    def memory(self):
        values = self.inner.memory()
        return {key: values[key] for key in MEMORY_KEYS}

    def describe(self):
        return {**self.inner.describe(), "family": "apionly"}


@register("apionly", "the tiny Qwen3 preset through the plugin API alone")
def make(arg, **overrides):
    if arg != "tiny":
        raise AdapterError(f"apionly knows only tiny, got {arg!r}")
    return ApiOnly(load("preset:qwen3-tiny", **overrides))
'''


def _loopeval_imports(source: str) -> set[str]:
    """The modules of loopeval's own packages that `source` imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names = (
            [alias.name for alias in node.names]
            if isinstance(node, ast.Import)
            else [node.module]
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
            else []
        )
        found |= {name for name in names if name.split(".")[0] in OWN}
    return found


def test_every_name_is_importable_and_documented() -> None:
    doc = api.__doc__ or ""
    missing = [name for name in api.__all__ if f"`{name}" not in doc]
    assert not missing, f"named in harness.plugin_api.__all__ but not in its docstring: {missing}"
    assert all(getattr(api, name, None) is not None for name in api.__all__)
    guide = (ROOT / "docs" / "adding-adapters.md").read_text()
    assert "harness.plugin_api" in guide


def test_the_scaffold_imports_loopeval_only_through_the_api() -> None:
    folder = ROOT / "adapters" / "scaffold"
    for template in ("adapter.py.txt", "test_adapter.py.txt"):
        source = Template((folder / template).read_text()).substitute(name="myarch", Name="Myarch")
        assert _loopeval_imports(source) == {"harness.plugin_api"}, template


def test_a_plugin_on_the_api_alone_loads_from_the_env_and_passes_the_kit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None
) -> None:
    assert _loopeval_imports(PLUGIN) == {"harness.plugin_api"}
    (tmp_path / "apionly.py").write_text(PLUGIN)
    monkeypatch.setenv(registry.ENV_VAR, str(tmp_path))
    registry._loaded_plugins = False  # LOOPEVAL_ADAPTERS is read again on the next look-up
    report = api.check_adapter("apionly:tiny", bridge=False, strict=False, max_new_tokens=4)
    assert report.ok, str(report)
    assert {entry.prefix: entry.source for entry in registry.available()}["apionly"] == f"folder {tmp_path.resolve()}"
