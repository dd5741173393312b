"""A throwaway Postgres server for the tests: initdb in a temporary directory, a free port on 127.0.0.1.

The server binaries come from the system's Postgres package (`scripts/install.sh --test` installs
it). initdb refuses to run as root, so under root the cluster belongs to the package's unprivileged
`postgres` user and every server command runs as that user (`runuser`); otherwise it belongs to
whoever runs pytest. The server listens on TCP only (no Unix socket), asks for a password, and is
stopped and deleted when the tests end. `fsync` is off: the data is thrown away.

Where no server can be started, `unavailable()` says why, and the fixtures in tests/conftest.py skip
with that reason, or fail when LOOPEVAL_REQUIRE_SERVICES is set (`.ci/run` sets it, so CI never
passes by skipping them).
"""

from __future__ import annotations

import glob
import importlib.util
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

SERVER_USER = "postgres"  # the Debian package's unprivileged account, used when pytest runs as root
SUPERUSER = "loopeval"


def bin_dir() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, else the newest /usr/lib/postgresql/N/bin (Debian keeps them there)."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent  # a symlink on PATH: the folder that holds the rest too
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    return Path(candidates[-1]).parent if candidates else None


def unavailable() -> str | None:
    """Why no throwaway server can run here, or None."""
    if importlib.util.find_spec("psycopg") is None:
        return "psycopg 3 is not installed (pip install -e '.[test]')"
    if bin_dir() is None:
        return "no Postgres server: initdb not found (scripts/install.sh --test installs Debian's postgresql as root)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no unprivileged {SERVER_USER!r} user to own the cluster (initdb refuses root)"
        if shutil.which("runuser") is None:
            return "running as root without runuser to start Postgres as another user"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PostgresServer:
    """One throwaway cluster. `start()` it, hand out databases with `database()`, `stop()` it."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="loopeval-pg-"))  # under /tmp: the server user must reach it
        self.data = self.root / "data"
        self.password = secrets.token_hex(16)
        self.port = free_port()
        self.bin = bin_dir()
        self._as_server: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam(SERVER_USER)
            os.chown(self.root, account.pw_uid, account.pw_gid)
            self._as_server = ["runuser", "-u", SERVER_USER, "--"]

    def _run(self, *args: str) -> None:
        result = subprocess.run([*self._as_server, *args], capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({result.returncode}): {result.stderr or result.stdout}")

    def start(self) -> PostgresServer:
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self._as_server:
            shutil.chown(pwfile, SERVER_USER)
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            SUPERUSER,
            f"--pwfile={pwfile}",
            "-E",
            "UTF8",
            "--auth-local=trust",
            "--auth-host=scram-sha-256",
            "--no-sync",
        )
        pwfile.unlink()
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(
                f"listen_addresses = '127.0.0.1'\nport = {self.port}\nunix_socket_directories = ''\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n"
            )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.root / "server.log"),
            "-w",
            "-t",
            "60",
            "start",
        )
        return self

    def url(self, database: str = "postgres", driver: str = "postgresql+psycopg") -> str:
        return f"{driver}://{SUPERUSER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """Create an empty database and return its SQLAlchemy URL (psycopg 3)."""
        import psycopg

        with psycopg.connect(self.url(driver="postgresql"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)
