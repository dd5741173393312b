"""Hostile input to every command: one line on stderr, exit code 2, and the folder exactly as it was.

Each case runs the real CLI (`harness.cli.main`, in-process) inside a fresh folder that already holds
a loopeval database with runs, an empty one, a non-SQLite file and two other applications' SQLite
files. After the command the test compares the sha256 of every file in the folder, so databases and
foreign files must stay byte-identical, and the whole listing: read commands (results, dashboard,
suites, models, estimate, zoo list, run --resume) may never create a file or folder, not even the
default results/ folder or SQLite's -wal and -shm files, and a refused write command (run, profile,
zoo train and convert, adapter new) is refused before its first write, so it creates none either.
Paths in the cases are relative to that folder, the working directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from db.store import Store
from harness.cli import main
from harness.planning.spec import RunSpec

FAST = ["--tasks", "lookup", "--limit", "1", "--samples", "1", "--max-new-tokens", "1", "--loops", "1", "--no-report"]
TINY = ["--model", "preset:qwen3-tiny"]
KEPT = "kept.sqlite"  # a loopeval database: run 1 finished (eval), run 2 a profile run
PAPER = [
    "--suite",
    "paper",
    "--tasks",
    "aime24",
    "--limit",
    "1",
    "--samples",
    "1",
    "--max-new-tokens",
    "1",
    "--no-report",
    "--model",
    "preset:qwen3-tiny",
    "--db",
    KEPT,
]
PROFILE = ["profile", "preset:qwen3-tiny", "--db", KEPT]
AIME_ROW = {
    "id": 60,
    "problem": "Find the number of ways alpha.",
    "solution": "...",
    "answer": "204",
    "url": "u",
    "year": "2024",
}


@dataclass(frozen=True)
class Case:
    """One hostile command line and a piece of the one error line it must end with."""

    id: str
    argv: list[str]
    fragment: str  # a piece of the one error line, so the test knows the right check refused it
    setup: Callable[[Path], None] | None = None  # extra hostile files, written before the snapshot


def _aime(
    rows: list[object] | None = None, raw: bytes | None = None, name: str = "aime24.jsonl"
) -> Callable[[Path], None]:
    """A --data-dir `data` for the paper suite whose AIME24 file holds `rows` (one JSON value a line) or `raw` bytes."""

    def setup(root: Path) -> None:
        (root / "data").mkdir()
        body = raw if raw is not None else "".join(json.dumps(row) + "\n" for row in rows or []).encode()
        (root / "data" / name).write_bytes(body)

    return setup


def _existing_package(root: Path) -> None:
    """An earlier `adapter new mine` the user edited: a second `new` must not touch it."""
    (root / "loopeval-mine").mkdir()
    (root / "loopeval-mine" / "edited.py").write_text("# the user's own work\n")


RUN_OPTIONS = [
    Case(
        "loops-huge",
        ["run", *TINY, *FAST, "--loops", "10000000", "--db", KEPT],
        "--loops must be an integer from 1 to 1024",
    ),
    Case(
        "loops-zero-in-list",
        ["run", *TINY, *FAST, "--loops", "0,2", "--db", KEPT],
        "--loops must be comma-separated positive integers",
    ),
    Case(
        "loops-word",
        ["run", *TINY, *FAST, "--loops", "two", "--db", KEPT],
        "--loops must be comma-separated positive integers",
    ),
    Case(
        "limit-beyond-64-bit",
        ["run", *TINY, *FAST, "--limit", "99999999999999999999", "--db", KEPT],
        "Invalid value for '--limit'",
    ),
    Case("limit-zero", ["run", *TINY, *FAST, "--limit", "0", "--db", KEPT], "--limit must be an integer from 1 to"),
    Case(
        "seed-negative",
        ["run", *TINY, *FAST, "--seed", "-1", "--db", KEPT],
        "--seed must be comma-separated integers >= 0",
    ),
    Case("seed-2-64", ["run", *TINY, *FAST, "--seed", str(2**64), "--db", KEPT], "--seed must be an integer from 0 to"),
    Case(
        "samples-trillion",
        ["run", *TINY, *FAST, "--samples", "1000000000000", "--db", KEPT],
        "--samples must be an integer from 1 to 1024",
    ),
    Case(
        "temperature-inf",
        ["run", *TINY, *FAST, "--temperature", "inf", "--db", KEPT],
        "--temperature must be a finite number >= 0",
    ),
    Case(
        "temperature-nan",
        ["run", *TINY, *FAST, "--temperature", "nan", "--db", KEPT],
        "--temperature must be a finite number >= 0",
    ),
    Case(
        "temperature-negative",
        ["run", *TINY, *FAST, "--temperature", "-0.5", "--db", KEPT],
        "--temperature must be a finite number >= 0",
    ),
    Case("top-p-nan", ["run", *TINY, *FAST, "--top-p", "nan", "--db", KEPT], "--top-p must be a number in (0, 1]"),
    Case("top-p-zero", ["run", *TINY, *FAST, "--top-p", "0", "--db", KEPT], "--top-p must be a number in (0, 1]"),
    Case(
        "top-p-above-one", ["run", *TINY, *FAST, "--top-p", "1.5", "--db", KEPT], "--top-p must be a number in (0, 1]"
    ),
    Case(
        "max-new-tokens-zero",
        ["run", *TINY, *FAST, "--max-new-tokens", "0", "--db", KEPT],
        "--max-new-tokens must be an integer from 1 to",
    ),
    Case(
        "batch-size-zero",
        ["run", *TINY, *FAST, "--batch-size", "0", "--db", KEPT],
        "--batch-size must be an integer from 1 to",
    ),
    Case(
        "samples-not-a-number",
        ["run", *TINY, *FAST, "--samples", "many", "--db", KEPT],
        "Invalid value for '--samples'",
    ),
    Case("unknown-option", ["run", *TINY, *FAST, "--loop", "2", "--db", KEPT], "No such option: --loop"),
]
RUN_NAMES = [
    Case("unknown-suite", ["run", *TINY, *FAST, "--suite", "nosuch", "--db", KEPT], "unknown suite 'nosuch'"),
    Case("unknown-task", ["run", *TINY, *FAST, "--tasks", "nosuch", "--db", KEPT], "unknown task 'nosuch'"),
    Case(
        "unknown-model-prefix", ["run", *FAST, "--model", "nosuch:thing", "--db", KEPT], "unknown model prefix 'nosuch'"
    ),
    Case(
        "unknown-preset",
        ["run", *FAST, "--model", "preset:no-such-preset", "--db", KEPT],
        "unknown preset 'no-such-preset'",
    ),
    Case("unknown-zoo-model", ["run", *FAST, "--model", "zoo:no-such-model", "--db", KEPT], "no-such-model"),
    Case(
        "model-name-two-prefixes-share",
        ["run", *FAST, "--model", "ouro-tiny", "--db", KEPT],
        "model name 'ouro-tiny' is ambiguous: give one of preset:ouro-tiny, zoo:ouro-tiny",
    ),
    Case(
        "model-name-unknown",
        ["run", *FAST, "--model", "qwen3-tiny-smal", "--db", KEPT],
        "unknown model 'qwen3-tiny-smal'",
    ),
    Case("model-name-console-markup", ["run", *FAST, "--model", "preset:[/b]", "--db", KEPT], "unknown preset '[/b]'"),
    Case(
        "missing-checkpoint", ["run", *FAST, "--model", "ouro:missing-checkpoint", "--db", KEPT], "missing-checkpoint"
    ),
    Case(
        "preset-without-tokenizer",
        ["run", *FAST, "--model", "preset:qwen3-1.7b", "--db", KEPT],
        "preset:qwen3-1.7b has no tokenizer, so it cannot read a suite's prompts",
    ),
]
RUN_DATA = [
    Case("data-dir-missing", ["run", *PAPER, "--data-dir", "nowhere"], "--data-dir nowhere is not a directory"),
    Case("data-dir-is-a-file", ["run", *PAPER, "--data-dir", "notes.txt"], "--data-dir notes.txt is not a directory"),
    Case(
        "data-dir-without-the-file",
        ["run", *PAPER, "--data-dir", "data"],
        "looked for",
        setup=lambda root: (root / "data").mkdir(),
    ),
    Case(
        "data-bad-json",
        ["run", *PAPER, "--data-dir", "data"],
        "cannot read",
        setup=_aime(raw=b'{"problem": "half an object\n'),
    ),
    Case("data-empty-file", ["run", *PAPER, "--data-dir", "data"], "holds no rows", setup=_aime(raw=b"")),
    Case(
        "data-binary-file", ["run", *PAPER, "--data-dir", "data"], "cannot read", setup=_aime(raw=bytes(range(256)) * 8)
    ),
    Case(
        "data-binary-parquet",
        ["run", *PAPER, "--data-dir", "data"],
        "cannot read",
        setup=_aime(raw=b"PAR1" + bytes(range(256)) * 8, name="aime24.parquet"),
    ),
    Case(
        "data-missing-column",
        ["run", *PAPER, "--data-dir", "data"],
        "has no column 'problem'",
        setup=_aime([{k: v for k, v in AIME_ROW.items() if k != "problem"}]),
    ),
    Case(
        "data-non-string-prompt",
        ["run", *PAPER, "--data-dir", "data"],
        "column 'problem'",
        setup=_aime([{**AIME_ROW, "problem": {"nested": ["not", "text"]}}]),
    ),
    Case(
        "data-empty-prompt",
        ["run", *PAPER, "--data-dir", "data"],
        "expected a non-empty question",
        setup=_aime([{**AIME_ROW, "problem": ""}]),
    ),
    Case(
        "data-rows-not-objects",
        ["run", *PAPER, "--data-dir", "data"],
        "line 1 is a JSON list, not an object",
        setup=_aime([[1, 2, 3]]),
    ),
]
RESUME = [
    Case("resume-missing-run", ["run", "--resume", "999", "--db", KEPT], "--resume 999: no such run"),
    Case("resume-finished-run", ["run", "--resume", "1", "--db", KEPT], "already finished"),
    Case("resume-profile-run", ["run", "--resume", "2", "--db", KEPT], "is a profile run"),
    Case(
        "resume-missing-database",
        ["run", "--resume", "1", "--db", "typo_dir/typo.sqlite"],
        "the folder typo_dir does not exist",
    ),
    Case("resume-default-database", ["run", "--resume", "1"], "no results database"),
    Case("resume-foreign-database", ["run", "--resume", "1", "--db", "users.sqlite"], "not a loopeval database"),
]
DATABASES = [
    Case("run-db-not-sqlite", ["run", *TINY, *FAST, "--db", "notes.txt"], "is not a SQLite database"),
    Case(
        "run-db-foreign-users",
        ["run", *TINY, *FAST, "--db", "users.sqlite"],
        "not a loopeval database (it holds tables users)",
    ),
    Case(
        "run-db-foreign-runs",
        ["run", *TINY, *FAST, "--db", "runs.sqlite"],
        "not a loopeval database (it holds tables runs)",
    ),
    Case(
        "run-db-directory-is-a-file",
        ["run", *TINY, *FAST, "--db", "notes.txt/r.sqlite"],
        "cannot create the database directory",
    ),
    Case(
        "run-db-is-a-directory",
        ["run", *TINY, *FAST, "--db", "folder"],
        "is not a file",
        setup=lambda root: (root / "folder").mkdir(),
    ),
    Case("run-db-unknown-driver", ["run", *TINY, *FAST, "--db", "nosuchdriver://x"], "no SQLAlchemy driver"),
    Case("results-typo-directory", ["results", "--db", "typo_dir/typo.sqlite"], "no results database"),
    Case("results-default-database", ["results"], "no results database"),
    Case("results-not-sqlite", ["results", "--db", "notes.txt"], "is not a SQLite database"),
    Case("results-foreign-users", ["results", "--db", "users.sqlite"], "not a loopeval database"),
    Case("results-foreign-runs", ["results", "--db", "runs.sqlite"], "not a loopeval database"),
    Case("results-empty-file", ["results", "--db", "empty.sqlite"], "holds no loopeval results"),
    Case("results-directory-is-a-file", ["results", "--db", "notes.txt/r.sqlite"], "no results database"),
    Case("results-unknown-driver", ["results", "--db", "nosuchdriver://x"], "no SQLAlchemy driver"),
    Case("results-db-is-root", ["results", "--db", "sqlite:////"], "is not a file"),
]
DASHBOARD = [
    Case(
        "dashboard-out-under-a-file",
        ["dashboard", "--db", KEPT, "--out", "notes.txt/report.html"],
        "cannot write the report",
    ),
    Case(
        "dashboard-out-is-a-directory",
        ["dashboard", "--db", KEPT, "--out", "folder"],
        "cannot write the report",
        setup=lambda root: (root / "folder").mkdir(),
    ),
    Case("dashboard-db-missing", ["dashboard", "--db", "typo_dir/typo.sqlite"], "no results database"),
    Case("dashboard-db-empty-file", ["dashboard", "--db", "empty.sqlite"], "holds no loopeval results"),
    Case("dashboard-db-no-runs", ["dashboard", "--db", "blank.sqlite"], "run `loopeval run` first"),
    Case("dashboard-db-foreign", ["dashboard", "--db", "users.sqlite"], "not a loopeval database"),
    Case("dashboard-db-not-sqlite", ["dashboard", "--db", "notes.txt"], "is not a SQLite database"),
    Case("dashboard-serve-db-missing", ["dashboard", "--serve", "--db", "typo_dir/typo.sqlite"], "no results database"),
    Case("dashboard-serve-port-zero", ["dashboard", "--serve", "--db", KEPT, "--port", "0"], "--port"),
    Case("dashboard-serve-port-too-big", ["dashboard", "--serve", "--db", KEPT, "--port", "70000"], "--port"),
]
PROFILE_CASES = [
    Case(
        "profile-batch-huge",
        [*PROFILE, "--lengths", "8", "--batch", "99999999999"],
        "--batch must be an integer from 1 to",
    ),
    Case("profile-batch-zero", [*PROFILE, "--lengths", "8", "--batch", "0"], "--batch must be an integer from 1 to"),
    Case("profile-length-beyond-context", [*PROFILE, "--lengths", "8,100000"], "exceeds"),
    Case("profile-length-zero", [*PROFILE, "--lengths", "0"], "--lengths must be"),
    Case("profile-length-word", [*PROFILE, "--lengths", "abc"], "--lengths must be"),
    Case("profile-loops-zero", [*PROFILE, "--lengths", "8", "--loops", "0"], "--loops must be"),
    Case("profile-decode-steps-zero", [*PROFILE, "--lengths", "8", "--decode-steps", "0"], "--decode-steps must be"),
    Case("profile-seed-negative", [*PROFILE, "--lengths", "8", "--seed", "-1"], "--seed must be an integer from 0 to"),
    Case(
        "profile-unknown-model",
        ["profile", "nosuch:thing", "--lengths", "8", "--db", KEPT],
        "unknown model prefix 'nosuch'",
    ),
    Case(
        "profile-db-foreign",
        ["profile", "preset:qwen3-tiny", "--lengths", "8", "--db", "runs.sqlite"],
        "not a loopeval database",
    ),
]
ESTIMATE = [
    Case("estimate-unknown-name", ["estimate", "no-such-preset", "--tokens", "8"], "unknown model 'no-such-preset'"),
    Case(
        "estimate-tokens-huge", ["estimate", "zoo:melt-tiny", "--tokens", "99999999999"], "--tokens must be from 1 to"
    ),
    Case("estimate-tokens-zero", ["estimate", "qwen3-tiny", "--tokens", "0"], "--tokens must be"),
    Case(
        "estimate-dtype-int8", ["estimate", "qwen3-tiny", "--tokens", "8", "--dtype", "int8"], "--dtype must be one of"
    ),
    Case("estimate-batch-zero", ["estimate", "qwen3-tiny", "--tokens", "8", "--batch", "0"], "--batch must be"),
    Case("estimate-loops-zero", ["estimate", "qwen3-tiny", "--tokens", "8", "--loops", "0"], "--loops must be"),
    Case("estimate-missing-config", ["estimate", "ouro:nowhere/config.json", "--tokens", "8"], "nowhere"),
    Case("estimate-config-not-json", ["estimate", "ouro:notes.txt", "--tokens", "8"], "notes.txt"),
]
ADAPTER = [
    Case("adapter-new-uppercase-name", ["adapter", "new", "Bad-Name"], "must be lowercase letters"),
    Case("adapter-new-path-name", ["adapter", "new", "../escape"], "must be lowercase letters"),
    Case("adapter-new-builtin-prefix", ["adapter", "new", "preset"], "already a registered prefix"),
    Case(
        "adapter-new-dir-under-a-file",
        ["adapter", "new", "mine", "--dir", "notes.txt/sub"],
        "is not an existing directory",
    ),
    Case("adapter-new-existing-folder", ["adapter", "new", "mine"], "already exists", setup=_existing_package),
    Case("adapter-check-unknown-spec", ["adapter", "check", "nosuch:thing"], "unknown model prefix 'nosuch'"),
    Case("adapter-check-markup-spec", ["adapter", "check", "nosuch:[/b]"], "unknown model prefix 'nosuch'"),
    Case(
        "adapter-check-shared-name",
        ["adapter", "check", "melt-tiny"],
        "ambiguous: give one of preset:melt-tiny, zoo:melt-tiny",
    ),
]
ZOO_AND_LISTS = [
    Case("zoo-train-unknown", ["zoo", "train", "nosuch"], "unknown zoo model(s) nosuch"),
    Case("zoo-train-device-tpu", ["zoo", "train", "ouro-tiny", "--device", "tpu"], "--device must be cpu or cuda"),
    Case(
        "zoo-convert-missing-teacher",
        ["zoo", "convert", "--teacher", "ouro:/nonexistent", "--out", "melt-out", "--steps", "1"],
        "/nonexistent",
    ),
    Case(
        "zoo-convert-gate-bogus",
        ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", "melt-out", "--gate", "bogus"],
        "--gate must be one of",
    ),
    Case(
        "zoo-convert-device-tpu",
        ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", "melt-out", "--device", "tpu"],
        "--device must be cpu or cuda",
    ),
    Case(
        "zoo-convert-data-missing",
        ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", "melt-out", "--data", "nowhere.jsonl"],
        "cannot read --data file",
    ),
    Case(
        "zoo-convert-data-bad-json",
        ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", "melt-out", "--data", "notes.txt"],
        "cannot read --data file notes.txt",
    ),
    Case(
        "zoo-convert-out-under-a-file",
        ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", "notes.txt/melt", "--steps", "1"],
        "--out notes.txt/melt",
    ),
    Case(
        "zoo-train-out-is-a-file",
        ["zoo", "train", "ouro-tiny", "--out", "notes.txt", "--steps", "1"],
        "--out notes.txt",
    ),
    Case("zoo-train-steps-zero", ["zoo", "train", "ouro-tiny", "--steps", "0"], "Invalid value for '--steps'"),
    Case("zoo-list-unknown-option", ["zoo", "list", "--jsn"], "No such option: --jsn"),
    Case("suites-extra-argument", ["suites", "paper"], "unexpected extra argument"),
    Case("models-unknown-option", ["models", "--all"], "No such option: --all"),
    Case("unknown-command", ["evaluate"], "No such command 'evaluate'"),
]


def _file(name: str, text: str) -> Callable[[Path], None]:
    """A setup that writes `text` to `name`."""
    return lambda root: (root / name).write_text(text)


def _fifo(name: str) -> Callable[[Path], None]:
    """A setup that makes `name` a FIFO: opening it for reading would block until a writer comes."""
    return lambda root: os.mkfifo(root / name)


SWEEP = "sweep.toml"
RUN_SWEEP = ["run", "--config", SWEEP, "--db", KEPT, "--no-report"]
TINY_SWEEP = 'models = [{spec = "preset:qwen3-tiny", overrides = {%s}}]\ntasks = ["lookup"]\nlimit = 1\nsamples = 1\nloops = [1]\n'
MORE_THAN_THE_MACHINE_GB = (
    2 * psutil.virtual_memory().total / 1e9
)  # "kv_budget = 40 on a 24 GB machine", on any machine
SWEEP_FILES = [
    Case(
        "sweep-nested-deeply",
        RUN_SWEEP,
        "nested too deeply",
        setup=_file(SWEEP, "loops = " + "[" * 5000 + "]" * 5000 + "\n"),
    ),
    Case(
        "sweep-gpus-per-run-inf",
        RUN_SWEEP,
        "gpus_per_run must be a finite number >= 0, got inf",
        setup=_file(SWEEP, 'executor = "ray"\ngpus_per_run = inf\n'),
    ),
    Case(
        "sweep-temperature-nan",
        RUN_SWEEP,
        "temperature must be a finite number >= 0, got nan",
        setup=_file(SWEEP, "temperature = nan\n"),
    ),
    Case(
        "sweep-override-nan",
        RUN_SWEEP,
        "models[0].overrides.max_batch must be a string, finite number or boolean, got nan",
        setup=_file(SWEEP, TINY_SWEEP % "max_batch = nan"),
    ),
    Case(
        "sweep-override-inf",
        RUN_SWEEP,
        "overrides.kv_budget must be a string, finite number or boolean, got inf",
        setup=_file(SWEEP, TINY_SWEEP % "kv_budget = inf"),
    ),
    Case(
        "sweep-exit-threshold-nan",
        RUN_SWEEP,
        "overrides.exit_threshold must be a string, finite number or boolean, got nan",
        setup=_file(SWEEP, 'models = [{spec = "zoo:ouro-tiny", overrides = {exit_threshold = nan}}]\n'),
    ),
    Case(
        "sweep-exit-threshold-word",
        RUN_SWEEP,
        "exit_threshold must be a number in [0, 1] for the gate criterion, got 'half'",
        setup=_file(SWEEP, 'models = [{spec = "zoo:ouro-tiny", overrides = {exit_threshold = "half"}}]\n'),
    ),
    Case(
        "sweep-kv-budget-over-memory",
        RUN_SWEEP,
        "the KV pool of kv_budget =",
        setup=_file(SWEEP, TINY_SWEEP % f"kv_budget = {MORE_THAN_THE_MACHINE_GB:.1f}"),
    ),
    Case(
        "sweep-is-dev-zero",
        ["run", "--config", "/dev/zero", "--db", KEPT],
        "--config /dev/zero: a device, FIFO or socket, not a regular file",
    ),
    Case("sweep-is-a-fifo", RUN_SWEEP, "a device, FIFO or socket, not a regular file", setup=_fifo(SWEEP)),
    Case(
        "sweep-is-a-folder",
        ["run", "--config", "folder", "--db", KEPT],
        "--config folder: a folder, not a regular file",
        setup=lambda root: (root / "folder").mkdir(),
    ),
    Case(
        "sweep-over-the-size-cap", RUN_SWEEP, "over the limit of 1,048,576", setup=_file(SWEEP, "# padding\n" * 120_000)
    ),
    Case(
        "sweep-not-utf8",
        RUN_SWEEP,
        "not UTF-8 text",
        setup=lambda root: (root / SWEEP).write_bytes(b"suite = '\xff\xfe'\n"),
    ),
    Case(
        "sweep-grid-over-the-limit",
        RUN_SWEEP,
        "the sweep asks for up to 2,048,000 runs (1 models x 1024 loop counts x 2000 seeds)",
        setup=_file(
            SWEEP, f'models = ["preset:qwen3-tiny"]\nloops = "1-1024"\nseeds = [{", ".join(map(str, range(2000)))}]\n'
        ),
    ),
    Case(
        "flags-grid-over-the-limit",
        [
            "run",
            *TINY,
            "--loops",
            "1-1024",
            "--seed",
            ",".join(f"{i * 1000}-{i * 1000 + 999}" for i in range(20)),
            "--db",
            KEPT,
        ],
        "over the limit of 10,000",
    ),
]

RECIPE = "recipes.toml"
ZOO_TRAIN = ["zoo", "train", "a", "--recipes", RECIPE, "--out", "zoo-out"]
LM = '[models.a]\nkind = "lm"\npreset = "qwen3-tiny"\n'
RECIPES = [
    Case(
        "recipe-base-a-list",
        ZOO_TRAIN,
        "model a: base ['b'] is not another model",
        setup=_file(RECIPE, LM + 'base = ["b"]\n[models.b]\n'),
    ),
    Case(
        "recipe-base-chain-deep",
        ZOO_TRAIN,
        "recipe a: steps must be an integer >= 0, got nan",
        setup=_file(
            RECIPE,
            "".join(f'[models.m{i}]\nbase = "m{i + 1}"\n' for i in range(3000)) + "[models.m3000]\nkind = 'lm'\n"
            'preset = "qwen3-tiny"\n[models.a]\nbase = "m0"\nsteps = nan\n',
        ),
    ),
    Case(
        "recipe-base-cycle",
        ZOO_TRAIN,
        "bases lead back here",
        setup=_file(RECIPE, LM + 'base = "b"\n[models.b]\nbase = "a"\n'),
    ),
    Case(
        "recipe-model-not-a-table",
        ZOO_TRAIN,
        "[models.a] must be a table, got 3",
        setup=_file(RECIPE, "[models]\na = 3\n"),
    ),
    Case(
        "recipe-config-a-string",
        ZOO_TRAIN,
        "model a: config must be a table of engine config fields, got 'loops=4'",
        setup=_file(RECIPE, LM + 'config = "loops=4"\n'),
    ),
    Case(
        "recipe-config-bad-field",
        ZOO_TRAIN,
        "config field num_heads must be a positive integer, got 0",
        setup=_file(RECIPE, LM + "config = { num_heads = 0 }\n"),
    ),
    Case(
        "recipe-steps-nan",
        ZOO_TRAIN,
        "recipe a: steps must be an integer >= 0, got nan",
        setup=_file(RECIPE, LM + "steps = nan\n"),
    ),
    Case(
        "recipe-lr-inf",
        ZOO_TRAIN,
        "recipe a: lr must be a finite number, got inf",
        setup=_file(RECIPE, LM + "lr = inf\n"),
    ),
    Case(
        "recipe-tasks-a-string",
        ZOO_TRAIN,
        "recipe a: tasks must be a list of task names",
        setup=_file(RECIPE, LM + 'tasks = "chain2"\n'),
    ),
    Case(
        "recipe-is-dev-zero",
        ["zoo", "train", "a", "--recipes", "/dev/zero"],
        "recipes file /dev/zero: a device, FIFO or socket",
    ),
    Case(
        "recipe-unknown-preset",
        ZOO_TRAIN,
        "no-such",
        setup=_file(RECIPE, '[models.a]\nkind = "lm"\npreset = "no-such"\n'),
    ),
    Case(
        "recipe-lr-huge",
        ZOO_TRAIN,
        "recipe a: lr must be in (0, 1], got 1000000000.0",
        setup=_file(RECIPE, LM + "lr = 1e9\n"),
    ),
    Case("recipe-lr-zero", ZOO_TRAIN, "recipe a: lr must be in (0, 1], got 0", setup=_file(RECIPE, LM + "lr = 0\n")),
    Case(
        "recipe-seed-past-32-bits",
        ZOO_TRAIN,
        "recipe a: seed must be in [0, 4294967295], got 18446744073709551615",
        setup=_file(RECIPE, LM + f"seed = {2**64 - 1}\n"),
    ),
    Case(
        "recipe-distill-temperature-zero",
        ZOO_TRAIN,
        "recipe a: distill_temperature must be in (0, 100], got 0",
        setup=_file(RECIPE, LM + "distill_temperature = 0\n"),
    ),
    Case(
        "recipe-grad-clip-negative",
        ZOO_TRAIN,
        "recipe a: grad_clip must be in (0, 1000000], got -1.0",
        setup=_file(RECIPE, LM + "grad_clip = -1.0\n"),
    ),
    Case(
        "recipe-min-lr-ratio-above-one",
        ZOO_TRAIN,
        "min_lr_ratio must be in [0, 1], got 2.5",
        setup=_file(RECIPE, LM + "min_lr_ratio = 2.5\n"),
    ),
    Case(
        "recipe-batch-size-huge",
        ZOO_TRAIN,
        "recipe a: batch_size must be in [1, 1048576], got 100000000",
        setup=_file(RECIPE, LM + "batch_size = 100000000\n"),
    ),
    Case(
        "recipe-batch-beyond-memory",
        ZOO_TRAIN,
        "training a: weights, gradients, optimizer states and the activations of batch_size 1000000",
        setup=_file(RECIPE, LM + "batch_size = 1000000\n"),
    ),
    Case(
        "recipe-hidden-32768-beyond-memory",
        ZOO_TRAIN,
        "GB is free on cpu: lower the recipe's batch_size or its model's sizes",
        setup=_file(RECIPE, LM + "config = { hidden_size = 32768, ffn_size = 131072 }\n"),
    ),
    *(
        Case(
            f"recipe-name-{label}",
            ["zoo", "train", name, "--recipes", RECIPE, "--out", "zoo-out"],
            f"recipe name {name!r} must be a plain name",
            setup=_file(RECIPE, LM.replace("[models.a]", f"[models.{json.dumps(name)}]")),
        )
        for label, name in (
            ("parent", "../escape"),
            ("absolute", "/tmp/loopeval-escape"),
            ("nested", "a/b"),
            ("dot", "."),
            ("backslash", "a\\b"),
        )
    ),
]


def _teacher(**changes: object) -> Callable[[Path], None]:
    """A teacher folder `teacher/` whose HF Ouro config.json is ouro-tiny's shape with `changes` (a non-dict: the whole file)."""
    config = {
        "model_type": "ouro",
        "vocab_size": 99,
        "hidden_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "total_ut_steps": 4,
        "max_position_embeddings": 512,
    }

    def setup(root: Path) -> None:
        (root / "teacher").mkdir()
        whole = changes.get("whole")
        (root / "teacher" / "config.json").write_text(
            str(whole) if whole is not None else json.dumps({**config, **changes})
        )

    return setup


