"""The README's Scale out section, followed on a real two-node Ray cluster with Ray's token authentication.

The commands are read from the README's Ray block and run as written, on a fresh home folder (no Ray
token yet, as on a new machine), with only what a shared test machine needs added: free ports, a
temporary folder per node, one CPU per node, and `--block`, so each node is stopped by stopping its
own `ray start` process (`ray stop` would stop every Ray instance on the machine, other tests' too).
A sweep of two runs goes into the real Postgres test server, one run on each node; a machine without
the token, or with a wrong one, is refused at once in one line naming the settings.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from tests.support import pg

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
HEAD = "HEAD:6379"
SWEEP = """\
models = ["zoo:ouro-tiny"]
tasks = ["chain2"]
loops = [1, 2]
samples = 1
limit = 2
max_new_tokens = 4
"""


def readme_ray_commands() -> dict[str, str]:
    """The README's Ray block, command by command (comments dropped), keyed by what each does."""
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("**Ray.**") : readme.index("Other ways to name the cluster")]
    lines = [
        line.strip().split("   #")[0].split("  #")[0].strip() for line in block.splitlines() if line.startswith("    ")
    ]
    keys = {
        "export RAY_AUTH_MODE": "auth",
        "ray get-auth-token": "token",
        "ray start --head": "head",
        "ray start --address": "node",
        "export LOOPEVAL_DB": "db",
        "loopeval run": "run",
        "ray stop": "stop",
    }
    commands = {key: line for line in lines for start, key in keys.items() if line.startswith(start)}
    assert set(commands) == set(keys.values()), f"the README's Ray block lost a step: {lines}"
    return commands


