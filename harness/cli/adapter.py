"""`loopeval adapter new NAME [--dir DIR]` and `loopeval adapter check SPEC`: add a model, then check it.

`new` writes a package that registers the prefix NAME and passes its own conformance test unchanged;
`check` runs the conformance kit (harness.conformance) on any spec, built-in or plugin, and exits 1 if
a check fails.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from harness.cli.common import AdaptersDirOption, TrustRemoteCodeFlag
from harness.hints import env_command


CHECKOUT = Path(__file__).resolve().parents[2]  # loopeval's source folder when it runs from one (an editable install)


def default_parent(cwd: Path, checkout: Path = CHECKOUT) -> Path:
    """Where `adapter new` writes without --dir: the current folder, unless that is inside loopeval's own source
    checkout, whose tree a user's package must not land in: then the folder beside it, as the docs' `--dir ..`."""
    inside = (checkout / "pyproject.toml").is_file() and (cwd == checkout or checkout in cwd.parents)
    return checkout.parent if inside else cwd


def new(
    name: str = typer.Argument(..., help="The adapter's spec prefix (lowercase letters, digits, _), e.g. myarch."),
    directory: str | None = typer.Option(
        None,
        "--dir",
        help="Where to write the package folder loopeval-NAME/. "
        "Default: here, or beside loopeval's source folder when here is inside it.",
    ),
) -> None:
    """Write a working adapter package: module, entry-point stanza, README and a conformance test."""
    from adapters.scaffold import write_scaffold

    here = Path.cwd()
    parent = Path(directory) if directory is not None else default_parent(here)
    root = write_scaffold(name, parent)
    typer.echo(
        f"wrote {root}"
        + (
            ""
            if directory is not None or parent == here
            else " (beside loopeval's source folder, not inside it; --dir picks another)"
        )
    )
    # Every step runs in the package's folder, and its first run stores into the package's own database, as
    # docs/adding-adapters.md does: a run in the folder typed in (the checkout, often) would put the new adapter's
    # zeros in that folder's results, where `loopeval results` then opens.
    steps = " && ".join(next_steps(name, env_command("python"), env_command("loopeval")))
    typer.echo(f"next: (cd {shlex.quote(str(root))} && {steps})")


def next_steps(name: str, python: str = "python", loopeval: str = "loopeval") -> list[str]:
    """The README's "Add your model" steps after `cd loopeval-NAME`: install, test, a first run, its results.

    With the defaults they read as the README prints them (tests/e2e/test_scaffold.py holds the two equal);
    `new` passes this environment's python and loopeval, so its `next:` line runs as printed."""
    pip = "pip" if python == "python" else f"{python} -m pip"
    db = f"sqlite:///{name}.db"
    return [
        f"{pip} install --no-deps --no-build-isolation -e .",
        f"{python} -m pytest",
        f"{loopeval} run --model {name}:tiny --tasks lookup --limit 2 --samples 1 --db {db}",
        f"{loopeval} results --db {db}",
    ]


def check(
    spec: str = typer.Argument(..., help="Model spec to check, e.g. myarch:tiny or transformers:/path/to/model."),
    bridge: bool = typer.Option(
        True, "--bridge/--no-bridge", help="Also run 2 synthetic docs through the LightEval bridge."
    ),
    max_new_tokens: int = typer.Option(
        12, "--max-new-tokens", help="New tokens per check generation (fewer is faster)."
    ),
    adapters_dir: AdaptersDirOption = None,
    trust_remote_code: TrustRemoteCodeFlag = False,
) -> None:
    """Run the conformance kit on SPEC and print one line per check; exit 1 if any check fails."""
    from rich.console import Console
    from rich.text import Text

    from adapters.registry import load, load_plugins
    from harness.conformance import check_adapter

    load_plugins(adapters_dir or ())
    console = Console(stderr=True)
    with console.status(Text(f"loading {spec}")):  # Text: a spec such as `x:[/b]` is not console markup
        adapter = load(spec, trust_remote_code=True) if trust_remote_code else load(spec)
    with console.status("checking") as status:
        report = check_adapter(
            adapter,
            bridge=bridge,
            strict=False,
            max_new_tokens=max_new_tokens,
            progress=lambda name: status.update(f"checking {name}"),
        )
    typer.echo(str(report))
    if not report.ok:
        raise typer.Exit(1)