CONVERT = ["zoo", "convert", "--teacher", "ouro:teacher", "--out", "melt-out", "--steps", "1"]
CONVERT_TINY = [
    "zoo",
    "convert",
    "--teacher",
    "zoo:ouro-tiny",
    "--out",
    "melt-out",
    "--steps",
    "1",
    "--data",
    "data.jsonl",
]
TEACHERS_AND_DATA = [
    Case("teacher-config-a-list", CONVERT, "expected a JSON object, got a list", setup=_teacher(whole="[1, 2, 3]")),
    Case(
        "teacher-zero-heads",
        CONVERT,
        "num_attention_heads must be a positive integer, got 0",
        setup=_teacher(num_attention_heads=0),
    ),
    Case(
        "teacher-width-a-string",
        CONVERT,
        "hidden_size must be a positive integer, got '128'",
        setup=_teacher(hidden_size="128"),
    ),
    Case(
        "teacher-context-1e12",
        CONVERT,
        "max_position (the context) must be at most 16777216 tokens, got 1000000000000",
        setup=_teacher(max_position_embeddings=10**12),
    ),
    Case(
        "teacher-loops-100000",
        CONVERT,
        "loops must be an integer from 1 (no looping) to 1024, got 100000",
        setup=_teacher(total_ut_steps=100_000),
    ),
    Case(
        "teacher-exit-threshold-nan",
        CONVERT,
        "NaN is not a JSON number",
        setup=_teacher(whole='{"early_exit_threshold": NaN}'),
    ),
    Case(
        "teacher-rope-theta-word",
        CONVERT,
        "rope_theta must be a finite number > 0, got 'big'",
        setup=_teacher(rope_theta="big"),
    ),
    Case(
        "teacher-tie-as-text",
        CONVERT,
        "tie_word_embeddings must be true or false, got 'false'",
        setup=_teacher(tie_word_embeddings="false"),
    ),
    Case(
        "teacher-eos-list-with-text",
        CONVERT,
        "eos_token_id must be a token id",
        setup=_teacher(eos_token_id=[2, "</s>"]),
    ),
    Case(
        "estimate-loops-100000",
        ["estimate", "ouro-1.4b", "--tokens", "8", "--loops", "100000"],
        "--loops must be an integer from 1 to 1024",
    ),
    Case(
        "convert-batch-size-1e8",
        [*CONVERT_TINY[:-2], "--batch-size", "100000000"],
        "batch_size must be in [1, 1048576], got 100000000",
    ),
    Case(
        "convert-batch-beyond-memory",
        [*CONVERT_TINY[:-2], "--batch-size", "1000000"],
        "batch_size 1000000 x 41 positions need",
    ),
    Case("convert-lr-zero", [*CONVERT_TINY[:-2], "--lr", "0"], "lr must be in (0, 1], got 0.0"),
    Case(
        "convert-data-not-utf8",
        CONVERT_TINY,
        "not UTF-8 text",
        setup=lambda root: (root / "data.jsonl").write_bytes(b'{"prompt": "\xff"}\n'),
    ),
    Case(
        "convert-data-not-strings",
        CONVERT_TINY,
        'line 1: expected a JSON object whose "prompt" and "answer" are non-empty strings',
        setup=_file("data.jsonl", '{"prompt": 12, "answer": ["3"]}\n'),
    ),
    Case("convert-data-dev-zero", [*CONVERT_TINY[:-1], "/dev/zero"], "--data file /dev/zero: a device, FIFO or socket"),
    Case("convert-data-fifo", CONVERT_TINY, "a device, FIFO or socket, not a regular file", setup=_fifo("data.jsonl")),
    Case("convert-data-empty", CONVERT_TINY, "holds no rows", setup=_file("data.jsonl", "\n")),
    Case(
        "probe-text-file-dev-zero",
        ["probe", "zoo:ouro-tiny", "--text-file", "/dev/zero", "--db", KEPT],
        "--text-file /dev/zero: a device",
    ),
]


