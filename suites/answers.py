"""How the paper suite reads a reply's final answer: strict about commitment, generous about form.

A sample scores only when its reply commits to one answer. Offline we cannot ask a judge what a
hedge means, so a reply that names several answers, negates one or contradicts itself reads as no
answer (scored 0), never as whichever letter a pattern happens to catch last. The rules, and why,
are in docs/architecture.md ("How replies are read"); everything is read after any `</think>`, and a
`<think>` never closed leaves nothing to read.

Multiple choice (`choice_letter`): the reply's declared answers (lines that begin `Answer:` or
`Final answer:`, an `Answer` header followed by the answer on the next line, `\\boxed{}`, and a
first line that is a lone letter, continuing MMLU's prompt `Answer: `, or an option line with its
explanation, "B. The ulna, because ...") must all name the same one letter. Without one, the last
"answer is X" / "correct option is X" / "X is correct" in its prose decides. Without either, the last
standalone capital letter, where `A` or `I` followed by a lower-case word is an article or pronoun, not
an option. In every case a letter that is negated ("not B"), hedged ("either A or B", "maybe B") or
listed ("B, C, D, A") is no answer. A revision ("Wait", "Actually", "Correction") that commits to an
answer replaces what came before it.

HLE (`hle_answers`, `hle_equivalent`): the `Answer:` fields of HLE's response format, lines that begin
`Answer:`, every one of which must be the gold; without one, what the last line states. Text quoted
later in a line ("the user said the answer: 42") is not a field. An answer is the gold as text, or as
mathematics under math-verify. On a multiple-choice item (`hle_letter`) the field must name one letter,
as above.
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
_DOUBT = r"(?i:maybe|perhaps|possibly|probably)"
_HEDGE = rf"(?i:not|neither|nor|either|both|between|{_DOUBT})"
# What joins one option to another: "B, C", "B or C", "B/C", "B (or possibly C)", "B, maybe C".
_CONNECTOR = r"(?:[,;/&]|(?i:\bor\b|\band\b|\bnor\b|\bvs\b\.?))"
_JOINED = (
    rf"[ \t]*[(\[]?[ \t]*{_CONNECTOR}(?:[ \t]*{_CONNECTOR})*[ \t]*(?:{_DOUBT}[ \t]+)?"
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
_DISPLAY = re.compile(r"[ \t]*(?:\\\[[ \t]*\n[\s\S]*?\\\]|\$\$[ \t]*\n[\s\S]*?\$\$)")  # display maths over lines
_CONTEXT = 40  # characters before a letter that can negate it or join it to another ("neither B nor")


# Where a reply takes back what it said ("Wait", "Actually", "on reflection"): a commitment after it replaces one before.
_REVISION = re.compile(
    r"\b(?:wait|actually|hmm+|on (?:second thought|reflection|closer inspection)|correction|scratch that"
    r"|i made (?:a|an) (?:mistake|error)|let me (?:re-?check|reconsider|re-?examine|re-?evaluate|double[- ]check))\b",
    re.IGNORECASE,
)
# A line that opens with an option's label and its text or explanation ("B. The ulna, because ...", "**B) ulna**").
_OPTION_LINE = r"^[ \t>*_(\[]*[{letters}][*_]*[).:][*_]*(?:[ \t]|$)"


def after_thinking(text: str) -> str:
    """The reply after its reasoning: what follows the last `</think>`; nothing when a `<think>` is never closed
    (reasoning cut off before any answer); else all of it."""
    if "</think>" in text:
        return text.rsplit("</think>", 1)[-1]
    return text.split("<think>", 1)[0]


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
    next non-empty line, or its display maths (`\\[`, `\\boxed{42}`, `\\]` on lines of their own) as one line (a
    header over a sentence of prose must not contradict the `Answer: X` below it)."""
    inline, headed = [], []
    for match in _FIELD.finditer(reply):
        if match.group(1).strip(" \t*_#"):
            inline.append(match.group(1))
        elif (following := _CONTENT_LINE.search(reply, match.end())) is not None:
            display = _DISPLAY.match(reply, following.start())
            headed.append(" ".join(display.group().split()) if display else following.group())
    return inline or headed


