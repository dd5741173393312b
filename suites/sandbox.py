"""Check an untrusted Python program in bubblewrap sandboxes, or refuse: never anything in between.

Used for HumanEval, whose score comes from executing model-written code. One check is two sandboxes
(the code that runs inside them: `suites/sandbox_inside.py`):
- the **program** (the model's code) runs in one and only answers calls to its entry function;
- the **check** (the item's tests) runs in another, calls that function through two pipes and reads
  each answer as a Python literal. It passes only when the check ran to its end, which it proves by
  writing a per-run random nonce to a pipe that only it holds. The program never sees the nonce or
  the tests, and no exit status or output of it counts: `os._exit(0)`, `atexit`, `sys.exit` in the
  function, `__eq__` that always agrees, patched builtins or asserts all stay in its own process.

Each sandbox:
- is its own process tree under `bwrap`, in new PID, network, IPC and UTS namespaces: no network at
  all (a new namespace holds only a loopback that is down), no view of other processes;
- has two private tmpfs folders as its only writable places, `/sandbox` (the working folder) and
  `/tmp`, each of `Limits.disk_bytes`; `/usr`, the library folders and the Python prefix are bound
  read-only. Nothing on the host is written, so nothing is left behind or removed afterwards;
- has an empty environment (`--clearenv`; `python -I` also ignores PYTHON* variables);
- runs as an unprivileged user: as root, it drops to a uid of its own that no account has (drawn from
  `SANDBOX_UIDS`, group `nogroup`) with no capabilities (`setpriv`), so no other sandbox's processes
  count against its process limit; else it is the calling user inside a user namespace; a seccomp
  filter refuses new user namespaces inside (x86_64 and aarch64; `--disable-userns` too where bwrap
  makes one);
- is limited as a whole where the machine allows it: as root with cgroup v1 memory and pids
  hierarchies, a cgroup per sandbox bounds its memory (its tmpfs pages included) and its tasks;
  elsewhere each process gets `memory_bytes` of address space and `processes` more processes than its
  user runs. Always: CPU seconds and file size per process, and a wall clock for the whole check;
- dies with the harness (`PR_SET_PDEATHSIG`, `--die-with-parent`). What a killed harness leaves (its
  cgroups, and a sandbox caught in bwrap's own setup, before its death signal is set) is killed and
  removed by the next `check_available()`: only loopeval's own, the cgroups under
  `loopeval-sandbox` whose harness process is gone.

`check_available()` runs a probe check once and raises `SandboxUnavailable` (one line) when the
sandbox cannot be set up here. Only that probe decides it, never a program's output. Nothing in
this module ever runs a program outside the sandbox. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import platform
import resource
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from suites import SuiteError

NOGROUP = 65534
SANDBOX_UIDS = range(
    0x7000_0000, 0x7001_0000
)  # no account's: as root, each sandbox runs as one of these, unused at its start
INSIDE_WORKDIR = "/sandbox"
STAND_IN = "loopeval_program"  # the name a check's source calls the program's function by
CGROUP_MOUNTS = Path("/sys/fs/cgroup")
CGROUP_PARENT = "loopeval-sandbox"  # loopeval's own cgroup in each hierarchy: every child is a sandbox of ours
_LIBRARY_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_INSIDE = (Path(__file__).with_name("sandbox_inside.py")).read_text(encoding="utf-8")


class SandboxUnavailable(SuiteError):
    """The sandbox cannot be set up on this machine: code is not executed at all."""


@dataclass(frozen=True)
class Limits:
    """What one sandbox may use (the program's, and the check's alike)."""

    wall_seconds: float = 10.0  # the whole check, both sandboxes
    cpu_seconds: int = 10  # each process
    memory_bytes: int = 1 << 30  # the sandbox as a whole (cgroup), else each process's address space
    processes: int = 16  # tasks (processes and threads, bwrap's two included) in a cgroup, else more than its user runs
    disk_bytes: int = 64 << 20  # each of its tmpfs folders, /sandbox and /tmp
    file_bytes: int = 16 << 20  # any one file written, its output included


@dataclass(frozen=True)
class Outcome:
    """How one check ended: `passed` only when the check ran to its end (its nonce came back)."""

    passed: bool
    reason: str  # "passed", "timeout", or the check's last line ("AssertionError", "ProgramError: ...")
    output: str  # the tails of the program's output and the check's


# --------------------------------------------------------------------------------- seccomp
_SYSCALLS = {  # (audit arch, clone, unshare, clone3)
    "x86_64": (0xC000003E, 56, 272, 435),
    "aarch64": (0xC00000B7, 220, 97, 435),
}


def _no_user_namespaces() -> bytes | None:
    """A classic-BPF seccomp program: clone/unshare with CLONE_NEWUSER fail with EPERM, clone3 with
    ENOSYS (its flags are out of reach; glibc then falls back to clone), foreign ABIs are killed.
    None on an architecture it does not know."""
    if platform.machine() not in _SYSCALLS:
        return None
    arch, clone, unshare, clone3 = _SYSCALLS[platform.machine()]
    load, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill, fail = 0x7FFF0000, 0x80000000, 0x00050000  # SECCOMP_RET_ALLOW, KILL_PROCESS, ERRNO | errno

    def op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
        return struct.pack("HBBI", code, jt, jf, k)

    return b"".join([
        op(load, 4), op(jeq, arch, 1, 0), op(ret, kill),  # seccomp_data.arch
        op(load, 0), op(jge, 0x40000000, 0, 1), op(ret, fail | errno.ENOSYS),  # .nr; x32 calls refused
        op(jeq, clone3, 0, 1), op(ret, fail | errno.ENOSYS),
        op(jeq, unshare, 1, 0), op(jeq, clone, 0, 3),
        op(load, 16), op(jset, 0x10000000, 0, 1), op(ret, fail | errno.EPERM),  # args[0] & CLONE_NEWUSER
        op(ret, allow),
    ])  # fmt: skip


# --------------------------------------------------------------------------------- cgroups
def _cgroup_parents() -> list[Path]:
    """loopeval's memory and pids cgroups, made when missing; [] where this process cannot use cgroup v1."""
    parents = [CGROUP_MOUNTS / "memory" / CGROUP_PARENT, CGROUP_MOUNTS / "pids" / CGROUP_PARENT]
    if os.geteuid() != 0 or not all((p.parent / "cgroup.procs").is_file() for p in parents):
        return []
    try:
        for parent in parents:
            parent.mkdir(exist_ok=True)
    except OSError:  # a read-only cgroup mount, as in most containers
        return []
    return parents