def _start(command: str, address: str, extra: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    argv = [str(BIN / "ray"), *shlex.split(command)[1:]]
    argv = [address if arg == HEAD else arg for arg in argv] + extra + ["--block"]
    return subprocess.Popen(argv, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True)


def _stop(nodes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each node's `ray start --block` (it stops its own processes), then kill what is left of its group."""
    for node in reversed(nodes):
        if node.poll() is None:
            node.send_signal(signal.SIGTERM)
    for node in reversed(nodes):
        try:
            node.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(node.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        node.wait()
        shutil.rmtree(node.args[node.args.index("--temp-dir") + 1], ignore_errors=True)


def _node_flags(name: str) -> list[str]:
    """Test-only flags: one CPU, no dashboard, a free agent port and a temporary folder of the node's own
    (short: Ray's socket paths under it must stay within AF_UNIX's 107 bytes)."""
    temp = tempfile.mkdtemp(prefix=f"loopeval-ray-{name}-", dir="/tmp")
    head = ["--include-dashboard", "false"] if name == "head" else []
    return ["--num-cpus", "1", "--temp-dir", temp, *head, "--dashboard-agent-listen-port", str(pg.free_port())]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A head and a second node started as the README says, with Ray's defaults on a fresh home; (address, env, folder)."""
    if not (BIN / "ray").exists():
        pytest.skip("Ray is not installed (pip install -e '.[test]')")
    commands = readme_ray_commands()
    tmp = tmp_path_factory.mktemp("cluster")
    home = tmp / "home"
    home.mkdir()
    env = {
        **os.environ,
        "HOME": str(home),
        "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
    }
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "LOOPEVAL_DB"):
        env.pop(name, None)
    name, _, value = commands["auth"].removeprefix("export ").partition("=")
    env[name] = value
    subprocess.run(commands["token"], shell=True, env=env, check=True, cwd=tmp)
    assert (home / ".ray" / "auth_token").is_file()

    port = pg.free_port()
    address = f"127.0.0.1:{port}"
    nodes = [_start(commands["head"].replace("6379", str(port)), address, _node_flags("head"), env, tmp / "head.log")]
    try:
        _wait_for_nodes(nodes, address, env, tmp)
        nodes.append(_start(commands["node"], address, _node_flags("node"), env, tmp / "node.log"))
        _wait_for_nodes(nodes, address, env, tmp)
        yield address, env, tmp
    finally:
        _stop(nodes)


def _wait_for_nodes(
    nodes: list[subprocess.Popen[bytes]], address: str, env: dict[str, str], tmp: Path, timeout: float = 180
) -> None:
    """Wait until every node of `nodes` is alive (`ray status` through the token), or fail with the nodes' logs."""
    count = len(nodes)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(node.poll() is None for node in nodes):
        status = subprocess.run(
            [str(BIN / "ray"), "status", "--address", address], env=env, capture_output=True, text=True
        )
        if status.returncode == 0 and len(re.findall(r"^\s*1 node_", status.stdout, re.M)) >= count:
            return
        time.sleep(2)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(tmp.glob("*.log")))
    raise AssertionError(f"the cluster did not reach {count} nodes:\n{logs}")


@pytest.mark.slow
def test_the_readme_scale_out_runs_a_sweep_on_two_nodes_into_postgres(
    cluster: tuple[str, dict[str, str], Path], postgres_server: object
) -> None:
    address, env, tmp = cluster
    commands = readme_ray_commands()
    url = postgres_server.database("ray_cluster_sweep")
    (tmp / "sweep.toml").write_text(SWEEP)
    argv = [str(BIN / "loopeval"), *[address if arg == HEAD else arg for arg in shlex.split(commands["run"])[1:]]]
    done = subprocess.run(
        argv + ["--no-report"], env={**env, "LOOPEVAL_DB": url}, cwd=tmp, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 runs queued on Ray" in done.stdout and "InvalidAuthToken" not in done.stderr

    engine = create_engine(url)
    with engine.connect() as conn:
        runs = conn.execute(text("SELECT loops, status, host FROM runs ORDER BY loops")).all()
        stored = conn.execute(text("SELECT COUNT(*) FROM samples")).scalar_one()
    engine.dispose()
    assert [(r.loops, r.status) for r in runs] == [(1, "finished"), (2, "finished")]
    assert stored == 2 * 2  # two runs x 2 docs x 1 sample, each stored once
    assert len({r.host["ray_node"] for r in runs}) == 2, "each of the two nodes ran one run (one CPU each)"


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["no token", "wrong token", "auth disabled"])
def test_a_machine_the_cluster_refuses_is_told_why_in_one_line(
    cluster: tuple[str, dict[str, str], Path], tmp_path: Path, setting: str
) -> None:
    address, env, _ = cluster
    env = dict(env)
    if setting == "no token":
        (tmp_path / "home").mkdir()
        env["HOME"] = str(tmp_path / "home")
        env.pop("RAY_AUTH_MODE")
    elif setting == "wrong token":
        env["RAY_AUTH_TOKEN"] = "0" * 32
    else:
        env["RAY_AUTH_MODE"] = "disabled"
    began = time.monotonic()
    done = subprocess.run(
        [
            str(BIN / "loopeval"),
            "run",
            "--executor",
            "ray",
            "--ray-address",
            address,
            "--model",
            "zoo:ouro-tiny",
            "--loops",
            "1",
            "--limit",
            "1",
            "--db",
            str(tmp_path / "r.sqlite"),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(
        f"loopeval: error: cannot connect to Ray at {address}: "
    )
    assert "RAY_AUTH_MODE=token" in done.stderr and "RAY_AUTH_TOKEN" in done.stderr
    why = {
        "no token": "this machine has no Ray token",
        "wrong token": "it refused the token in RAY_AUTH_TOKEN",
        "auth disabled": "RAY_AUTH_MODE is 'disabled' here",
    }[setting]
    assert why in done.stderr
    assert time.monotonic() - began < 60, "refused at once, not after Ray's 20 s of retries"
    assert not (tmp_path / "r.sqlite").exists(), "nothing is written before Ray accepts the machine"


@pytest.mark.slow
def test_a_submitter_with_the_token_at_hand_needs_no_auth_mode(
    cluster: tuple[str, dict[str, str], Path], tmp_path: Path
) -> None:
    """RAY_AUTH_MODE unset in the submitting shell: loopeval finds the token (~/.ray/auth_token) and uses it."""
    address, env, _ = cluster
    env = {name: value for name, value in env.items() if name != "RAY_AUTH_MODE"}
    done = subprocess.run(
        [
            str(BIN / "loopeval"),
            "run",
            "--executor",
            "ray",
            "--ray-address",
            address,
            "--model",
            "zoo:ouro-tiny",
            "--loops",
            "1",
            "--tasks",
            "chain2",
            "--limit",
            "1",
            "--samples",
            "1",
            "--max-new-tokens",
            "2",
            "--db",
            str(tmp_path / "r.sqlite"),
            "--no-report",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 runs queued on Ray" in done.stdout and "InvalidAuthToken" not in done.stderr