def _opening(reply: str, letters: str) -> list[str]:
    """The reply's first line when it is an answer: a lone letter (`B`, `(B)`, `**B.**`) over whatever follows,
    or a letter with its option text or explanation (`B) ulna`, "B. The ulna, because ...") when no other line
    opens with an option: a reply whose lines walk through the options ("A) femur: no.\nB) ulna: yes.") is not."""
    first_line = reply.strip().partition("\n")[0]
    lone = re.fullmatch(rf"[ \t*_(\[]*[{letters}][ \t*_)\].:]*", first_line)
    option_lines = re.findall(_OPTION_LINE.format(letters=letters), reply.strip(), re.MULTILINE)
    with_text = len(option_lines) == 1 and re.match(_OPTION_LINE.format(letters=letters), first_line)
    return [first_line] if lone or with_text else []


def choice_letter(text: str, n_choices: int) -> str | None:
    """The one option letter a reply commits to, or None (see the module docstring)."""
    letters = LETTERS[:n_choices]
    reply = after_thinking(text)
    starts = [m.start() for m in _REVISION.finditer(reply)]
    for start in reversed(starts):  # the last revision that commits to something replaces what came before it
        reading = _committed(reply[start:], letters, [])
        if reading is None and re.search(rf"\b{_DOUBT}[ \t*_(]*[{letters}](?![A-Za-z0-9])", reply[start:]):
            return None  # a doubt raised after the answer ("Answer: B. Hmm, maybe C.") and never settled
        if reading is not None:
            return reading or None
    before = reply[: starts[0]] if starts else reply
    reading = _committed(before, letters, _opening(before, letters))
    return _standalone(before, letters) if reading is None else reading or None


def _committed(reply: str, letters: str, opening: list[str]) -> str | None:
    """What the reply's declared answers (with its `opening` line), else its last prose statement, name: one letter,
    `_NO_ANSWER` (declared answers that differ, or a statement naming no one option), or None (nothing named)."""
    spans = _fields(reply) + _BOXED.findall(reply) + opening
    declared = {_read_span(span, letters) for span in spans} - {None}  # a box or line naming no option says nothing
    if len(declared) > 1:
        return _NO_ANSWER  # declared answers that differ
    if declared:
        return declared.pop()
    for reading in reversed(_prose_readings(reply, letters)):
        if reading is not None:  # the last statement that names an option decides, even when it names no one
            return reading
    return None


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


# LaTeX wrappers an answer may sit in (`\\boxed{Paris}`, `\\text{Paris}`), and the quotes around a quoted word.
_WRAPPER = re.compile(r"\\(?:boxed|text(?:bf|rm)?|mathrm|mathbf)\{((?:[^{}]|\{[^{}]*\})*)\}")
_QUOTES = "\"'`\u2018\u2019\u201c\u201d"
# Words that make an answer something other than one committed value: math-verify would read a number out of them.
_UNCOMMITTED = re.compile(
    r"\b(?:not|or|and|nor|either|neither|maybe|perhaps|possibly|probably|wrong|incorrect)\b", re.IGNORECASE
)
# Where a final sentence states its answer: after "answer is" / "answer:", else after its last "is" or "=".
_STATED = re.compile(
    r"\banswer(?:[ \t]+(?:is|would be|should be|must be)[ \t]*[:：]?|[ \t]*[:：])[ \t]*", re.IGNORECASE
)
_COPULA = re.compile(r"(?:\bis\b|\bequals\b|=)[ \t]*")
_LATEX_WORD = re.compile(r"\\(?:text\w*|mathrm|operatorname)\{[^{}]*\}|\\[A-Za-z]+")  # \\text{cm}, \\frac
_UNIT_AFTER = re.compile(r"[ \t]+[A-Za-z]+(?:[/^][A-Za-z0-9]+)*(?:[ \t]+[A-Za-z]+)?[ \t.]*$")  # " cm", " m/s^2"
_SENTENCE_END = re.compile(r"(?<![0-9])\.[ \t]+(?=[A-Z])")


# A `\\pm` with nothing before it (`\\pm 1`, `x = \\pm\\frac{1}{2}`): math-verify drops it (reading `\\pm 1` as 1) or
# fails; as `0 \\pm 1` it reads the pair {-1, 1}, as it reads `1 \\pm \\sqrt{2}`.
_UNARY_PM = re.compile(r"((?:^|[=({\[,:$]|\\boxed\{|\\\(|\\\[)[ \t]*)\\pm(?![A-Za-z])", re.MULTILINE)


