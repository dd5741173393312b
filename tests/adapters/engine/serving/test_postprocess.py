"""`Postprocessor`: each step's tokens recorded, the stops applied (eos, a stop string, the length), and a finished
sequence retired from the scheduler as its `Generation`."""

from __future__ import annotations

from adapters.base import Finished, Sampling
from adapters.engine.io.tokenizer import char_tokenizer
from adapters.engine.serving.block_manager import BlockManager
from adapters.engine.serving.postprocess import Postprocessor
from adapters.engine.serving.scheduler import Scheduler
from adapters.engine.serving.sequence import Sequence

EOS = 2


def running(*seqs: Sequence) -> Scheduler:
    """A scheduler whose running set is `seqs`, each holding the blocks of its prompt."""
    s = Scheduler(BlockManager(16, 4, bytes_per_token=8, latent_bytes_per_token=0), 8, lambda *_: None)
    for seq in seqs:
        s.manager.hold(seq, seq.prompt_len)
        s.start(seq)
    return s


def seq(request: int, prompt: list[int], sampling: Sampling) -> Sequence:
    return Sequence(
        request=request,
        sample=0,
        key=0,
        prompt_len=len(prompt),
        tokens=list(prompt),
        capacity=len(prompt) + sampling.max_new_tokens,
        sampling=sampling,
    )


def test_eos_and_length_end_sequences_and_the_rest_go_on():
    ended, long, short = (
        seq(i, [1, 5, 6], Sampling(temperature=0.0, max_new_tokens=m)) for i, m in enumerate((9, 9, 2))
    )
    scheduler, finished = running(ended, long, short), []
    post = Postprocessor(scheduler, loops=4, looped=True, eos_ids={EOS}, tokenizer=None, on_finished=finished.append)
    post.record([ended, long, short], [EOS, 7, 8], exit_loops=[2, 3, 4])
    assert [seq.request for seq in scheduler.running] == [2, 1]  # the last running one took the leaver's row
    assert [(r, s, g.finish_reason, g.token_ids, g.loops_used) for r, s, g in finished[0]] == [
        (0, 0, "eos", [EOS], [2])
    ]
    post.record([short, long], [9, 10], exit_loops=None)  # None: every row read at the last loop
    (done,) = finished[1:]
    assert [
        (r, g.finish_reason, g.token_ids, g.loops_used, g.generated_tokens, g.prompt_tokens) for r, _, g in done
    ] == [(2, "length", [8, 9], [4, 4], 2, 3)]
    assert long.tokens == [1, 5, 6, 7, 10] and long.finish is None and scheduler.running == [long]
    assert done[0][2].text is None  # no tokenizer, no text


def test_a_stop_string_cuts_the_text_before_it_and_a_plain_model_records_no_loops():
    tokenizer = char_tokenizer()
    prompt = tokenizer("q:")["input_ids"]
    sampling = Sampling(temperature=0.0, max_new_tokens=20, stop=("\n\n",))
    s = seq(0, prompt, sampling)
    finished: list[list[Finished]] = []
    post = Postprocessor(
        running(s), loops=1, looped=False, eos_ids={EOS}, tokenizer=tokenizer, on_finished=finished.append
    )
    for ch in "ab\n\n":
        post.record([s], tokenizer(ch, add_special_tokens=False)["input_ids"], exit_loops=None)
    ((_, _, generation),) = finished[0]
    assert generation.finish_reason == "stop" and generation.text == "ab" and generation.loops_used is None
    assert generation.token_ids == tokenizer("ab\n\n", add_special_tokens=False)["input_ids"]
