"""`loopeval run`'s settings are declared once (`harness.planning.options.OPTIONS`): each row is a flag of the real
command line and a key of a sweep file, and the two give the same request. A new row needs an example here."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from harness.cli import app
from harness.planning.options import BY_KEY, OPTIONS, SWEEP_CHOICES, given
from harness.planning.sweep import build_request

# key -> (the flags that give it, the sweep file that gives it); DATA is replaced by a real directory.
EXAMPLES: dict[str, tuple[list[str], str]] = {
    "models": (
        ["--model", "preset:qwen3-tiny", "--model", "zoo:ouro-tiny"],
        'models = ["preset:qwen3-tiny", "zoo:ouro-tiny"]',
    ),
    "suite": (["--suite", "paper"], 'suite = "paper"'),
    "tasks": (["--tasks", "lookup, addition"], 'tasks = ["lookup", "addition"]'),
    "loops": (["--loops", "1-3,8"], "loops = [1, 2, 3, 8]"),
    "exit_threshold": (["--exit-threshold", "0.9,0.5"], 'exit_threshold = "0.9, 0.5"'),
    "exit_criterion": (
        ["--exit-threshold", "0.5", "--exit-criterion", "kl"],
        'exit_threshold = [0.5]\nexit_criterion = "kl"',
    ),
    "kv_policy": (["--kv-policy", "shared-ema:.5,shared-last"], 'kv_policy = ["shared-ema:.5", "shared-last"]'),
    "kv_dtype": (["--kv-dtype", "int8"], 'kv_dtype = "int8"'),
    "samples": (["--samples", "3"], "samples = 3"),
    "temperature": (["--temperature", "0.5"], "temperature = 0.5"),
    "top_p": (["--top-p", "0.9"], "top_p = 0.9"),
    "max_new_tokens": (["--max-new-tokens", "7"], "max_new_tokens = 7"),
    "limit": (["--limit", "5"], "limit = 5"),
    "batch_size": (["--batch-size", "4"], "batch_size = 4"),
    "seed": (["--seed", "3"], "seed = 3"),
    "seeds": (["--seed", "0-2"], "seeds = [0, 1, 2]"),
    "data_dir": (["--data-dir", "DATA"], 'data_dir = "DATA"'),
    "trust_remote_code": (["--trust-remote-code"], "trust_remote_code = true"),
    "db": (["--db", "results.sqlite"], 'db = "results.sqlite"'),
    "executor": (["--executor", "ray"], 'executor = "ray"'),
    "ray_address": (["--executor", "ray", "--ray-address", "head:6379"], 'executor = "ray"\nray_address = "head:6379"'),
    "gpus_per_run": (["--executor", "ray", "--gpus-per-run", "0.5"], 'executor = "ray"\ngpus_per_run = 0.5'),
    "device": (["--device", "cpu"], 'device = "cpu"'),
    "workers": (["--workers", "2"], "workers = 2"),
}


def _flags(args: list[str]) -> dict[str, object]:
    """What typer hands `loopeval run` for these arguments: parsed by the real command, then normalised as typer's
    callback does (an option repeated zero times is None)."""
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    params = {param.name: param for param in command.params}
    parsed = command.make_context("run", list(args)).params
    return {name: typer.main._normalize_collection_value(params[name], value) for name, value in parsed.items()}


def test_every_setting_has_an_example() -> None:
    assert set(EXAMPLES) == set(BY_KEY) and len(BY_KEY) == len(OPTIONS), "one row per key, each exercised below"


@pytest.mark.parametrize("key", EXAMPLES)
def test_a_flag_and_its_sweep_file_key_make_the_same_request(key: str, tmp_path: Path) -> None:
    """Each beside a choice of what runs (`--suite paper`), since a sweep file is never the default job."""
    args, toml = EXAMPLES[key]
    args, toml = [a.replace("DATA", str(tmp_path)) for a in args], toml.replace("DATA", str(tmp_path))
    base_args, base_toml = (
        (["--suite", "paper"], 'suite = "paper"') if key != "suite" else (["--limit", "9"], "limit = 9")
    )
    path = tmp_path / "sweep.toml"
    path.write_text(f"{base_toml}\n{toml}\n")
    from_flags = build_request(given(_flags(base_args + args)))
    assert from_flags == build_request(given(_flags([])), str(path))
    assert from_flags != build_request(given(_flags(base_args))), f"{key} changes the request"


def test_the_options_that_choose_what_runs_end_the_default_job() -> None:
    """The default job is six specs (the lab's, the headline's, the exit sweep's, three of memory levers); a flag that
    chooses what runs makes it one per seed, any other leaves it."""
    assert len(build_request(given(_flags([]))).specs) == 6
    for key, (args, _) in EXAMPLES.items():
        flags = [a for a in args if a.startswith("--")]
        chooses = any(BY_KEY[k].keyword in SWEEP_CHOICES for k in BY_KEY if BY_KEY[k].flag in flags and BY_KEY[k].type)
        specs = build_request(given(_flags([a.replace("DATA", ".") for a in args]))).specs
        assert (len(specs) < 6) == chooses, key
