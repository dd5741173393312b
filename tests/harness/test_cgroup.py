"""Limits from the cgroup, not the host: the memory a job may take is the tightest of the host's available RAM and
the limits of the cgroups holding the process (v1 and v2, `harness.measurement.cgroup`).

The reading is tested on files laid out as the kernel lays out /proc/self and the cgroup filesystems, for both
versions; the refusal inside a REAL memory-limited cgroup (made here under /sys/fs/cgroup, as root): a run whose
KV budget and a training run whose memory floor need more than the cgroup's 2 GB (and less than the host has free)
are refused before they start, in one line, exit 2.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness.measurement.capacity import available_bytes
from harness.measurement.cgroup import cgroup_available
from measures import GB

LOOPEVAL = str(Path(sys.executable).with_name("loopeval"))
LIMIT = 2 * 1024**3  # the real cgroup's limit: 2 GiB
MiB = 1024**2


def _files(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def _proc(tmp: Path, cgroup: str, mounts: list[str]) -> Path:
    """A /proc/self with `cgroup` and a mountinfo of `mounts` ("ROOT MOUNTPOINT FSTYPE OPTIONS" each)."""
    lines = [
        f"{30 + i} 23 0:{28 + i} {root} {point} rw,relatime - {fstype} {fstype} {options}"
        for i, (root, point, fstype, options) in enumerate(m.split() for m in mounts)
    ]
    _files(tmp / "proc", {"cgroup": cgroup, "mountinfo": "\n".join(lines) + "\n"})
    return tmp / "proc"


def test_v1_the_tightest_group_up_the_hierarchy_less_its_usage_and_not_its_inactive_cache(tmp_path: Path) -> None:
    memory = tmp_path / "cgroup" / "memory"
    unlimited = "9223372036854771712\n"  # what v1 writes for no limit
    _files(
        memory,
        {
            "memory.limit_in_bytes": unlimited,
            "memory.usage_in_bytes": f"{9000 * MiB}\n",
            "memory.stat": "cache 0\n",
            "jobs/memory.limit_in_bytes": f"{3000 * MiB}\n",  # the parent binds: 3000 - (2600 - 100) = 500 MiB left
            "jobs/memory.usage_in_bytes": f"{2600 * MiB}\n",
            "jobs/memory.stat": f"total_inactive_file {100 * MiB}\nrss 1\n",
            "jobs/42/memory.limit_in_bytes": f"{2048 * MiB}\n",  # its own: 2048 - (1000 - 300) = 1348 MiB left
            "jobs/42/memory.usage_in_bytes": f"{1000 * MiB}\n",
            "jobs/42/memory.stat": f"total_inactive_file {300 * MiB}\n",
        },
    )
    proc = _proc(
        tmp_path,
        "12:pids:/jobs/42\n4:memory:/jobs/42\n0::/\n",
        [f"/ {tmp_path / 'cgroup' / 'unified'} cgroup2 rw", f"/ {memory} cgroup rw,memory"],
    )
    assert cgroup_available(proc) == 500 * MiB
    (memory / "jobs" / "memory.limit_in_bytes").write_text(unlimited)
    assert cgroup_available(proc) == 1348 * MiB
    (memory / "jobs" / "42" / "memory.limit_in_bytes").write_text(unlimited)
    assert cgroup_available(proc) is None, "no group limits memory"


def test_v2_memory_max_and_current_and_a_containers_own_subtree(tmp_path: Path) -> None:
    unified = tmp_path / "cgroup"
    _files(
        unified,
        {
            "memory.max": "max\n",  # no limit in this container's own root
            "memory.current": f"{5000 * MiB}\n",
            "memory.stat": "anon 1\ninactive_file 0\n",
            "app/memory.max": f"{2048 * MiB}\n",
            "app/memory.current": f"{1500 * MiB}\n",
            "app/memory.stat": f"anon 1\ninactive_file {200 * MiB}\nfile 3\n",
        },
    )
    # the container sees only its subtree: the mount's root is its own group, /system.slice/box
    proc = _proc(tmp_path, "0::/system.slice/box/app\n", [f"/system.slice/box {unified} cgroup2 rw,nsdelegate"])
    assert cgroup_available(proc) == (2048 - 1300) * MiB
    (unified / "app" / "memory.max").write_text("max\n")
    assert cgroup_available(proc) is None


def test_no_cgroup_fs_or_an_unreadable_one_is_no_limit(tmp_path: Path) -> None:
    assert cgroup_available(tmp_path / "nowhere") is None  # no /proc/self/cgroup: not Linux
    proc = _proc(tmp_path, "0::/\n", [f"/ {tmp_path} tmpfs rw"])  # no cgroup filesystem mounted
    assert cgroup_available(proc) is None
    proc = _proc(tmp_path, "0::/gone\n", [f"/ {tmp_path / 'cg'} cgroup2 rw"])  # its group's files are not there
    assert cgroup_available(proc) is None


# ------------------------------------------------------------------------------------- the real cgroup
def _real_cgroup() -> tuple[Path, str]:
    """A memory cgroup limited to LIMIT made under /sys/fs/cgroup (v1's memory hierarchy, else v2's unified one),
    and the name of its limit file; skips saying exactly why one cannot be made here."""
    if os.geteuid() != 0:
        pytest.skip(f"making a cgroup needs root, and this test runs as uid {os.geteuid()}")
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    controls = v2 / "cgroup.subtree_control"
    if (v1 / "memory.limit_in_bytes").is_file():
        parent, limit = v1, "memory.limit_in_bytes"
    elif controls.is_file() and "memory" in controls.read_text().split():
        parent, limit = v2, "memory.max"
    else:
        pytest.skip(
            "no cgroup memory controller here: /sys/fs/cgroup has neither v1's memory hierarchy nor a v2 "
            "root whose cgroup.subtree_control enables memory"
        )
    group = parent / f"loopeval-test-{os.getpid()}"
    try:
        group.mkdir()
        (group / limit).write_text(str(LIMIT))
    except OSError as exc:
        pytest.skip(f"cannot make a memory-limited cgroup under {parent}: {exc} (a read-only cgroup mount?)")
    return group, limit


@pytest.fixture
def limited() -> Iterator[Path]:
    group, _ = _real_cgroup()
    yield group
    for _ in range(50):  # the processes that ran in it have ended; an empty cgroup is removed with rmdir
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)


def _in_cgroup(group: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`loopeval ARGS` in a process that joins `group` before it starts."""

    def join() -> None:
        (group / "cgroup.procs").write_text(str(os.getpid()))

    return subprocess.run([LOOPEVAL, *args], capture_output=True, text=True, cwd=cwd, preexec_fn=join, timeout=600)