def _damaged(change: Callable[[Path], None]) -> Callable[[Path], None]:
    """A setup that makes `damaged.sqlite`, a copy of the kept database, and changes it."""

    def setup(root: Path) -> None:
        shutil.copy(root / KEPT, root / "damaged.sqlite")
        change(root / "damaged.sqlite")

    return setup


def _sql(statement: str) -> Callable[[Path], None]:
    def change(path: Path) -> None:
        conn = sqlite3.connect(path)
        conn.execute(statement)
        conn.commit()
        conn.close()

    return change


def _garbage_pages(path: Path) -> None:
    """Every page after the first (the header and the schema) overwritten with random bytes."""
    data = path.read_bytes()
    path.write_bytes(data[:4096] + random.Random(0).randbytes(len(data) - 4096))


DAMAGES = {
    "two-heads": (_sql("INSERT INTO alembic_version VALUES ('0005')"), "records 2 schema revisions"),
    "garbage-pages": (_garbage_pages, "the file is damaged"),
    "dropped-table": (_sql("DROP TABLE task_metrics"), "lacks table(s) task_metrics"),
}
DAMAGED = "damaged.sqlite"
DAMAGED_DATABASES = [
    Case(
        f"{command[0]}-{'-'.join(command[1:2])}-{damage}".replace("--", "-"),
        [*command, "--db", DAMAGED],
        fragment,
        setup=_damaged(change),
    )
    for damage, (change, fragment) in DAMAGES.items()
    for command in (
        ["results"],
        ["dashboard"],
        ["run", *TINY, *FAST],
        ["run", "--resume", "1"],
        ["profile", "preset:qwen3-tiny", "--lengths", "8"],
        ["probe", "zoo:ouro-tiny", "--loops", "2", "--limit", "1"],
    )
]
SERVER_URLS = [
    Case(f"{command[0]}-postgres-{what}", [*command, "--db", url], "is not a database URL")
    for what, url in (
        ("port-not-a-number", "postgresql://me:secret@db.lab:five/loopeval"),
        ("ipv6-unclosed", "postgresql://me@[::1/loopeval"),
        ("port-out-of-range", "postgresql://me@db.lab:99999/loopeval"),
    )
    for command in (["results"], ["dashboard"], ["run", *TINY, *FAST], ["run", "--resume", "1"])
]


