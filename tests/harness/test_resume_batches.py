"""A resumed run cannot change an exit decision: a sample's numbers depend, in their last bits, on which other samples
share its batch, and an exit threshold falls on either side of them; so a resumed run generates a partly stored task
again in the unbroken run's batches and stores only what it lacks (`harness.bridge.generation`).

First the cause, on the engine itself: one prompt, greedy, alone and beside another, with the exit threshold put at
its own exit probability as one of the two batches rounds it, exits at another loop. Then the fix, through the real
CLI on real SQLite files: a run stopped with part of a task stored (its later samples deleted, as a kill leaves it)
and resumed hands the adapter exactly the unbroken run's batches, and stores exactly the unbroken run's samples, for
an adapter that takes whole workloads (the engine's scheduler) and one that takes batches.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from torch import Tensor

import adapters
from adapters.base import Sampling
from adapters.engine import exits
from harness.cli import main
from tests.support.sqlite import query

PROMPT, BESIDE = [5, 6, 7, 8, 9], [20, 21, 22, 23, 24]  # token ids of equal length: the batch has no padding


def _first_rows(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The cumulative exit probability of row 0 at every gate test from now on (the real gate, recorded)."""
    seen: list[float] = []
    real = exits.ExitCheck._gate

    def recorded(self: exits.ExitCheck, normed: Tensor) -> Tensor:
        cum = real(self, normed)
        seen.append(float(cum[0]))
        return cum

    monkeypatch.setattr(exits.ExitCheck, "_gate", recorded)
    return seen


def _generate(prompts: list[list[int]], threshold: float) -> Any:
    """Row 0's generation on the static path (the whole batch every loop), greedy, exits at `threshold`."""
    adapter = adapters.load("preset:ouro-tiny", loops=4, exit_threshold=threshold, batching="static", device="cpu")
    return adapter.generate(prompts, Sampling(temperature=0, max_new_tokens=8))[0]


def test_the_samples_sharing_a_batch_can_change_a_tokens_exit_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _first_rows(monkeypatch)
    _generate([PROMPT], 0.5)
    alone = list(seen)
    seen.clear()
    _generate([PROMPT, BESIDE], 0.5)
    beside = list(seen)
    differ = [(a, b) for a, b in zip(alone, beside) if a != b]
    if not differ:
        pytest.skip("this machine's kernels round the prompt's numbers alike in batches of 1 and 2 rows")
    threshold = max(differ[0])  # one batch's probability reaches it, the other's falls a rounding short
    one, two = _generate([PROMPT], threshold), _generate([PROMPT, BESIDE], threshold)
    assert one.loops_used != two.loops_used, "the same prompt, greedy, exits at another loop beside another prompt"


# `recording:NAME` is the preset NAME taking batches, `recording-workload:NAME` taking whole workloads; each call's
# prompts and seeds are appended to the file RECORD names.
RECORDING = """
import json
import os

import adapters
from adapters.registry import register


class Recording:
    def __init__(self, inner, spec):
        self.inner, self.spec, self.tokenizer, self.max_context = inner, spec, inner.tokenizer, inner.max_context

    def record(self, call):
        with open(os.environ["RECORD"], "a") as out:
            out.write(json.dumps(call) + "\\n")

    @property
    def loops(self):
        return self.inner.loops

    @loops.setter
    def loops(self, value):
        self.inner.loops = value

    def reset_memory_peak(self):
        self.inner.reset_memory_peak()

    def forward_logits(self, input_ids):
        return self.inner.forward_logits(input_ids)

    def generate(self, prompts, sampling):
        self.record([prompts, sampling.seed])
        return self.inner.generate(prompts, sampling)

    def memory(self):
        return self.inner.memory()

    def describe(self):
        return self.inner.describe()


class RecordingWorkload(Recording):
    def generate_requests(self, requests, on_finished):
        self.record([[request.prompt, request.sampling.seed, request.samples] for request in requests])
        self.inner.generate_requests(requests, on_finished)


@register("recording", "an engine preset taking batches, recording them")
def load(name, **overrides):
    return Recording(adapters.load(f"preset:{name}", **overrides), f"recording:{name}")


@register("recording-workload", "an engine preset taking workloads, recording them")
def load_workload(name, **overrides):
    inner = adapters.load(f"preset:{name}", **{"max_batch": 2, **overrides})
    return RecordingWorkload(inner, f"recording-workload:{name}")
"""
SAMPLES = "SELECT task, doc_id, sample_index, output, loops_used, loops_histogram FROM samples"


@pytest.mark.parametrize("prefix", ["recording-workload", "recording"])
def test_a_resumed_task_is_generated_in_the_unbroken_runs_batches_and_keeps_its_samples(
    prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None
) -> None:
    plugins, record = tmp_path / "plugins", tmp_path / "calls.jsonl"
    plugins.mkdir()
    (plugins / "recording.py").write_text(RECORDING)
    monkeypatch.setenv("RECORD", str(record))
    run = ["--model", f"{prefix}:ouro-tiny", "--tasks", "addition,chain2", "--limit", "6", "--samples", "1"]
    run += ["--max-new-tokens", "4", "--batch-size", "2", "--loops", "4", "--temperature", "1.0"]
    run += ["--exit-threshold", "0.5", "--no-report", "--adapters-dir", str(plugins)]
    unbroken, stopped = tmp_path / "whole.sqlite", tmp_path / "stopped.sqlite"
    assert main(["run", *run, "--db", str(unbroken)]) == 0
    calls = record.read_text()
    shutil.copy(unbroken, stopped)
    with sqlite3.connect(stopped) as conn:  # stopped with 3 samples of the first task stored, as a kill leaves it
        (first,) = conn.execute("SELECT task FROM samples ORDER BY id LIMIT 1").fetchone()
        conn.execute(
            "DELETE FROM samples WHERE id > (SELECT id FROM samples WHERE task = ? ORDER BY id LIMIT 1 OFFSET 2)",
            (first,),
        )
        conn.execute("DELETE FROM task_metrics")
        conn.execute("UPDATE runs SET status = 'interrupted', lease_owner = NULL")
    conn.close()
    assert query(stopped, "SELECT count(*) FROM samples") == [(3,)]
    record.unlink()
    assert main(["run", "--resume", "1", "--adapters-dir", str(plugins), "--db", str(stopped), "--no-report"]) == 0
    before = [json.loads(line) for line in calls.splitlines()]
    # one workload per task, generated again whole; of the batches, those holding a doc to generate (the first
    # batch's 2 docs are stored whole: no later batch depends on it, so it is not generated again)
    expected = before if prefix == "recording-workload" else before[1:]
    resumed = [json.loads(line) for line in record.read_text().splitlines()]
    assert resumed == expected, "the resumed run's batches are the unbroken run's"
    keys = query(stopped, "SELECT task, doc_id, sample_index FROM samples")
    assert len(keys) == len(set(keys)) == 12, "each sample stored once"
    assert sorted(query(stopped, SAMPLES)) == sorted(query(unbroken, SAMPLES))
    assert any(loops < 4 for *_, loops, _ in query(stopped, SAMPLES)), "some tokens exited before the last loop"
