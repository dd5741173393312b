"""`loopeval dashboard --serve` under hostile requests: refused with 4xx, no stack trace, and still serving.

The real command serves a real SQLite database; requests go over a real socket with `http.client`,
which sends paths and Host headers exactly as written (no normalising). After each hostile request
the test asks for a valid callback and the page again, so a server that fell over is caught at once.
"""

from __future__ import annotations

import http.client
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from dashboards.app import APP_HEADERS, INPUT_CHECKS, MAX_REQUEST_BYTES, create_app
from db.store import Store
from harness.planning.spec import RunSpec

from tests.support.browser import served_process

pytestmark = pytest.mark.slow  # starts the real server: the fast tier (-m 'not slow') skips it

CALLBACK = "/_dash-update-component"
# As the browser sends it: an input whose property is unset comes without "value", and there is no "state".
DEPTH = {
    "output": "depth.figure",
    "outputs": {"id": "depth", "property": "figure"},
    "changedPropIds": [],
    "inputs": [{"id": "depth-set", "property": "value", "value": None}, {"id": "refresh", "property": "n_intervals"}],
}
ACCURACY_INPUTS = {"set": None, "task": None, "models": ["preset:qwen3-tiny"], "loops": [1], "measure": "kv_bytes_allocated",
                   "context": 512, "refresh": None}  # fmt: skip


def accuracy(**values: object) -> dict:
    """The accuracy callback's request as the browser sends it, with some input values replaced."""
    inputs = {**ACCURACY_INPUTS, **values}
    return {"output": "..answer.children...accuracy-memory.figure...accuracy-loops.figure..",
            "outputs": [{"id": "answer", "property": "children"}, {"id": "accuracy-memory", "property": "figure"},
                        {"id": "accuracy-loops", "property": "figure"}],
            "inputs": [{"id": key, "property": "n_intervals" if key == "refresh" else "value", "value": value}
                       for key, value in inputs.items()],
            "changedPropIds": [], "state": []}  # fmt: skip


def depth(**fields: object) -> dict:
    return {**DEPTH, **fields}


def choices(measure: object) -> dict:
    """The set filter's request, which carries the measure selected as state."""
    names = [
        ("models", "options"),
        ("models", "value"),
        ("loops", "options"),
        ("loops", "value"),
        ("measure", "options"),
        ("measure", "value"),
    ]
    return {
        "output": ".." + "...".join(f"{c}.{p}" for c, p in names) + "..",
        "outputs": [{"id": c, "property": p} for c, p in names],
        "changedPropIds": [],
        "inputs": [{"id": "set", "property": "value", "value": None}],
        "state": [{"id": "measure", "property": "value", "value": measure}],
    }


MALFORMED: dict[str, bytes | object] = {
    "not-json": b"{not json",
    "deeply-nested-json": b"[" * 200_000,
    "json-array": [],
    "json-string": "depth.figure",
    "empty-object": {},
    "no-output": {k: v for k, v in DEPTH.items() if k != "output"},
    "unknown-output": depth(output="secrets.figure"),
    "output-a-number": depth(output=5),
    "outputs-of-another-callback": depth(outputs={"id": "samples", "property": "data"}),
    "inputs-a-string": depth(inputs="depth-set"),
    "inputs-numbers": depth(inputs=[1, 2]),
    "inputs-missing": depth(inputs=[]),
    "input-without-id": depth(inputs=[{"property": "value", "value": None}, DEPTH["inputs"][1]]),
    "unset-verdict": {"output": "..samples.data...sample-count.children..",  # None is no verdict
                      "outputs": [{"id": "samples", "property": "data"}, {"id": "sample-count", "property": "children"}],
                      "inputs": [{"id": "sample-task", "property": "value"}, {"id": "sample-model", "property": "value"},
                                 {"id": "sample-verdict", "property": "value"}, {"id": "refresh", "property": "n_intervals"}],
                      "changedPropIds": []},
    "input-of-another-component": depth(inputs=[{"id": "run", "property": "value", "value": 1}, DEPTH["inputs"][1]]),
    "state-a-string": depth(state="x"),
    "state-unknown-measure": choices("rm -rf"),
    "state-of-another-component": {**choices(None), "state": [{"id": "run", "property": "value", "value": 1}]},
    "changed-ids-a-number": depth(changedPropIds=5),
    "set-id-a-list": depth(inputs=[{"id": "depth-set", "property": "value", "value": [1]}, DEPTH["inputs"][1]]),
    "context-a-word": accuracy(context="abc"),
    "context-1e300": accuracy(context=1e300),
    "models-a-number": accuracy(models=5),
    "loops-words": accuracy(loops=["x"]),
    "loops-beyond-64-bit": accuracy(loops=[10**30]),
    "measure-unknown": accuracy(measure="rm -rf"),
    "set-an-object": accuracy(set={"$ne": None}),
    "run-beyond-64-bit": {"output": "memory-run.figure", "outputs": {"id": "memory-run", "property": "figure"},
                          "inputs": [{"id": "run", "property": "value", "value": 10**30},
                                     {"id": "refresh", "property": "n_intervals", "value": None}],
                          "changedPropIds": [], "state": []},
    "verdict-unknown": {"output": "..samples.data...sample-count.children..",
                        "outputs": [{"id": "samples", "property": "data"}, {"id": "sample-count", "property": "children"}],
                        "inputs": [{"id": "sample-task", "property": "value", "value": None},
                                   {"id": "sample-model", "property": "value", "value": None},
                                   {"id": "sample-verdict", "property": "value", "value": "everything"},
                                   {"id": "refresh", "property": "n_intervals", "value": None}],
                        "changedPropIds": [], "state": []},
}  # fmt: skip
TRAVERSALS = [
    "/_dash-component-suites/dash/../../../../../../etc/passwd",
    "/_dash-component-suites/dash/..%2f..%2f..%2f..%2fetc%2fpasswd",
    "/_dash-component-suites/os/path.py",
    "/_dash-component-suites/dash/dcc/not-there.js",
    "/../../../../etc/passwd",
    "/%2e%2e/%2e%2e/etc/passwd",
    "/assets/../../etc/passwd",
    "/etc/passwd",
]


