"""`loopeval dashboard`: write the static report, or serve the live app with `--serve`."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from harness.cli.common import DbOption, MkdirFlag, check_folder, report_path


def dashboard(
    db: DbOption = None,
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Where the static report goes (one offline HTML file). Default: beside the database, "
        "as `loopeval run` writes it.",
    ),
    mkdir: MkdirFlag = False,
    serve: bool = typer.Option(False, "--serve", help="Serve the live Dash app instead of writing a report."),
    host: str = typer.Option("127.0.0.1", "--host", help="Interface the app binds to (only with --serve)."),
    port: int = typer.Option(8050, "--port", min=1, max=65535, help="Port of the app (only with --serve)."),
    log_requests: bool = typer.Option(
        False, "--log-requests", help="Print one line per request the app answers (only with --serve)."
    ),
    allowed_host: list[str] | None = typer.Option(
        None,
        "--allowed-host",
        help="Another host name the app answers to (repeatable; only with --serve). By "
        "default it answers only requests naming --host (and localhost's names when that is loopback).",
    ),
) -> None:
    """Accuracy against gigabytes, memory traces, loop sweeps and samples: a report file or a served app."""
    from db.session import display_url, resolve_db_url

    url = resolve_db_url(db)
    if serve:
        from dashboards import app  # lazy: dash is heavy

        hosts = app.allowed_hosts(host, allowed_host or ())
        dash_app = app.create_app(url, hosts)  # raises ResultsError before binding when there is nothing to show
        if host not in app.LOOPBACK_NAMES:
            print(
                f"loopeval dashboard: warning: --host {host} serves the results to other machines on the network "
                "(no login); use 127.0.0.1 to keep them on this one",
                file=sys.stderr,
            )
        print(
            f"loopeval dashboard: serving {display_url(url)} at http://{host}:{port}/ to requests for {', '.join(sorted(hosts))} "
            "(--allowed-host adds a name; Ctrl+C stops)",
            flush=True,  # before serving, also into a pipe or a log file
        )
        app.serve(dash_app, host, port, log_requests)
        return
    from harness.report import write_report

    if out is not None:
        check_folder(out, "--out", mkdir)
    path = write_report(url, out or report_path(url), log=lambda line: print(line, file=sys.stderr))
    print(f"loopeval dashboard: wrote {path.resolve()}")
