"""Ctrl-C on a real `loopeval run` of the tiny zoo, its output going to a pipe as to a log file: a terminal's Ctrl-C
(SIGINT to the whole process group: the command and its worker processes) part-way, during start-up and while it
plans. The job ends with one honest line, how many of its runs finished and one command that continues them all,
and the lines before it count the finished runs up ("k/N", the job's time so far) in the order they are written."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.sqlite import query

pytestmark = pytest.mark.slow
LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
# 9 runs (qwen3 once, melt and ouro at 4 loop counts), small enough to start in seconds, long enough to stop part-way
JOB = [
    "run",
    *("--model", "zoo:qwen3-tiny-small", "--model", "zoo:melt-tiny", "--model", "zoo:ouro-tiny"),
    *("--loops", "1,2,4,8", "--tasks", "lookup,chain2", "--limit", "4", "--samples", "1", "--no-report"),
]
RUNS = 9
END = re.compile(
    r"(\d+) of (\d+) runs finished, (\d+) interrupted; continue with: \S*loopeval run --resume (\d+) --db (\S+)"
)


def _interrupt_after(db: Path, wanted: re.Pattern[str]) -> tuple[list[str], str]:
    """Start the job, send the terminal's SIGINT once a line matches `wanted`; its stdout lines and stderr."""
    proc = subprocess.Popen(
        [LOOPEVAL, *JOB, "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        # a pytest started in the background (`cmd &`) hands children SIGINT ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line.rstrip("\n"))
        if wanted.search(line):
            os.killpg(proc.pid, signal.SIGINT)
            break
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (lines, rest, err)
    assert "Traceback" not in err, err
    return lines + rest.splitlines(), err


def _one_hint(lines: list[str], err: str, db: Path) -> tuple[int, int]:
    """The end line (the last) agrees with the store and is the only resume hint; (finished, resume id)."""
    assert sum(text.count("--resume") for text in [*lines, err]) == 1, (lines, err)
    end = END.fullmatch(lines[-1])
    assert end, lines
    finished, total, interrupted, resume_id = (int(end.group(k)) for k in (1, 2, 3, 4))
    assert end.group(5) == str(db) and total == RUNS and finished + interrupted == RUNS
    statuses = dict(query(db, "SELECT id, status FROM runs"))
    assert sorted(statuses.values()) == sorted(["finished"] * finished + ["interrupted"] * interrupted)
    assert statuses[resume_id] == "interrupted"
    return finished, resume_id


def test_ctrl_c_part_way_ends_with_one_honest_line_and_one_resume_hint(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    lines, err = _interrupt_after(db, re.compile(r"^1/9 \d:\d\d:\d\d run \d+ "))
    assert lines[0].startswith("job: zoo:qwen3-tiny-small, zoo:melt-tiny, zoo:ouro-tiny on the synthetic suite")
    assert "job: 9 runs in 1 sweep, stored as runs 1-9" in lines
    finished, _ = _one_hint(lines, err, db)
    assert 1 <= finished < RUNS
    counted = [int(m.group(1)) for line in lines if (m := re.match(r"(\d+)/9 \d:\d\d:\d\d run \d+ \S+", line))]
    assert counted == list(range(1, finished + 1)), "\n".join(lines)  # each finished run's line, counted up in order
    job_line = next(line for line in lines if line.startswith("job: 1 sweep "))
    assert f"{finished}/9" in job_line and job_line.endswith("interrupted"), job_line  # never "9/9 done"


def test_ctrl_c_during_start_up_still_says_how_to_continue(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    lines, err = _interrupt_after(db, re.compile(r"^job: 9 runs in 1 sweep, stored"))
    finished, resume_id = _one_hint(lines, err, db)
    assert finished < RUNS and resume_id == min(
        i for i, s in query(db, "SELECT id, status FROM runs") if s != "finished"
    )


def test_ctrl_c_while_planning_says_nothing_was_stored(tmp_path: Path) -> None:
    db = tmp_path / "r.sqlite"
    lines, err = _interrupt_after(db, re.compile(r"; planning$"))
    assert lines[-1] == "interrupted before any run was stored: nothing to continue; run the command again", lines
    assert "--resume" not in "\n".join(lines) + err and not db.exists()
