"""HumanEval in the sandbox: canonical solutions pass, broken ones fail, hostile programs are contained.

Everything runs for real under bubblewrap; a test that checks containment also proves on the host
that the forbidden effect (a file written outside the sandbox, a TCP connection) did not happen.
Forged passes and the limits per program: tests/suites/test_sandbox_hostile.py.
"""

from __future__ import annotations

import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest
from lighteval.models.model_output import ModelResponse

from tests.support.paper_data import HUMANEVAL
from suites import humaneval, sandbox
from suites.loader import with_samples
from suites.paper import task_configs

LIMITS = sandbox.Limits(wall_seconds=4, cpu_seconds=2)
TRUNCATE = HUMANEVAL[1]  # truncate_number(3.5) == 0.5


def gold(row: dict) -> humaneval.Gold:
    return humaneval.prompt(row, "humaneval").choices[0]


def run(row: dict, reply: str) -> sandbox.Outcome:
    g = gold(row)
    return sandbox.run_check(humaneval.program(reply, g), g.entry_point, humaneval.check(g), LIMITS)


def body(statements: str) -> str:
    """A completion of truncate_number that runs `statements` first, then returns the right answer."""
    return "".join(f"    {line}\n" for line in statements.splitlines()) + "    return number % 1.0\n"


def test_canonical_solutions_pass_and_broken_ones_fail():
    (config,) = with_samples([c for c in task_configs() if c.name == "humaneval"], 2)
    fn = config.metrics[0].sample_level_fn
    for row in HUMANEVAL:
        doc = humaneval.prompt(row, "humaneval")
        full = f"```python\n{row['prompt']}{row['canonical_solution']}```"
        assert fn.compute(doc=doc, model_response=ModelResponse(text=[row["canonical_solution"], full])) == 1.0
        broken = ["    return None\n", "```python\ndef " + row["entry_point"] + "(*args):\n    return 1 / 0\n```"]
        assert fn.compute(doc=doc, model_response=ModelResponse(text=broken)) == 0.0
        # pass@1 over n=2 with one right sample is LightEval's unbiased estimate: 1/2.
        assert fn.compute(doc=doc, model_response=ModelResponse(text=[broken[0], full])) == 0.5


def test_reply_forms_make_the_expected_program():
    g = gold(TRUNCATE)
    completion = humaneval.program("    return number % 1.0\n", g)
    assert completion.startswith(TRUNCATE["prompt"] + "    return number % 1.0\n")
    fenced = humaneval.program(
        "<think>```python\nx = 1\n```</think>Sure:\n```python\ndef truncate_number(n):\n    return n % 1\n```", g
    )
    assert "x = 1" not in fenced and "def truncate_number(n):\n    return n % 1" in fenced
    assert "check" not in completion + fenced, "the program never holds the tests"
    check = humaneval.check(g)
    assert check.startswith(TRUNCATE["prompt"] + TRUNCATE["canonical_solution"]) and TRUNCATE["test"] in check
    assert check.rstrip().endswith("truncate_number = loopeval_program\ncheck(truncate_number)")


RIGHT_DEF = "def truncate_number(number: float) -> float:\n    return number % 1.0\n"
WRONG_DEF = "def truncate_number(number: float) -> float:\n    return number - 1\n"
EXAMPLE = "```python\nprint(truncate_number(3.5))  # 0.5\n```"
TESTS = "def test_truncate_number():\n    assert truncate_number(3.5) == 0.5\n"  # defines test_truncate_number only


