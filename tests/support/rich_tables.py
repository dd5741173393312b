"""The tables `loopeval results` prints, read back for the tests that check them."""

from __future__ import annotations


def body_rows(out: str) -> list[list[list[str]]]:
    """Each printed table's body rows as cells, in the order printed (rich's box characters stripped)."""
    tables: list[list[list[str]]] = []
    for line in out.splitlines():
        if line.startswith("┏"):
            tables.append([])
        elif line.startswith("│"):
            tables[-1].append([c.strip() for c in line.split("│")[1:-1]])
    return tables
