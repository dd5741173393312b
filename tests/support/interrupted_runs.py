"""The sweep the interrupt tests stop part-way (local executor and Ray)."""

from __future__ import annotations

from pathlib import Path


SAMPLES = 80  # 2 tasks x 40 items, one sample each


def one_at_a_time(folder: Path) -> Path:
    """A sweep of `SAMPLES` samples that the engine decodes one sequence at a time (`max_batch = 1`), so they
    are committed one by one, about 15 ms apart at r = 8 on an idle machine: an interrupt sent after the
    third lands with most of them still to come (at 20 samples and r = 2 the run once stored them all first)."""
    path = folder / "sweep.toml"
    path.write_text(
        'models = [{ spec = "preset:ouro-tiny", overrides = { max_batch = 1 } }]\n'
        'loops = [8]\ntasks = ["addition", "chain2"]\nlimit = 40\nsamples = 1\nmax_new_tokens = 16\n'
    )
    return path
