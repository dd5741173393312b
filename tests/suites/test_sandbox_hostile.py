"""The HumanEval sandbox under attack: no exit path forges a pass, and the limits hold per program.

Every case runs for real under bubblewrap (as root here and in CI: a uid of its own per sandbox, cgroup v1). A forged
pass must score 0 while the same trick around a right answer still scores 1, so each test shows the
verdict comes from the check and nothing else. Limits are set just above what the program tries,
so the cases are quick; the host is inspected afterwards (folder modes, processes, cgroups).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from lighteval.models.model_output import ModelResponse

from tests.support.paper_data import HUMANEVAL
from suites import humaneval, sandbox

LIMITS = sandbox.Limits(wall_seconds=4, cpu_seconds=2)
TRUNCATE = HUMANEVAL[1]  # truncate_number(3.5) == 0.5; its tests also try 1.33 and 123.456
RIGHT = "    return number % 1.0\n"
WRONG = "    return 0.5\n"  # right for 3.5 only
MiB = 1 << 20


def gold() -> humaneval.Gold:
    return humaneval.prompt(TRUNCATE, "humaneval").choices[0]


def check(reply: str, limits: sandbox.Limits = LIMITS) -> sandbox.Outcome:
    """The item's real check of `reply`, as HumanEval scores it."""
    g = gold()
    return sandbox.run_check(humaneval.program(reply, g), g.entry_point, humaneval.check(g), limits)


def fenced(code: str) -> str:
    return f"```python\n{code}```\n"


def function(module: str, body: str) -> str:
    """A reply defining truncate_number after some module-level `module` code."""
    return fenced(f"{module}\ndef truncate_number(number):\n{body}")


def probe(source: str, entry: str, limits: sandbox.Limits) -> sandbox.Outcome:
    """Run `source` and print what its `entry()` returns, from the check (so it reaches `output`)."""
    return sandbox.run_check(source, entry, f"print('answer:', repr({sandbox.STAND_IN}()))\n", limits)


def answer(outcome: sandbox.Outcome) -> object:
    assert outcome.passed, outcome
    return eval(outcome.output.split("answer: ", 1)[1].splitlines()[0])  # noqa: S307 - the check's own print


# --------------------------------------------------------------------------------- forged passes
ALWAYS_EQUAL = """
class Anything(float):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __sub__(self, other): return Anything()
    def __abs__(self): return Anything()
    def __del__(self): raise SystemExit(0)
"""
FORGERIES = {
    "only-os-exit-0": "import os; os._exit(0)\n",  # the whole reply: it continues the prompt at module level
    "atexit-os-exit-0": function("import atexit, os\natexit.register(os._exit, 0)", WRONG),
    "sys-exit-0-inside-the-check": function("import sys", "    sys.exit(0)\n"),
    "os-exit-0-inside-the-check": function("import os", "    os._exit(0)\n"),
    "always-equal-result-raising-systemexit-in-del": function(ALWAYS_EQUAL, "    return Anything(0.5)\n"),
    "patched-builtins-and-assert": function(
        "import builtins, sys\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('Nothing', (Exception,), {})\n"
        "sys.excepthook = lambda *a: None", WRONG),
    "signal-handlers-exit-0": function(
        "import os, signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGPIPE, signal.SIGALRM, signal.SIGXCPU):\n"
        "    signal.signal(s, lambda *a: os._exit(0))\nsignal.alarm(1)", "    raise ValueError('wrong')\n"),
    "thread-exits-0-mid-check": function(
        "import os, threading, time\nthreading.Thread(target=lambda: (time.sleep(0.3), os._exit(0)), daemon=True).start()",
        "    time.sleep(1)\n    return 0.5\n"),
    "guessed-nonces-everywhere": function(
        "import os, secrets\nfor _ in range(200):\n    guess = (secrets.token_hex(16) + '\\n').encode()\n"
        "    for fd in range(1024):\n        try:\n            os.write(fd, guess)\n        except OSError:\n            pass\n"
        "os._exit(0)", WRONG),
    "trace-hooks": function(
        "import sys\nsys.settrace(lambda *a: None)\nsys.setprofile(lambda frame, event, arg: None)", WRONG),
}  # fmt: skip


@pytest.mark.parametrize("reply", list(FORGERIES.values()), ids=list(FORGERIES))
def test_a_wrong_program_scores_0_by_any_exit_path(reply: str) -> None:
    assert not check(reply).passed


@pytest.mark.parametrize(
    "module",
    ["import atexit, os\natexit.register(os._exit, 1)",  # the program's own exit status counts for nothing
     "import builtins\nbuiltins.abs = lambda x: 1e9",  # the check's builtins are not the program's
     "import sys\nprint('bwrap: no', file=sys.stderr)\nsys.stdout.close()"],
    ids=["atexit-exit-1", "abs-patched-against-itself", "bwrap-line-and-closed-stdout"],
)  # fmt: skip
def test_the_same_tricks_around_a_right_answer_still_pass(module: str) -> None:
    assert check(function(module, RIGHT)).passed


