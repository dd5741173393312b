"""Plugins cannot end the process: a plugin hook that calls `sys.exit(0)` or `sys.exit(3)`, raises GeneratorExit, a
KeyboardInterrupt of its own or any other BaseException fails in one line naming the plugin and the hook, in `run`
(the run stored as failed with that line as its reason, exit 1), `profile` and `adapter check`; a hook called while
planning is refused before anything is written (exit 2). The user's real Ctrl-C, landing inside a plugin's hook,
still interrupts the run, which then resumes to the end.

The plugin is a real module written to a temporary folder and found through LOOPEVAL_ADAPTERS, run through the real
CLI (`harness.cli.main` in this process, and `loopeval` in a process of its own) on real SQLite files.
"""

from __future__ import annotations

import re

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from adapters import registry
from harness.cli import main
from tests.support.sqlite import query

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
FAST = ["--tasks", "lookup", "--limit", "1", "--samples", "1", "--max-new-tokens", "2", "--loops", "1", "--no-report"]

# `exiting:HOOK-KIND-AFTER` is qwen3-tiny whose hook HOOK, from its AFTER+1-th call on, ends the way KIND says
# (`sleep`: it sleeps a second instead, so a signal sent meanwhile lands inside the plugin's code).
PLUGIN = '''
"""A plugin whose chosen hook ends the process, or tries to."""
import sys
import time

import adapters
from adapters.registry import register


class Meltdown(BaseException):
    """Not an Exception: what a careless plugin may raise."""


def end(kind):
    if kind == "exit0":
        sys.exit(0)
    if kind == "exit3":
        sys.exit(3)
    if kind == "generatorexit":
        raise GeneratorExit("the generator was closed")
    if kind == "interrupt":
        raise KeyboardInterrupt("the plugin's own")
    if kind == "meltdown":
        raise Meltdown("the core melted")
    time.sleep(1.0)


class Exiting:
    def __init__(self, hook, kind, after, overrides):
        self.hook, self.kind, self.after, self.calls = hook, kind, after, {}
        self.inner = adapters.load("preset:qwen3-tiny", **overrides)
        self.spec, self.tokenizer = f"exiting:{hook}-{kind}-{after}", self.inner.tokenizer

    def _call(self, hook):
        self.calls[hook] = self.calls.get(hook, 0) + 1
        if hook == self.hook and self.calls[hook] > self.after:
            end(self.kind)

    @property
    def max_context(self):
        self._call("max_context")
        return self.inner.max_context

    @property
    def loops(self):
        return 1

    @loops.setter
    def loops(self, value):
        self._call("loops")

    def reset_memory_peak(self):
        self._call("reset_memory_peak")
        self.inner.reset_memory_peak()

    def forward_logits(self, input_ids):
        self._call("forward_logits")
        return self.inner.forward_logits(input_ids)

    def generate(self, prompts, sampling):
        self._call("generate")
        return self.inner.generate(prompts, sampling)

    def memory(self):
        self._call("memory")
        return self.inner.memory()

    def describe(self):
        self._call("describe")
        looped = {"kv_strategy": "per_loop"} if self.hook == "loops" else {}  # runs at --loops, set through `loops`
        return {**self.inner.describe(), **looped}


class ExitingWorkload(Exiting):
    def generate_requests(self, requests, on_finished):
        self._call("generate_requests")
        self.inner.generate_requests(requests, on_finished)


@register("exiting", "qwen3-tiny whose chosen hook exits")
def load(arg, **overrides):
    hook, kind, after = arg.rsplit("-", 2)
    if hook == "load":
        end(kind)
    return (ExitingWorkload if hook == "generate_requests" else Exiting)(hook, kind, int(after), overrides)
'''

KINDS = {  # how a plugin ends -> the name the line gives it
    "exit0": "SystemExit: 0",
    "exit3": "SystemExit: 3",
    "generatorexit": "GeneratorExit: the generator was closed",
    "interrupt": "KeyboardInterrupt: the plugin's own",
    "meltdown": "Meltdown: the core melted",
}
HOOK_NAMES = {  # a hook -> how the line names it
    "load": "its loader",
    "max_context": "max_context",
    "memory": "memory()",
    "describe": "describe()",
    "loops": "its loops setter",
    "reset_memory_peak": "reset_memory_peak()",
    "generate": "generate()",
    "generate_requests": "generate_requests()",
    "forward_logits": "forward_logits()",
}
# The hooks a run calls once it is stored, with the calls planning makes first (which pass).
RUN_HOOKS = {
    "max_context": 1,
    "memory": 1,
    "describe": 1,
    "loops": 0,
    "reset_memory_peak": 0,
    "generate": 0,
    "generate_requests": 0,
}


@pytest.fixture
def plugin_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "exiting.py").write_text(PLUGIN)
    return folder


@pytest.fixture
def from_env(plugin_folder: Path, monkeypatch: pytest.MonkeyPatch, isolated_registry: None) -> None:
    """The plugin folder in LOOPEVAL_ADAPTERS, read afresh on the next look-up (the registry reads it once)."""
    monkeypatch.setenv(registry.ENV_VAR, str(plugin_folder))
    registry._loaded_plugins = False


def _errors(err: str) -> list[str]:
    """The lines a command printed, each finished run's without the job's count and time it starts with in a log
    (`1/1 0:00:01 run 1 ...`)."""
    assert "Traceback" not in err, err
    return [PROGRESS.sub("", line) for line in err.strip().splitlines() if not line.startswith("threads: ")]


PROGRESS = re.compile(r"^\d+/\d+ \d+:\d\d:\d\d ")


