"""The README is a user's page that points into docs/: its commands are the two the project promises, it stays short,
and every relative link of it and of docs/ (a file, and a heading where the link names one) resolves.

Sections moved out of the README into docs/ keep working as links only if their anchors match the headings GitHub
renders, so the anchors are checked against GitHub's rule for heading ids.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """The id GitHub gives a heading: lower case, punctuation dropped (hyphens and underscores kept), spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_the_anchor_rule_is_githubs() -> None:
    assert _anchor("Compute, repeated runs and the memory sampler") == "compute-repeated-runs-and-the-memory-sampler"
    assert _anchor("Scale out: sweep files, Ray and Postgres") == "scale-out-sweep-files-ray-and-postgres"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in _anchors(file)):
            broken.append(target)
    assert broken == [], f"{page.name}: links that lead nowhere"


def test_the_readme_is_a_short_page_that_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 400
    run, test = (
        "    bash scripts/install.sh && .venv/bin/loopeval run\n",
        "    bash scripts/install.sh --test && .venv/bin/python -m pytest\n",
    )
    assert run in text and test in text and text.index(test) < text.index("## What the main job runs and shows")
    assert text.index("## Add your model") < text.index("## Reading results"), "adding a model comes near the top"
    assert "![" in text and (ROOT / "docs" / "img" / "report.png").is_file()