def fenced(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{code}```"


# Replies to truncate_number in the shapes models write them: the block that defines the entry point is the program;
# when several do, the last (the corrected, final version); when none does, the first block continues the prompt.
HUMANEVAL_REPLIES = {
    "right-then-example": (f"{fenced(RIGHT_DEF)}\nExample:\n{EXAMPLE}", True),
    "example-then-right": (
        "Usage:\n" + fenced(">>> truncate_number(3.5)\n0.5\n") + "\nCode:\n" + fenced(RIGHT_DEF),
        True,
    ),
    "corrected": (f"First try:\n{fenced(WRONG_DEF)}\nThat fails for 3.5. Fixed:\n{fenced(RIGHT_DEF)}", True),
    "right-then-tests": (fenced(RIGHT_DEF) + "\n" + fenced(TESTS), True),
    "capitalised-tag": (fenced(RIGHT_DEF, "Python"), True),
    "indented-in-list": (
        "1. The function:\n" + "".join(f"   {line}\n" for line in fenced(RIGHT_DEF).splitlines()),
        True,
    ),
    "shell-block-first": (fenced("pip install nothing\n", "bash") + "\nThen:\n" + fenced(RIGHT_DEF), True),
    "fence-on-code-line": (fenced(RIGHT_DEF.rstrip()), True),
    "body-then-example": (fenced("    return number % 1.0\n") + "\n" + EXAMPLE, True),
    "unfenced-definition": (RIGHT_DEF, True),
    "right-then-simplified-wrong": (f"{fenced(RIGHT_DEF)}\nSimpler:\n{fenced(WRONG_DEF)}", False),
    "wrong-then-example": (f"{fenced(WRONG_DEF)}\nExample:\n{EXAMPLE}", False),
    "right-only-in-thinking": (f"<think>{fenced(RIGHT_DEF)}</think>\n{fenced(WRONG_DEF)}", False),
    "helper-only": (fenced("def helper(number):\n    return number % 1.0\n"), False),
    "wrong-body-then-example": (fenced("    return number\n") + "\n" + EXAMPLE, False),
    "unfenced-wrong-definition": (WRONG_DEF, False),
}


@pytest.mark.parametrize(("reply", "passes"), list(HUMANEVAL_REPLIES.values()), ids=list(HUMANEVAL_REPLIES))
def test_the_block_that_defines_the_entry_point_is_scored(reply: str, passes: bool):
    assert run(TRUNCATE, reply).passed == passes


@pytest.mark.parametrize(
    "statements",
    [
        "while True:\n    pass",  # CPU loop
        "import time\ntime.sleep(60)",  # wall clock
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",  # fork bomb
        "hog = bytearray(8 << 30)",  # large allocation
    ],
    ids=["infinite-loop", "sleep", "fork-bomb", "large-allocation"],
)
def test_runaway_programs_are_stopped_and_score_0(statements: str):
    began = time.monotonic()
    outcome = run(TRUNCATE, body(statements))
    assert not outcome.passed
    assert time.monotonic() - began < LIMITS.wall_seconds + 5


@pytest.mark.sandbox_user_alone  # looks for any sandboxed program on the host: no other test's beside it
def test_a_fork_bomb_leaves_no_process_behind():
    run(
        TRUNCATE,
        body("import os\nfor _ in range(10000):\n    try:\n        os.fork()\n    except OSError:\n        pass"),
    )
    time.sleep(0.5)
    leftover = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _is_sandboxed(p)]
    assert leftover == []


def _is_sandboxed(proc: Path) -> bool:
    try:
        return b"program.py" in (proc / "cmdline").read_bytes()
    except OSError:
        return False


def test_a_connection_attempt_never_reaches_the_host(tmp_path: Path):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(1.0)
        port = server.getsockname()[1]
        outcome = run(
            TRUNCATE, body(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).send(b'x')")
        )
        with pytest.raises(socket.timeout):
            server.accept()
    assert not outcome.passed  # and the listening socket above never accepted anything


def test_a_write_outside_the_work_folder_does_not_happen(tmp_path: Path):
    marker = tmp_path / f"escaped-{uuid.uuid4().hex}"
    in_tmp = Path("/tmp") / f"escaped-{uuid.uuid4().hex}"
    outcome = run(TRUNCATE, body(f"open({str(marker)!r}, 'w').write('x')"))
    assert not outcome.passed and not marker.exists()
    # /tmp inside is the sandbox's own tmpfs: the program may write there, the host never sees it.
    inside = run(TRUNCATE, body(f"open({str(in_tmp)!r}, 'w').write('x')"))
    assert inside.passed and not in_tmp.exists()


def test_environment_secrets_are_not_readable(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LOOPEVAL_TEST_SECRET", "hunter2")
    # The completion is right only if it can see the secret: contained, it scores 0.
    outcome = run(TRUNCATE, body("import os\nassert os.environ.get('LOOPEVAL_TEST_SECRET', '').startswith('hunt')"))
    assert not outcome.passed and "hunter2" not in outcome.output
    spy = run(TRUNCATE, body("import os\nprint(sorted(os.environ))\nprint(open('/proc/1/environ').read())"))
    assert "LOOPEVAL_TEST_SECRET" not in spy.output and "hunter2" not in spy.output


def test_without_bubblewrap_it_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on the PATH
    sandbox.check_available.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxUnavailable) as info:
            sandbox.check_available()
        assert "bubblewrap" in str(info.value) and "\n" not in str(info.value)
        with pytest.raises(sandbox.SandboxUnavailable):
            humaneval.passes(humaneval.prompt(TRUNCATE, "humaneval"), ModelResponse(text=["    return 0.5\n"]))
    finally:
        sandbox.check_available.cache_clear()


NON_ROOT_CHECK = """
import os, socket, sys
sys.path.insert(0, {modules!r})
from suites import sandbox
assert os.getuid() != 0
limits = sandbox.Limits(wall_seconds=4, cpu_seconds=2)
check = "loopeval_program()\\n"
ok = sandbox.run_check("import os\\ndef f():\\n    print(os.getuid(), sorted(os.environ))\\n", "f", check, limits)
assert ok.passed and "['HOME', 'LANG', 'PATH', 'PWD']" in ok.output, ok
userns = "import ctypes\\ndef f():\\n    assert ctypes.CDLL(None).unshare(0x10000000) == 0\\n"
assert not sandbox.run_check(userns, "f", check, limits).passed, "a user namespace inside"
with socket.socket() as server:
    server.bind(("127.0.0.1", 0)); server.listen(); server.settimeout(1.0)
    code = "import socket\\ndef f():\\n    socket.create_connection(('127.0.0.1', %d), timeout=2)\\n" % server.getsockname()[1]
    assert not sandbox.run_check(code, "f", check, limits).passed
    try:
        server.accept()
        raise SystemExit("a connection reached the host")
    except socket.timeout:
        pass
assert not sandbox.run_check("while True: pass", "f", check, limits).passed
print("non-root sandbox ok")
"""


def test_the_user_namespace_sandbox_of_a_non_root_caller(tmp_path: Path):
    """As root, the same checks run once more as `nobody` with the system Python: the non-root path.

    The sandbox's modules are copied to a folder `nobody` can read, wherever the checkout lies."""
    import os
    import shutil
    import subprocess

    if os.geteuid() != 0 or shutil.which("setpriv") is None or not Path("/usr/bin/python3").is_file():
        pytest.skip("needs root, setpriv and /usr/bin/python3 to act as a non-root caller")
    modules = Path(tempfile.mkdtemp(prefix="loopeval-test-modules-", dir="/tmp"))
    try:
        (modules / "suites").mkdir()
        for name in ("__init__.py", "sandbox.py", "sandbox_inside.py"):
            shutil.copy(Path(sandbox.__file__).with_name(name), modules / "suites" / name)
        for path in (modules, modules / "suites", *(modules / "suites").iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c"]
        done = subprocess.run([*drop, NON_ROOT_CHECK.format(modules=str(modules))], cwd="/", capture_output=True,
                              text=True, timeout=60)  # fmt: skip
    finally:
        shutil.rmtree(modules)
    assert done.returncode == 0 and "non-root sandbox ok" in done.stdout, done.stderr
