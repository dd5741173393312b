"""The LightEval bridge through the real LightEval pipeline: scores, sampling settings, batching, resume, choices."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from adapters.base import AdapterError, Generation, Sampling
from harness.bridge.evaluation import run_suite
from harness.bridge.records import LOGLIKELIHOOD_SAMPLE_INDEX, SampleRecord, batch_seed
from suites import synthetic
from suites.registry import load_suite
from tests.support.rounding import rounding_bound

ANSWERS = {item["prompt"]: item["answer"] for task in synthetic.TASKS for item in synthetic.load_split(task, "test")}


class ScriptedAdapter:
    """Answers synthetic prompts from the gold (or off by one), then keeps talking past the stop."""

    spec = "test:scripted"
    tokenizer = None
    max_context = 512

    def __init__(self, right_samples: set[int] | None = None) -> None:
        self.right_samples = {0, 1, 2, 3, 4, 5, 6, 7} if right_samples is None else right_samples
        self.calls: list[tuple[list[str], Sampling]] = []

    def generate(self, prompts, sampling: Sampling) -> list[Generation]:
        self.calls.append((list(prompts), sampling))
        out = []
        for prompt in prompts:
            for j in range(sampling.n):
                answer = ANSWERS[prompt] if j in self.right_samples else str(int(ANSWERS[prompt]) + 1)
                text = answer + "\n" + "9" * 5  # the bridge must cut at the stop sequence
                out.append(Generation([5] * 3, text, "length", len(prompt), 3, loops_used=[2, 3, 4]))
        return out

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise AssertionError("generation tasks never need logits")

    def memory(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {}


class MemorySink:
    """A SampleSink kept in memory: finished records per task, and everything it was told."""

    def __init__(self, stored: list[SampleRecord] = ()) -> None:
        self.stored = {(r.task, r.doc_id, r.sample_index): r for r in stored}
        self.received: list[SampleRecord] = []
        self.batches: list[tuple[str, int, int]] = []

    def finished(self, task: str) -> dict[tuple[str, int], SampleRecord]:
        return {(d, i): r for (t, d, i), r in self.stored.items() if t == task}

    def on_batch_start(self, task: str, batch_index: int, n_prompts: int) -> None:
        self.batches.append((task, batch_index, n_prompts))

    def on_records(self, records: list[SampleRecord]) -> None:
        self.received += records


@pytest.fixture(scope="module")
def configs():
    return load_suite("synthetic", tasks=["addition", "chain3"])


def test_gold_scores_one_wrong_scores_zero_and_settings_reach_generate(configs):
    adapter, sink = ScriptedAdapter(), MemorySink()
    run = Sampling(temperature=0.6, top_p=0.9, max_new_tokens=32768, n=2, seed=11, stop=("###",))
    result = run_suite(adapter, configs, run, sink=sink, limit=10, batch_size=4, progress=False)

    assert result.metrics["addition"]["pass@k:k=1&n=2"][0] == 1.0
    assert result.metrics["chain3"]["pass@k:k=1&n=2"] == (1.0, 0.0)
    assert result.metrics["all"] == {"pass@1": (1.0, None)}
    assert result.n_docs == {"addition": 10, "chain3": 10}
    assert len(result.scores) == 40 and set(result.scores.values()) == {1.0}

    # 10 docs per task in batches of at most 4: 4 + 4 + 2 per task
    assert [len(prompts) for prompts, _ in adapter.calls] == [4, 4, 2, 4, 4, 2]
    for prompts, sampling in adapter.calls:
        task = "addition" if prompts[0].endswith("=") else "chain3"
        first = next(r.doc_id for r in sink.received if r.prompt == prompts[0])
        assert sampling.n == 2  # the doc's num_samples (pass@1 over the run's n)
        assert sampling.max_new_tokens == synthetic.generation_size(task)  # the doc's generation_size caps the run's
        assert sampling.stop == ("###", "\n")  # run stops, then the doc's
        assert (sampling.temperature, sampling.top_p) == (0.6, 0.9)
        assert sampling.seed == batch_seed(11, task, first)
    assert len({s.seed for _, s in adapter.calls}) == len(adapter.calls)

    # one record per sample, sent right after its batch, cut at the stop
    assert len(sink.received) == 40 and len({(r.task, r.doc_id, r.sample_index) for r in sink.received}) == 40
    record = sink.received[0]
    assert record.output == ANSWERS[record.prompt] and record.gold == record.output
    assert (record.prompt_tokens, record.generated_tokens, record.loops_used, record.finish_reason) == (
        len(record.prompt),
        3,
        3.0,
        "length",
    )
    assert record.latency_seconds >= 0 and record.score is None
    assert [b[:2] for b in sink.batches] == [
        ("addition", 0),
        ("addition", 1),
        ("addition", 2),
        ("chain3", 0),
        ("chain3", 1),
        ("chain3", 2),
    ]

    wrong = run_suite(ScriptedAdapter(right_samples=set()), configs, run, limit=10, progress=False)
    assert wrong.metrics["all"]["pass@1"][0] == 0.0 and set(wrong.scores.values()) == {0.0}


def test_pass_at_1_averages_samples_and_scores_each_sample(configs):
    result = run_suite(ScriptedAdapter(right_samples={0, 2}), configs, Sampling(n=4), limit=5, progress=False)
    value, stderr = result.metrics["addition"]["pass@k:k=1&n=4"]
    assert value == 0.5 and stderr == 0.0
    for (_task, _doc_id, index), score in result.scores.items():
        assert score == (1.0 if index in (0, 2) else 0.0)


def test_run_settings_cap_and_seed_change_the_call(configs):
    adapter = ScriptedAdapter()
    run_suite(adapter, configs[:1], Sampling(temperature=0, max_new_tokens=3, seed=5), limit=2, progress=False)
    ((prompts, sampling),) = adapter.calls
    assert sampling.max_new_tokens == 3 and sampling.n == 1 and sampling.temperature == 0
    other = ScriptedAdapter()
    run_suite(other, configs[:1], Sampling(temperature=0, max_new_tokens=3, seed=6), limit=2, progress=False)
    assert other.calls[0][0] == prompts and other.calls[0][1].seed != sampling.seed


def test_resume_skips_finished_docs_and_scores_everything(configs):
    first_sink, first = MemorySink(), ScriptedAdapter()
    run = Sampling(n=2, seed=3)
    run_suite(first, configs, run, sink=first_sink, limit=8, batch_size=3, progress=False)
    assert len(first_sink.received) == 32

    # Keep both samples of 3 addition docs (stored as wrong answers, to see they are reused), one
    # sample of a 4th doc, and nothing of chain3.
    docs = sorted({r.doc_id for r in first_sink.received if r.task == "addition"})
    whole, partial = docs[:3], docs[3]
    kept = [replace(r, output="-1") for r in first_sink.received if r.task == "addition" and r.doc_id in whole]
    kept += [r for r in first_sink.received if r.task == "addition" and r.doc_id == partial and r.sample_index == 0]
    sink, adapter = MemorySink(kept), ScriptedAdapter()
    result = run_suite(adapter, configs, run, sink=sink, limit=8, batch_size=3, progress=False)

    # the unbroken run's batches, those holding a doc to generate (a stored sample in them is generated again, to
    # batch as the unbroken run did, and not stored twice)
    stored_prompts = {r.prompt for r in kept if r.doc_id in whole}
    assert adapter.calls == [call for call in first.calls if not set(call[0]) <= stored_prompts]
    sent = {(r.task, r.doc_id, r.sample_index) for r in sink.received}
    assert not sent & set(sink.stored) and len(sent) == 32 - len(kept)
    assert result.n_docs == {"addition": 8, "chain3": 8}
    assert result.metrics["addition"]["pass@k:k=1&n=2"][0] == 5 / 8  # the 3 stored docs count, as stored
    assert result.metrics["chain3"]["pass@k:k=1&n=2"][0] == 1.0
    assert len(result.scores) == 32
    assert all(result.scores[("addition", d, i)] == 0.0 for d in whole for i in (0, 1))


def test_progress_bars_on_a_given_rich_progress(configs):
    from rich.progress import Progress

    progress = Progress(disable=True)
    run_suite(ScriptedAdapter(), configs, Sampling(), limit=5, batch_size=2, progress=progress)
    (bar,) = progress.tasks
    assert bar.total == bar.completed == 6  # 3 batches per task


def test_bad_arguments(configs):
    with pytest.raises(AdapterError, match="batch_size must be >= 1"):
        run_suite(ScriptedAdapter(), configs, Sampling(), batch_size=0, progress=False)
    with pytest.raises(AdapterError, match="limit must be >= 1"):
        run_suite(ScriptedAdapter(), configs, Sampling(), limit=0, progress=False)
    with pytest.raises(AdapterError, match="no tasks"):
        run_suite(ScriptedAdapter(), [], Sampling(), progress=False)


class LetterAdapter:
    """Character-level logits that always favour one letter: ranks that choice first."""

    spec = "test:letters"
    max_context = 64

    def __init__(self, favourite: str) -> None:
        from adapters.engine.io.tokenizer import char_tokenizer

        self.tokenizer = char_tokenizer()
        self.favourite = self.tokenizer.convert_tokens_to_ids(favourite)
        self.shapes: list[tuple[int, ...]] = []

    def forward_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(input_ids.shape))
        logits = torch.zeros(*input_ids.shape, len(self.tokenizer))
        logits[..., self.favourite] = 5.0
        return logits

    def generate(self, prompts, sampling):
        raise AssertionError("a log-likelihood task never generates")

    def memory(self) -> dict:
        return {}

    def describe(self) -> dict:
        return {}


def mc_config(tmp_path: Path, golds: list[int]):
    """A multiple-choice task in LightEval's usual shape: letters as choices, log-likelihood accuracy."""
    from lighteval.metrics.metrics import Metrics
    from lighteval.tasks.lighteval_task import LightevalTaskConfig
    from lighteval.tasks.requests import Doc

    path = tmp_path / "mc.jsonl"
    path.write_text("".join(json.dumps({"q": f"Question {i}?", "gold": g}) + "\n" for i, g in enumerate(golds)))

    def prompt(line, task_name=None):
        return Doc(
            task_name=task_name,
            query=f"{line['q']}\nA. x\nB. y\nC. z\nAnswer:",
            choices=[" A", " B", " C"],
            gold_index=line["gold"],
        )

    return LightevalTaskConfig(
        name="mc", prompt_function=prompt, hf_repo=str(path), hf_subset="default", hf_avail_splits=["test"],
        evaluation_splits=["test"], few_shots_split="test", metrics=[Metrics.loglikelihood_acc],
    )  # fmt: skip


