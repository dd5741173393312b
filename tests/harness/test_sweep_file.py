"""Sweep files (`loopeval run --config sweep.toml`): the same RunSpec as the flags, per-model overrides, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import main
from harness.errors import UserError
from harness.planning.plan import prepare_sweep
from harness.planning.defaults import EXITS, LAB, LEVERS
from harness.planning.spec import RunSpec
from harness.planning.sweep import build_request

SWEEP = """\
models = ["preset:qwen3-tiny", {spec = "preset:ouro-tiny", overrides = {max_batch = 3}}]
suite = "synthetic"
tasks = ["lookup", "addition"]
loops = [2, 1]
samples = 2
temperature = 0.5
top_p = 0.9
max_new_tokens = 4
limit = 3
batch_size = 2
seeds = [0, 5]
"""
FLAGS = [
    "--model",
    "preset:qwen3-tiny",
    "--model",
    "preset:ouro-tiny",
    "--tasks",
    "lookup,addition",
    "--loops",
    "2,1",
    "--samples",
    "2",
    "--temperature",
    "0.5",
    "--top-p",
    "0.9",
    "--max-new-tokens",
    "4",
    "--limit",
    "3",
    "--batch-size",
    "2",
]


def sweep_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sweep.toml"
    path.write_text(text)
    return str(path)


def flags(**given: object) -> dict[str, object]:
    """build_request's flags as `loopeval run` passes them: None where an option was not given."""
    names = (
        "models",
        "suite",
        "tasks",
        "loops",
        "samples",
        "temperature",
        "top_p",
        "max_new_tokens",
        "limit",
        "batch_size",
        "seeds",
        "db_url",
        "data_dir",
        "trust_remote_code",
        "executor",
        "ray_address",
        "gpus_per_run",
    )
    return {name: given.get(name) for name in names}


def test_the_file_and_the_flags_build_the_same_runspecs(tmp_path: Path) -> None:
    from_file = build_request(flags(), sweep_file(tmp_path, SWEEP))
    from_flags = build_request(
        flags(
            models=["preset:qwen3-tiny", "preset:ouro-tiny"],
            tasks=["lookup", "addition"],
            loops=[2, 1],
            samples=2,
            temperature=0.5,
            top_p=0.9,
            max_new_tokens=4,
            limit=3,
            batch_size=2,
            seeds=[0, 5],
        )
    )
    assert [s.seed for s in from_file.specs] == [0, 5] and from_file.executor == "local"
    for file_spec, flag_spec in zip(from_file.specs, from_flags.specs, strict=True):
        assert file_spec.model_overrides == {"preset:ouro-tiny": {"max_batch": 3}}
        assert file_spec == RunSpec(**{**vars(flag_spec), "model_overrides": {"preset:ouro-tiny": {"max_batch": 3}}})
    # without the overrides the file and the flags are the same RunSpec, field for field
    plain = SWEEP.replace('{spec = "preset:ouro-tiny", overrides = {max_batch = 3}}', '"preset:ouro-tiny"')
    assert build_request(flags(), sweep_file(tmp_path, plain)).specs == from_flags.specs


def test_the_default_benchmark_runs_the_lab_sweep_first_the_exit_and_lever_sweeps_last_and_any_choice_of_what_runs_drops_them(
    tmp_path: Path,
) -> None:
    db = f"sqlite:///{tmp_path / 'r.sqlite'}"
    lab, headline, exits, shared, quantized, trained = build_request(
        flags(db_url=db, batch_size=8)
    ).specs  # where and how fast: still the default
    assert headline == RunSpec.build(db_url=db, batch_size=8)
    assert (exits.models, exits.loops, exits.exit_thresholds) == (EXITS.models, (4,), (0.5, 0.7, 0.9))
    assert (shared.models, shared.loops, shared.kv_policies, shared.kv_dtypes) == (
        LEVERS.shared,
        (4,),
        LEVERS.policies,
        ("auto", "int8"),
    )
    assert (quantized.models, quantized.kv_policies, quantized.kv_dtypes) == (LEVERS.quantized, (), ("int8",))
    assert (trained.models, trained.loops, trained.kv_policies, trained.kv_dtypes) == (
        ("zoo:melt-tiny-last",),
        (4,),
        (),
        (),
    )
    for joined in (exits, shared, quantized, trained):  # in the headline's set
        assert (joined.suite, joined.sampling, joined.limit, joined.tasks) == (
            headline.suite,
            headline.sampling,
            headline.limit,
            headline.tasks,
        )
    assert lab.models == LAB.models and lab.loops == tuple(range(1, 13)) and lab.limit == 20 and lab.db_url == db
    assert (lab.sampling.temperature, lab.sampling.n, lab.batch_size) == (0.0, 1, 8)
    for choice in ({"limit": 5}, {"models": ["zoo:ouro-tiny"]}, {"loops": [4]}, {"seeds": [0]}, {"temperature": 1.0}):
        (only,) = build_request(flags(**choice)).specs
        assert only.models != LAB.models and not only.exit_thresholds and not only.kv_dtypes
    (only,) = build_request(flags(), sweep_file(tmp_path, SWEEP.replace("seeds = [0, 5]", ""))).specs
    assert only.limit == 3


