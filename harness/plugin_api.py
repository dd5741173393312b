"""The names a plugin adapter may import: loopeval's promise to plugins, kept whatever moves inside.

A plugin that imports from anywhere else (`adapters.engine.io.tokenizer`, say) relies on where a name happens to live
today, and an internal move breaks it, as one did when the tokenizer moved to `adapters.engine.io`. Every name below
stays importable from here; the scaffold `loopeval adapter new` writes (`adapters/scaffold`) imports only these, and
`tests/harness/test_plugin_api.py` loads a plugin that imports nothing else of loopeval's and checks it with the kit.

- The contract (`adapters.base`): `Adapter` (what loopeval calls), `Sampling` in, `Generation` out, `Prompt`,
  `AdapterError` (a problem the user can fix: one line, exit 2), `PAPER_PROTOCOL`; the optional `Scheduling` extra
  (whole workloads) with its `Request` and `Finished`; `MEMORY_KEYS` and `OPTIONAL_MEMORY_KEYS`, what `memory()`
  reports.
- The registry (`adapters.registry`): `register` a prefix; `load`, `inspect` and `resolve` other specs, e.g. to
  wrap a built-in model as the scaffold wraps `preset:qwen3-tiny`.
- The character tokenizer (`adapters.engine.io.tokenizer`): `char_tokenizer()` and its `CHAR_VOCAB_SIZE`, a
  transformers tokenizer made without any download, for token-level models without a tokenizer of their own.
- The conformance kit (`harness.conformance`): `check_adapter`, its `ConformanceReport` and `ConformanceError`.
"""

from __future__ import annotations

from adapters.base import (
    PAPER_PROTOCOL,
    Adapter,
    AdapterError,
    Finished,
    Generation,
    Prompt,
    Request,
    Sampling,
    Scheduling,
)
from adapters.engine.io.tokenizer import CHAR_VOCAB_SIZE, char_tokenizer
from adapters.registry import inspect, load, register, resolve
from harness.conformance import ConformanceError, ConformanceReport, check_adapter
from measures import MEMORY_KEYS, OPTIONAL_MEMORY_KEYS

__all__ = [
    "CHAR_VOCAB_SIZE",
    "MEMORY_KEYS",
    "OPTIONAL_MEMORY_KEYS",
    "PAPER_PROTOCOL",
    "Adapter",
    "AdapterError",
    "ConformanceError",
    "ConformanceReport",
    "Finished",
    "Generation",
    "Prompt",
    "Request",
    "Sampling",
    "Scheduling",
    "char_tokenizer",
    "check_adapter",
    "inspect",
    "load",
    "register",
    "resolve",
]
