"""The engine stays readable in one sitting: no class in `adapters/engine/` over `MAX_CLASS_LINES` lines.

A class that outgrows this is doing more than one job (the scheduler once held the policy, the model
runner and post-processing in 270 lines); split it along its jobs instead of raising the limit.
"""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[3] / "adapters" / "engine"
MAX_CLASS_LINES = 150


def class_lengths(path: Path) -> dict[str, int]:
    """Each class of `path` (nested ones too) -> its lines, decorators left out: end_lineno - lineno + 1."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.name: node.end_lineno - node.lineno + 1 for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def test_no_engine_class_is_over_the_limit() -> None:
    lengths = {
        f"{path.relative_to(ENGINE)}:{name}": lines
        for path in sorted(ENGINE.rglob("*.py"))
        for name, lines in class_lengths(path).items()
    }
    assert len(lengths) > 20  # the engine's classes were found
    over = {name: lines for name, lines in lengths.items() if lines > MAX_CLASS_LINES}
    assert not over, f"classes over {MAX_CLASS_LINES} lines (split them along their jobs): {over}"


def test_the_count_is_the_class_statement_to_its_last_line(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "import os\n\n\n@decorated\nclass A:\n    x = 1\n\n    def f(self):\n        return 2\n\n\nclass B:\n    pass\n"
    )
    assert class_lengths(source) == {"A": 5, "B": 2}
