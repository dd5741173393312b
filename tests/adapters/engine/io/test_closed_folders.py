"""Model folders are closed: nothing in a folder a user hands loopeval makes it open a FIFO, a device or a file outside
the folder. A shard index naming `../x`, an absolute path, `/dev/stdin`, a FIFO or a path through a linked folder is refused by name before
any weight is read, and so is a FIFO or device among the folder's other files (tokenizer, generation config), which
transformers would open. Every load runs in a thread with a deadline, so a regression fails instead of hanging.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import adapters
from adapters.base import AdapterError
from adapters.engine.io.checkpoint import random_model
from adapters.engine.io.tokenizer import char_tokenizer


def _ouro_folder(path: Path, shard: str = "model-00001-of-00001.safetensors") -> Path:
    """ouro-tiny as the HF release lays a sharded checkpoint out: config.json, one shard and its index, a tokenizer."""
    model = random_model("ouro-tiny", 3, torch.float32, "cpu")
    cfg = model.config
    path.mkdir()
    tensors = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(path / shard))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(tensors, shard)}))
    (path / "config.json").write_text(
        json.dumps(
            {
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
                "bos_token_id": 1,
                "eos_token_id": 2,
            }
        )
    )
    char_tokenizer().save_pretrained(str(path))
    return path


def _index_names(folder: Path, shard: str) -> None:
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    index.write_text(json.dumps({"weight_map": dict.fromkeys(weight_map, shard)}))


def _shard_outside(folder: Path) -> None:  # a whole, valid shard beside the folder
    os.replace(folder / "model-00001-of-00001.safetensors", folder.parent / "outside.safetensors")


def _within(seconds: float, call: Callable[[], object], fifos: list[Path]) -> BaseException | None:
    """What `call()` raised (None if it returned), failing the test if it is still running after `seconds` (a FIFO
    opened for reading blocks: each is then opened for writing, which releases it)."""
    outcome: list[BaseException | None] = []

    def target() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 (handed back to the test)
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        for fifo in fifos:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail(f"loading hung for {seconds} s: it opened a FIFO")
    return outcome[0]


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


# (what the hostile folder holds, how it is made from a good one, a piece of the one error line)
CASES: list[tuple[str, Callable[[Path], None], str]] = [
    (
        "shard-parent",
        lambda f: (_shard_outside(f), _index_names(f, "../outside.safetensors")),
        "shard of model.safetensors.index.json '../outside.safetensors' in",
    ),
    (
        "shard-absolute",
        lambda f: (_shard_outside(f), _index_names(f, str(f.parent / "outside.safetensors"))),
        "must name a file inside the folder (a relative path without ..)",
    ),
    ("shard-dev-stdin", lambda f: _index_names(f, "/dev/stdin"), "'/dev/stdin' in"),
    (
        "shard-fifo",
        lambda f: (_fifo(f / "pipe.safetensors"), _index_names(f, "pipe.safetensors")),
        "pipe.safetensors: a device, FIFO or socket, not a regular file",
    ),
    (
        "shard-under-a-linked-folder",
        lambda f: (_shard_outside(f), (f / "sub").symlink_to(f.parent), _index_names(f, "sub/outside.safetensors")),
        "is a link, which may lead outside",
    ),
    (
        "shard-link-to-dev-zero",
        lambda f: ((f / "zero.safetensors").symlink_to("/dev/zero"), _index_names(f, "zero.safetensors")),
        "a device, FIFO or socket, not a regular file",
    ),
    ("shard-a-number", lambda f: _index_names(f, 7), "shard of model.safetensors.index.json 7 in"),
    ("shard-missing", lambda f: _index_names(f, "nowhere.safetensors"), "nowhere.safetensors: no such file"),
    (
        "tokenizer-config-fifo",
        lambda f: (os.remove(f / "tokenizer_config.json"), _fifo(f / "tokenizer_config.json")),
        "tokenizer_config.json: a device, FIFO or socket",
    ),
    (
        "generation-config-dev-zero",
        lambda f: (f / "generation_config.json").symlink_to("/dev/zero"),
        "generation_config.json: a device, FIFO or socket",
    ),
    (
        "special-tokens-dev-stdin",
        lambda f: (f / "special_tokens_map.json").symlink_to("/dev/stdin"),
        "special_tokens_map.json",
    ),
]


def test_the_good_sharded_folder_loads(tmp_path: Path) -> None:
    """The folder every case damages loads and runs as it is: the refusals below are the damage's."""
    adapter = adapters.load(f"ouro:{_ouro_folder(tmp_path / 'ouro')}", dtype="fp32", device="cpu")
    assert adapter.forward_logits(torch.tensor([[1, 40, 41]])).shape == (1, 3, adapter.config.vocab_size)


def test_a_hub_cache_snapshot_of_links_loads(tmp_path: Path) -> None:
    """The Hugging Face hub's cache lays a snapshot out as links into `blobs/`, shards and config.json alike: such a
    folder is the user's download, its links its maker's, and it loads as the plain folder does."""
    plain = _ouro_folder(tmp_path / "plain")
    blobs, snapshot = tmp_path / "hub" / "blobs", tmp_path / "hub" / "snapshots" / "0123abcd"
    blobs.mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for i, file in enumerate(sorted(plain.iterdir())):
        os.replace(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
    adapter = adapters.load(f"ouro:{snapshot}", dtype="fp32", device="cpu")
    assert adapter.forward_logits(torch.tensor([[1, 40, 41]])).shape == (1, 3, adapter.config.vocab_size)


@pytest.mark.parametrize("prefix", ["ouro", "transformers"])
@pytest.mark.parametrize(("what", "damage", "fragment"), CASES, ids=[c[0] for c in CASES])
def test_a_folder_that_reaches_out_is_refused_by_name(
    what: str, damage: Callable[[Path], None], fragment: str, prefix: str, tmp_path: Path
) -> None:
    if what == "special-tokens-dev-stdin" and os.path.isfile("/dev/stdin"):
        pytest.skip("stdin is a regular file here: reading it is harmless")
    folder = _ouro_folder(tmp_path / "ouro")
    damage(folder)
    fifos = [p for p in folder.iterdir() if p.is_fifo()]
    for call in (
        lambda: adapters.inspect(f"{prefix}:{folder}"),
        lambda: adapters.load(f"{prefix}:{folder}", device="cpu"),
    ):
        error = _within(60, call, fifos)
        if prefix == "transformers" and error is None:
            continue  # the transformers backend has no inspector: load refuses it
        assert isinstance(error, AdapterError), repr(error)
        assert fragment in str(error) and "\n" not in str(error), str(error)
