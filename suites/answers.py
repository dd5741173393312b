"""How the paper suite reads a reply's final answer: as strictly as the benchmarks' own graders.

A sample scores only when its reply commits to one answer. Offline we cannot ask a judge what a
hedge means, so a reply that names several answers, negates one or contradicts itself reads as no
answer (scored 0), never as whichever letter a pattern happens to catch last. The rules, and why,
are in docs/architecture.md ("How replies are read"); everything is read after any `</think>`.

Multiple choice (`choice_letter`): the reply's declared answers (lines that begin `Answer:` or
`Final answer:`, an `Answer` header followed by the answer on the next line, `\\boxed{}`, and a
first line that is a lone letter, continuing MMLU's prompt `Answer: `) must all name the same one
letter. Without one, the last "answer is X" / "correct option is X" / "X is correct" in its prose
decides. Without either, the last standalone capital letter, where `A` or `I` followed by a lower-case
word is an article or pronoun, not an option. In every case a letter that is negated ("not B"), hedged
("either A or B") or listed ("B, C, D, A") is no answer.

HLE (`hle_answer`): the `Answer:` field of HLE's response format, a line that begins `Answer:`;
several fields must agree. Text quoted later in a line ("the user said the answer: 42") is not a field.
On a multiple-choice item (`hle_letter`) the field must name one letter, as above.
"""

from __future__ import annotations

import re
import string

LETTERS = "ABCDEFGHIJ"

# A declared answer: a line that begins (after markdown: #, >, -, *, _) with "Answer" or "Final/Correct/Exact/
# Short/My/The answer", then a colon and the answer, or nothing (a header: the answer is on the next line).
_FIELD = re.compile(
    r"^[ \t>#*_-]*(?:(?:final|correct|exact|short|my|the)[ \t]+)?answer[ \t]*[*_]*[ \t]*(?:[:：]|$)[*_]*[ \t]*(.*)$",
    re.IGNORECASE | re.MULTILINE,
)
_BOXED = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
# An answer stated in prose ("the answer is", "correct option is", "answer:"): the rest of its line is read.
_ANCHOR = re.compile(
    r"\b(?:answer|option|choice)(?:[ \t]+(?:is|(?:would|should|must|will)[ \t]+be)[ \t]*[:：]?|[ \t]*[:：])",
    re.IGNORECASE,
)
# What may stand between an anchor and its letter ("the correct option is", "letter"), and the markup around it.
_FILLER = (
    r"(?i:(?:the[ \t]+)?(?:(?:final|correct|right|best)[ \t]+)*(?:answer|option|choice|letter)[ \t]*(?:is)?[ \t]*"
    r"[:：]?[ \t]*)?"
)
_OPEN = r"(?:[ \t*_$(\[{]|\\boxed\{|\\text(?:bf)?\{|\\mathrm\{|\\\()*"
_CLOSE = r"[)\]}*_$?]*"
_HEDGE = r"(?i:not|neither|nor|either|both|between)"
# What joins one option to another: "B, C", "B or C", "B/C", "B (or possibly C)", "B, maybe C".
_CONNECTOR = r"(?:[,;/&]|(?i:\bor\b|\band\b|\bnor\b|\bvs\b\.?))"
_JOINED = (
    rf"[ \t]*[(\[]?[ \t]*{_CONNECTOR}(?:[ \t]*{_CONNECTOR})*[ \t]*(?i:(?:possibly|maybe|perhaps|probably)[ \t]+)?"
    r"[ \t*_$(\[]*"
)
# Words after "A" or "I" that make it an option named as a subject ("A is right"), not an article or pronoun.
_PREDICATES = frozenset(
    ("is", "was", "seems", "appears", "looks", "fits", "matches", "remains", "must", "should", "would", "could",
     "can", "will", "holds", "gives", "works")
)  # fmt: skip
_NO_ANSWER = ""  # a span that names options, but not one: negated, hedged or listed
_FOLLOWING_WORD = re.compile(r"[ \t]+([a-z]+)")
_CONTENT_LINE = re.compile(r"^.*[^ \t*_#\n].*$", re.MULTILINE)  # a line with more than spaces and markup
_CONTEXT = 40  # characters before a letter that can negate it or join it to another ("neither B nor")


def after_thinking(text: str) -> str:
    """The reply after its reasoning: what follows the last `</think>`, else all of it."""
    return text.rsplit("</think>", 1)[-1]


def _is_word(text: str, end: int) -> bool:
    """Whether the capital just before `end` is an article or pronoun: `A` or `I` then a lower-case word
    that is not a predicate ("A quick check", "I think"; not "A is right")."""
    if text[end - 1] not in "AI":
        return False
    following = _FOLLOWING_WORD.match(text, end)
    return following is not None and following.group(1) not in _PREDICATES


def _joins_another(text: str, end: int, letters: str) -> bool:
    """Whether the option ending at `end` is joined to another ("B, C", "B or C", "A/B"): a list, not one answer."""
    joined = re.compile(rf"{_CLOSE}{_JOINED}([{letters}])(?![A-Za-z0-9])").match(text, end)
    return joined is not None and not _is_word(text, joined.end())


def _negated_or_listed(text: str, start: int, end: int, letters: str) -> bool:
    """Whether the option at text[start:end] is negated or hedged ("not B", "either A or B") or one of a list."""
    before = text[max(0, start - _CONTEXT) : start]
    return bool(
        re.search(rf"\b{_HEDGE}[ \t*_(]*$", before)
        or re.search(rf"(?<![A-Za-z0-9])[{letters}]{_CLOSE}{_JOINED}$", before)
        or _joins_another(text, end, letters)
    )