def _checkpoint(family: str, edit: Callable[[Path], object]) -> Callable[[Path], None]:
    """A setup writing a tiny checkpoint of `family` (qwen3: the HF layout; huginn: the official one) to `ckpt/`,
    then `edit`ing the folder."""

    def setup(root: Path) -> None:
        from adapters.testing import save_tiny_huginn, save_tiny_qwen3

        with contextlib.redirect_stderr(io.StringIO()):  # transformers' progress bar: not the command's output
            folder = {"qwen3": save_tiny_qwen3, "huginn": save_tiny_huginn}[family](root / "ckpt")
        edit(folder)

    return setup


def _json_edit(name: str, change: Callable[[dict], None]) -> Callable[[Path], None]:
    """An edit of the folder's JSON file `name` in place."""

    def edit(folder: Path) -> None:
        value = json.loads((folder / name).read_text())
        change(value)
        (folder / name).write_text(json.dumps(value))

    return edit


def _transformers_sweep(root: Path) -> None:
    """A sweep giving an engine-only override (`triton_kernels`) to a `transformers:` model."""
    _checkpoint("qwen3", lambda folder: None)(root)
    sweep = TINY_SWEEP.replace("preset:qwen3-tiny", "transformers:ckpt") % "triton_kernels = true"
    (root / SWEEP).write_text(sweep)


