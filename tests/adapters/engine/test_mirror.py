"""Every module of `adapters/engine/` has a unit-test file of its own, at the mirrored path.

`adapters/engine/serving/scheduler.py` is tested by `tests/adapters/engine/serving/test_scheduler.py`, and a
package's `__init__.py` that holds code by `test_<package>.py` in the package's test folder
(`families/__init__.py`: `families/test_families.py`). A new module without its file fails here, so the
tests keep mirroring the code as it grows.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
ENGINE = ROOT / "adapters" / "engine"
TESTS = Path(__file__).resolve().parent


def mirror_of(module: Path) -> Path:
    """The test file that `module` (a path under `adapters/engine/`) must have."""
    relative = module.relative_to(ENGINE)
    name = relative.parent.name if module.name == "__init__.py" else module.stem
    return TESTS / relative.parent / f"test_{name}.py"


def has_code(module: Path) -> bool:
    """Whether a module holds more than a docstring and imports (an empty `__init__.py` needs no test)."""
    lines = [line for line in module.read_text(encoding="utf-8").splitlines() if line.strip()]
    return any(
        line.startswith(("def ", "class ", "@")) or "=" in line.split("#")[0]
        for line in lines
        if not line.startswith((" ", '"', "from ", "import "))
    )


def test_every_engine_module_has_a_test_file_of_its_own() -> None:
    modules = [m for m in sorted(ENGINE.rglob("*.py")) if m.name != "__init__.py" or has_code(m)]
    assert len(modules) > 30  # the engine's modules were found
    missing = [
        f"{m.relative_to(ROOT)} -> {mirror_of(m).relative_to(ROOT)}" for m in modules if not mirror_of(m).is_file()
    ]
    assert not missing, "engine modules without a test file of their own:\n" + "\n".join(missing)


def test_the_mirrored_path_of_a_module_and_of_a_package() -> None:
    assert mirror_of(ENGINE / "serving" / "scheduler.py") == TESTS / "serving" / "test_scheduler.py"
    assert mirror_of(ENGINE / "families" / "__init__.py") == TESTS / "families" / "test_families.py"
    assert mirror_of(ENGINE / "model.py") == TESTS / "test_model.py"
    assert has_code(ENGINE / "families" / "__init__.py") and not has_code(ENGINE / "serving" / "__init__.py")