def test_a_program_cannot_find_the_nonce(monkeypatch: pytest.MonkeyPatch) -> None:
    """It searches its argv, environment, /proc, its fds and every file it can read; the nonce is in none."""
    nonce = uuid.uuid4().hex
    real = sandbox.secrets.token_hex
    monkeypatch.setattr(sandbox.secrets, "token_hex", lambda n=None: nonce if n == 16 else real(n))
    hunt = (
        "import os, re, sys\nfound = set()\ntexts = [' '.join(sys.argv), repr(dict(os.environ))]\n"
        "for root in ('/proc', '/sandbox', '/tmp', '/dev/fd'):\n"
        "    for folder, _, files in os.walk(root):\n"
        "        for name in files:\n"
        "            try:\n                texts.append(open(os.path.join(folder, name), 'rb').read(1 << 16).decode('latin-1'))\n"
        "            except Exception:\n                pass\n"
        "        if folder.count('/') > 3:\n            break\n"
        "for text in texts:\n    found.update(re.findall('[0-9a-f]{32}', text))\n"
        "print('searched', len(texts), 'texts:', sorted(found))\nsys.stdout.flush()\n"
        "for token in found:\n    for fd in range(3, 64):\n"
        "        try:\n            os.write(fd, token.encode())\n        except OSError:\n            pass\n"
    )  # fmt: skip
    outcome = check(function(hunt, WRONG))
    assert "searched" in outcome.output and nonce not in outcome.output and not outcome.passed


def test_a_bwrap_line_from_a_program_scores_0_and_the_run_goes_on() -> None:
    """'Sandbox unavailable' is the harness's own probe's verdict, never a program's output."""
    sandbox.check_available()
    doc = humaneval.prompt(TRUNCATE, "humaneval")
    fake = 'import os, sys\nprint("bwrap: Can\'t mount proc on /newroot/proc: Operation not permitted", file=sys.stderr)\nos._exit(1)\n'
    assert humaneval.passes(doc, ModelResponse(text=[fake])) == 0.0
    assert humaneval.passes(doc, ModelResponse(text=[RIGHT])) == 1.0


def test_a_result_that_is_not_a_literal_cannot_travel() -> None:
    """Only values travel: an object of the program's own (an iterator here) fails, its value would pass."""
    outcome = check(function("", "    return iter([number % 1.0])\n"))
    assert not outcome.passed and "not a Python literal" in outcome.reason
    assert check(function("class Half(float):\n    pass", "    return Half(number % 1.0)\n")).passed


# --------------------------------------------------------------------------------- limits per program
FILL = """
def fill(folder, mib):
    written = 0
    try:
        with open(folder + '/big', 'wb') as f:
            for _ in range(mib):
                f.write(bytes(1 << 20))
                f.flush()
                written += 1 << 20
    except OSError as error:
        return written, error.errno
    return written, None
"""


@pytest.mark.parametrize("folder", ["/sandbox", "/tmp"])
def test_disk_writes_stop_at_the_folder_size(folder: str) -> None:
    """600 MB into the work folder, 1.5 GB into /tmp: scaled down, 12 MiB into folders of 8 MiB."""
    limits = sandbox.Limits(wall_seconds=6, cpu_seconds=3, disk_bytes=8 * MiB)
    written, error = answer(probe(FILL + f"def go():\n    return fill({folder!r}, 12)\n", "go", limits))
    assert 4 * MiB <= written <= 8 * MiB and error == 28  # ENOSPC


HOLD = """
import os, time
def hold(count, mib):
    ready, tell = os.pipe()
    children = []
    for _ in range(count):
        child = os.fork()
        if child == 0:
            block = bytearray(mib << 20)  # zero-filled: every page touched
            os.write(tell, b'%d\\n' % os.getpid())
            time.sleep(30)
            os._exit(0)
        children.append(child)
    os.close(tell)
    time.sleep(2)  # time to allocate, and for the OOM killer to choose
    os.set_blocking(ready, False)
    try:
        holding = {int(pid) for pid in os.read(ready, 4096).split()}
    except BlockingIOError:
        holding = set()
    return sum(os.waitpid(child, os.WNOHANG) == (0, 0) for child in holding)  # holding and still alive
def four():
    return hold(4, 48)
def one():
    return hold(1, 48)
"""