def test_loglikelihood_ranks_choices_with_forward_logits(tmp_path: Path):
    config = mc_config(tmp_path, golds=[1, 1, 0, 2, 1])
    adapter, sink = LetterAdapter("B"), MemorySink()
    result = run_suite(adapter, [config], Sampling(n=3), sink=sink, batch_size=2, progress=False)
    assert result.metrics["mc"]["acc"][0] == pytest.approx(3 / 5)
    assert sorted(result.scores.values()) == [0.0, 0.0, 1.0, 1.0, 1.0]
    assert {k[2] for k in result.scores} == {LOGLIKELIHOOD_SAMPLE_INDEX}
    assert [s[0] for s in adapter.shapes] == [6, 6, 3]  # 2 docs x 3 choices per forward
    assert len(sink.received) == 5 and {r.output for r in sink.received} == {" B"}
    assert all(r.sample_index == LOGLIKELIHOOD_SAMPLE_INDEX and r.generated_tokens is None for r in sink.received)

    # resume: nothing already stored is sent again, the metric still covers every doc
    resumed = MemorySink(sink.received[:3])
    again = run_suite(LetterAdapter("B"), [config], Sampling(), sink=resumed, batch_size=2, progress=False)
    assert len(resumed.received) == 2 and again.metrics["mc"]["acc"][0] == pytest.approx(3 / 5)


