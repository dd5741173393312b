"""Files a user keeps are whole or untouched: the HTML report, and checkpoints with their metadata.

A report write that runs out of disk (a real, small tmpfs that fills) or is interrupted leaves the report that
was there byte for byte and no temporary file; a checkpoint save interrupted halfway leaves a folder that every
command refuses as incomplete, naming it, until a save completes it; a folder without its completion marker
(a zoo folder copied without it) is refused the same way.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import pytest
import torch

import adapters
import adapters.files
from adapters.engine.io.checkpoint import random_model, save_checkpoint
from adapters.files import COMPLETE_MARKER
from adapters.zoo import ZOO_DIR
from harness.report import write_report
from harness.cli import main


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_error(capfd: pytest.CaptureFixture[str]) -> str:
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("loopeval: error: "), err
    return lines[0]


def test_a_report_write_on_a_full_disk_keeps_the_complete_report(
    stored_db: Path, small_disk: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    report = write_report(str(stored_db), small_disk / "report.html")
    before = _digest(report)
    free = shutil.disk_usage(small_disk).free
    (small_disk / "ballast").write_bytes(b"\0" * (free - report.stat().st_size // 2))  # room for half a report more
    assert main(["dashboard", "--db", str(stored_db), "--out", str(report)]) == 2
    line = _one_error(capfd)
    assert (
        f"cannot write the report to {report}: No space left on device; any report already there is unchanged" in line
    )
    assert _digest(report) == before
    assert sorted(p.name for p in small_disk.iterdir()) == ["ballast", "report.html"], (
        "no half-written file left behind"
    )


def test_an_interrupted_report_write_keeps_the_complete_report(
    stored_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    report = write_report(str(stored_db), tmp_path / "report.html")
    before = _digest(report)

    def interrupted(fd: int) -> None:  # Ctrl-C arriving while the new report is being written
        raise KeyboardInterrupt

    monkeypatch.setattr("adapters.files.os.fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_report(str(stored_db), report)
    assert _digest(report) == before
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def test_the_report_is_readable_by_its_group_as_a_file_open_writes(stored_db: Path, tmp_path: Path) -> None:
    """The report gets the mode any file written here gets (0666 less the umask), not its temporary file's 0600."""
    umask = os.umask(0o027)
    try:
        report = write_report(str(stored_db), tmp_path / "report.html")
        (tmp_path / "plain.txt").write_text("written by open()")
    finally:
        os.umask(umask)
    assert stat.S_IMODE(report.stat().st_mode) == stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode) == 0o640


def test_an_interrupted_streamed_write_keeps_the_previous_file(tmp_path: Path) -> None:
    """The training state is streamed into the file (`torch.save` given the open file): a write stopped after the new
    state was streamed, before it was synced and renamed, leaves the previous state whole and no temporary file."""
    state = tmp_path / "train_state.pt"
    adapters.files.write_atomically(state, lambda fh: torch.save({"step": 1}, fh))
    before = _digest(state)

    def interrupted(fh) -> None:
        torch.save({"step": 2, "weights": torch.ones(4096)}, fh)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        adapters.files.write_atomically(state, interrupted)
    assert _digest(state) == before and torch.load(state)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["train_state.pt"]
    adapters.files.write_atomically(state, lambda fh: torch.save({"step": 2}, fh))
    assert torch.load(state)["step"] == 2 and [p.name for p in tmp_path.iterdir()] == ["train_state.pt"]


def _model() -> torch.nn.Module:
    return random_model("qwen3-tiny", 0, torch.float32, "cpu")


def test_a_checkpoint_save_interrupted_between_files_is_refused_until_a_save_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ckpt"
    save_checkpoint(_model(), folder, extra_files={"train_info.json": '{"steps": 1}\n'})
    assert adapters.load(f"qwen3:{folder}").spec == f"qwen3:{folder}"
    renames = 0
    real_replace = os.replace

    def killed_after_the_weights(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        nonlocal renames
        renames += 1
        if renames == 2:  # the new config.json is in, the weights and train_info.json are not
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(adapters.files.os, "replace", killed_after_the_weights)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(_model(), folder, extra_files={"train_info.json": '{"steps": 2}\n'})
    monkeypatch.setattr(adapters.files.os, "replace", real_replace)
    assert not (folder / COMPLETE_MARKER).exists() and not list(folder.glob(".staging-*"))
    with pytest.raises(
        adapters.AdapterError, match=f"checkpoint {folder} is incomplete: it has no completion marker {COMPLETE_MARKER}"
    ):
        adapters.load(f"qwen3:{folder}")
    code = main(["estimate", f"qwen3:{folder}", "--tokens", "8"])
    assert code == 2 and f"checkpoint {folder} is incomplete" in _one_error(capfd)
    save_checkpoint(_model(), folder, extra_files={"train_info.json": '{"steps": 2}\n'})
    assert (folder / "train_info.json").read_text() == '{"steps": 2}\n'
    assert adapters.load(f"qwen3:{folder}").spec == f"qwen3:{folder}"


def test_a_zoo_folder_without_its_marker_is_refused_by_name(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "ouro-copy"
    shutil.copytree(ZOO_DIR / "ouro-tiny", copy)
    (copy / COMPLETE_MARKER).unlink()
    code = main(
        ["run", "--model", f"ouro:{copy}", "--tasks", "lookup", "--limit", "1", "--db", str(tmp_path / "r.sqlite")]
    )
    line = _one_error(capfd)
    assert code == 2 and f"checkpoint {copy} is incomplete: it has no completion marker {COMPLETE_MARKER}" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ouro-copy"], "refused before the database was created"
