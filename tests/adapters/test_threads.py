"""The thread policy (`adapters.threads`): one thread for small models, the cores for large ones, overrides
that win and are checked, and the choice applied to torch, stored with each run and said once."""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import torch

import adapters
from adapters import threads
from adapters.base import AdapterError
from harness.cli import main


@pytest.fixture(autouse=True)
def _restore_threads(monkeypatch: pytest.MonkeyPatch):
    """Each test starts with no choice made, torch's count, and the variables as they were."""
    monkeypatch.delenv(threads.ENV_VAR, raising=False)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(threads, "_applied", None)
    count = torch.get_num_threads()
    yield
    torch.set_num_threads(count)


def test_small_models_get_one_thread_and_large_or_unknown_ones_every_core(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "cores", lambda: 4)
    assert threads.choose(321_024).count == 1 and "one run per core" in threads.choose(321_024).reason
    assert threads.choose(threads.SMALL_MODEL_PARAMS) == threads.Threads(4, "the cores this process may use")
    assert threads.choose(None).count == 4  # a size loopeval cannot read is treated as large


def test_the_flag_wins_over_the_variable_which_wins_over_the_size_and_neither_passes_the_cores(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setenv(threads.ENV_VAR, "3")
    assert threads.choose(1_000) == threads.Threads(3, threads.ENV_VAR)
    assert threads.choose(1_000, requested=2) == threads.Threads(2, "--threads")
    assert threads.choose(None, requested=9) == threads.Threads(
        4, "--threads 9, capped at the 4 cores this process may use"
    )


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", "", "5000"])
def test_a_bad_count_is_refused_naming_where_it_came_from(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(threads.ENV_VAR, value)
    with pytest.raises(AdapterError, match=f"^{threads.ENV_VAR} must be a whole number of threads from 1 to 1024"):
        threads.choose(1_000)
    with pytest.raises(AdapterError, match="^--threads must be"):
        threads.choose(1_000, requested=0)


def test_apply_sets_torch_and_the_variables_child_processes_read() -> None:
    chosen = threads.apply(threads.Threads(1, "test"))
    assert torch.get_num_threads() == 1 and threads.applied() is chosen
    assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "1"
    assert threads.ensure(10**12) is chosen  # a choice made stays: loading a model does not undo the CLI's


def test_loading_an_engine_model_applies_the_policy_when_nothing_chose_a_count() -> None:
    """As in a notebook or a script, where no command chose a count: loading a tiny model makes torch compute with one thread."""
    torch.set_num_threads(2)
    adapters.load("preset:qwen3-tiny")
    assert torch.get_num_threads() == 1 and threads.applied().reason.startswith("a model under")


@pytest.mark.slow  # three real runs
def test_run_says_the_count_once_and_stores_it_with_every_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.sqlite"
    argv = [
        "run",
        "--model",
        "preset:qwen3-tiny",
        "--model",
        "preset:ouro-tiny",
        "--loops",
        "1,2",
        "--tasks",
        "lookup",
        "--limit",
        "1",
        "--samples",
        "1",
        "--max-new-tokens",
        "2",
        "--db",
        str(db),
        "--no-report",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("threads: ") == 1 and "threads: 1 thread (a model under 50M parameters: one run per core" in out
    hosts = [json.loads(h) for (h,) in sqlite3.connect(db).execute("SELECT host FROM runs").fetchall()]
    assert len(hosts) == 3 and all(h["threads"]["count"] == 1 for h in hosts)
    assert torch.get_num_threads() == 1


def test_a_bad_threads_flag_is_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.sqlite"
    assert main(["run", "--model", "preset:qwen3-tiny", "--threads", "0", "--db", str(db)]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "loopeval: error: --threads must be a whole number of threads from 1 to 1024, got 0"
    )
    assert not db.exists()