HUGE = 10**400  # JSON's integers have no bound; a float's range does
QWEN3_HUGE_THETA = _checkpoint(
    "qwen3", _json_edit("config.json", lambda c: c["rope_parameters"].update(rope_theta=HUGE))
)
HUGINN_HUGE_BASE = _checkpoint("huginn", _json_edit("config.json", lambda c: c.update(rope_base=HUGE)))
HUGINN_HUGE_VOCABULARY = _checkpoint("huginn", _json_edit("config.json", lambda c: c.update(vocab_size=HUGE)))
# 99 tokens for a vocabulary of 99, one of them at id 500: the tokenizer's size alone passes
HUGINN_SPARSE_TOKENIZER = _checkpoint(
    "huginn", _json_edit("tokenizer.json", lambda t: t["model"]["vocab"].update(a=500))
)
CHECKPOINT_RUN = ["run", *FAST, "--db", KEPT]
ROUND_FIVE = [
    Case(
        "qwen3-rope-theta-400-digits",
        [*CHECKPOINT_RUN, "--model", "qwen3:ckpt"],
        "field rope_theta must be a finite number > 0, got an integer of 401 digits",
        setup=QWEN3_HUGE_THETA,
    ),
    Case(
        "estimate-qwen3-rope-theta-400-digits",
        ["estimate", "qwen3:ckpt", "--tokens", "8"],
        "field rope_theta must be a finite number > 0, got an integer of 401 digits",
        setup=QWEN3_HUGE_THETA,
    ),
    Case(
        "huginn-rope-base-400-digits",
        [*CHECKPOINT_RUN, "--model", "huginn:ckpt"],
        "field rope_base must be a finite number > 0, got an integer of 401 digits",
        setup=HUGINN_HUGE_BASE,
    ),
    Case(
        "estimate-huginn-vocabulary-400-digits",
        ["estimate", "huginn:ckpt", "--tokens", "8"],
        "config field vocab_size must be at most 16777216, got an integer of 401 digits",
        setup=HUGINN_HUGE_VOCABULARY,
    ),
    Case(
        "huginn-tokenizer-id-past-the-vocabulary",
        [*CHECKPOINT_RUN, "--model", "huginn:ckpt"],
        "the tokenizer's ids run to 500, past the model's vocabulary of 99",
        setup=HUGINN_SPARSE_TOKENIZER,
    ),
    Case(
        "probe-huginn-tokenizer-id-past-the-vocabulary",
        ["probe", "huginn:ckpt", "--loops", "2", "--tasks", "lookup", "--db", KEPT],
        "the tokenizer's ids run to 500, past the model's vocabulary of 99",
        setup=HUGINN_SPARSE_TOKENIZER,
    ),
    Case(
        "transformers-triton-kernels-override",
        RUN_SWEEP,
        "transformers:ckpt: no override triton_kernels for this adapter (it takes dtype, device,",
        setup=_transformers_sweep,
    ),
    *[
        Case(
            f"sweep-device-override-{device}",
            RUN_SWEEP,
            f"overrides of preset:qwen3-tiny: device must be cpu or cuda, got {device!r}",
            setup=_file(SWEEP, TINY_SWEEP % f'device = "{device}"'),
        )
        for device in ("mps", "garbage")
    ],
]
CASES = (
    RUN_OPTIONS
    + RUN_NAMES
    + RUN_DATA
    + RESUME
    + DATABASES
    + DASHBOARD
    + PROFILE_CASES
    + ESTIMATE
    + ADAPTER
    + ZOO_AND_LISTS
    + SWEEP_FILES
    + RECIPES
    + TEACHERS_AND_DATA
    + DAMAGED_DATABASES
    + SERVER_URLS
    + ROUND_FIVE
)


