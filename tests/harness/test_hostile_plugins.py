"""Hostile plugins: values a plugin adapter returns are checked before anything is stored (byte counts up to 2**53), an
exception in any of its hooks (loader, properties, memory(), describe(), generate(), the loops setter, reset_memory_peak)
is one line, refusing the run before it starts or failing it with that line as its reason, a plugin that exits or is
interrupted at import is skipped like any broken plugin, one whose names() fails leaves bare names working, and no
plugin can claim a built-in prefix. After a refused or failed plugin run, `results` and `dashboard` on the same
database still work.

The plugins are real folder plugins (`--adapters-dir`) wrapping the tiny engine preset, run through the real CLI
(`harness.cli.main`, in-process) on real SQLite files.
"""

from __future__ import annotations

import sqlite3
import textwrap
from pathlib import Path

import pytest

import adapters
from adapters import AdapterError, registry
from harness.cli import main

FAST = ["--tasks", "lookup", "--limit", "1", "--samples", "1", "--max-new-tokens", "2", "--loops", "1", "--no-report"]

# `hostile:WHAT` is qwen3-tiny, except for the one value WHAT names, which it returns wrong, or the hook that raises.
HOSTILE = """
import time

import adapters
from adapters.registry import register


class Hostile:
    def __init__(self, what, **overrides):
        if what == "load-raises":
            raise OSError("the weights server is down\\n  (a second line)")
        self.inner = adapters.load("preset:qwen3-tiny", **overrides)
        self.what, self.spec, self.tokenizer, self.generating = what, f"hostile:{what}", self.inner.tokenizer, False
        self._context = {"negative-context": -512, "float-context": 512.5, "huge-context": 10**12}.get(what, self.inner.max_context)

    def _raise(self, hook):  # `WHOOK-raises` raises in that hook; `WHOOK-raises-late` only once generating
        if self.what == f"{hook}-raises" or self.what == f"{hook}-raises-late" and self.generating:
            raise RuntimeError(f"{hook} broke\\n  on a second line")

    @property
    def max_context(self):
        self._raise("context")
        return self._context

    @property
    def loops(self):
        return 1

    @loops.setter
    def loops(self, value):
        self._raise("loops")

    def reset_memory_peak(self):
        self._raise("reset")
        self.inner.reset_memory_peak()

    def forward_logits(self, input_ids):
        return self.inner.forward_logits(input_ids)

    def generate(self, prompts, sampling):
        self.generating = True
        self._raise("generate")
        time.sleep(0.1)  # the memory sampler (every 20 ms) reads memory() while this runs
        out = self.inner.generate(prompts, sampling)
        for g in out:
            if self.what == "finish-reason":
                g.finish_reason = "exploded"
            if self.what == "negative-tokens":
                g.generated_tokens = -3
            if self.what == "huge-tokens":
                g.prompt_tokens = 10**30
        return out

    def memory(self):
        self._raise("memory")
        values = dict(self.inner.memory())
        bad = {"negative-memory": -1000, "infinite-memory": float("inf"), "string-memory": "lots", "nan-memory": float("nan"),
               "huge-memory": 1e30, "just-over-memory": 2**53 + 1}
        if self.what in bad:
            values["kv_bytes_used"] = bad[self.what]
        if self.what == "negative-while-generating" and self.generating:
            values["kv_bytes_used"] = -1
        if self.what == "huge-while-generating" and self.generating:
            values["weights_bytes"] = 10**30
        return values

    def describe(self):
        self._raise("describe")
        looped = {"kv_strategy": "per_loop"} if self.what.startswith("loops") else {}  # runs at --loops, set through `loops`
        return {**self.inner.describe(), **looped, **({"threshold": float("nan")} if self.what == "nan-describe" else {})}


@register("hostile", "adapters that return values loopeval must not store")
def load(what, **overrides):
    return Hostile(what, **overrides)
"""


@pytest.fixture
def plugins(tmp_path: Path, isolated_registry: None) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    (folder / "hostile.py").write_text(HOSTILE)
    return folder


