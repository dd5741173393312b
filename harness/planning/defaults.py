"""What `loopeval run` runs where the user gives nothing: each suite's sampling, the default job's sweeps (the lab's,
the headline's, the exit sweep and the memory levers), the exit criterion, and the names of the KV axis.

Light (no harness type, no evaluation stack), so the options table (`harness.planning.options`) can quote these
defaults in its help and `harness.planning.spec` can fill them in.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from adapters.base import EXIT_CRITERIA, PAPER_PROTOCOL, Sampling
from suites import synthetic

# Sampling where the user gave none, per suite. Synthetic answers are a few characters, so the
# paper's sampling with a short budget, and two samples per problem rather than the paper's four: with
# 200 problems per task the spread between problems dominates pass@1's standard error, so samples 3
# and 4 would narrow the default job's intervals by about 8% for twice its decoding (docs/benchmarks.md,
# "Threads and a busy machine"). `--samples 4` gives the paper's n.
SUITE_SAMPLING: dict[str, Sampling] = {
    "synthetic": dataclasses.replace(PAPER_PROTOCOL, max_new_tokens=synthetic.GENERATION_SIZE, n=2),
    "paper": PAPER_PROTOCOL,
}


@dataclass(frozen=True)
class RunDefaults:
    """The default `loopeval run`'s headline sweep: the trained tiny zoo on the synthetic suite (its time, measured
    with the date: docs/reference.md and docs/benchmarks.md)."""

    models: tuple[str, ...] = ("zoo:qwen3-tiny-small", "zoo:qwen3-tiny-deep", "zoo:ouro-tiny", "zoo:melt-tiny")
    suite: str = "synthetic"
    loops: tuple[int, ...] = (1, 2, 4, 8)
    limit: int | None = None  # docs per task: all of them
    batch_size: int = 32


DEFAULTS = RunDefaults()


@dataclass(frozen=True)
class LabDefaults:
    """The recurrence-lab sweep the default `loopeval run` adds before its headline sweep, so that the default
    report's depth-extrapolation figure shows the lab zoo (BaseLoop, its conditioned variants, the CoreLoop and
    the Huginn-style model trained with sampled recurrence, all at T = 4 or a mean of 4) at every r from 1 to 3T.
    Greedy on the first 20 docs of each task, and a set of its own, never compared with the headline's sampled
    points."""

    models: tuple[str, ...] = (
        "zoo:lab-baseloop",
        "zoo:lab-history",
        "zoo:lab-loopgate",
        "zoo:lab-history-loopgate",
        "zoo:lab-coreloop",
        "zoo:lab-huginn",
    )
    loops: tuple[int, ...] = tuple(range(1, 13))
    limit: int = 20
    temperature: float = 0.0
    samples: int = 1

    def options(self) -> dict[str, Any]:
        """As `RunSpec.build` keywords."""
        return dataclasses.asdict(self)


LAB = LabDefaults()


@dataclass(frozen=True)
class ExitDefaults:
    """The exit sweep the default `loopeval run` adds after its headline sweep, in the headline's set (same suite,
    sampling and docs): the Ouro and MELT tiny models at their trained T = 4 with the exit gate's threshold swept,
    so that the first report a user opens draws accuracy against the loops a token ran beside accuracy against
    memory. Each token stops at the first loop whose cumulative exit probability reaches the threshold and skips
    the rest (`adapters.engine.exits`). No 1.0: it runs every loop, the same tokens as the headline's run at r = 4,
    which the figures draw as each line's full-depth end (`dashboards.cost_figures.accuracy_vs_compute`)."""

    models: tuple[str, ...] = ("zoo:ouro-tiny", "zoo:melt-tiny")
    loops: tuple[int, ...] = (4,)
    exit_thresholds: tuple[float, ...] = (0.5, 0.7, 0.9)

    def options(self) -> dict[str, Any]:
        """As `RunSpec.build` keywords."""
        return dataclasses.asdict(self)


EXITS = ExitDefaults()


@dataclass(frozen=True)
class LeverDefaults:
    """The memory-lever sweep the default `loopeval run` adds after its exit sweep, in the headline's set: the Ouro tiny
    model at its trained T = 4 under the training-free sharing of the Ouro and MELT papers (`shared-last`,
    `shared-mean`), each in the model's dtype and in int8, and the Ouro, MELT and Qwen3 tiny models in int8 under their
    own KV, so that the first report's "Memory levers" figure sets what memory each lever saves against what it costs,
    beside MELT's trained gate. Ouro's own per-loop KV in its own dtype is the headline's run at r = 4, the reference
    every lever saves against (`analysis.points.lever_points`), so it is not decoded again, as the exit sweep does
    not decode threshold 1.0 again. Three specs: a policy is a looped per-loop model's lever, a dtype every model's, and
    the model trained to share: `zoo:melt-tiny-last` holds shared-last's one row per layer and token (its gate keeps the
    last loop's K/V) but was trained to decode that way (converted from ouro-tiny chunk-wise), so training-free and
    trained sharing sit side by side at about the same bytes (docs/findings.md)."""

    shared: tuple[str, ...] = ("zoo:ouro-tiny",)
    policies: tuple[str, ...] = ("shared-last", "shared-mean")
    dtypes: tuple[str, ...] = ("auto", "int8")
    quantized: tuple[str, ...] = ("zoo:ouro-tiny", "zoo:melt-tiny", "zoo:qwen3-tiny-small")
    trained: tuple[str, ...] = ("zoo:melt-tiny-last",)
    loops: tuple[int, ...] = (4,)

    def options(self) -> list[dict[str, Any]]:
        """As `RunSpec.build` keywords, one dict per spec."""
        return [
            dict(models=self.shared, loops=self.loops, kv_policies=self.policies, kv_dtypes=self.dtypes),
            dict(models=self.quantized, loops=self.loops, kv_dtypes=("int8",)),
            dict(models=self.trained, loops=self.loops),
        ]


LEVERS = LeverDefaults()


DEFAULT_EXIT_CRITERION = EXIT_CRITERIA[0]  # Ouro's learned exit gate
