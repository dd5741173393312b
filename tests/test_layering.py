"""The import rules of docs/architecture.md ("Packages and import rules"), checked from the source.

Every `.py` file of the packages, bench/ and scripts/ is parsed with `ast`, and every import statement
counts, those inside functions and under `if TYPE_CHECKING:` included: a lazy import still ties one
package to another. What each package may import is read from the table in docs/architecture.md, so
the doc and this test cannot drift apart. The light-module rule is checked by importing the modules in a
fresh interpreter and looking at `sys.modules`, since that is what the GPU machine's Python sees.

Every failure names the file, the line and the rule it breaks.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("measures", "adapters", "training", "harness", "suites", "db", "analysis", "dashboards")
SCRIPT_FOLDERS = ("bench", "scripts")  # entry points: may import any package, public names only
FIRST_PARTY = set(PACKAGES) | set(SCRIPT_FOLDERS) | {"tests"}
STDLIB = set(sys.stdlib_module_names)


# What the GPU machine's Python lacks (it has torch, transformers, nvidia-ml-py and psutil), and the
# modules that must import none of it because that machine runs them.
HEAVY = ("lighteval", "datasets", "sqlalchemy", "alembic", "pandas", "plotly", "dash", "vllm")
LIGHT_MODULES = (
    *sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for folder in ("adapters", "training", "harness/measurement")
        for p in (ROOT / folder).rglob("*.py")
    ),
    "measures",
    "harness.cli.estimate",
    "harness.cli.profile",
)
LIGHT_SCRIPTS = (
    "bench/bench_engine.py",
    "bench/bench_exits.py",
    "bench/gpu_check.py",
    "bench/gpu_profile.py",
    "bench/pipeline_check.py",
)  # what bench/gpu_run.sh runs (pipeline_check.py: the standard library only)


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repo root
    line: int
    module: str  # absolute dotted module name
    names: tuple[str, ...]  # for `from module import a, b`; () for `import module`

    @property
    def top(self) -> str:
        return self.module.partition(".")[0]

    def __str__(self) -> str:
        return f"from {self.module} import {', '.join(self.names)}" if self.names else f"import {self.module}"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _imports(path: Path) -> list[Import]:
    rel = path.relative_to(ROOT).as_posix()
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=rel)):
        if isinstance(node, ast.Import):
            found += [Import(rel, node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:  # relative: resolve against the file's package
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, module] if module else base)
            found.append(Import(rel, node.lineno, module, tuple(alias.name for alias in node.names)))
    return found


def _files(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


ALL_IMPORTS = {folder: [i for p in _files(folder) for i in _imports(p)] for folder in PACKAGES + SCRIPT_FOLDERS}


@functools.cache
def _allowed_from_doc() -> dict[str, tuple[set[str], set[str] | None]]:
    """package -> (project packages it may import, third-party packages it may import or None for any).

    Read from the table in docs/architecture.md whose header starts `| package | holds | may import
    (project) | may import (third-party) |`: module names are the `backticked` lowercase words of the
    last two cells; a cell without any means "nothing" for the project column and, unless it starts with
    "nothing" (the standard library only), "any" for third-party.
    """
    rows: dict[str, tuple[set[str], set[str] | None]] = {}
    in_table = False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| package | holds | may import (project) | may import (third-party)"):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        if set(cells[0]) <= set("-: "):
            continue
        package = cells[0].strip("`/ ")
        names = [set(re.findall(r"`([a-z_][a-z0-9_]*)/?`", cell)) for cell in cells[2:4]]
        rows[package] = (names[0], names[1] or (set() if cells[3].startswith("nothing") else None))
    assert set(rows) >= set(PACKAGES), (
        f"{DOC.relative_to(ROOT)}: the import-rules table lacks rows for {set(PACKAGES) - set(rows)}"
    )
    return rows


def _report(violations: list[str], rule: str) -> None:
    if violations:
        pytest.fail(f"rule broken: {rule} (docs/architecture.md)\n" + "\n".join(violations), pytrace=False)


def test_sources_are_found() -> None:
    """Guards the other tests against passing on nothing."""
    assert len(_files(*PACKAGES)) > 40
    assert sum(len(v) for v in ALL_IMPORTS.values()) > 400


@pytest.mark.parametrize("package", PACKAGES)
def test_project_imports(package: str) -> None:
    allowed = _allowed_from_doc()[package][0] | {package}
    violations = [
        f"{i.file}:{i.line}: {i} (may import: {', '.join(sorted(allowed))})"
        for i in ALL_IMPORTS[package]
        if i.top in FIRST_PARTY and i.top not in allowed
    ]
    _report(violations, f"{package}/ imports only {', '.join(sorted(allowed))} among the project's packages")


@pytest.mark.parametrize("package", PACKAGES)
def test_third_party_imports(package: str) -> None:
    allowed = _allowed_from_doc()[package][1]
    if allowed is None:
        return
    violations = [
        f"{i.file}:{i.line}: {i} (may import: {', '.join(sorted(allowed)) or 'nothing'}, and the standard library)"
        for i in ALL_IMPORTS[package]
        if i.top not in FIRST_PARTY and i.top not in STDLIB and i.top not in allowed
    ]
    _report(violations, f"{package}/ imports only {', '.join(sorted(allowed))} outside the standard library")


def test_vllm_only_in_its_backend() -> None:
    violations = [
        f"{i.file}:{i.line}: {i}"
        for imports in ALL_IMPORTS.values()
        for i in imports
        if i.top == "vllm" and i.file != "adapters/vllm_backend.py"
    ]
    _report(violations, "vllm is imported in adapters/vllm_backend.py only")


def test_dashboards_and_analysis_take_sqlalchemy_engine_only() -> None:
    violations = [
        f"{i.file}:{i.line}: {i}"
        for i in ALL_IMPORTS["dashboards"] + ALL_IMPORTS["analysis"]
        if i.top == "sqlalchemy" and (i.module != "sqlalchemy" or set(i.names) - {"Engine"})
    ]
    _report(
        violations, "dashboards/ and analysis/ use sqlalchemy only for the `Engine` type; they read through db.queries"
    )


def _private_imports() -> list[tuple[Import, str]]:
    """(import, private name) for every import of a `_name` from another top-level folder of the project."""
    found = []
    for folder, imports in ALL_IMPORTS.items():
        for i in imports:
            if i.top not in FIRST_PARTY or i.top == folder:
                continue
            parts = i.module.split(".") + list(i.names)
            found += [(i, part) for part in parts if part.startswith("_") and not part.startswith("__")]
    return found


def test_no_private_names_across_packages() -> None:
    violations = [f"{i.file}:{i.line}: {i} (private name {name})" for i, name in _private_imports()]
    _report(violations, "no module imports a private name (_x) from another top-level package")


def test_cli_commands_import_no_other_command() -> None:
    violations = []
    for i in ALL_IMPORTS["harness"]:
        if not i.file.startswith("harness/cli/") or i.file == "harness/cli/__init__.py":
            continue  # __init__ is where every command is registered
        if i.module == "harness.cli":
            violations += [
                f"{i.file}:{i.line}: {i} (imports harness.cli.{name})" for name in i.names if name != "common"
            ]
        elif i.module.startswith("harness.cli.") and i.module != "harness.cli.common":
            violations.append(f"{i.file}:{i.line}: {i}")
    _report(violations, "a harness/cli/ command module imports harness.cli.common, never another command module")


def test_only_the_dashboard_command_imports_dashboards() -> None:
    """`loopeval results` and `run` read points through `analysis/`; only `loopeval dashboard` draws them."""
    violations = [
        f"{i.file}:{i.line}: {i}"
        for i in ALL_IMPORTS["harness"]
        if i.file.startswith("harness/cli/") and i.file != "harness/cli/dashboard.py" and i.top == "dashboards"
    ]
    _report(
        violations, "no module of harness/cli but dashboard.py imports dashboards; the others read through analysis/"
    )


_PROBE = r"""
import importlib, importlib.util, json, sys, traceback
root, heavy, modules, scripts = sys.argv[1], set(json.loads(sys.argv[2])), json.loads(sys.argv[3]), json.loads(sys.argv[4])
already = sorted(heavy & {name.partition(".")[0] for name in sys.modules})
culprits = {}

