"""Run an untrusted Python program in a bubblewrap sandbox, or refuse: never anything in between.

Used for HumanEval, whose score comes from executing model-written code. Each program runs:
- in its own process tree under `bwrap`, in new PID, network, IPC and UTS namespaces: no network
  at all (a new namespace holds only a loopback that is down), no view of other processes;
- with a fresh, throwaway working directory (`/sandbox`) as the only writable bind; the interpreter's
  prefix, `/usr` and the library folders are bound read-only, `/tmp` is a private tmpfs;
- with an empty environment (`--clearenv`; `python -I` also ignores PYTHON* variables and the user
  site), so no secret of the harness's environment is readable;
- as an unprivileged user: as root, the program drops to `nobody` (65534) with no capabilities
  (`setpriv`), else it runs as the calling user inside a user namespace;
- under resource limits: CPU seconds, address space, file size and at most `processes` more
  processes than its user already has (a fork bomb stops there), with `--die-with-parent`;
- under a wall-clock timeout that kills the whole tree (killing `bwrap` ends its PID namespace).

`check_available()` runs a probe program once and raises `SandboxUnavailable` (one line) when the
sandbox cannot be set up here: no `bwrap`, no `setpriv` as root, or namespaces refused. Nothing in
this module ever runs a program outside the sandbox. Standard library only.
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from suites import SuiteError

NOBODY = 65534
INSIDE_WORKDIR = "/sandbox"
_LIBRARY_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


class SandboxUnavailable(SuiteError):
    """The sandbox cannot be set up on this machine: code is not executed at all."""


@dataclass(frozen=True)
class Limits:
    """What one program may use. `processes` counts on top of those its user already runs."""

    wall_seconds: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # address space
    file_bytes: int = 16 << 20  # any one file written, its output included
    processes: int = 32


@dataclass(frozen=True)
class Outcome:
    """How one program ended: `passed` only for exit status 0 within the limits."""

    passed: bool
    reason: str  # "passed", "exit N", "signal NAME", "timeout"
    output: str  # the tail of stdout and stderr together


def _run_as_nobody() -> bool:
    return os.geteuid() == 0


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


def _bwrap_command(workdir: Path) -> list[str]:
    """The `bwrap ... python -I -B program.py` command line for a program in `workdir`."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise SandboxUnavailable(
            "HumanEval executes model code only in a sandbox and bubblewrap is not installed: "
            "install it (apt-get install bubblewrap, see scripts/install.sh)"
        )
    prefix = Path(sys.base_prefix).resolve()
    python = Path(sys.executable).resolve()
    if not python.is_relative_to(prefix) and not python.is_relative_to("/usr"):
        python = prefix / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
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
    command += [
        "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp", "--bind", str(workdir), INSIDE_WORKDIR,
        "--chdir", INSIDE_WORKDIR, "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", INSIDE_WORKDIR,
        "--setenv", "LANG", "C.UTF-8",
    ]  # fmt: skip
    if _run_as_nobody():  # no user namespace: the program's processes count against uid 65534's limit
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            raise SandboxUnavailable("running as root, the sandbox needs setpriv (util-linux) to drop to nobody")
        command += [
            "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
            "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs",
        ]  # fmt: skip
    else:
        command += ["--unshare-all", "--unshare-user", "--disable-userns"]
    return command + [str(python), "-I", "-B", "program.py"]


def _limit(limits: Limits, processes: int) -> None:
    """Runs in the child before `bwrap` starts: the limits every process of the sandbox inherits."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
    resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _reason(returncode: int) -> str:
    if returncode == 0:
        return "passed"
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def _tail(path: Path, size: int = 4000) -> str:
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode("utf-8", "replace")


def _remove(folder: str) -> None:
    """Delete a work folder whatever modes the program left on its files."""

    def make_writable(function, path, _exc) -> None:
        os.chmod(os.path.dirname(path), 0o700)
        if os.path.isdir(path):
            os.chmod(path, 0o700)
        function(path)

    shutil.rmtree(folder, onerror=make_writable)


def run_python(source: str, limits: Limits = Limits()) -> Outcome:
    """Execute `source` as `program.py` in a fresh sandbox; SandboxUnavailable when there is none."""
    host = tempfile.mkdtemp(prefix="loopeval-sandbox-")
    try:
        workdir = Path(host) / "work"
        workdir.mkdir()
        (workdir / "program.py").write_text(source, encoding="utf-8")
        owner = NOBODY if _run_as_nobody() else os.getuid()
        if _run_as_nobody():
            os.chown(workdir, NOBODY, NOBODY)
        command = _bwrap_command(workdir)
        processes = _user_processes(owner) + limits.processes
        log = Path(host) / "output"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=host,
                start_new_session=True, preexec_fn=lambda: _limit(limits, processes),
            )  # fmt: skip
            try:
                returncode = proc.wait(timeout=limits.wall_seconds)
                reason = _reason(returncode)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # bwrap's PID namespace dies with it
                proc.wait()
                returncode, reason = -signal.SIGKILL, "timeout"
        output = _tail(log)
        if returncode != 0 and output.lstrip().startswith(("bwrap:", "setpriv:")):
            raise SandboxUnavailable(f"the sandbox could not be set up: {output.strip().splitlines()[0]}")
        return Outcome(passed=returncode == 0, reason=reason, output=output)
    finally:
        _remove(host)


@functools.cache
def check_available() -> None:
    """Raise SandboxUnavailable (one line) unless a probe program runs in the sandbox, once per process."""
    outcome = run_python("print('sandboxed')")
    if not outcome.passed or "sandboxed" not in outcome.output:
        first = (outcome.output.strip().splitlines() or [outcome.reason])[0]
        raise SandboxUnavailable(f"the sandbox could not run a probe program ({outcome.reason}): {first}")
