"""What several commands share: option definitions, number parsing, byte formatting and tables.

Command modules import from here and never from each other, so each command reads on its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from harness.errors import UserError

GB = 1e9  # decimal gigabytes, as the MELT paper reports them

DbOption = Annotated[
    Optional[str],
    typer.Option(
        "--db",
        help="Results database: a SQLAlchemy URL or a SQLite file path. "
        "Default: $LOOPEVAL_DB, else results/loopeval.sqlite under the working directory.",
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
AdaptersDirOption = Annotated[
    Optional[list[str]],
    typer.Option("--adapters-dir", help="Folder of adapter plugin modules, repeatable (also LOOPEVAL_ADAPTERS)."),
]
TrustRemoteCodeFlag = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Let transformers:/vllm: models run code shipped in their directory (prints a warning)."),
]
DeviceOption = Annotated[str, typer.Option("--device", help="cpu or cuda.")]
ThreadsOption = Annotated[Optional[int], typer.Option("--threads", min=1, help="torch CPU threads.")]


def parse_int_list(value: str | None, option: str, minimum: int = 1) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4], ranges included ('1-12'); UserError naming the option on anything else."""
    from harness.sweep import int_ranges

    return None if value is None else int_ranges(value, option, minimum)


def gigabytes(value: int | float | None) -> str:
    """Decimal GB with 4 significant digits, so tiny models' megabytes still show."""
    return "n/a" if value is None else f"{value / GB:.4g}"


def report_path(db_url: str) -> Path:
    """The HTML report goes beside a SQLite database file, else to results/report.html."""
    from db.session import DEFAULT_DB_PATH, sqlite_path

    path = sqlite_path(db_url)
    return (path.parent if path is not None else DEFAULT_DB_PATH.parent) / "report.html"


def check_device(device: str) -> None:
    if device not in ("cpu", "cuda"):
        raise UserError(f"--device must be cpu or cuda, got {device!r}")


def check_out_dir(path: Path, option: str) -> None:
    """UserError when `path` cannot become a writable folder; checked before training starts, creating nothing."""
    existing = path
    while not existing.exists():  # the nearest ancestor that exists ("." and "/" always do)
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{option} {path}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{option} {path}: {existing} is not writable")


def set_threads(threads: int | None) -> None:
    if threads:
        import torch

        torch.set_num_threads(threads)


def progress() -> Any:
    """The progress display of long commands: one bar per task, counts and elapsed time."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # Descriptions name models and tasks, which are stored strings: shown as written, never as console markup.
    return Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    transient=False)


def print_table(title: str | None, columns: list[str], rows: list[list[str]], right: tuple[str, ...] = (), caption: str | None = None) -> None:
    """A rich table; piped output gets the whole table (220 columns), not one squeezed to 80.

    Cells and title are `Text`, not markup: a stored model name such as `[/bold]` is printed as written
    instead of styling the table or failing it with a MarkupError.
    """
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=None if title is None else Text(title), caption=caption)
    for column in columns:
        table.add_column(column, justify="right" if column in right else "left")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    Console(width=None if sys.stdout.isatty() else 220).print(table)


def _headline(pass_at_1: dict[str, Any]) -> str:
    """The suite mean of pass@1 over benchmarks, each task group's mean, then one line per benchmark (see db.headline)."""
    def line(name: str, value: float | None) -> str:
        return f"{name} {'n/a' if value is None else f'{value:.3f}'}"

    groups = [line(f"[{name}]", value) for name, value in pass_at_1.get("groups", {}).items()]
    return "\n".join([line("mean", pass_at_1["mean"]), *groups, *(line(n, v) for n, v in pass_at_1["benchmarks"].items())])


def print_runs(runs: list[dict[str, Any]]) -> None:
    """Stored runs as a table (what `loopeval run` ends with and `loopeval results` prints)."""
    columns = ["id", "sweep", "model", "loops", "suite", "status", "samples", "pass@1 (suite mean; per benchmark)",
               "weights", "kv peak", "torch alloc peak", "nvml proc peak", "rss peak"]
    rows = []
    for r in runs:
        memory = r["memory"]
        rows.append([
            str(r["id"]), r["sweep_id"], r["model"], "-" if r["loops"] is None else str(r["loops"]), r["suite"],
            r["status"], str(r["n_samples"]), _headline(r["pass_at_1"]), gigabytes(memory.get("weights_bytes")),
            gigabytes(memory.get("kv_bytes_peak")), gigabytes(memory.get("torch_allocated_peak")),
            gigabytes(memory.get("nvml_process_peak")), gigabytes(memory.get("rss_peak")),
        ])
    print_table(None, columns, rows, right=("id", "loops", "samples"), caption="memory in GB = 1e9 bytes; n/a = source unavailable here")
