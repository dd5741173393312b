"""Suite listing and loading, the project-only LightEval registry, and the samples knob."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from suites import SuiteError
from suites.registry import list_suites, load_suite, suite_tasks

REPO = Path(__file__).resolve().parents[2]


def test_list_and_tasks_without_importing_lighteval():
    code = (
        "import sys; from suites.registry import list_suites, suite_tasks;"
        "print(sorted(list_suites()), suite_tasks('synthetic'));"
        "print('lighteval' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == [
        "['paper', 'synthetic'] ['addition', 'chain2', 'chain3', 'chain4', 'lookup', 'r30k3', 'r30k4', 'r30k5', 'r30k6', 'r30k8', 'r110k4', 'c30k2', 'c30k4', 'c30k6', 'c30k8', 'c150k2', 'c150k3', 'c150k5', 'c150k7']",
        "False",
    ]
    assert all(list_suites().values())
    assert "mmlu_redux" in suite_tasks("paper")


def test_loopeval_suites_names_the_default_tasks_a_run_evaluates(capsys: pytest.CaptureFixture[str]) -> None:
    """The listing says which tasks `loopeval run` evaluates without --tasks: for synthetic the chains and the
    automata the zoo trained on, with addition and lookup (out of the default mix, as docs/reference.md says) by name only."""
    from harness.cli import main
    from suites import synthetic

    assert main(["suites"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("synthetic  "))
    defaults = line.split("default tasks: ")[1].split(";")[0].split(", ")
    assert defaults == list(synthetic.DEFAULT_TASKS) == [t.name for t in load_suite("synthetic")]
    assert "addition" not in defaults and "lookup" not in defaults
    assert {"addition", "lookup"} <= set(line.split("also by name: ")[1].split(", "))


def test_unknown_suite_and_task_name_the_valid_ones():
    with pytest.raises(SuiteError, match=r"unknown suite 'bogus' \(suites: synthetic, paper\)"):
        load_suite("bogus")
    with pytest.raises(SuiteError, match=r"unknown suite 'bogus'"):
        suite_tasks("bogus")
    with pytest.raises(
        SuiteError,
        match=r"unknown task 'chain9' in suite 'synthetic' \(tasks: addition, chain2, chain3, chain4, lookup, r30k3, ",
    ):
        load_suite("synthetic", tasks=["chain2", "chain9"])


def test_a_mistyped_task_fails_before_lighteval_is_imported():
    """`loopeval run --tasks` with a typo answers at once: the LightEval import alone takes seconds."""
    code = (
        "import sys; from harness.cli import main;"
        "rc = main(['run', '--model', 'zoo:ouro-tiny', '--tasks', 'chain2,chian3', '--db', 'sqlite://']);"
        "print(rc, 'lighteval' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "2 False", done.stderr
    assert done.stderr.startswith(
        "loopeval: error: unknown task 'chian3' in suite 'synthetic' (tasks: addition, chain2, "
    )


@pytest.mark.parametrize("suite", ["synthetic", "paper"])
def test_the_names_checked_before_loading_are_the_configs_names(suite: str) -> None:
    from suites.registry import _MODULES

    module = _MODULES[suite]
    assert list(module.CONFIG_NAMES) == [config.name for config in module.task_configs()]


def test_every_suite_has_its_sampling_and_paper_runs_the_paper_protocol():
    from adapters.base import PAPER_PROTOCOL, Sampling
    from harness.planning.defaults import SUITE_SAMPLING
    from harness.planning.spec import RunSpec

    assert set(SUITE_SAMPLING) == set(list_suites())
    assert PAPER_PROTOCOL == Sampling(temperature=1.0, top_p=0.7, max_new_tokens=32768, n=4)
    spec = RunSpec.build(suite="paper")
    assert (spec.sampling.temperature, spec.sampling.top_p, spec.sampling.max_new_tokens, spec.sampling.n) == (
        1.0,
        0.7,
        32768,
        4,
    )


def test_synthetic_configs_read_the_bundled_test_split():
    configs = load_suite("synthetic", tasks=["lookup", "chain2"])
    assert [c.name for c in configs] == ["chain2", "lookup"]  # suite order
    for config in configs:
        assert Path(config.hf_repo) == REPO / "suites" / "data" / "synthetic" / f"{config.name}.test.jsonl"
        assert (
            list(config.stop_sequence) == ["\n"] and config.generation_size == 8
        )  # chain2, lookup: answers of at most 4 characters
        assert [m.metric_name for m in config.metrics] == ["pass@k:k=1&n=1"]


def test_synthetic_runs_its_default_tasks_unless_others_are_named():
    assert [c.name for c in load_suite("synthetic")] == [
        "chain2",
        "chain3",
        "chain4",
        "c30k2",
        "c30k4",
        "c30k6",
        "c30k8",
    ]
    assert [c.name for c in load_suite("synthetic", tasks=["r110k4", "r30k5"])] == ["r30k5", "r110k4"]
    from suites import paper
    from suites.registry import _select

    assert _select("paper", None) == {c.name for c in paper.task_configs()}  # paper's default is all of it


def test_synthetic_reads_a_data_dir_copy(tmp_path: Path):
    (tmp_path / "lookup.jsonl").write_text('{"prompt":"a=1;a=?","answer":"1"}\n')
    (config,) = load_suite("synthetic", tasks=["lookup"], data_dir=tmp_path)
    assert config.hf_repo == str(tmp_path / "lookup.jsonl")
    with pytest.raises(
        SuiteError,
        match=r"task addition: no local copy of .*addition\.test\.jsonl.*looked for .*addition\.jsonl and .*addition\.parquet",
    ):
        load_suite("synthetic", tasks=["addition"], data_dir=tmp_path)
    with pytest.raises(SuiteError, match="data directory .*nowhere does not exist"):
        load_suite("synthetic", data_dir=tmp_path / "nowhere")


def test_project_registry_holds_only_our_tasks_and_reads_local_files():
    from suites.loader import ProjectRegistry, load_task_dataset

    configs = load_suite("synthetic")
    registry = ProjectRegistry(configs)
    tasks = registry.load_tasks()
    assert sorted(tasks) == ["c30k2|0", "c30k4|0", "c30k6|0", "c30k8|0", "chain2|0", "chain3|0", "chain4|0"]
    task = tasks["chain4|0"]
    task.dataset = load_task_dataset(task.config)
    docs = task.get_docs(max_samples=3)
    assert len(docs) == 3 and all(d.query.endswith("=?") and d.choices[0].isdigit() for d in docs)
    # LightEval's default registry would have imported its built-in task modules (one downloads at import)
    assert "lighteval.tasks.tasks.tiny_benchmarks" not in sys.modules
    with pytest.raises(SuiteError, match="repeated: c30k8"):
        ProjectRegistry(configs + [configs[-1]])


def test_load_task_dataset_errors(tmp_path: Path):
    import dataclasses

    from suites.loader import load_task_dataset

    (config,) = load_suite("synthetic", tasks=["lookup"])
    with pytest.raises(SuiteError, match="reads org/name, which is not a local JSONL or parquet file.*--data-dir"):
        load_task_dataset(dataclasses.replace(config, hf_repo="org/name"))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(SuiteError, match="holds no rows"):
        load_task_dataset(dataclasses.replace(config, hf_repo=str(tmp_path / "empty.jsonl")))
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(SuiteError, match="cannot read .*bad.jsonl"):
        load_task_dataset(dataclasses.replace(config, hf_repo=str(tmp_path / "bad.jsonl")))


def test_with_samples_sets_pass_at_k_n_and_leaves_the_input_alone():
    from suites.loader import with_samples

    configs = load_suite("synthetic", tasks=["addition"])
    (changed,) = with_samples(configs, 5)
    (metric,) = changed.metrics
    assert metric.metric_name == "pass@k:k=1&n=5" and metric.sample_level_fn.n == 5
    assert configs[0].metrics[0].sample_level_fn.n == 1 and configs[0].metrics[0].metric_name == "pass@k:k=1&n=1"