class Watch:
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in heavy and top not in culprits:
            chain = [f"{f.filename[len(root) + 1:]}:{f.lineno}" for f in traceback.extract_stack()[:-1]
                     if f.filename.startswith(root + "/")]
            culprits[top] = [current, chain]
        return None

sys.meta_path.insert(0, Watch())
for current in modules:
    importlib.import_module(current)
for current in scripts:
    spec = importlib.util.spec_from_file_location("probe_" + current.replace("/", "_")[:-3], f"{root}/{current}")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
loaded = sorted(heavy & {name.partition(".")[0] for name in sys.modules})
print(json.dumps({"already": already, "loaded": loaded, "culprits": culprits}))
"""


def test_light_modules_import_no_evaluation_stack() -> None:
    """The modules the GPU machine runs import none of HEAVY when they are imported."""
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            _PROBE,
            str(ROOT),
            json.dumps(HEAVY),
            json.dumps(LIGHT_MODULES),
            json.dumps(LIGHT_SCRIPTS),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout.strip().splitlines()[-1])
    assert not result["already"], f"the interpreter starts with {result['already']} imported; the probe cannot tell"
    violations = []
    for package in result["loaded"]:
        target, chain = result["culprits"].get(package, ["?", []])
        where = chain[-1] if chain else "(outside the project)"
        violations.append(f"{where}: imports {package} when {target} is imported; import chain: {' -> '.join(chain)}")
    _report(
        violations,
        "what the GPU machine runs (every adapters/ and harness/measurement/ module, harness.cli.estimate, "
        f"harness.cli.profile, the GPU scripts of bench/) imports none of {', '.join(HEAVY)} at module import time",
    )


# Settings with one home (docs/architecture.md, "Where a change goes"): a pattern that marks a second home,
# and the one file allowed to hold it.
ONE_HOME = {
    "the paper protocol's top-p": (re.compile(r"""top_p["']?\s*[=:]\s*0\.7\b"""), "adapters/base.py"),
    "PAPER_PROTOCOL's definition": (re.compile(r"^PAPER_PROTOCOL\b.*=", re.M), "adapters/base.py"),
    "sampling's rules": (re.compile(r"""["']?top_p["']?\s*:\s*\(\s*["']a number in"""), "adapters/base.py"),
    # the memory vocabulary (item 1 of issue 30): the analytic formula, the measure-name tuples, the GB constant
    "the analytic memory formula": (re.compile(r"latent_bytes_per_token\"?\]?\s*\*\s*min\("), "measures/__init__.py"),
    "a list of four or more measure names": (
        re.compile(
            r"""[(\[]\s*(?:{name}\s*,\s*){{3,}}{name}""".format(
                name=r"""["'](?:weights_bytes|kv_bytes_\w+|torch_\w+|nvml_\w+|rss\w*)["']"""
            )
        ),
        "measures/__init__.py",
    ),
    # the settings issue 46 gave one home: a second definition, or the literal it would be written with, anywhere else
    "the atomic file write (temporary file, then rename)": (
        re.compile(r"\bos\.(?:replace|rename)\(|\bmkstemp\("),
        "adapters/files.py",
    ),
    "LOOPEVAL_DB's name": (re.compile(r"""["']LOOPEVAL_DB["']|^DB_ENV\b[^=\n]*=""", re.M), "db/__init__.py"),
    "the sample browsers' columns": (
        re.compile(
            r"""^SAMPLE_COLUMNS\b[^=\n]*=|["']prompt_tokens["']\s*:\s*["']prompt """
            r"""tokens["']|["']prompt tokens["']\s*,\s*["']generated tokens["']""",
            re.M,
        ),
        "dashboards/data.py",
    ),
    "the selectable memory measures": (
        re.compile(r"^(?:MEMORY_MEASURES|WEIGHTS_PLUS_KV|ANALYTIC)\b[^=\n]*=", re.M),
        "measures/__init__.py",
    ),
    # issue 56 gave the engine's KV a room of its own: the policies' names are defined in one module
    "the KV policies' names": (
        re.compile(r"^(?:KV_POLICIES|POLICY_NAMES|SHARED_POLICIES|KV_DTYPES)\b[^=\n]*=", re.M),
        "adapters/engine/kv/policies.py",
    ),
    "a memory measure's label": (
        re.compile(
            r"""["'](?:(?:weights \+ )?KV cache peak|analytic weights \+ KV|NVML process """
            r"""peak|torch allocated peak|process RSS peak \(CPU\))["']\s*[,)}\]]"""
        ),
        "measures/__init__.py",
    ),
}
# The old homes issue 30 moved (the memory vocabulary, LightEval's bridge, the run-row and loops setters), gone: a
# module there again, or a name defined outside its one home (None: nowhere), is a second home.
OLD_HOMES = (
    "db/measures.py",
    # issue 46 split the harness by job: the LightEval bridge, measurement and conformance moved into sub-packages
    *(
        f"harness/{name}.py"
        for name in ("lighteval_model", "evaluation", "sampler", "profiling", "capacity", "conformance")
    ),
    # issue 46 split the engine by concern: serving, checkpoint I/O and training moved whole, with no shim left behind
    *(
        f"adapters/engine/{name}.py"
        for name in (
            "continuous",
            "scheduler",
            "block_manager",
            "model_runner",
            "sequence",
            "postprocess",
            "paged",
            "rows",
            "graphs",
            "checkpoint",
            "presets",
            "tokenizer",
            "huginn",
            "training",
            "objectives",
        )
    ),
    # issue 56: the engine's KV (names, layouts, byte format, caches) moved whole into adapters/engine/kv/
    *(f"adapters/engine/{name}.py" for name in ("cache", "kvformat", "families/sharing")),
    # and the harness by job: planning and execution moved whole
    *(f"harness/{name}.py" for name in ("spec", "sweep", "runner", "pool", "ray_executor", "recorder")),
)
OLD_NAMES = {
    "MEMORY_KEYS": "measures/__init__.py",
    "PEAK_OF_SERIES": None,
    "BYTE_UNITS": "measures/__init__.py",
    "create_run_row": None,
    "_at_loops": None,
    "at_loops": "harness/planning/spec.py",
    "run_row": "harness/execution/recorder.py",
}