def _refused(done: subprocess.CompletedProcess[str]) -> float:
    """The one line a refusal inside the cgroup ends with; the GB it said the job needs."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    line = lines[0]
    assert line.startswith("loopeval: error: ") and "is free on cpu under this process's cgroup memory limit" in line
    need = float(line.split(" need ")[1].split(" GB")[0])
    assert LIMIT / GB < need < psutil.virtual_memory().available / GB, "more than the cgroup allows, less than the host"
    assert available_bytes("cpu")[0] > need * GB, "outside the cgroup the same check passes"
    return need


def test_a_run_whose_kv_budget_exceeds_a_real_2gb_cgroup_is_refused_before_it_starts(
    limited: Path, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(
        textwrap.dedent("""
        models = [{spec = "zoo:ouro-tiny", overrides = {kv_budget = 3.5}}]
        tasks = ["lookup"]
        limit = 1
        samples = 1
        loops = [1]
    """)
    )
    db = tmp_path / "results.sqlite"
    done = _in_cgroup(limited, ["run", "--config", str(sweep), "--db", str(db), "--no-report"], tmp_path)
    assert 3.5 <= _refused(done) < 4
    assert "the KV pool of kv_budget = 3.5 GB" in done.stderr and "lower kv_budget" in done.stderr
    assert not db.exists(), "refused before anything was written"


def test_a_training_run_whose_memory_floor_exceeds_a_real_2gb_cgroup_is_refused_before_it_starts(
    limited: Path, tmp_path: Path
) -> None:
    out = tmp_path / "melt"
    done = _in_cgroup(
        limited, ["zoo", "convert", "--teacher", "zoo:ouro-tiny", "--out", str(out), "--batch-size", "1200"], tmp_path
    )
    _refused(done)
    assert "lower --batch-size" in done.stderr
    assert not out.exists() or not any(out.iterdir()), "nothing trained or written"