@pytest.mark.numerics
def test_melt_choice_scores_do_not_depend_on_the_batch():
    """A MELT model's chunks count back from a sequence's last token, so a padded row would score
    differently: choices of different lengths, scored in one batch, get the scores they get alone."""
    import adapters
    from lighteval.tasks.requests import Doc

    from harness.bridge.lighteval_model import AdapterModel

    adapter = adapters.load("zoo:melt-tiny", dtype="fp32", device="cpu")
    model = AdapterModel(adapter, Sampling(), progress=False)
    docs = [
        Doc(task_name="mc", query=q, choices=[" 7", " 12", " 512", " 3;"], gold_index=0, id=str(i))
        for i, q in enumerate(["a=4;b=a+3;b=?", "x=5;y=x+7;z=?"])
    ]

    def alone(doc: Doc, choice: str) -> float:
        (context,), (continuation,) = model.tok_encode_pair(
            model.prompt_manager.prepare_prompt(doc), [choice], pairwise=True
        )
        ids = list(context) + list(continuation)
        logprobs = torch.log_softmax(adapter.forward_logits(torch.tensor([ids[:-1]])), dim=-1)[0, -len(continuation) :]
        return logprobs.gather(-1, torch.tensor(continuation)[:, None]).sum().item()

    def every_alone() -> torch.Tensor:
        return torch.tensor([[alone(doc, c) for c in doc.choices] for doc in docs])

    # the padded batch and single rows round differently, as far as float32 rounding carries the model (tests/support/rounding.py)
    bound = rounding_bound(adapter.model, every_alone)
    together = [response.logprobs for _, response in model.ranker.score(docs)]
    assert together == [pytest.approx(row, abs=bound) for row in every_alone().tolist()]