def _sources() -> list[Path]:
    """The packages' and entry points' files, migrations left out: they are history, written with the names of their day."""
    return [p for p in _files(*PACKAGES, *SCRIPT_FOLDERS) if "migrations" not in p.parts]


@pytest.mark.parametrize("setting", ONE_HOME)
def test_a_setting_has_one_home(setting: str) -> None:
    pattern, home = ONE_HOME[setting]
    found = [p.relative_to(ROOT).as_posix() for p in _sources() if pattern.search(p.read_text(encoding="utf-8"))]
    assert found == [home], f"{setting} is written in {found}; its one home is {home}"


def test_byte_units_have_one_home() -> None:
    """`1e9` (or `1e6`, `1_000_000_000`) written as a number is a second home of `measures.GB` (`MB`); in text it is fine."""
    violations = []
    for p in _sources():
        if p.relative_to(ROOT).parts[0] == "measures":
            continue
        with p.open("rb") as source:
            violations += [
                f"{p.relative_to(ROOT)}:{t.start[0]}: {t.string}"
                for t in tokenize.tokenize(source.readline)
                if t.type == tokenize.NUMBER
                and t.string.replace("_", "").lower() in ("1e9", "1e6", "1000000000", "1e+9")
            ]
    _report(violations, "byte units are measures.GB / MB, never a bare 1e9 or 1e6")


