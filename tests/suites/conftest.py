"""The suites' tests run HumanEval programs in the sandbox, each as a uid of its own here (root): see `suites.sandbox`."""

from __future__ import annotations

import fcntl
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _sandbox_user(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A test marked `sandbox_user_alone` looks at the host as a whole (sandboxed programs left running, a program
    held at its process cap; not root, every sandbox is the calling user, whose processes RLIMIT_NPROC counts
    together), so no other test's sandbox may run beside it in another pytest process: it takes exclusively a lock
    that every other suites test shares, in the folder all of the test run's processes share."""
    alone = request.node.get_closest_marker("sandbox_user_alone") is not None
    with open(tmp_path_factory.getbasetemp().parent / "loopeval-sandbox-user.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        yield
