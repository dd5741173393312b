"""A model folder that ships Python (config, model and tokenizer all naming custom code via `auto_map`)
never runs it without --trust-remote-code, even when stdin answers transformers' question with "y"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.tokenizer import char_tokenizer

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
pytestmark = pytest.mark.slow  # the console script in subprocesses, answering prompts on stdin

RUN = [
    "run",
    "--tasks",
    "lookup",
    "--limit",
    "1",
    "--samples",
    "1",
    "--max-new-tokens",
    "1",
    "--loops",
    "1",
    "--no-report",
]


@pytest.fixture(scope="module")
def hostile_ouro(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """An Ouro-format folder (real tiny weights) whose config and tokenizer point at code that writes a marker."""
    root = tmp_path_factory.mktemp("remote")
    folder, marker = root / "ouro", root / "MARKER"
    folder.mkdir()
    model = random_model("ouro-tiny", 0, torch.float32, "cpu")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    cfg = model.config
    char_tokenizer().save_pretrained(str(folder))
    payload = f"open({str(marker)!r}, 'a').write(__name__ + '\\n')\n"
    for module, cls, base in (
        ("configuration_evil", "EvilConfig", "PretrainedConfig"),
        ("modeling_evil", "EvilModel", "PreTrainedModel"),
        ("tokenization_evil", "EvilTokenizer", "PreTrainedTokenizerFast"),
    ):
        (folder / f"{module}.py").write_text(
            f"{payload}from transformers import {base}\n\n\nclass {cls}({base}):\n    model_type = 'evil'\n"
        )
    config = {
        "architectures": ["EvilModel"],
        "model_type": "evil",
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
        "pad_token_id": 0,
        "auto_map": {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"},
    }
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    tokenizer_config["auto_map"] = {
        "AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]
    }
    tokenizer_config["tokenizer_class"] = "EvilTokenizer"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return folder, marker


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([LOOPEVAL, *args], input="y\n" * 20, capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_engine_reads_the_folder_without_running_its_code(hostile_ouro: tuple[Path, Path], tmp_path: Path):
    folder, marker = hostile_ouro
    result = _run([*RUN, "--model", f"ouro:{folder}", "--db", str(tmp_path / "r.sqlite")], tmp_path)
    assert result.returncode == 0, result.stderr
    assert not marker.exists(), marker.read_text()


def test_transformers_refuses_the_folder_naming_the_flag(hostile_ouro: tuple[Path, Path], tmp_path: Path):
    folder, marker = hostile_ouro
    result = _run([*RUN, "--model", f"transformers:{folder}", "--db", str(tmp_path / "r.sqlite")], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopeval: error:") and "--trust-remote-code" in lines[0], (
        result.stderr
    )
    assert not marker.exists(), marker.read_text()
    assert not (tmp_path / "r.sqlite").exists(), "refused before the database was touched"
