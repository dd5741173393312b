"""Values read from a checkpoint's config files (config.json, generation_config.json), each checked by type.

A config.json is someone else's file. Python's own conversions read it too kindly: `bool("false")` is True (and
silently dropped a checkpoint's own lm_head), `float("1e6")` turns text into a number, and a list of eos ids holding
text fails later, mid-run, as a traceback. Every loader reads its fields through these readers, the one home of what
a config value may be; each refusal is one AdapterError naming the file's field and the value as written.
"""

from __future__ import annotations

import math
from typing import Any

from adapters.base import AdapterError

MISSING: Any = object()  # a field with no default: absent is an error


def _get(raw: dict[str, Any], key: str, default: Any, where: str) -> Any:
    value = raw.get(key, default)
    if value is MISSING:
        raise AdapterError(f"{where} lacks field {key!r}")
    return value


def flag(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    """A JSON true or false (text such as "false" is refused, not read as true)."""
    value = _get(raw, key, default, where)
    if type(value) is not bool:
        raise AdapterError(f"{where} field {key} must be true or false, got {value!r}")
    return value


def number(raw: dict[str, Any], key: str, default: Any, where: str, low: float = 0.0) -> float:
    """A finite JSON number above `low` (text such as "1e6" is refused), as a float: an integer too large for one
    (JSON's integers have no bound; `10**400` overflows) is refused as well, shown by its digits."""
    value = _get(raw, key, default, where)
    if type(value) not in (int, float) or not low < value < math.inf or not math.isfinite(_as_float(value)):
        shown = f"an integer of {len(str(value))} digits" if type(value) is int else repr(value)
        raise AdapterError(f"{where} field {key} must be a finite number > {low:g}, got {shown}")
    return float(value)


def _as_float(value: float) -> float:
    """`value` as a float; infinity where it is too large for one."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def integer(raw: dict[str, Any], key: str, default: Any, where: str, low: int = 1) -> int:
    """A JSON integer of at least `low` (LoopConfig bounds it further)."""
    value = _get(raw, key, default, where)
    if type(value) is not int or value < low:
        what = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise AdapterError(f"{where} field {key} must be {what}, got {value!r}")
    return value


def id_list(raw: dict[str, Any], key: str, where: str) -> list[int]:
    """A token id field as a list: absent or null is [], one id [id], a list of ids the list; every id an integer >= 0."""
    value = raw.get(key)
    ids = [] if value is None else value if isinstance(value, list) else [value]
    if not all(type(i) is int and i >= 0 for i in ids):
        raise AdapterError(f"{where} field {key} must be a token id (an integer >= 0) or a list of them, got {value!r}")
    return ids


def first_id(raw: dict[str, Any], key: str, where: str) -> int | None:
    """The first of a token id field's ids (`id_list`), None when it names none."""
    ids = id_list(raw, key, where)
    return ids[0] if ids else None


def id_count(tokenizer: Any) -> int:
    """How many ids a tokenizer can produce: its largest id plus one, which is more than its size (`len`) where its
    ids skip some (a tokenizer.json mapping a token to id 500 in a vocabulary of 99 has 99 tokens)."""
    ids = tokenizer.get_vocab().values() if hasattr(tokenizer, "get_vocab") else ()
    return max(len(tokenizer), max(ids, default=-1) + 1)


def check_vocabulary(where: str, vocab_size: int, ids: dict[str, Any], tokens: int | None = None) -> None:
    """AdapterError unless every id of `ids` (name -> an id, a list of ids, or None) indexes the model's vocabulary of
    `vocab_size`, and a tokenizer's `tokens` (the ids it can produce: its largest plus one) fit in it: found at load,
    not as an index error mid-run."""
    for name, value in ids.items():
        for i in value if isinstance(value, (list, tuple, set)) else [value]:
            if i is not None and (type(i) is not int or not 0 <= i < vocab_size):
                raise AdapterError(f"{where}: {name} {i!r} is outside the model's vocabulary of {vocab_size} tokens")
    if tokens is not None and tokens > vocab_size:
        raise AdapterError(
            f"{where}: the tokenizer's ids run to {tokens - 1}, past the model's vocabulary of {vocab_size} (ids 0 to "
            f"{vocab_size - 1}): its last ids would index no embedding"
        )