def both_signs(text: str) -> str:
    """`text` with each unary `\\pm X` written `0 \\pm X`, the form math-verify reads as both signs."""
    return _UNARY_PM.sub(r"\g<1>0 \\pm", text)


def hle_normalise(text: str) -> str:
    """An HLE answer as compared as text: no `**` or `$`, `\\boxed{}` and `\\text{}` unwrapped, single spaces, no
    trailing .,;:!?, no surrounding quotes, lower case."""
    text = text.replace("**", "").replace("$", "")
    while (unwrapped := _WRAPPER.sub(r"\1", text)) != text:
        text = unwrapped
    text = " ".join(text.split()).rstrip(".,;:!? ")
    return text.strip(_QUOTES).rstrip(".,;:!? ").lower()


def hle_answers(text: str) -> list[str]:
    """Every answer an HLE reply gives: its `Answer:` fields (all of them: they must agree), else what its last
    non-empty line states (the text after "the answer is", else after its last "is" or "=", else the whole line)."""
    reply = after_thinking(text)
    fields = _fields(reply)
    if fields:
        return fields
    lines = [line for line in reply.splitlines() if line.strip()]
    return [_stated(lines[-1])] if lines else []


def _stated(sentence: str) -> str:
    """The answer a final sentence of prose states, up to the end of that sentence."""
    anchors = list(_STATED.finditer(sentence)) or list(_COPULA.finditer(sentence))
    stated = sentence[anchors[-1].end() :] if anchors else sentence
    return _SENTENCE_END.split(stated, 1)[0]


def hle_equivalent(answer: str, gold: str) -> bool:
    """Whether an HLE answer is the gold: equal as text under `hle_normalise`, or, where both are mathematics
    (`_is_math`), equal under math-verify (fractions and decimals, LaTeX, units, `x = 3`). An answer holding a hedge
    or a negation ("42 or 41", "not 42") is compared only as text: math-verify would read a number out of it. A field
    written as a sentence is read as a final sentence is (`_stated`). Words are compared only as text: math-verify reads "Paris" as the product P*a*r*i*s, equal to any anagram."""
    if hle_normalise(answer) == hle_normalise(gold) != "":
        return True
    if _UNCOMMITTED.search(answer):
        return False
    stated = _stated(answer)  # a field written as a sentence: "Answer: The capital is Paris."
    if hle_normalise(stated) == hle_normalise(gold) != "":
        return True
    candidate = answer if _is_math(answer) else stated
    if not (_is_math(gold) and _is_math(candidate)):
        return False
    from math_verify import parse, verify

    return bool(verify(parse(_as_math(gold)), parse(_as_math(candidate))))


def _is_math(text: str) -> bool:
    """Whether `text` is mathematics, perhaps with a unit (`3/4`, `x = 3`, `12 cm`, `9.8\\,\\text{m/s}^2`): it has a digit
    or LaTeX, and no word but the unit after it (in "Apollo 11" math-verify would find 11, equal to "Gemini 11")."""
    bare = _UNIT_AFTER.sub("", _LATEX_WORD.sub(" ", text.replace("$", "")).strip())
    return bool(re.search(r"[0-9\\]", text)) and not re.search(r"[A-Za-z]{2,}", bare)


def _as_math(text: str) -> str:
    """`text` as math-verify should read it: LaTeX outside any delimiter put in `$...$` (bare, math-verify takes a
    number out of it: `x = 0 \\pm 2` is 2), a unary `\\pm` read as both signs; plain text (`12 cm`) as it is."""
    if "\\" in text and not any(delimiter in text for delimiter in ("$", "\\(", "\\[", "\\boxed")):
        text = f"${text}$"
    return both_signs(text)


def hle_letter(text: str) -> str | None:
    """The one letter an HLE reply's answers name, for HLE's multiple-choice items (whose answers are letters):
    `Answer: (B)` and `Answer: B) <option text>` are B, `Answer: B or C` and `Answer: not B` are none."""
    named = {_read_span(answer, string.ascii_uppercase) for answer in hle_answers(text)}
    return named.pop() or None if len(named) == 1 else None