@pytest.fixture(scope="module")
def db_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A loopeval database with one finished run and one sample."""
    path = tmp_path_factory.mktemp("served") / "results.sqlite"
    store = Store.open(str(path))
    spec = RunSpec.build(
        models=["preset:qwen3-tiny"], tasks=["lookup"], loops=[1], samples=1, max_new_tokens=1, limit=1
    )
    run = store.create_run(sweep_id="served", model_spec="preset:qwen3-tiny", adapter="preset", suite="synthetic",
                           spec=spec.to_dict())  # fmt: skip
    store.add_samples(run, [dict(task="lookup", doc_id="0", sample_index=0, prompt="p", output="o")])
    store.finish_run(run, "finished")
    store.close()
    return f"sqlite:///{path}"


@pytest.fixture(scope="module")
def server(db_url: str) -> Iterator[tuple[str, int, int]]:
    """The served app: (host, port, pid), allowing one extra host name."""
    with served_process(db_url, "--allowed-host", "dash.lab.internal") as (url, process):
        parts = urlsplit(url)
        yield parts.hostname, parts.port, process.pid


def request(
    server: tuple[str, int, int],
    method: str,
    path: str,
    body: bytes | None = None,
    host: str | None = "default",
    content_type: str = "application/json",
) -> tuple[int, dict[str, str], bytes]:
    """One request exactly as written (path and Host untouched); `host=None` sends no Host header."""
    address, port, _ = server
    connection = http.client.HTTPConnection(address, port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        if host is not None:
            connection.putheader("Host", f"127.0.0.1:{port}" if host == "default" else host)
        if body is not None:
            connection.putheader("Content-Type", content_type)
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def post(server: tuple[str, int, int], payload: bytes | object) -> tuple[int, dict[str, str], bytes]:
    return request(server, "POST", CALLBACK, payload if isinstance(payload, bytes) else json.dumps(payload).encode())


def assert_refused(answer: tuple[int, dict[str, str], bytes], low: int = 400, high: int = 499) -> None:
    status, headers, body = answer
    assert low <= status <= high, (status, body[:300])
    assert b"Traceback" not in body and b'File "' not in body and b"Exception" not in body, body[:500]
    assert_secure(headers)


def assert_secure(headers: dict[str, str]) -> None:
    for name, value in APP_HEADERS.items():
        assert headers.get(name) == value, f"{name} missing on this response"


def assert_still_serving(server: tuple[str, int, int]) -> None:
    status, headers, body = post(server, DEPTH)
    assert status == 200 and b'"depth"' in body, body[:300]
    status, headers, body = request(server, "GET", "/")
    assert status == 200 and b"_dash-config" in body, body[:300]
    assert_secure(headers)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_every_input_of_every_callback_has_a_value_check(db_url: str) -> None:
    app = create_app(db_url)
    inputs = {
        f"{i['id']}.{i['property']}" for spec in app.callback_map.values() for i in [*spec["inputs"], *spec["state"]]
    }
    assert inputs == set(INPUT_CHECKS), "a callback input without a check is refused; a check without an input is dead"


def test_valid_requests_are_answered_with_the_security_headers(server: tuple[str, int, int]) -> None:
    assert_still_serving(server)
    status, headers, body = post(server, accuracy())
    assert status == 200 and b"accuracy-memory" in body
    status, _, body = post(server, choices("kv_bytes_allocated"))  # a callback with state
    assert status == 200 and b'"measure"' in body, body[:300]
    assert_secure(headers)
    for path in ("/_dash-layout", "/_dash-dependencies", "/_favicon.ico"):
        status, headers, _ = request(server, "GET", path)
        assert status == 200, path
        assert_secure(headers)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:80", "127.0.0.1.evil.example", "localhost.evil.example",
                                  "[::1", "", "dash.lab.internal.evil.example", "127.0.0.1@evil.example", "x@127.0.0.1"])  # fmt: skip
def test_a_foreign_host_header_is_refused(server: tuple[str, int, int], host: str) -> None:
    """A DNS-rebinding page sends its own name as the Host: the app answers only its own names."""
    assert_refused(request(server, "GET", "/", host=host), 400, 400)
    assert_refused(request(server, "POST", CALLBACK, json.dumps(DEPTH).encode(), host=host), 400, 400)
    assert_still_serving(server)


def test_no_host_header_is_refused_and_the_allowed_ones_are_answered(server: tuple[str, int, int]) -> None:
    assert_refused(request(server, "GET", "/", host=None), 400, 400)
    port = server[1]
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}", "dash.lab.internal:8080"):
        status, headers, _ = request(server, "GET", "/", host=host)
        assert status == 200, host
        assert_secure(headers)


def test_a_100_mb_body_is_refused_with_413_and_not_read(server: tuple[str, int, int]) -> None:
    """The body is refused from its Content-Length: the server does not read (or hold) 100 MB."""
    address, port, pid = server
    before = rss_bytes(pid)
    with socket.create_connection((address, port), timeout=30) as sock:
        size = 100_000_000
        sock.sendall(
            f"POST {CALLBACK} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {size}\r\n\r\n".encode()
            + b"[" * (1 << 20)
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert rss_bytes(pid) - before < 50_000_000
    just_over = json.dumps({**DEPTH, "padding": "x" * MAX_REQUEST_BYTES}).encode()
    assert_refused(post(server, just_over), 413, 413)
    assert_still_serving(server)


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_callback_is_400_without_a_stack_trace(server: tuple[str, int, int], name: str) -> None:
    assert_refused(post(server, MALFORMED[name]), 400, 400)
    assert_still_serving(server)


def test_wrong_methods_and_content_types_are_4xx(server: tuple[str, int, int]) -> None:
    assert_refused(request(server, "GET", CALLBACK))
    assert_refused(request(server, "PUT", CALLBACK, json.dumps(DEPTH).encode()))
    assert_refused(request(server, "POST", CALLBACK, json.dumps(DEPTH).encode(), content_type="text/plain"))
    assert_refused(request(server, "DELETE", "/"))
    assert_still_serving(server)


@pytest.mark.parametrize("path", TRAVERSALS)
def test_a_path_outside_the_app_is_404_and_no_file_leaks(server: tuple[str, int, int], path: str) -> None:
    status, headers, body = request(server, "GET", path)
    assert_refused((status, headers, body), 404, 404)
    assert b"root:" not in body and b"import " not in body
    assert_still_serving(server)


def test_the_server_answers_after_a_burst_of_hostile_requests(server: tuple[str, int, int]) -> None:
    began = time.monotonic()
    for payload in list(MALFORMED.values()) * 3:
        assert 400 <= post(server, payload)[0] < 500
    assert_still_serving(server)
    assert time.monotonic() - began < 60


def test_a_database_damaged_while_served_is_named_in_one_line(results_url: str) -> None:
    """A hand edit while the app serves: the damaged run is left out, named once in the log and on the page, and
    the views still draw the others; a database file that stops being one is a 503 with its one-line error."""
    path = Path(results_url.removeprefix("sqlite:///"))
    with served_process(results_url) as (url, process):
        server = (urlsplit(url).hostname, urlsplit(url).port, process.pid)
        assert post(server, DEPTH)[0] == 200
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE runs SET sampling = '{\"temperature\": ' WHERE id = 1")
        conn.close()
        for _ in range(2):
            status, _, body = post(server, accuracy(models=["zoo:ouro-tiny"], loops=[1, 2]))
            assert status == 200 and b'"accuracy-memory"' in body, body[:300]
        status, _, body = request(server, "GET", "/_dash-layout")
        line = f"run 1 skipped: runs.sampling is not valid JSON ({results_url})"
        assert status == 200 and line in str(json.loads(body)), body[:300]  # in the layout: JSON escapes its slashes
        path.write_bytes(b"this is no longer a database" * 100)
        status, headers, body = request(server, "GET", "/_dash-layout")
        assert status == 503 and body.decode().startswith(f"database {results_url}: "), body[:300]
        assert len(body.decode().splitlines()) == 1 and b"Traceback" not in body
        assert_secure(headers)
    log = process.stdout.read()
    assert "Traceback" not in log, log[-3000:]
    assert log.count(line) == 1, log[-3000:]