def _owner_alive(group: Path) -> bool:
    """A sandbox cgroup is named OWNERPID-TOKEN: it is in use while that harness process lives."""
    owner = group.name.split("-", 1)[0]
    return owner.isdigit() and Path(f"/proc/{owner}").exists()


def _remove_cgroup(group: Path, deadline: float) -> bool:
    """Kill what is left in `group` and remove it (its tasks need a moment to leave after SIGKILL)."""
    while True:
        try:
            for pid in (group / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            group.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def remove_stale_cgroups() -> list[Path]:
    """Remove the sandbox cgroups of harness processes that no longer run (killed ones); return them."""
    removed = []
    for parent in _cgroup_parents():
        for group in parent.iterdir():
            if group.is_dir() and not _owner_alive(group) and _remove_cgroup(group, time.monotonic() + 2):
                removed.append(group)
    return removed


class _Cgroup:
    """One sandbox's memory and pids cgroups (v1), with its limits; a process joins them before exec."""

    def __init__(self, parents: list[Path], limits: Limits) -> None:
        name = f"{os.getpid()}-{secrets.token_hex(6)}"
        self.groups = [parent / name for parent in parents]
        memory, pids = self.groups
        try:
            for group in self.groups:
                group.mkdir()
            (memory / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # swap counted too, where the kernel accounts it
                (memory / "memory.memsw.limit_in_bytes").write_text(str(limits.memory_bytes))
            (pids / "pids.max").write_text(str(limits.processes))
        except OSError:
            self.remove()
            raise

    def join(self) -> None:
        for group in self.groups:
            (group / "cgroup.procs").write_text(str(os.getpid()))

    def remove(self) -> None:
        deadline = time.monotonic() + 5
        for group in self.groups:
            _remove_cgroup(group, deadline)


# --------------------------------------------------------------------------------- bwrap
def _as_root() -> bool:
    return os.geteuid() == 0


def _sandbox_user() -> tuple[int, int]:
    """The uid a sandbox started now runs as, and how many processes that uid holds already: as root, one of
    `SANDBOX_UIDS` that holds none (drawn at random, so that concurrent harnesses rarely draw the same one);
    else the calling user."""
    if not _as_root():
        return os.getuid(), _user_processes(os.getuid())
    while _user_processes(uid := secrets.choice(SANDBOX_UIDS)):
        pass
    return uid, 0


def _user_processes(uid: int) -> int:
    """How many processes `uid` owns now (RLIMIT_NPROC counts them all, the sandbox's included)."""
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except FileNotFoundError:
                continue
    return count


def _python() -> tuple[Path, Path]:
    """The interpreter to run inside and the prefix it needs (a venv's base interpreter)."""
    prefix = Path(sys.base_prefix).resolve()
    python = Path(sys.executable).resolve()
    if not python.is_relative_to(prefix) and not python.is_relative_to("/usr"):
        python = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return python, prefix


def _bwrap_command(limits: Limits, seccomp_fd: int | None, program_fd: int | None, uid: int) -> list[str]:
    """The `bwrap ... python -I -B -c INSIDE` command line (its role's arguments follow)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "HumanEval executes model code only in a sandbox and bubblewrap is not installed: "
            "install it (apt-get install bubblewrap, see scripts/install.sh)"
        )
    python, prefix = _python()
    command = [bwrap, "--die-with-parent", "--new-session", "--clearenv", "--ro-bind", "/usr", "/usr"]
    for folder in _LIBRARY_DIRS:
        if os.path.islink(folder):
            command += ["--symlink", os.readlink(folder), folder]
        elif os.path.isdir(folder):
            command += ["--ro-bind", folder, folder]
    if not prefix.is_relative_to("/usr"):  # at its own path, which its RUNPATH names; parents traversable
        for parent in reversed(prefix.parents[:-1]):
            command += ["--perms", "0755", "--dir", str(parent)]
        command += ["--ro-bind", str(prefix), str(prefix)]
    size = str(limits.disk_bytes)
    command += [
        "--proc", "/proc", "--dev", "/dev", "--size", size, "--perms", "1777", "--tmpfs", "/tmp",
        "--size", size, "--perms", "1777", "--tmpfs", INSIDE_WORKDIR, "--chdir", INSIDE_WORKDIR,
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INSIDE_WORKDIR, "--setenv", "LANG", "C.UTF-8",
    ]  # fmt: skip
    if program_fd is not None:
        command += ["--perms", "0444", "--file", str(program_fd), f"{INSIDE_WORKDIR}/program.py"]
    if seccomp_fd is not None:
        command += ["--seccomp", str(seccomp_fd)]
    if _as_root():  # no user namespace: the program's processes count against `uid`'s limit, this sandbox's alone
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("running as root, the sandbox needs setpriv (util-linux) to drop its privileges")
        command += [
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            setpriv, f"--reuid={uid}", f"--regid={NOGROUP}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs",
        ]  # fmt: skip
    else:
        command += ["--unshare-all", "--unshare-user", "--disable-userns"]
    return command + [str(python), "-I", "-B", "-c", _INSIDE]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _in_child(limits: Limits, group: _Cgroup | None, processes: int, harness: int) -> None:
    """Runs in the child before `bwrap` starts: its cgroup, the limits every process inherits, and death
    with the harness (bwrap's --die-with-parent starts only once bwrap runs; this covers the moments before)."""
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    if group is not None:
        group.join()
    else:  # no cgroup: the memory budget holds per process only, so few processes
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _libc().prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across the exec of bwrap
    if os.getppid() != harness:  # the harness died before that
        os._exit(1)


def _data(text: str | bytes) -> IO[bytes]:
    """An unlinked temporary file holding `text`, rewound: for bwrap's --file/--seccomp and a stdin."""
    file = tempfile.TemporaryFile()
    file.write(text.encode("utf-8") if isinstance(text, str) else text)
    file.seek(0)
    return file


def _tail(file: IO[bytes], size: int = 4000) -> str:
    file.seek(max(0, file.seek(0, os.SEEK_END) - size))
    return file.read().decode("utf-8", "replace")


class _Sandbox:
    """One running `bwrap` sandbox in its cgroup (where there is one), its output in an unlinked file.

    `stack` ends it: the process tree killed, then the cgroup removed, then the files closed."""

    def __init__(
        self,
        stack: contextlib.ExitStack,
        limits: Limits,
        parents: list[Path],
        role: list[str],
        pass_fds: tuple[int, ...],
        program: str | None = None,
        stdin: str | None = None,
    ) -> None:
        contents = {"seccomp": _no_user_namespaces(), "program": program}
        fds = {name: stack.enter_context(_data(text)).fileno() for name, text in contents.items() if text is not None}
        uid, held = _sandbox_user()
        command = _bwrap_command(limits, fds.get("seccomp"), fds.get("program"), uid)
        self.output = stack.enter_context(tempfile.TemporaryFile())
        stdin_file = stack.enter_context(_data(stdin)) if stdin is not None else subprocess.DEVNULL
        self.group = _Cgroup(parents, limits) if parents else None
        if self.group is not None:
            stack.callback(self.group.remove)
        processes = 0 if self.group else held + limits.processes
        harness, _ = os.getpid(), _libc()  # libc is loaded here, not in the forked child
        self.process = subprocess.Popen(
            [*command, *role], stdin=stdin_file, stdout=self.output, stderr=subprocess.STDOUT, cwd="/",
            pass_fds=pass_fds + tuple(fds.values()), start_new_session=True,
            preexec_fn=lambda: _in_child(limits, self.group, processes, harness),
        )  # fmt: skip
        stack.callback(self.kill)

    def kill(self) -> None:
        """End the whole tree: killing `bwrap` ends its PID namespace (its cgroup is emptied after)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()


def _check(program: str, entry_point: str, check: str, limits: Limits) -> Outcome:
    nonce = secrets.token_hex(16)
    parents = _cgroup_parents()
    with contextlib.ExitStack() as stack:
        held: set[int] = set()

        def close(*fds: int) -> None:  # each pipe end exactly once: a number closed twice may be another's by then
            for fd in fds:
                held.discard(fd)
                os.close(fd)

        stack.callback(lambda: close(*held))
        pipes = [os.pipe() for _ in range(3)]  # (read end, write end) each, close-on-exec here
        held.update(fd for pipe in pipes for fd in pipe)
        (calls_out, calls_in), (answers_out, answers_in), (proof_out, proof_in) = pipes
        served = _Sandbox(stack, limits, parents, ["serve", entry_point, str(calls_out), str(answers_in)],
                          (calls_out, answers_in), program=program)  # fmt: skip
        checker = _Sandbox(stack, limits, parents, ["check", str(calls_in), str(answers_out), str(proof_in)],
                           (calls_in, answers_out, proof_in), stdin=json.dumps({"source": check, "nonce": nonce}))  # fmt: skip
        close(calls_out, calls_in, answers_out, answers_in, proof_in)  # the sandboxes hold them: an end is seen
        try:
            checker.process.wait(timeout=limits.wall_seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        checker.kill()
        served.kill()
        passed = not timed_out and secrets.compare_digest(_read_now(proof_out), nonce.encode("ascii"))
        said = _tail(checker.output)
        output = _tail(served.output) + said
    reason = "passed" if passed else "timeout" if timed_out else (said.strip().splitlines() or ["no result"])[-1]
    return Outcome(passed=passed, reason=reason, output=output)


def _read_now(fd: int) -> bytes:
    """What the pipe holds now (its writers are dead), without waiting."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 64)
    except BlockingIOError:
        return b""


def run_check(program: str, entry_point: str, check: str, limits: Limits = Limits()) -> Outcome:
    """Run `program` in one sandbox and `check` in another, where `loopeval_program` calls the program's
    `entry_point`; passed when `check` ran to its end. SandboxUnavailable (from the probe) when there is none."""
    check_available()
    return _check(program, entry_point, check, limits)


@functools.cache
def check_available() -> None:
    """Raise SandboxUnavailable (one line) unless a probe check passes in the sandbox, once per process.

    It first removes the cgroups that killed harness processes left (the next start's cleanup)."""
    remove_stale_cgroups()
    outcome = _check(
        "def probe():\n    return 'sandboxed'\n", "probe", f"assert {STAND_IN}() == 'sandboxed'\n", Limits()
    )
    if not outcome.passed:
        first = (outcome.output.strip().splitlines() or [outcome.reason])[0]
        raise SandboxUnavailable(f"the sandbox could not run a probe program ({outcome.reason}): {first}")