def _read_span(span: str, letters: str) -> str | None:
    """The letter an answer's text names; `_NO_ANSWER` when it names options but not one; None when it names none.

    The letter must open the span (after filler and markup), so "I think B" names none; "not B" and
    "either A or B" are no answer. A lower-case letter counts only when nothing but punctuation follows it
    ("answer: b"), so "the answer is a classic" names none.
    """
    lower_alone = rf"[{letters.lower()}](?=[ \t]*(?:$|[).:,;*_$\]}}]))"
    found = re.match(rf"{_FILLER}{_OPEN}(?:({_HEDGE})[ \t]+{_OPEN})?([{letters}]|{lower_alone})(?![A-Za-z0-9])", span)
    if found is None:
        return None
    if found.group(1) or _joins_another(span, found.end(), letters):
        return _NO_ANSWER
    return found.group(2).upper()


def _fields(reply: str) -> list[str]:
    """The text of every declared `Answer:` line; only where none gives it inline, each bare `Answer` header's
    next non-empty line (a header over a sentence of prose must not contradict the `Answer: X` below it)."""
    inline, headed = [], []
    for match in _FIELD.finditer(reply):
        if match.group(1).strip(" \t*_#"):
            inline.append(match.group(1))
        elif (following := _CONTENT_LINE.search(reply, match.end())) is not None:
            headed.append(following.group())
    return inline or headed


def _opening(reply: str, letters: str) -> list[str]:
    """The reply's first line when it is an answer: a lone letter (`B`, `(B)`, `**B.**`) over whatever follows,
    or, as the whole reply, a letter and its option text (`B) ulna`). A first line that opens a walk through
    the options ("A) femur: a leg bone, no.") is not."""
    first_line, _, rest = reply.strip().partition("\n")
    lone = re.fullmatch(rf"[ \t*_(\[]*[{letters}][ \t*_)\].:]*", first_line)
    with_text = not rest and re.match(rf"[*_(\[]*[{letters}][*_]*[).:][ \t]", first_line)
    return [first_line] if lone or with_text else []


def choice_letter(text: str, n_choices: int) -> str | None:
    """The one option letter a reply commits to, or None (see the module docstring)."""
    letters = LETTERS[:n_choices]
    reply = after_thinking(text)
    spans = _fields(reply) + _BOXED.findall(reply) + _opening(reply, letters)
    declared = {_read_span(span, letters) for span in spans} - {None}  # a box or line naming no option says nothing
    if len(declared) > 1:
        return None  # declared answers that differ
    if declared:
        return declared.pop() or None
    for reading in reversed(_prose_readings(reply, letters)):
        if reading is not None:  # the last statement that names an option decides, even when it names no one
            return reading or None
    return _standalone(reply, letters)


def _rest_of_line(text: str, start: int) -> str:
    end = text.find("\n", start)
    return text[start : end if end >= 0 else len(text)]


def _prose_readings(reply: str, letters: str) -> list[str | None]:
    """What each prose statement of an answer names, in reply order: "the answer is X" and "X is correct"."""
    readings = [(m.end(), _read_span(_rest_of_line(reply, m.end()), letters)) for m in _ANCHOR.finditer(reply)]
    subject = rf"(?<![A-Za-z0-9])\(?([{letters}])\)?[ \t]+(?:is|seems)[ \t]+(?:the[ \t]+)?(?:correct|right|best)\b"
    for m in re.finditer(subject, reply):
        listed = _negated_or_listed(reply, m.start(1), m.end(1), letters)
        readings.append((m.start(), _NO_ANSWER if listed else m.group(1)))
    return [reading for _, reading in sorted(readings, key=lambda item: item[0])]


def _standalone(reply: str, letters: str) -> str | None:
    """The last capital option letter standing alone (not an article or pronoun), unless negated or listed."""
    for match in reversed(list(re.finditer(rf"(?<![A-Za-z0-9])([{letters}])(?![A-Za-z0-9])", reply))):
        if _is_word(reply, match.end()):
            continue
        return None if _negated_or_listed(reply, match.start(), match.end(), letters) else match.group(1)
    return None


def hle_normalise(text: str) -> str:
    """An HLE answer as compared offline: no `**` or `$`, single spaces, no trailing .,;:!?, lower case."""
    text = " ".join(text.replace("**", "").replace("$", "").split())
    return text.rstrip(".,;:!? ").lower()


def hle_answer(text: str) -> str | None:
    """The answer of an HLE reply: its `Answer:` field (several must agree, else None), else its last non-empty line."""
    reply = after_thinking(text)
    fields = _fields(reply)
    if fields:
        return fields[-1] if len({hle_normalise(field) for field in fields}) == 1 else None
    lines = [line for line in reply.splitlines() if line.strip()]
    return lines[-1] if lines else None


def hle_letter(text: str) -> str | None:
    """The one letter an HLE reply's answer names, for HLE's multiple-choice items (whose answers are letters):
    `Answer: (B)` and `Answer: B) <option text>` are B, `Answer: B or C` and `Answer: not B` are none."""
    answer = hle_answer(text)
    return None if answer is None else _read_span(answer, string.ascii_uppercase) or None
