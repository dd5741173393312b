"""Fixtures for the dashboard tests: one real tiny sweep, run once per session, and copies of it.

The database comes from the real `loopeval run` (tiny presets, synthetic suite, real LightEval
pipeline, real memory sampler) and `loopeval profile`, so the figures are tested on what users get.
"""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from sqlalchemy import create_engine, update
from sqlalchemy.orm import Session

from dashboards.data import browse_samples
from db.models import Sample
from harness.cli import main

from tests.support.browser import PAYLOAD


def _loopeval(*args: str, cwd: Path) -> None:
    """The real command, run in this process: the evaluation stack is imported once per test run, not once per
    command (about 5 s each)."""
    with contextlib.chdir(cwd):
        assert main(list(args)) == 0, f"loopeval {' '.join(args)} failed"


@pytest.fixture(scope="session")
def results_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file filled by a real tiny sweep (every tiny preset, loops 1 and 2) and real profiles (a looped
    model at chosen loops, a plain one at its own)."""
    workdir = tmp_path_factory.mktemp("sweep")
    path = workdir / "results.sqlite"
    _loopeval(
        "run",
        "--limit",
        "2",
        "--max-new-tokens",
        "4",
        "--loops",
        "1,2",
        "--samples",
        "1",
        "--tasks",
        "addition,chain2,lookup",
        "--db",
        str(path),
        "--no-report",
        cwd=workdir,
    )
    _loopeval("profile", "preset:melt-tiny", "--lengths", "16,32,64", "--loops", "1,2", "--db", str(path), cwd=workdir)
    _loopeval("profile", "preset:qwen3-tiny", "--lengths", "16,32", "--db", str(path), cwd=workdir)  # at its own loops
    return path


@pytest.fixture(scope="session")
def two_sets_db(results_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sweep's database, then the case that once merged sets: one (model, loops) of it run again on
    fewer tasks and items (a later sweep, so its set is the default one)."""
    workdir = tmp_path_factory.mktemp("two-sets")
    path = workdir / "results.sqlite"
    shutil.copy(results_db, path)
    _loopeval(
        "run",
        "--model",
        "zoo:ouro-tiny",
        "--loops",
        "2",
        "--tasks",
        "chain2",
        "--limit",
        "1",
        "--samples",
        "1",
        "--max-new-tokens",
        "4",
        "--db",
        str(path),
        "--no-report",
        cwd=workdir,
    )
    return path


@pytest.fixture()
def two_sets_url(two_sets_db: Path, tmp_path: Path) -> str:
    copy = tmp_path / "two-sets.sqlite"
    shutil.copy(two_sets_db, copy)
    return f"sqlite:///{copy}"


@pytest.fixture()
def results_url(results_db: Path, tmp_path: Path) -> str:
    """A private copy of the sweep's database (tests may change it) as a SQLAlchemy URL."""
    copy = tmp_path / "results.sqlite"
    shutil.copy(results_db, copy)
    return f"sqlite:///{copy}"


@pytest.fixture()
def payload_url(results_url: str) -> str:
    """The sweep's database with one stored output replaced by script-injection markup.

    The sample chosen is the first the sample browsers list, so it is on the first page of the
    report's and the app's tables.
    """
    engine = create_engine(results_url)
    first = int(browse_samples(engine)["sample_id"].iloc[0])
    with Session(engine) as session, session.begin():
        session.execute(update(Sample).where(Sample.id == first).values(output=PAYLOAD))
    engine.dispose()
    return results_url
