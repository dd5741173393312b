"""The sweep the interrupt tests stop part-way (local executor and Ray)."""

from __future__ import annotations

from pathlib import Path


def one_at_a_time(folder: Path) -> Path:
    """A sweep of 20 samples that the engine decodes one sequence at a time (`max_batch = 1`), so they
    are committed one by one and an interrupt lands while the run is under way."""
    path = folder / "sweep.toml"
    path.write_text('models = [{ spec = "preset:ouro-tiny", overrides = { max_batch = 1 } }]\n'
                    'loops = [2]\ntasks = ["addition", "chain2"]\nlimit = 10\nsamples = 1\nmax_new_tokens = 16\n')
    return path
