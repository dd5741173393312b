"""`loopeval adapter new NAME`: write a working adapter package a user starts from.

The package registers the prefix NAME (a module calling `adapters.registry.register`), declares it
under the `loopeval.adapters` entry-point group so an installed copy is discovered, runs the tiny
engine preset underneath so it works before the user changes anything, and ships a test that runs
the conformance kit. The templates are the `*.txt` files beside this module; `$name` and `$Name`
are replaced (string.Template, so the Python braces in them need no escaping).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from string import Template

from adapters.base import AdapterError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,39}$")

# template file -> path in the generated project ($name is replaced in paths too)
FILES: dict[str, str] = {
    "pyproject.toml.txt": "pyproject.toml",
    "README.md.txt": "README.md",
    "init.py.txt": "loopeval_$name/__init__.py",
    "adapter.py.txt": "loopeval_$name/adapter.py",
    "test_adapter.py.txt": "tests/test_${name}_adapter.py",
}


def check_name(name: str) -> None:
    """NAME becomes a spec prefix and part of a Python package name, and may not shadow a registered prefix."""
    from adapters.registry import available

    if not NAME_PATTERN.match(name):
        raise AdapterError(
            f"adapter name {name!r} must be lowercase letters, digits and _, starting with a letter (it becomes the prefix NAME:)"
        )
    taken = {e.prefix: e.source for e in available()}
    if name in taken:
        raise AdapterError(f"adapter name {name!r} is already a registered prefix ({taken[name]}); pick another")


def write_scaffold(name: str, directory: str | Path = ".") -> Path:
    """Write the package `loopeval-NAME/` under `directory` and return its path; refuses to overwrite."""
    check_name(name)
    parent = Path(directory).expanduser()
    if not parent.is_dir():
        raise AdapterError(f"--dir {directory} is not an existing directory")
    root = parent / f"loopeval-{name}"
    if root.exists():
        raise AdapterError(f"{root} already exists; remove it or pass another --dir")
    values = {"name": name, "Name": "".join(part.capitalize() for part in name.split("_"))}
    templates = resources.files(__package__)
    try:
        for template, target in FILES.items():
            path = root / Template(target).substitute(values)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(Template(templates.joinpath(template).read_text()).substitute(values))
    except OSError as exc:
        raise AdapterError(f"cannot write the adapter package under {parent}: {exc.strerror or exc}") from None
    return root
