"""One naming of models everywhere: `run`, `profile`, `estimate`, `adapter check` and the Python API take
the same specs, a bare name stands for the one spec that has it, and a name two prefixes share is
refused with the candidates in one line (exit 2) by every command alike."""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
from pathlib import Path

import pytest

import adapters
from adapters import AdapterError, registry
from adapters.engine.config import FAMILIES, LoopConfig
from adapters.engine.io.presets import FAMILY_GUIDE, PRESETS, family_table
from adapters.zoo import zoo_info, zoo_names
from harness.cli import main
from harness.hints import env_command
from harness.planning.spec import RunSpec


def test_bare_names_resolve_to_their_one_spec() -> None:
    assert adapters.resolve("ouro-1.4b") == "preset:ouro-1.4b"
    assert adapters.resolve("qwen3-tiny-small") == "zoo:qwen3-tiny-small"
    assert adapters.resolve("zoo:ouro-tiny") == "zoo:ouro-tiny"  # a full spec is kept as given
    assert adapters.resolve("ouro:/any/path") == "ouro:/any/path"
    for shared in ("ouro-tiny", "melt-tiny"):  # shipped both as a random preset and as a trained zoo model
        with pytest.raises(AdapterError, match=f"'{shared}' is ambiguous: give one of preset:{shared}, zoo:{shared}$"):
            adapters.resolve(shared)
    with pytest.raises(AdapterError, match="unknown model 'ouro-1.4c'.*close: ouro-1.4b"):
        adapters.resolve("ouro-1.4c")
    with pytest.raises(AdapterError, match="unknown model prefix 'nosuch'"):
        adapters.resolve("nosuch:thing")


def test_every_shipped_name_is_listed_and_only_shared_ones_are_ambiguous() -> None:
    named = registry.named_models()
    assert set(named) == set(PRESETS) | set(zoo_names())
    assert (
        {name for name, specs in named.items() if len(specs) > 1}
        == set(PRESETS) & set(zoo_names())
        == {"ouro-tiny", "melt-tiny"}
    )


def test_a_plugin_name_that_collides_makes_the_bare_name_ambiguous() -> None:
    """The rule is the registry's, not the engine's: a plugin listing `qwen3-1.7b` takes the bare name away."""
    registry.available()  # built-ins loaded before the snapshot, so restoring it keeps them
    saved = dict(registry._REGISTRY)
    try:
        registry.register("mine", "a plugin with named models", names=lambda: ["qwen3-1.7b", "mine-small"])(
            lambda arg, **o: None
        )
        assert adapters.resolve("mine-small") == "mine:mine-small"
        with pytest.raises(AdapterError, match="give one of mine:qwen3-1.7b, preset:qwen3-1.7b"):
            adapters.resolve("qwen3-1.7b")
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(saved)


def test_python_api_takes_bare_names() -> None:
    adapter = adapters.load("qwen3-tiny", seed=3)
    assert adapter.spec == "preset:qwen3-tiny"
    assert adapters.inspect("ouro-1.4b", loops=2) == adapters.inspect("preset:ouro-1.4b", loops=2)
    shipped = LoopConfig.from_dict(zoo_info("qwen3-tiny-deep")["config"])
    assert LoopConfig.from_dict(adapters.inspect("qwen3-tiny-deep")["config"]) == shipped


def test_run_specs_store_the_full_spec_and_key_overrides_by_it() -> None:
    spec = RunSpec.build(models=["qwen3-tiny", "zoo:ouro-tiny"], model_overrides={"qwen3-tiny": {"max_batch": 3}})
    assert spec.models == ("preset:qwen3-tiny", "zoo:ouro-tiny")
    assert spec.model_overrides == {"preset:qwen3-tiny": {"max_batch": 3}}


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--model", "ouro-tiny", "--tasks", "lookup", "--limit", "1"],
        ["profile", "ouro-tiny", "--lengths", "8"],
        ["estimate", "ouro-tiny", "--tokens", "8"],
        ["adapter", "check", "ouro-tiny"],
        ["zoo", "convert", "--teacher", "ouro-tiny", "--out", "melt-out", "--steps", "1"],
    ],
)
def test_every_command_refuses_a_shared_name_alike_before_any_work(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert all(line.startswith("job: ") and line.endswith("; planning") for line in out.splitlines()), out  # run's
    assert err == "loopeval: error: model name 'ouro-tiny' is ambiguous: give one of preset:ouro-tiny, zoo:ouro-tiny\n"
    assert list(tmp_path.iterdir()) == []  # no results/ folder, no database


def test_models_and_the_readme_describe_every_family_from_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    """Each family the engine loads from a checkpoint (every one but `custom`) has its KV strategy, checkpoints and
    the meaning of --loops in `FAMILY_GUIDE`; `loopeval models` prints it and the README shows it as its model table."""
    assert set(FAMILY_GUIDE) == set(FAMILIES) - {"custom"}
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, family in FAMILY_GUIDE.items():
        kv_strategy = {config.kv_strategy for config in PRESETS.values() if config.family == name}
        assert len(kv_strategy) == 1 and family.kv.startswith(f"`{kv_strategy.pop()}`")
        assert any(
            line.startswith(f"family {name}: ") and line.endswith(family.loops.replace("`", "")) for line in lines
        )
        assert family.checkpoints.startswith(f"`{name}:DIR`")  # the spec prefix that loads the family's folder
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "\n".join(family_table()) + "\n" in readme


def test_models_and_zoo_list_show_each_context(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    for name, config in PRESETS.items():
        assert any(
            line.startswith(f"preset:{name} ") and line.endswith(f"context {config.max_position}") for line in lines
        )
    for name in zoo_names():
        context = zoo_info(name)["config"]["max_position"]
        assert any(line.startswith(f"zoo:{name} ") and line.endswith(f"context {context}") for line in lines)
    assert lines[-1].endswith("give the prefix with ouro-tiny, melt-tiny.")
    assert main(["zoo", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {row["name"]: row["context"] for row in rows} == {
        name: zoo_info(name)["config"]["max_position"] for name in zoo_names()
    }


def test_env_command_is_the_bare_name_only_where_the_shell_finds_this_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv not activated: `loopeval` is not found
    script = env_command("loopeval")
    assert Path(script).name == "loopeval" and Path(script).is_absolute() and Path(script).exists()
    monkeypatch.setenv("PATH", f"{Path(script).parent}:/usr/bin:/bin")  # activated
    assert env_command("loopeval") == "loopeval" and env_command("python") == "python"


@pytest.mark.slow
def test_run_takes_a_bare_name_and_its_closing_hint_runs_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(
        "PATH", "/usr/bin:/bin"
    )  # as after `bash scripts/install.sh && .venv/bin/loopeval run`: no venv on PATH
    db = tmp_path / "r.sqlite"
    assert (
        main(
            [
                "run",
                "--model",
                "qwen3-tiny",
                "--tasks",
                "lookup",
                "--limit",
                "1",
                "--samples",
                "1",
                "--max-new-tokens",
                "1",
                "--no-report",
                "--db",
                str(db),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert sqlite3.connect(db).execute("SELECT model_spec, adapter FROM runs").fetchall() == [
        ("preset:qwen3-tiny", "preset")
    ]
    hint = out.split("(show them: ", 1)[1].split(")\n", 1)[0]
    wide = {**os.environ, "COLUMNS": "160"}  # on 80 columns the model column folds the name over two lines
    shown = subprocess.run(shlex.split(hint), capture_output=True, text=True, timeout=300, env=wide)
    assert shown.returncode == 0, shown.stderr
    assert "preset:qwen3-tiny" in shown.stdout
