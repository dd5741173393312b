"""The README quotes the answer sentence of the job its pictures show, so a newcomer never sees two winners.

scripts/screenshots.py writes docs/img/answer.txt (the sentence the report opens on, `analysis.answer` on the same
database) beside report.png and app.png in one go; this test compares the README's quoted sentence with it. Cheap by
choice: it reads two files, where recomputing the sentence would need the main job's 95-run database.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWER = ROOT / "docs" / "img" / "answer.txt"


def test_the_readme_quotes_the_answer_its_screenshots_show() -> None:
    sentence = ANSWER.read_text(encoding="utf-8").strip()
    assert sentence.startswith("Best by ") and "\n" not in sentence, "one sentence, as analysis.answer writes it"
    quoted = re.findall(r"^\s*> (Best by .*)$", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.M)
    assert quoted == [sentence], "README.md's answer differs from the job's: rerun scripts/screenshots.py, quote it"