def test_memory_is_bounded_for_the_program_as_a_whole() -> None:
    """4 processes holding 3.4 GB together: scaled down, 4 x 48 MiB against 128 MiB for the program."""
    if not sandbox._cgroup_parents():
        pytest.skip("no cgroup v1 memory and pids hierarchy writable here: memory is bounded per process only")
    limits = sandbox.Limits(wall_seconds=8, cpu_seconds=4, memory_bytes=128 * MiB)
    assert answer(probe(HOLD, "one", limits)) == 1, "one 48 MiB process fits"
    assert answer(probe(HOLD, "four", limits)) <= 2, "four do not: at most two hold their 48 MiB at once"


FORK = """
import os, time
def forks():
    made = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            made += 1
    except OSError:
        return made
"""


def test_processes_are_bounded_for_the_program_as_a_whole() -> None:
    if not sandbox._cgroup_parents():
        pytest.skip("no cgroup v1 memory and pids hierarchy writable here: processes are bounded per user")
    limits = sandbox.Limits(wall_seconds=6, cpu_seconds=3, processes=8)
    made = answer(probe(FORK, "forks", limits))
    assert 1 <= made <= 8 - 3  # bwrap's two processes and the interpreter count too


@pytest.mark.sandbox_user_alone  # counts the sandbox user's processes: no other test's sandbox beside it
def test_without_a_cgroup_each_process_is_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where cgroups cannot be used (not root, read-only cgroup mounts): address space per process, few processes."""
    monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: [])
    limits = sandbox.Limits(wall_seconds=6, cpu_seconds=3, memory_bytes=256 * MiB, processes=8)
    source = "def big():\n    try:\n        bytearray(300 << 20)\n    except MemoryError:\n        return 'refused'\n"
    assert answer(probe(source, "big", limits)) == "refused"
    others = 0 if os.geteuid() == 0 else sandbox._user_processes(os.getuid())  # as root a sandbox's uid is its own
    assert 1 <= answer(probe(FORK, "forks", limits)) <= 8 + others


@pytest.mark.sandbox_user_alone  # holds a program at its process cap: no other test's sandbox beside it
def test_without_a_cgroup_a_program_at_its_cap_takes_no_process_from_another_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As root every sandbox runs as a uid of its own. With one shared user (`nobody`) a program holding its
    process cap used up the processes of a check started before it: that check's fork failed and a right
    program scored 0."""
    if os.geteuid() != 0:
        pytest.skip("not root: every sandbox is the calling user, whose processes RLIMIT_NPROC counts together")
    monkeypatch.setattr(sandbox, "_cgroup_parents", lambda: [])
    limits = sandbox.Limits(wall_seconds=8, cpu_seconds=4, processes=8)
    late = (
        "import os, time\ndef late():\n    time.sleep(2)\n    child = os.fork()\n    if child == 0:\n        os._exit(0)\n"
        "    return os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])\n"
    )
    holds = FORK.replace(
        "        return made", "        time.sleep(3)  # at the cap while `late` forks\n        return made"
    )
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(probe, late, "late", limits)
        time.sleep(0.5)  # `late`'s sandboxes are up before the other program starts forking
        made = answer(probe(holds, "forks", limits))
        assert answer(waiting.result()) == 0  # its fork worked
    assert 1 <= made <= 8


def test_no_user_namespace_can_be_made_inside() -> None:
    """A nested user namespace (root on the host or not): unshare, clone and clone3 refuse; fork and threads work."""
    source = (
        "import ctypes, os, subprocess, threading\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "def call(*args):\n    result = libc.syscall(*args)\n    return result, ctypes.get_errno() if result < 0 else 0\n"
        "def tries():\n    unshare = (libc.unshare(0x10000000), ctypes.get_errno())\n"
        "    clone3 = call(435, 0, 0)\n"
        "    tool = subprocess.run(['unshare', '--user', 'true'], capture_output=True).returncode\n"
        "    thread = threading.Thread(target=lambda: None)\n    thread.start()\n    thread.join()\n"
        "    child = os.fork()\n    if child == 0:\n        os._exit(7)\n"
        "    return unshare, clone3[1], tool, os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])\n"
    )  # fmt: skip
    unshare, clone3, tool, forked = answer(probe(source, "tries", LIMITS))
    assert unshare == (-1, 1) and clone3 == 38 and tool != 0 and forked == 7  # EPERM, ENOSYS


def test_links_and_locked_folders_left_behind_change_nothing_on_the_host(tmp_path: Path) -> None:
    """A symlink to a host folder and chmod 0 folders in both tmpfs: the check still scores, the host is as it was."""
    host = tmp_path / "host"
    host.mkdir(mode=0o755)
    (host / "kept.txt").write_text("kept\n")
    host.chmod(0o755)
    before = sorted((p.name, p.stat().st_mode) for p in [host, *host.iterdir()])
    module = "\n".join([
        "import os",
        f"for place in ('/sandbox', '/tmp'):\n    os.symlink({str(host)!r}, place + '/link')",
        "    os.makedirs(place + '/sub/deeper')\n    open(place + '/sub/deeper/f', 'w').write('x')",
        "    os.chmod(place + '/sub/deeper', 0)\n    os.chmod(place + '/sub', 0)",
        "    os.symlink('/', place + '/root')",
    ])  # fmt: skip
    assert check(function(module, RIGHT)).passed
    assert sorted((p.name, p.stat().st_mode) for p in [host, *host.iterdir()]) == before
    assert (host / "kept.txt").read_text() == "kept\n"