def test_no_old_home_is_back() -> None:
    """`db/measures.py` and `adapters.base.MEMORY_KEYS` moved to `measures/`, the LightEval bridge into
    `harness/bridge/`, the sampler, profiling and capacity into `harness/measurement/`, the runner's and profiler's
    `_at_loops` into `harness.planning.spec.at_loops`, `create_run_row` and the commands' own run rows into
    `harness.execution.recorder.run_row`: nothing defines them elsewhere, and nothing imports them from their old homes."""
    assert not [old for old in OLD_HOMES if (ROOT / old).exists()]
    violations = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            targets = [
                t.id for t in getattr(node, "targets", [getattr(node, "target", None)]) if isinstance(t, ast.Name)
            ]
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                targets.append(node.name)
            violations += [
                f"{p.relative_to(ROOT)}:{node.lineno}: defines {name}"
                for name in targets
                if name in OLD_NAMES and p.relative_to(ROOT).as_posix() != OLD_NAMES[name]
            ]
    moved = (
        "db.measures",
        *(f"harness.{name}" for name in ("lighteval_model", "evaluation", "sampler", "profiling", "capacity")),
    )
    violations += [f"{i.file}:{i.line}: {i}" for imports in ALL_IMPORTS.values() for i in imports if i.module in moved]
    _report(violations, "what issue 30 moved has one home (docs/architecture.md, Packages and import rules)")