def _line(hook: str, kind: str, after: int = 0) -> str:
    return f"exiting:{hook}-{kind}-{after}: {HOOK_NAMES[hook]} raised {KINDS[kind]}"


def _rotated(hooks: list[str]) -> list[tuple[str, str]]:
    """Every hook once and every kind once (on generate()), the kinds taken in turn."""
    kinds = list(KINDS)
    pairs = [(hook, kinds[i % len(kinds)]) for i, hook in enumerate(hooks)] + [("generate", kind) for kind in kinds]
    return list(dict.fromkeys(pairs))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("hook", list(RUN_HOOKS))
def test_a_plugin_ending_in_a_hook_of_a_run_fails_the_run_with_its_reason(
    hook: str, kind: str, from_env: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.sqlite"
    spec = f"exiting:{hook}-{kind}-{RUN_HOOKS[hook]}"
    code = main(["run", "--model", spec, *FAST, "--db", str(db)])
    out, err = capfd.readouterr()
    line = _line(hook, kind, RUN_HOOKS[hook])
    assert code == 1, err
    said = [row.strip() for row in _errors(out + err)]
    assert f"run 1 failed: HookError: {line}" in said, said  # as it happens, and in the closing summary
    assert any(row.startswith(f"run 1 {spec}") and row.endswith(f": HookError: {line}") for row in said), said
    assert query(db, "SELECT status, error FROM runs") == [("failed", f"HookError: {line}")]


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("hook", ["load", "describe"])
def test_a_plugin_ending_while_a_run_is_planned_is_refused_before_anything_is_written(
    hook: str, kind: str, from_env: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.sqlite"
    assert main(["run", "--model", f"exiting:{hook}-{kind}-0", *FAST, "--db", str(db)]) == 2
    assert _errors(capfd.readouterr().err) == [f"loopeval: error: {_line(hook, kind)}"]
    assert not db.exists()


@pytest.mark.parametrize(
    ("hook", "kind"), _rotated(["load", "describe", "max_context", "memory", "reset_memory_peak", "generate"])
)
def test_a_plugin_ending_while_profiled_is_one_line_and_stores_nothing(
    hook: str, kind: str, from_env: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.sqlite"
    code = main(["profile", f"exiting:{hook}-{kind}-0", "--lengths", "8", "--decode-steps", "2", "--db", str(db)])
    assert code == 2
    assert _errors(capfd.readouterr().err) == [f"loopeval: error: {_line(hook, kind)}"]
    assert not db.exists() or query(db, "SELECT count(*) FROM runs") == [(0,)]


@pytest.mark.parametrize(
    ("hook", "kind"), _rotated(["load", "describe", "max_context", "memory", "forward_logits", "generate"])
)
def test_a_plugin_ending_in_adapter_check_fails_the_check_naming_the_hook(
    hook: str, kind: str, from_env: None, capfd: pytest.CaptureFixture[str]
) -> None:
    code = main(["adapter", "check", f"exiting:{hook}-{kind}-0", "--no-bridge", "--max-new-tokens", "4"])
    out, err = capfd.readouterr()
    if hook == "load":  # nothing to check: refused as any unloadable spec is
        assert code == 2 and _errors(err) == [f"loopeval: error: {_line(hook, kind)}"]
        return
    assert code == 1 and "Traceback" not in out + err, out + err
    failed = [line for line in out.splitlines() if line.strip().startswith("[fail]")]
    assert failed and any(line.endswith(_line(hook, kind)) for line in failed), out


def test_an_exit_in_a_plugin_ends_a_real_process_with_a_failed_run(plugin_folder: Path, tmp_path: Path) -> None:
    """`sys.exit(0)` in generate(), in a process of its own: exit 1 (not 0), the run failed with its reason."""
    db = tmp_path / "results.sqlite"
    env = {**os.environ, registry.ENV_VAR: str(plugin_folder)}
    done = subprocess.run(
        [LOOPEVAL, "run", "--model", "exiting:generate-exit0-0", *FAST, "--db", str(db)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"run 1 failed: HookError: {_line('generate', 'exit0')}" in done.stdout + done.stderr
    assert query(db, "SELECT status, error FROM runs") == [("failed", f"HookError: {_line('generate', 'exit0')}")]


def test_the_users_ctrl_c_inside_a_plugins_hook_still_interrupts_and_the_run_resumes(
    plugin_folder: Path, tmp_path: Path, from_env: None
) -> None:
    """A real SIGINT sent while the plugin's generate() sleeps is the user's: the run is interrupted (130), not
    failed, and `--resume` finishes it with every sample once."""
    db = tmp_path / "results.sqlite"
    argv = ["run", "--model", "exiting:generate-sleep-0", *FAST[:2], "--limit", "6", *FAST[4:], "--batch-size", "1"]
    proc = subprocess.Popen(
        [LOOPEVAL, *argv, "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, registry.ENV_VAR: str(plugin_folder)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as test_run's: even under `pytest &`
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline and not _samples(db):
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    time.sleep(0.3)  # inside the next generate() call's second of sleep
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert query(db, "SELECT status, error FROM runs") == [("interrupted", None)]
    assert "--resume 1" in out + err
    assert main(["run", "--resume", "1", "--db", str(db), "--no-report"]) == 0
    assert query(db, "SELECT status FROM runs") == [("finished",)]
    keys = query(db, "SELECT task, doc_id, sample_index FROM samples")
    assert len(keys) == 6 == len(set(keys))


def _samples(db: Path) -> int:
    try:
        return query(db, "SELECT count(*) FROM samples")[0][0] if db.exists() else 0
    except Exception:  # the schema is not there yet
        return 0
