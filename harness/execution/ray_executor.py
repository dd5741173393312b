"""The Ray executor (`loopeval run --executor ray`): each run of a sweep is one Ray task.

The submitting process plans the sweep as the local executor does, creates every run's row up front
(status `queued`, with the full spec) and submits one task per run with its resource request: its
GPUs (`--gpus-per-run`, at least the model's `tensor_parallel_size`), or one CPU on a cluster
without GPUs, as many CPUs as the run computes with threads (`adapters.threads`): a task computes with
the CPUs Ray gave it, OMP_NUM_THREADS and MKL_NUM_THREADS set to match before its worker starts, so
runs that share a node never ask for more cores than it has. A task opens the store by URL in its worker and runs the stored run through
`harness.execution.runner.run_one`, the local path (`_execute`, `StoreSink`): samples are committed as they
finish, so a worker that dies (killed process, lost node) leaves a resumable run, and Ray's retry of
the task resumes it without storing a sample twice. Each task gets a fresh worker process
(`max_calls=1`), so a run's RSS, CUDA and NVML peaks are its own and its GPU memory is freed after
it. The submitter polls the store for every run's status and sample count to draw the progress bars.

Ray is imported only in this module, and only when `--executor ray` is used. See
docs/architecture.md ("Executors") for what each executor guarantees.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from db.record import PlannedRun

from harness.errors import UserError
from harness.hints import env_command
from harness.execution.bars import RunBars
from harness.execution.executor import Log, Queued
from harness.execution.recorder import host_info, package_versions
from harness.execution.runner import RunOutcome, resumable_run, run_label, run_one
from harness.planning.plan import stored_spec
from harness.planning.spec import RunSpec
from harness.planning.sweep import SweepRequest

if TYPE_CHECKING:
    from harness.progress import JobProgress

    from db.store import Store

RETRIES = 3  # Ray re-runs a task whose worker died this many times; every retry resumes the run
POLL_SECONDS = 1.0  # how often the submitter reads the store's progress
CANCEL_GRACE_SECONDS = 30.0  # after Ctrl-C, how long running tasks get to mark their runs interrupted


@dataclass(frozen=True)
class Job:
    """One run as submitted: the stored run and its Ray resource request."""

    run: PlannedRun
    resources: dict[str, float]

    @property
    def run_id(self) -> int:
        return self.run.run_id

    @property
    def label(self) -> str:
        return run_label(self.run)


def run_in_worker(run_id: int, db_url: str) -> str:
    """One Ray task: run, or continue, the stored run `run_id` in this worker; returns its final status.

    A retried task finds the samples its dead predecessor committed and skips them (`run_one`).
    The run's host is rewritten with this worker's, with its pid and Ray node.
    """
    import ray

    from adapters.threads import Threads, apply
    from db.models import utcnow
    from db.store import Store

    logging.getLogger("lighteval").setLevel(logging.ERROR)
    cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)  # type: ignore[no-untyped-call]
    apply(Threads(max(1, int(cpus)), f"the {cpus:g} CPU{'' if cpus == 1 else 's'} Ray gave this task"))
    store = Store.open(db_url)
    try:
        run = store.get_run(run_id)
        if run is not None and run.status == "finished":  # the worker died after storing the whole run
            return run.status
        host = {**host_info(), "pid": os.getpid(), "ray_node": ray.get_runtime_context().get_node_id()}
        started = {"started_at": utcnow()} if run is not None and run.status == "queued" else {}
        store.update_run(run_id, host=host, versions=package_versions(), **started)
        return run_one(run_id, store, db_url, log=print).status
    finally:
        store.close()


def worker_db_url(db: str | None) -> str:
    """The store's URL as workers must open it: with its password, and a SQLite file by absolute path
    (a worker's working directory is not the submitter's)."""
    from db.session import resolve_db_url, sqlite_path

    url = resolve_db_url(db)
    path = sqlite_path(url)
    return url if path is None else f"sqlite:///{path.resolve()}"


@contextmanager
def connect(address: str | None, plugin_dirs: Sequence[str] = ()) -> Iterator[Any]:
    """The `ray` module connected to `address` (else $RAY_ADDRESS, else a new local instance); a connection opened here
    closes here. Plugin folders reach the workers through LOOPEVAL_ADAPTERS, since each worker loads its own adapter.
    """
    ray = preflight(address)
    if ray.is_initialized():  # the caller (a notebook, a test) is connected already
        yield ray
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    kwargs: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if plugin_dirs:
        from adapters.registry import ENV_VAR

        dirs = [str(Path(d).resolve()) for d in plugin_dirs] + [
            d for d in os.environ.get(ENV_VAR, "").split(os.pathsep) if d
        ]
        kwargs["runtime_env"] = {"env_vars": {ENV_VAR: os.pathsep.join(dirs)}}
    where = address or os.environ.get("RAY_ADDRESS")
    if where is None:
        kwargs["include_dashboard"] = False  # a local instance only for this sweep
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UserError(f"cannot connect to Ray at {where}: {str(exc).splitlines()[0]}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def preflight(address: str | None) -> Any:
    """The `ray` module, once the cluster at `address` (else $RAY_ADDRESS) is known to take this machine:
    Ray is installed, something listens there, its GCS accepts our token. One line (UserError) if not.

    `loopeval run` calls it before planning the sweep (which imports LightEval, seconds), so a missing Ray or
    a wrong address is told at once; `connect` calls it again (a connection opened by the caller skips it)."""
    try:
        import ray
    except ImportError:
        raise UserError("--executor ray needs Ray: pip install 'loopeval[ray]'") from None
    where = address or os.environ.get("RAY_ADDRESS")
    if where is not None and not ray.is_initialized():
        _use_token_at_hand()
        _check_reachable(where)
        _check_token(where)
    return ray


def feasible_cpus(ray: Any, cpus: int) -> int:
    """`cpus`, or fewer where no node of the cluster has that many (a task asking more would wait forever)."""
    largest = max((n["Resources"].get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)
    return max(1, min(cpus, int(largest)))


class RayExecutor:
    """The Ray executor: planned here, then every run a Ray task writing to the shared store."""

    def __init__(self, request: SweepRequest, plugin_dirs: Sequence[str] = ()) -> None:
        self.address, self.gpus_per_run, self.db = request.ray_address, request.gpus_per_run, request.db
        self.plugin_dirs = plugin_dirs
        self.ray: Any = None
        self.url = ""  # the store as workers open it (`worker_db_url`), once connected
        self.jobs: list[Job] = []

    def preflight(self) -> None:
        """Ray missing or the address wrong: told before the seconds of planning."""
        preflight(self.address)

    @contextmanager
    def connected(self) -> Iterator[None]:
        self.url = worker_db_url(self.db)
        with connect(self.address, self.plugin_dirs) as ray:
            self.ray = ray
            self.check_store(self.url)  # a SQLite file other machines cannot see fails here, before it is written
            yield

    def check_store(self, db_url: str) -> None:
        """Refuse a SQLite store when a worker could run on another machine, where that file does not exist."""
        from db.session import sqlite_path

        path = sqlite_path(db_url)
        here = socket.gethostname()
        others = {
            n["NodeManagerHostname"] for n in self.ray.nodes() if n.get("Alive") and n["NodeManagerHostname"] != here
        }
        if path is not None and others:
            raise UserError(
                f"the Ray cluster has nodes on other machines ({', '.join(sorted(others))}) but the store is the SQLite "
                f"file {path} on this one; give a Postgres URL (--db postgresql://USER@HOST/DATABASE)"
            )

    def default_gpus(self) -> float:
        """GPUs per run: as given, else one where the cluster has GPUs, else none (the run takes one CPU)."""
        if self.gpus_per_run is not None:
            return self.gpus_per_run
        return 1.0 if self.ray.cluster_resources().get("GPU", 0) > 0 else 0.0

    def prepare(self, queued: list[Queued], threads: int) -> None:
        """One job per stored run, with its resource request (each CPU run asks for as many CPUs as it has threads)."""
        gpus, cpus = self.default_gpus(), feasible_cpus(self.ray, threads)
        for q in queued:
            q.plan.loaded.clear()  # adapters loaded to plan are not needed here: every worker loads its own
            self.jobs += [Job(run, resources(q.spec, run.model, gpus, cpus)) for run in q.runs]

    def run(self, store: Store, progress: JobProgress, log: Log) -> list[RunOutcome]:
        """Submit every prepared run and wait for them."""
        if not self.jobs:  # every run was already stored finished (runner.skip_stored)
            return []
        where = self.ray.get_runtime_context().gcs_address
        log(
            f"sweep {self.jobs[0].run.sweep_id}: {len(self.jobs)} runs queued on Ray at {where}, "
            f"{_describe(self.jobs[0].resources)} each"
        )
        return self.execute(self.jobs, store, progress, log)

    def resume(self, run_id: int, store: Store, threads: int, progress: JobProgress, log: Log) -> list[RunOutcome]:
        """Continue the stopped run `run_id` as one Ray task."""
        row = resumable_run(store, run_id)
        if row.status == "finished":
            raise UserError(f"--resume {run_id}: run already finished")
        run = PlannedRun.of(row)
        job = Job(
            run, resources(stored_spec(row, self.url), run.model, self.default_gpus(), feasible_cpus(self.ray, threads))
        )
        return self.execute([job], store, progress, log)

    def execute(self, jobs: list[Job], store: Store, progress: JobProgress | None, log: Log) -> list[RunOutcome]:
        """Submit one task per job and wait for all of them, drawing progress from the store; outcomes in job order.

        Ctrl-C cancels the tasks (running ones mark their runs interrupted) and queued runs are marked
        interrupted too, so every run of the sweep can be continued with `--resume`.
        """
        refs = {self._task(job.resources).remote(job.run_id, self.url): job for job in jobs}
        ids = [job.run_id for job in jobs]
        bars = RunBars(progress, [job.run for job in jobs])
        pending = list(refs)
        try:
            while pending:
                done, pending = self.ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
                for ref in done:
                    self._settle(ref, refs[ref], store, log)
                bars.update(store.run_progress(ids))
        except KeyboardInterrupt:
            self._cancel(pending, [refs[ref] for ref in pending], store)
            raise
        final = {run_id: status for run_id, (status, _) in store.run_progress(ids).items()}
        return [RunOutcome(job.run, final[job.run_id]) for job in jobs]

    def _task(self, resources: dict[str, float]) -> Any:
        threads = str(max(1, int(resources["num_cpus"])))
        return self.ray.remote(
            max_retries=RETRIES,
            max_calls=1,
            runtime_env={"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}},
            **resources,
        )(run_in_worker)

    def _settle(self, ref: Any, job: Job, store: Store, log: Log) -> None:
        """Log how a finished task ended; a run whose last worker died is marked interrupted, ready to resume."""
        try:
            status = self.ray.get(ref)
        except (
            self.ray.exceptions.RayTaskError
        ) as exc:  # the run raised: _execute stored it as failed, unless loading did
            error = str(exc.cause if exc.cause is not None else exc).splitlines()[0]
            if store.run_progress([job.run_id])[job.run_id][0] in ("queued", "running"):
                store.finish_run(job.run_id, "failed", error=f"{type(exc.cause).__name__}: {error}")
            log(f"{job.label}: failed: {error}")
            return
        except self.ray.exceptions.RayError as exc:  # its worker died more often than Ray retries
            store.finish_run(job.run_id, "interrupted", error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            log(
                f"{job.label}: its worker died {RETRIES + 1} times; continue with: {env_command('loopeval')} run --resume {job.run_id}"
            )
            return
        log(f"{job.label}: {status}")

    def _cancel(self, refs: list[Any], jobs: list[Job], store: Store) -> None:
        """Cancel the pending tasks and store their runs as interrupted (the job's last line says how to continue)."""
        for ref in refs:
            self.ray.cancel(ref)
        self.ray.wait(refs, num_returns=len(refs), timeout=CANCEL_GRACE_SECONDS)
        states = store.run_progress(job.run_id for job in jobs)
        for job in jobs:
            if states.get(job.run_id, ("",))[0] in ("queued", "running"):
                store.finish_run(job.run_id, "interrupted", error="sweep interrupted")


AUTH_MODE_ENV = "RAY_AUTH_MODE"  # Ray's own variables: the mode, and the token itself or the file holding it
TOKEN_ENV, TOKEN_PATH_ENV = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"


def _use_token_at_hand() -> None:
    """Authenticate with Ray's token whenever one is at hand and RAY_AUTH_MODE says nothing.

    Ray 2.60 turns token authentication on for the clusters it starts (`ray.init()`; `ray start --head`
    once ~/.ray/auth_token exists), but a driver given an explicit address sends no token unless
    RAY_AUTH_MODE=token: it is refused, retrying for 20 s. Ray's own rule for a cluster it finds by itself
    (`address="auto"`) is applied here to every address; a client with a token still connects to a
    cluster without authentication. An explicit RAY_AUTH_MODE is left as it is.
    """
    try:
        from ray._private.authentication import authentication_token_setup as setup
    except ImportError:  # a Ray without token authentication
        return
    logging.getLogger(setup.__name__).setLevel(logging.ERROR)  # its note would say what the next line does
    setup.maybe_enable_token_auth_if_token_available(warn_if_disabled=False)


def _token_source() -> str:
    """Where Ray reads this machine's token from, as the error names it."""
    if os.environ.get(TOKEN_ENV):
        return TOKEN_ENV
    return os.environ.get(TOKEN_PATH_ENV) or str(Path.home() / ".ray" / "auth_token")


def auth_error(address: str) -> str:
    """The one line for a cluster that refused this machine: what is wrong here, and the settings that fix it."""
    mode = os.environ.get(AUTH_MODE_ENV)
    if mode != "token":
        why = f"{AUTH_MODE_ENV} is {mode!r} here" if mode else "this machine has no Ray token"
    else:
        why = f"it refused the token in {_token_source()}"
    return (
        f"cannot connect to Ray at {address}: the cluster requires token authentication and {why}; set "
        f"{AUTH_MODE_ENV}=token and give this machine the head's token (its ~/.ray/auth_token, or {TOKEN_ENV})"
    )


@contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 (Ray's C++ core logs there, around Python) for the length of the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _check_token(address: str) -> None:
    """Ask the cluster's GCS once whether it accepts this machine, and fail in one line if not.

    `ray.init` would retry a refused token for 20 s, logging a warning a second, and end with "Failed to
    connect" naming no cause. Ray Client addresses (ray://) and Ray's own lookups ("auto") are left to it.
    """
    if "://" in address or ":" not in address:
        return
    from ray._raylet import GcsClient  # type: ignore[attr-defined]  # the client `ray.init` itself opens first; Ray has no public one
    from ray.exceptions import AuthenticationError

    try:
        with _quiet_stderr():
            GcsClient(address=address)
    except AuthenticationError:
        raise UserError(auth_error(address)) from None
    except Exception as exc:  # no GCS there: ray.init would fail the same way, after retrying
        raise UserError(f"cannot connect to Ray at {address}: {str(exc).splitlines()[0]}") from None


def _check_reachable(address: str) -> None:
    """Fail at once on a HOST:PORT nothing listens on: Ray itself retries such an address for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():  # "auto", "local": Ray's own lookup
        return
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as exc:
        raise UserError(f"cannot connect to Ray at {address}: {exc.strerror or exc}") from None


def resources(spec: RunSpec, model: str, gpus_per_run: float, cpus: int = 1) -> dict[str, float]:
    """The Ray resource request of one run of `model`: its GPUs (at least the model's tensor-parallel size) and
    one CPU, else `cpus` CPUs (the threads it computes with)."""
    tensor_parallel = spec.model_overrides.get(model, {}).get("tensor_parallel_size", 1)
    gpus = max(
        gpus_per_run,
        float(tensor_parallel) if isinstance(tensor_parallel, (int, float)) and tensor_parallel > 1 else 0.0,
    )
    return {"num_cpus": 1, "num_gpus": gpus} if gpus else {"num_cpus": cpus}


def _describe(resources: dict[str, float]) -> str:
    gpus = resources.get("num_gpus")
    return f"{gpus:g} GPU" if gpus else f"{resources['num_cpus']:g} CPU"