HARNESS = """
import sys
sys.path.insert(0, {repo!r})
from suites import sandbox
program = "import time\\ntime.sleep(60)\\ndef {entry}():\\n    pass\\n"
sandbox.run_check(program, {entry!r}, "loopeval_program()\\n", sandbox.Limits(wall_seconds=60, cpu_seconds=60))
"""


def _sandbox_pids(marker: str, harness: int) -> list[int]:
    """The processes whose command line holds `marker`, the harness's own apart."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and proc.name != str(harness) and marker.encode() in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _end(process: subprocess.Popen, groups: list[Path]) -> None:
    """A test's own process and cgroups, gone whatever the test did."""
    process.kill()
    process.wait()
    for group in groups:
        if group.exists():
            group.rmdir()


def _running(harness: int, parents: list[Path]) -> bool:
    """Both sandboxes are past their setup: each pids cgroup holds bwrap's two processes and the interpreter."""
    groups = list(parents[1].glob(f"{harness}-*"))
    return len(groups) == 2 and all(len((g / "cgroup.procs").read_text().split()) >= 3 for g in groups)


def test_a_killed_harness_leaves_no_process_folder_or_cgroup(tmp_path: Path) -> None:
    """kill -9 of the harness mid-check: its sandboxes die with it, nothing is left in its tmp folder, and the
    cgroups it made are removed at the next start, only those: a live harness's and other folders stay."""
    if not sandbox._cgroup_parents():
        pytest.skip("no cgroup v1 memory and pids hierarchy writable here: the sandboxes' cgroups are not made")
    entry = f"sleeper_{uuid.uuid4().hex[:12]}"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    (tmp / "loopeval-sandbox-not-ours").mkdir()  # a folder of that name that loopeval did not make
    repo = str(Path(sandbox.__file__).resolve().parents[1])
    env = {**os.environ, "TMPDIR": str(tmp)}
    harness = subprocess.Popen([sys.executable, "-c", HARNESS.format(repo=repo, entry=entry)], env=env)
    parents = sandbox._cgroup_parents()
    live = [parent / f"{os.getpid()}-live" for parent in parents]  # a running harness's (this test's) cgroups
    try:
        for group in live:
            group.mkdir()
        deadline = time.monotonic() + 20
        while not _running(harness.pid, parents):
            assert harness.poll() is None and time.monotonic() < deadline, "the sandboxes did not start"
            time.sleep(0.05)
        harness.send_signal(signal.SIGKILL)
        harness.wait()
        deadline = time.monotonic() + 5
        while _sandbox_pids(entry, harness.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sandbox_pids(entry, harness.pid) == [], "the sandbox outlived its harness"
        assert [p.name for p in tmp.iterdir()] == ["loopeval-sandbox-not-ours"]
        left = [group for parent in parents for group in parent.glob(f"{harness.pid}-*")]
        assert len(left) == 2 * len(parents)  # its two sandboxes' cgroups, in each hierarchy
        removed = sandbox.remove_stale_cgroups()
        assert set(left) <= set(removed) and not any(group.exists() for group in left)
        assert all(group.exists() for group in live), "a live harness's cgroups are not touched"
    finally:
        _end(harness, live)


def test_the_next_start_ends_what_a_killed_harness_left_running(tmp_path: Path) -> None:
    """A harness killed during bwrap's own setup can leave a sandbox running (bwrap sets its death signal only
    once set up): the next start's cleanup kills what is in a dead harness's cgroups before removing them."""
    parents = sandbox._cgroup_parents()
    if not parents:
        pytest.skip("no cgroup v1 memory and pids hierarchy writable here: leftovers end only with their limits")
    gone = subprocess.Popen(["true"])
    gone.wait()  # a harness pid that no longer runs
    stale = [parent / f"{gone.pid}-{uuid.uuid4().hex[:12]}" for parent in parents]
    for group in stale:
        group.mkdir()

    def join() -> None:
        for group in stale:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    leftover = subprocess.Popen(["sleep", "60"], preexec_fn=join)
    try:
        removed = sandbox.remove_stale_cgroups()
        assert leftover.wait(timeout=5) == -signal.SIGKILL
        assert set(stale) <= set(removed) and not any(group.exists() for group in stale)
    finally:
        _end(leftover, stale)