def test_engine_preset_end_to_end(tmp_path: Path):
    import adapters

    adapter = adapters.load("preset:qwen3-tiny")
    sink = MemorySink()
    result = run_suite(
        adapter,
        load_suite("synthetic"),
        Sampling(temperature=1.0, n=2, seed=1),
        sink=sink,
        limit=3,
        batch_size=8,
        progress=False,
    )
    assert set(result.metrics) == set(synthetic.DEFAULT_TASKS) | {"all"}
    for task in synthetic.DEFAULT_TASKS:
        value, stderr = result.metrics[task]["pass@k:k=1&n=2"]
        assert 0.0 <= value <= 1.0 and stderr is not None and not math.isnan(stderr)
    assert len(sink.received) == len(result.scores) == len(synthetic.DEFAULT_TASKS) * 3 * 2
    assert all(r.generated_tokens <= synthetic.GENERATION_SIZE and "\n" not in r.output for r in sink.received)
    assert all(r.loops_used == 1.0 or r.loops_used is None for r in sink.received)

    mc = run_suite(adapter, [mc_config(tmp_path, golds=[0, 1, 2, 1])], Sampling(), progress=False)
    assert 0.0 <= mc.metrics["mc"]["acc"][0] <= 1.0
    assert "lighteval.tasks.tasks.tiny_benchmarks" not in sys.modules


class CountingSink(MemorySink):
    """A MemorySink that also keeps each group of records as the bridge sent it."""

    def __init__(self, stored: list[SampleRecord] = ()) -> None:
        super().__init__(stored)
        self.groups: list[list[SampleRecord]] = []

    def on_records(self, records: list[SampleRecord]) -> None:
        super().on_records(records)
        self.groups.append(records)


def test_a_scheduling_adapter_gets_the_whole_task_and_samples_are_stored_as_they_finish():
    """The engine takes each task's docs in one call; samples reach the sink in groups as they finish,
    and a resumed run generates only the samples not stored, with the same outputs as an unbroken run."""
    import adapters
    from adapters.base import Scheduling

    adapter = adapters.load("preset:ouro-tiny", max_batch=4, seed=2)
    assert isinstance(adapter, Scheduling)
    configs = load_suite("synthetic", tasks=["addition"])
    run = Sampling(temperature=1.0, top_p=0.7, n=3, seed=4)
    whole = CountingSink()
    run_suite(adapter, configs, run, sink=whole, limit=6, batch_size=2, progress=False)
    assert whole.batches == [("addition", 0, 6)]  # one workload, not batches of batch_size docs
    assert len(whole.received) == 18 and len(whole.groups) > 1  # committed as they finished, not all at the end
    outputs = {(r.doc_id, r.sample_index): r.output for r in whole.received}
    assert len(set(outputs.values())) > 1

    kept = [r for r in whole.received if r.sample_index != 1]  # an interrupted run stored samples 0 and 2 of every doc
    resumed = CountingSink(kept)
    run_suite(adapter, configs, run, sink=resumed, limit=6, batch_size=2, progress=False)
    assert sorted((r.doc_id, r.sample_index) for r in resumed.received) == sorted(
        (d, 1) for d, _ in {(r.doc_id, 0) for r in whole.received}
    )
    assert all(r.output == outputs[(r.doc_id, r.sample_index)] for r in resumed.received)