def _foreign_sqlite(path: Path, table: str) -> None:
    """Another application's SQLite file: loopeval must refuse it without writing a byte."""
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute(f"INSERT INTO {table} (name) VALUES ('alice')")
    conn.close()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The files every case starts with: loopeval databases (with runs, without runs, empty) and foreign files."""
    root = tmp_path_factory.mktemp("template")
    store = Store.open(str(root / KEPT))
    spec = RunSpec.build(
        models=["preset:qwen3-tiny"], tasks=["lookup"], loops=[1], samples=1, max_new_tokens=1, limit=1
    )
    finished = store.create_run(
        sweep_id="kept", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic", spec=spec.to_dict()
    )
    store.add_samples(finished, [dict(task="lookup", doc_id="0", sample_index=0, prompt="p", output="o")])
    store.finish_run(finished, "finished")
    profiled = store.create_run(
        sweep_id="profiled",
        kind="profile",
        model_spec="preset:qwen3-tiny",
        adapter="preset",
        suite="profile",
        spec={"lengths": [8]},
    )
    store.finish_run(profiled, "finished")
    store.close()
    Store.open(str(root / "blank.sqlite")).close()  # loopeval's schema, no runs
    (root / "empty.sqlite").write_bytes(b"")
    (root / "notes.txt").write_text("a user's notes, not a database\n")
    _foreign_sqlite(root / "users.sqlite", "users")
    _foreign_sqlite(root / "runs.sqlite", "runs")
    return root


def snapshot(root: Path) -> dict[str, str]:
    """Every path under `root` -> sha256 of its bytes ("dir" for folders): what a refused command must keep."""
    return {
        str(p.relative_to(root)): "dir"
        if p.is_dir()
        else hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "special"
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input(
    case: Case, template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "work"
    shutil.copytree(template, root)
    if case.setup is not None:
        case.setup(root)
    monkeypatch.chdir(root)
    monkeypatch.delenv("LOOPEVAL_DB", raising=False)
    monkeypatch.delenv("LOOPEVAL_ADAPTERS", raising=False)
    before = snapshot(root)

    code = main(case.argv)

    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}; stderr: {err}"
    assert len(lines) == 1 and lines[0].startswith("loopeval: error: "), f"stderr is not one error line:\n{err}"
    assert case.fragment in lines[0], lines[0]
    assert "secret" not in err, "a password was printed"
    after = snapshot(root)
    changed = {path for path, digest in before.items() if after.get(path) != digest}
    assert not changed, f"changed or removed: {sorted(changed)}"
    assert sorted(after) == sorted(before), f"the refused command created {sorted(set(after) - set(before))}"


def test_enough_cases_across_every_command() -> None:
    """The issue asks for at least 60 hostile inputs, and every command must face some."""
    commands = {" ".join(c.argv[:2]) if c.argv[0] in ("zoo", "adapter") else c.argv[0] for c in CASES}
    assert len(CASES) >= 60
    assert {
        "run",
        "results",
        "suites",
        "models",
        "estimate",
        "profile",
        "dashboard",
        "zoo list",
        "zoo train",
        "zoo convert",
        "adapter new",
        "adapter check",
    } <= commands


def test_stored_names_that_look_like_console_markup_print_as_written(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A database copied from elsewhere may name a model `[/b]`: rich would read it as a closing tag and fail
    the whole table with a MarkupError, or style it. `loopeval results` prints it as written."""
    path = tmp_path / "names.sqlite"
    store = Store.open(str(path))
    for model in ("e:[/b]x", "e:[red]y"):
        store.finish_run(store.create_run(sweep_id="s", model_spec=model, adapter="e", suite="synthetic"), "finished")
    store.close()
    before = snapshot(tmp_path)

    assert main(["results", "--db", str(path)]) == 0
    out, err = capfd.readouterr()
    assert err == "" and "e:[/b]x" in out and "e:[red]y" in out, out + err
    assert snapshot(tmp_path) == before


def _int_options() -> list[tuple[list[str], str]]:
    """(command path, option) for every integer option of every command, read from the CLI itself."""
    import typer

    from harness.cli import app

    found = []

    def walk(command: typer.core.TyperCommand | typer.core.TyperGroup, path: list[str]) -> None:
        for param in command.params:
            if param.type_descriptor.annotation is int and param.opts[0].startswith("--"):
                found.append((path, param.opts[0]))
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return found


@pytest.mark.parametrize(("path", "option"), _int_options(), ids=lambda v: " ".join(v) if isinstance(v, list) else v)
def test_every_integer_option_refuses_a_number_of_400_digits_in_one_line(
    path: list[str], option: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """`estimate --batch 999...9` overflowed a float in its table; every integer option is bounded (at most a database's
    integer column, tighter where the command says), so the class is one line and exit 2 before any work."""
    monkeypatch.chdir(tmp_path)
    code = main([*path, option, "9" * 400])
    err = capfd.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"loopeval: error: Invalid value for '{option}'"), err
    assert list(tmp_path.iterdir()) == []
