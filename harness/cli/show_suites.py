"""`loopeval suites`: the suites `loopeval run --suite` accepts, one per line."""

from __future__ import annotations

import typer


def suites() -> None:
    """The suites `loopeval run --suite` accepts, one per line."""
    from suites.registry import list_suites

    for name, description in list_suites().items():
        typer.echo(f"{name}  {description}")