def test_a_flag_beside_the_file_overrides_its_key(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, SWEEP)
    (spec,) = build_request(flags(limit=1, seeds=[9]), path).specs
    assert spec.limit == 1 and spec.seed == 9 and spec.batch_size == 2
    (spec,) = build_request(flags(models=["preset:qwen3-tiny"], seeds=[0]), path).specs
    assert spec.models == ("preset:qwen3-tiny",) and spec.model_overrides == {}  # --model replaces the file's models


def test_per_model_overrides_reach_the_adapter_and_come_back_on_resume() -> None:
    spec = RunSpec.build(
        models=["preset:ouro-tiny", "preset:qwen3-tiny"],
        tasks=["lookup"],
        seed=4,
        model_overrides={"preset:ouro-tiny": {"max_batch": 3, "exit_policy": "none"}},
    )
    assert spec.load_overrides("preset:ouro-tiny") == {"seed": 4, "max_batch": 3, "exit_policy": "none"}
    assert spec.load_overrides("preset:qwen3-tiny") == {"seed": 4}
    stored = json.loads(json.dumps(spec.to_dict()))  # as runs.spec holds it
    sampling = json.loads(json.dumps(dataclasses.asdict(spec.sampling)))  # as runs.sampling holds it
    assert RunSpec.from_dict(stored, sampling, None) == spec
    older = {
        key: value for key, value in stored.items() if key != "model_overrides"
    }  # a run stored before overrides existed
    assert RunSpec.from_dict(older, sampling, None).model_overrides == {}
    with pytest.raises(UserError, match="not one of the sweep's models"):
        RunSpec.build(models=["preset:qwen3-tiny"], model_overrides={"preset:ouro-tiny": {"max_batch": 3}})
    with pytest.raises(Exception, match="unknown override.*bogus"):
        prepare_sweep(
            RunSpec.build(
                models=["preset:ouro-tiny"], tasks=["lookup"], model_overrides={"preset:ouro-tiny": {"bogus": 1}}
            )
        )


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("limt = 3", "unknown key 'limt'"),
        ("limit = 0", "limit must be a positive integer, got 0"),
        ("loops = '1,two'", "loops must be comma-separated positive integers or ranges such as 1-12, got '1,two'"),
        ("loops = 4", "loops must be a non-empty list of positive integers"),
        ("loops = [1, 0]", "loops must be a non-empty list of positive integers"),
        ("samples = 1.5", "samples must be an integer from 1 to 1024, got 1.5"),
        ("top_p = 1.5", "top_p must be a number in (0, 1]"),
        ("temperature = -1", "temperature must be a finite number >= 0"),
        ("suite = 'nosuch'", "suite must be one of synthetic, paper"),
        ("tasks = []", "tasks must be a non-empty list of strings"),
        ("seed = 1\nseeds = [2]", "give seed or seeds, not both"),
        ("seeds = [-1]", "seeds must be a non-empty list of non-negative integers"),
        ("trust_remote_code = 'yes'", "trust_remote_code must be true or false"),
        ("data_dir = '/no/such/dir'", "data_dir: /no/such/dir is not a directory"),
        ("executor = 'slurm'", "executor must be local or ray"),
        ("gpus_per_run = 1", "gpus_per_run in a sweep file) applies only to --executor ray"),
        ("models = 'preset:ouro-tiny'", "models must be a non-empty list"),
        ("models = ['preset:ouro-tiny', 'preset:ouro-tiny']", "models[1]: preset:ouro-tiny is listed twice"),
        ("models = [{name = 'preset:ouro-tiny'}]", "models[0]: unknown key 'name'"),
        ("models = [{overrides = {max_batch = 2}}]", "models[0].spec must be a non-empty string"),
        (
            "models = [{spec = 'preset:ouro-tiny', overrides = {loops = 2}}]",
            "models[0].overrides.loops: loops is set for the whole sweep",
        ),
        (
            "models = [{spec = 'preset:ouro-tiny', overrides = {max_batch = [1]}}]",
            "models[0].overrides.max_batch must be a string, finite number or boolean",
        ),
        ("models = [{spec = 'preset:ouro-tiny', overrides = {bogus = 1}}]", "unknown override(s) bogus"),
        ("models = ['preset:nosuch']", "unknown preset 'nosuch'"),
        ("tasks = ['nosuch']", "unknown task 'nosuch'"),
        ("limit = ", "not valid TOML"),
    ],
)
def test_an_invalid_file_is_one_line_naming_the_key(
    text: str, fragment: str, tmp_path: Path, stored_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = stored_db.read_bytes()
    path = sweep_file(tmp_path, text)
    assert main(["run", "--config", path, "--db", str(stored_db), "--no-report"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopeval: error:"), lines
    assert fragment in lines[0], lines[0]
    assert stored_db.read_bytes() == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--config", "/no/such/sweep.toml"], "--config /no/such/sweep.toml: no such file"),
        (["--gpus-per-run", "1"], "--gpus-per-run (gpus_per_run in a sweep file) applies only to --executor ray"),
        (
            ["--ray-address", "127.0.0.1:1"],
            "--ray-address (ray_address in a sweep file) applies only to --executor ray",
        ),
        (["--executor", "slurm"], "--executor must be local or ray"),
        (["--executor", "ray", "--gpus-per-run", "-1"], "--gpus-per-run must be a finite number >= 0"),
        (["--seed", "-1"], "--seed must be comma-separated integers >= 0"),
    ],
)
def test_bad_executor_and_config_options(
    args: list[str], fragment: str, stored_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        main(["run", "--model", "preset:qwen3-tiny", "--tasks", "lookup", *args, "--db", str(stored_db), "--no-report"])
        == 2
    )
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("loopeval: error:") and fragment in lines[0], lines


@pytest.mark.slow  # a fresh interpreter plans the sweep (LightEval's import) before it fails
def test_executor_ray_without_ray_installed_says_how_to_install(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"  # Ray unimportable, as in the main job's install
        "from harness.cli import main\n"
        f"sys.exit(main(['run', '--executor', 'ray', '--model', 'preset:qwen3-tiny', '--tasks', 'lookup', '--db', {str(tmp_path / 'r.sqlite')!r}]))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert (
        result.returncode == 2
        and result.stderr.strip() == "loopeval: error: --executor ray needs Ray: pip install 'loopeval[ray]'"
    )
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.slow  # a fresh interpreter plans the sweep (LightEval's import) before it fails
def test_a_ray_address_nothing_listens_on_is_one_line_at_once(tmp_path: Path) -> None:
    """Ray itself would retry it for minutes; a fresh interpreter, so no Ray connection of this session is reused.
    The address is checked before the sweep is planned, which would import LightEval (seconds) first."""
    check = "import sys; from harness.cli import main; rc = main(sys.argv[1:]); assert 'lighteval' not in sys.modules; sys.exit(rc)"
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            check,
            "run",
            "--executor",
            "ray",
            "--ray-address",
            "127.0.0.1:1",
            "--model",
            "preset:qwen3-tiny",
            "--tasks",
            "lookup",
            "--db",
            str(tmp_path / "r.sqlite"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        "loopeval: error: cannot connect to Ray at 127.0.0.1:1: Connection refused"
    ]
    assert not (tmp_path / "r.sqlite").exists()


@pytest.mark.slow
def test_a_run_from_the_file_stores_the_spec_the_flags_store_and_never_imports_ray(tmp_path: Path) -> None:
    """Real runs, in a fresh interpreter each: the local executor must work where Ray is not installed."""
    plain = SWEEP.replace('{spec = "preset:ouro-tiny", overrides = {max_batch = 3}}', '"preset:ouro-tiny"').replace(
        "seeds = [0, 5]", "seed = 5"
    )
    path = sweep_file(tmp_path, plain)
    check = "import sys; from harness.cli import main; rc = main(sys.argv[1:]); assert 'ray' not in sys.modules; sys.exit(rc)"
    for name, args in (("file", ["--config", path]), ("flags", [*FLAGS, "--seed", "5"])):
        result = subprocess.run(
            [sys.executable, "-c", check, "run", *args, "--db", str(tmp_path / f"{name}.sqlite"), "--no-report"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert result.returncode == 0, result.stdout + result.stderr
    specs = {}
    for name in ("file", "flags"):
        conn = sqlite3.connect(tmp_path / f"{name}.sqlite")
        specs[name] = [
            (model, loops, json.loads(spec))
            for model, loops, spec in conn.execute("SELECT model_spec, loops, spec FROM runs ORDER BY id")
        ]
        conn.close()
    assert specs["file"] == specs["flags"] and len(specs["file"]) == 3