def _one_error(capfd: pytest.CaptureFixture[str]) -> str:
    err = capfd.readouterr().err
    lines = err.strip().splitlines()
    assert "Traceback" not in err and len(lines) == 1 and lines[0].startswith("loopeval: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("what", "fragment"),
    [
        ("negative-memory", "memory()['kv_bytes_used'] is -1000; byte counts must be whole numbers from 0 to 2**53"),
        ("huge-memory", "memory()['kv_bytes_used'] is 1e+30; byte counts must be whole numbers from 0 to 2**53"),
        ("just-over-memory", "memory()['kv_bytes_used'] is 9007199254740993;"),
        ("memory-raises", "memory() raised RuntimeError: memory broke on a second line"),
        ("describe-raises", "describe() raised RuntimeError: describe broke on a second line"),
        ("context-raises", "max_context raised RuntimeError: context broke on a second line"),
        ("load-raises", "its loader raised OSError: the weights server is down (a second line)"),
        ("infinite-memory", "memory()['kv_bytes_used'] is inf"),
        ("nan-memory", "memory()['kv_bytes_used'] is nan"),
        ("string-memory", "memory()['kv_bytes_used'] is 'lots'"),
        ("negative-context", "max_context must be an integer from 1 to 16777216 (tokens), got -512"),
        ("float-context", "max_context must be an integer from 1 to 16777216 (tokens), got 512.5"),
        ("huge-context", "max_context must be an integer from 1 to 16777216 (tokens), got 1000000000000"),
        ("nan-describe", "describe() must return a dict of standard JSON values"),
    ],
)
def test_a_plugin_value_that_cannot_be_stored_is_refused_before_anything_is_written(
    what: str, fragment: str, plugins: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.sqlite"
    code = main(["run", "--adapters-dir", str(plugins), "--model", f"hostile:{what}", *FAST, "--db", str(db)])
    line = _one_error(capfd)
    assert code == 2 and f"hostile:{what}: {fragment}" in line, line
    assert not db.exists(), "refused before the database was created"


@pytest.mark.parametrize(
    ("what", "fragment"),
    [
        ("finish-reason", "finish_reason 'exploded' is not one of eos, stop, length"),
        ("negative-tokens", "generated_tokens -3 is not a whole number from 0 to 16777216"),
        ("huge-tokens", "prompt_tokens 1000000000000000000000000000000 is not a whole number from 0 to 16777216"),
        ("negative-while-generating", "memory()['kv_bytes_used'] is -1"),
        ("huge-while-generating", "memory()['weights_bytes'] is 1000000000000000000000000000000;"),
        ("memory-raises-late", "memory() raised RuntimeError: memory broke on a second line"),
        ("generate-raises", "generate() raised RuntimeError: generate broke on a second line"),
        ("loops-raises", "its loops setter raised RuntimeError: loops broke on a second line"),
        ("reset-raises", "reset_memory_peak() raised RuntimeError: reset broke on a second line"),
    ],
)
def test_a_plugin_value_that_turns_bad_while_generating_fails_the_run_and_is_never_stored(
    what: str, fragment: str, plugins: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "results.sqlite"
    assert main(["run", "--model", "preset:qwen3-tiny", *FAST, "--db", str(db)]) == 0  # a good run already stored
    code = main(["run", "--adapters-dir", str(plugins), "--model", f"hostile:{what}", *FAST, "--db", str(db)])
    err = capfd.readouterr().err
    assert code == 1 and fragment in err and "Traceback" not in err, err
    assert any(line.strip().startswith(f"run 2 hostile:{what}") and fragment in line for line in err.splitlines()), err
    with sqlite3.connect(db) as conn:
        status, error = conn.execute(
            "SELECT status, error FROM runs WHERE model_spec = ?", (f"hostile:{what}",)
        ).fetchone()
        assert status == "failed" and fragment in error and "\n" not in error
        assert conn.execute(
            "SELECT count(*) FROM samples WHERE finish_reason NOT IN ('eos', 'stop', 'length') "
            "OR generated_tokens < 0 OR prompt_tokens < 0"
        ).fetchone() == (0,)
        assert conn.execute(
            "SELECT count(*) FROM memory_peaks WHERE value < 0 OR typeof(value) NOT IN ('integer', 'null')"
        ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM memory_samples WHERE kv_bytes_used < 0").fetchone() == (0,)
    conn.close()
    # the store is not poisoned: every later read command works
    assert main(["results", "--db", str(db)]) == 0
    assert main(["dashboard", "--db", str(db), "--out", str(tmp_path / "report.html")]) == 0
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("body", ["import sys\nsys.exit(3)\n", "raise KeyboardInterrupt\n", "raise SystemExit\n"])
def test_a_plugin_that_exits_or_is_interrupted_at_import_is_skipped_by_name(
    body: str, tmp_path: Path, isolated_registry: None, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "quitter.py").write_text(body)
    db = tmp_path / "results.sqlite"
    code = main(
        ["run", "--adapters-dir", str(tmp_path / "plugins"), "--model", "preset:qwen3-tiny", *FAST, "--db", str(db)]
    )
    err = capfd.readouterr().err
    assert code == 0, err
    assert "loopeval: warning: adapter plugin 'quitter' from folder" in err and "skipped:" in err
    assert [f.name for f in registry.plugin_failures()][-1] == "quitter"


def test_a_plugin_whose_names_fail_leaves_bare_names_working(
    tmp_path: Path, isolated_registry: None, capfd: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "namer.py").write_text(
        textwrap.dedent("""
        from adapters.registry import register

        def names():
            raise RuntimeError("the catalogue server is down")

        register("namer", "lists its names from a server", names=names)(lambda arg, **kw: None)
    """)
    )
    registry.load_plugins([tmp_path / "plugins"])
    assert adapters.resolve("qwen3-tiny-small") == "zoo:qwen3-tiny-small"
    assert adapters.resolve("ouro-1.4b") == "preset:ouro-1.4b"
    err = capfd.readouterr().err
    assert err.count("adapter plugin 'namer: names()'") == 1 and "RuntimeError: the catalogue server is down" in err


@pytest.mark.parametrize("source", ["builtin", "folder /elsewhere", None])
def test_a_plugin_cannot_claim_a_builtin_prefix_by_any_source(
    source: str | None, tmp_path: Path, isolated_registry: None
) -> None:
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "squatter.py").write_text(
        textwrap.dedent(f"""
        from adapters.registry import register
        register("zoo", "not the zoo", source={source!r})(lambda arg, **kw: None)
    """)
    )
    failures = registry.load_plugins([tmp_path / "plugins"])
    assert failures[-1].name == "squatter" and "zoo" in failures[-1].error
    entry = {e.prefix: e for e in adapters.available()}["zoo"]
    assert entry.source == "builtin" and entry.factory.__module__ == "adapters.zoo"
    with pytest.raises(AdapterError, match="source 'builtin' is loopeval's own"):
        registry.register("mine", "a module's own adapter", source="builtin")(lambda arg, **kw: None)


@pytest.mark.parametrize(
    ("what", "fragment"),
    [
        ("describe-raises", "describe() raised RuntimeError: describe broke on a second line"),
        ("generate-raises", "generate() raised RuntimeError: generate broke on a second line"),
        ("memory-raises-late", "memory() raised RuntimeError: memory broke on a second line"),
        ("huge-while-generating", "memory()['weights_bytes'] is 1000000000000000000000000000000;"),
    ],
)
def test_a_plugin_hook_that_fails_while_profiled_is_one_line_and_stores_no_point(
    what: str, fragment: str, plugins: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """`loopeval profile` calls the same hooks outside a run: the same one line, and no profile point is stored."""
    registry.load_plugins([plugins])  # profile has no --adapters-dir: the folder as LOOPEVAL_ADAPTERS would add it
    db = tmp_path / "results.sqlite"
    code = main(["profile", f"hostile:{what}", "--lengths", "8", "--decode-steps", "2", "--db", str(db)])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    errors = [
        line for line in err.strip().splitlines() if not line.startswith("threads: ")
    ]  # the thread notice comes first
    assert len(errors) == 1 and errors[0].startswith(f"loopeval: error: hostile:{what}: ") and fragment in errors[0], (
        err
    )
    if db.exists():
        with sqlite3.connect(db) as conn:
            assert conn.execute("SELECT count(*) FROM profile_points").fetchone() == (0,)
        conn.close()
