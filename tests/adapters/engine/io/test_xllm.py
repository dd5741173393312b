"""The IFM Part II artifact layout: the manifest checked as the release's own loader checks it, the config mapping, and
one clear line for every refusal (the parity of what loads is `tests/adapters/engine/families/test_ifm.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapters.base import AdapterError
from adapters.engine.io.xllm import MANIFEST, ifm_config, manifest_digest, sha256_file
from adapters.testing import save_tiny_ifm, tiny_ifm_fields


@pytest.fixture
def artifact(tmp_path: Path) -> Path:
    return save_tiny_ifm(tmp_path / "huginn-s-fixed-r5", variant="fixed-r5")


def test_a_verified_artifact_maps_to_its_family(artifact, tmp_path):
    cfg = ifm_config(artifact)
    assert (cfg.family, cfg.prelude_layers, cfg.shared_layers, cfg.coda_layers, cfg.loops) == ("ifm", 1, 2, 1, 5)
    assert (cfg.num_kv_heads, cfg.ifm_injection, cfg.tie_embeddings) == (2, "diagonal", False)
    d4 = ifm_config(save_tiny_ifm(tmp_path / "d4", variant="d4"))
    assert (d4.family, d4.kv_strategy, d4.shared_layers, d4.loops) == ("custom", "standard", 4, 1)
    linear = ifm_config(save_tiny_ifm(tmp_path / "linear", variant="huginn-linear"))
    assert (linear.ifm_injection, linear.ifm_exit_norm, linear.ifm_prelude_norm) == ("linear", True, False)
    assert ifm_config(save_tiny_ifm(tmp_path / "ortho", variant="orthoinj")).ifm_injection == "orthogonal"


def test_a_changed_file_is_refused_by_name(artifact):
    shard = artifact / "model-00001-of-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(AdapterError, match=r"model-00001-of-00001\.safetensors does not match artifact_manifest"):
        ifm_config(artifact)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda root: (root / "extra.bin").write_bytes(b"x"), r"unlisted \['extra.bin'\]"),
        (lambda root: (root / "NOTICE").unlink(), r"missing \['NOTICE'\]"),
        (lambda root: (root / "extra").mkdir(), "unexpected folder"),
        (lambda root: (root / "link").symlink_to(root / "NOTICE"), "symbolic links"),
        (lambda root: (root / MANIFEST).unlink(), "has no artifact_manifest.json"),
        (lambda root: (root / "tokenizer" / "tokenizer.json").unlink(), r"missing \['tokenizer/tokenizer.json'\]"),
    ],
)
def test_a_folder_outside_the_released_layout_is_refused(artifact, change, message):
    change(artifact)
    with pytest.raises(AdapterError, match=message):
        ifm_config(artifact)


def test_an_unfilled_model_card_is_refused_even_when_the_manifest_lists_it(artifact):
    """The release's own check: a document template's `<REQUIRED:` field left in, the manifest rewritten to match."""
    card = artifact / "README.md"
    card.write_text("model card <REQUIRED: license>\n")
    manifest = json.loads((artifact / MANIFEST).read_text())
    record = next(r for r in manifest["files"] if r["path"] == "README.md")
    record["sha256"], record["size_bytes"] = sha256_file(card), card.stat().st_size
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (artifact / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(AdapterError, match="README.md is empty or has an unfilled"):
        ifm_config(artifact)


def test_a_tampered_manifest_is_refused(artifact):
    manifest = json.loads((artifact / MANIFEST).read_text())
    manifest["files"][0]["size_bytes"] += 1
    (artifact / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(AdapterError, match="does not match its own SHA-256"):
        ifm_config(artifact)
    manifest["manifest_sha256"] = manifest_digest(manifest)  # a consistent manifest of the wrong size
    (artifact / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(AdapterError, match="does not match artifact_manifest.json"):
        ifm_config(artifact)


def test_hub_download_metadata_is_ignored(artifact):
    (artifact / ".gitattributes").write_text("*.safetensors filter=lfs\n")
    (artifact / ".cache" / "huggingface").mkdir(parents=True)
    (artifact / ".cache" / "huggingface" / "download.lock").write_text("")
    assert ifm_config(artifact).family == "ifm"


def test_unsupported_fields_and_students_are_refused(tmp_path):
    from adapters.engine.io.xllm import model_config

    with pytest.raises(AdapterError, match="qknorm must be False"):
        model_config({**tiny_ifm_fields("fixed-r5"), "qknorm": True})
    with pytest.raises(AdapterError, match="arch 'gekko'"):
        model_config({**tiny_ifm_fields("fixed-r5"), "arch": "gekko"})


def test_the_cli_refuses_a_changed_artifact_in_one_line(artifact, capsys):
    from harness.cli import main

    (artifact / "NOTICE").write_text("changed\n")
    code = main(
        [
            "run",
            "--model",
            f"ifm:{artifact}",
            "--tasks",
            "chain3",
            "--limit",
            "1",
            "--db",
            str(artifact.parent / "r.db"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "NOTICE does not match artifact_manifest.json" in err and "Traceback" not in err
