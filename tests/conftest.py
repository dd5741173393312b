"""Shared pytest fixtures. Tests run on the CPU with real tensors, real SQLite files and the real LightEval pipeline.

Services are real too: a throwaway Postgres server (`postgres_server`, `postgres_url`; tests/support/pg.py)
and a local Ray instance with 2 CPUs (`ray_address`), never mocks of either. Where one cannot run,
its tests skip with the reason (or fail, with LOOPEVAL_REQUIRE_SERVICES set, as .ci/run does).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

# pytest-xdist runs a pytest process per core (pyproject addopts): one torch thread each, so they never oversubscribe
# the cores; alone (-n 0), up to two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))
# The tables loopeval prints are as wide as the terminal says (COLUMNS) and 220 columns on a pipe; xdist's workers
# are handed COLUMNS=80. Tests read what a pipe gets, whatever runs them; a test that wants a width sets it.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _offline_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing may download at run time: make any accidental hub access fail fast."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(autouse=True)
def _grad_enabled() -> None:
    """LightEval 0.13 calls torch.set_grad_enabled(False) at import; tests that train need autograd back."""
    torch.set_grad_enabled(True)


def _service_missing(reason: str) -> None:
    """Skip a test that needs a missing service, or fail where CI requires every service (.ci/run)."""
    if os.environ.get("LOOPEVAL_REQUIRE_SERVICES"):
        pytest.fail(f"LOOPEVAL_REQUIRE_SERVICES is set but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """A throwaway Postgres cluster for the whole session (tests/support/pg.py), stopped and deleted at the end."""
    from tests.support import pg

    reason = pg.unavailable()
    if reason:
        _service_missing(reason)
    server = pg.PostgresServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture()
def postgres_url(postgres_server: Any, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the session's Postgres server, as a SQLAlchemy URL (psycopg 3)."""
    name = (
        "t_"
        + "".join(c if c.isalnum() else "_" for c in request.node.name.lower())[:50]
        + f"_{os.getpid()}_{id(request)}"
    )
    return postgres_server.database(name[:63])


@pytest.fixture(scope="session")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local Ray instance with 2 CPUs for the session, its temp files and logs under pytest's tmp; its GCS address.

    Workers inherit this process's environment, so the hub stays offline in them too.
    """
    try:
        import ray
    except ImportError:
        _service_missing("Ray is not installed (pip install -e '.[test]')")
    offline = {
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    saved = {name: os.environ.get(name) for name in offline}
    os.environ.update(offline)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp_path_factory.mktemp("ray")))
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(scope="module")
def stored_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A loopeval database that already holds a finished run (a refused command must leave it byte-identical)."""
    from db.store import Store

    path = tmp_path_factory.mktemp("store") / "kept.sqlite"
    store = Store.open(str(path))
    store.finish_run(
        store.create_run(sweep_id="kept", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic"),
        "finished",
    )
    store.close()
    return path


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 16 MB tmpfs mounted on a folder: a disk that really fills. Mounting needs root (the tests and CI run as
    root); elsewhere the test skips with the reason."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill (needs root): {mounted.stderr.strip()}")
    yield folder
    subprocess.run(["umount", "-l", str(folder)], check=False)


@pytest.fixture
def isolated_registry() -> Iterator[None]:
    """Plugins change module-level registry state; give each test its own and put the original back."""
    from adapters import registry

    registry.available()  # built-ins loaded before the snapshot is taken
    saved = (
        dict(registry._REGISTRY),
        list(registry._FAILURES),
        set(registry._scanned_dirs),
        registry._loaded_plugins,
        set(registry._BROKEN_NAMES),
    )
    yield
    registry._REGISTRY.clear()
    registry._REGISTRY.update(saved[0])
    registry._FAILURES[:] = saved[1]
    registry._scanned_dirs.clear()
    registry._scanned_dirs.update(saved[2])
    registry._loaded_plugins = saved[3]
    registry._BROKEN_NAMES.clear()
    registry._BROKEN_NAMES.update(saved[4])
