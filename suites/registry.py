"""Which suites exist, what tasks they hold, and how to load them as LightEval task configs.

Listing is cheap (no lighteval import); `load_suite` imports lighteval through the suite modules.
A task name is either a task (`chain3`, `mmlu_redux:anatomy`) or a group, the part before ":"
(`mmlu_redux` selects all of its subjects), as in LightEval.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from suites import SuiteError, paper, synthetic

if TYPE_CHECKING:
    from lighteval.tasks.lighteval_task import LightevalTaskConfig

_DESCRIPTIONS: dict[str, str] = {
    "synthetic": "bundled, 200 test items a task: variable chains (no depth needed) and cellular automata (depth)",
    "paper": "AIME24/25/26, AMC23, MATH-500, OlympiadBench, GPQA-Diamond, MMLU-Redux, HumanEval, HLE (local copies via --data-dir)",
}
_MODULES = {"synthetic": synthetic, "paper": paper}


def list_suites() -> dict[str, str]:
    """Suite name -> one line: what it is, the tasks a run without --tasks evaluates, and the others it takes by name.

    The task lists come from the suite modules, so they are what `loopeval run` does."""
    lines = {}
    for name, module in _MODULES.items():
        others = [task for task in module.TASKS if task not in module.DEFAULT_TASKS]
        lines[name] = f"{_DESCRIPTIONS[name]}; default tasks: {', '.join(module.DEFAULT_TASKS)}" + (
            f"; also by name: {', '.join(others)}" if others else ""
        )
    return lines


def _check_suite(name: str) -> None:
    if name not in _MODULES:
        raise SuiteError(f"unknown suite {name!r} (suites: {', '.join(_MODULES)})")


def suite_tasks(name: str) -> list[str]:
    """The selectable task names of a suite (groups such as `mmlu_redux` stand for their subtasks)."""
    _check_suite(name)
    return list(_MODULES[name].TASKS)


def _select(name: str, tasks: list[str] | None) -> set[str]:
    """The config names `tasks` select (else the suite's DEFAULT_TASKS), checked against the suite's
    `CONFIG_NAMES` before lighteval is imported, so a mistyped task fails at once."""
    tasks = list(_MODULES[name].DEFAULT_TASKS) if tasks is None else tasks
    chosen: set[str] = set()
    for task in tasks:
        matches = {c for c in _MODULES[name].CONFIG_NAMES if c == task or c.split(":")[0] == task}
        if not matches:
            raise SuiteError(f"unknown task {task!r} in suite {name!r} (tasks: {', '.join(suite_tasks(name))})")
        chosen |= matches
    return chosen


def local_candidates(config: LightevalTaskConfig, data_dir: Path) -> list[Path]:
    """The files that may hold a task's data in `data_dir`: `<task>.jsonl` or `<task>.parquet`, ":" as "/"."""
    stem = config.name.replace(":", "/")
    return [data_dir / f"{stem}.jsonl", data_dir / f"{stem}.parquet"]


def _localize(config: LightevalTaskConfig, data_dir: Path, columns: dict[str, str]) -> LightevalTaskConfig:
    """Point a task at its local copy after checking its `columns`, or say exactly what to fix (one line)."""
    from suites.loader import CoercedPrompt, check_rows

    candidates = local_candidates(config, data_dir)
    found = next((path for path in candidates if path.is_file()), None)
    split = config.evaluation_splits[0]
    if found is None:
        raise SuiteError(
            f"task {config.name}: no local copy of {config.hf_repo} (subset {config.hf_subset}, split {split}); "
            f"looked for {candidates[0]} and {candidates[1]}; save that split there, e.g. "
            f"datasets.load_dataset({config.hf_repo!r}, {config.hf_subset!r}, split={split!r}).to_json({str(candidates[0])!r})"
        )
    check_rows(config, found, columns, f"the {split!r} split of {config.hf_repo} (subset {config.hf_subset})")
    return dataclasses.replace(
        config, hf_repo=str(found), prompt_function=CoercedPrompt(config.prompt_function, columns)
    )


def load_suite(name: str, *, tasks: list[str] | None = None, data_dir: Path | None = None) -> list[LightevalTaskConfig]:
    """The suite's LightEval task configs (`tasks`, else its DEFAULT_TASKS), reading local copies from `data_dir`.

    Their pass@k metrics count one sample; the run sets its n with `suites.loader.with_samples`.

    Every returned config's `hf_repo` is a local JSONL or parquet file (see `suites.loader`): the
    synthetic suite reads its bundled test split unless `data_dir` holds `<task>.jsonl`/`.parquet`;
    the paper suite needs `data_dir`, since nothing is downloaded at run time.
    """
    _check_suite(name)
    chosen = _select(name, tasks)
    configs = [c for c in _MODULES[name].task_configs() if c.name in chosen]
    if data_dir is not None:
        data_dir = Path(data_dir)
        if not data_dir.is_dir():
            raise SuiteError(f"data directory {data_dir} does not exist")
        columns = _MODULES[name].COLUMNS
        configs = [_localize(c, data_dir, columns[c.name.split(":")[0]]) for c in configs]
    elif name == "paper":
        first = configs[0]
        raise SuiteError(
            f"the paper suite reads local copies of its datasets: pass --data-dir DIR holding one file per task "
            f"(e.g. {local_candidates(first, Path('DIR'))[0]} with the {first.evaluation_splits[0]!r} split of "
            f"{first.hf_repo}); nothing is downloaded at run time"
        )
    for task in dict.fromkeys(c.name.split(":")[0] for c in configs):
        getattr(_MODULES[name], "PREFLIGHT", {}).get(task, lambda: None)()
    return configs


def data_fingerprint(configs: list[LightevalTaskConfig]) -> str:
    """sha256 over each task's name and the bytes of the file it reads: two runs with the same
    fingerprint evaluated the same items (an edited or re-downloaded copy changes it)."""
    digest = hashlib.sha256()
    for config in sorted(configs, key=lambda c: c.name):
        digest.update(config.name.encode() + b"\0")
        path = Path(config.hf_repo)
        digest.update(path.read_bytes() if path.is_file() else config.hf_repo.encode())
        digest.update(b"\0")
    return digest.hexdigest()
