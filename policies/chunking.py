"""Per-type text compression for `content_type_chunking` (design D5.2).

Every function here is pure and keeps one promise per content type:

- JSON and code: minified without changing what they mean (`policies.minify`).
- Logs: runs of identical lines become one line plus `[previous line repeated N more times]`,
  runs of near-identical lines (same once digits and hex ids are ignored) keep their first and
  last line around `[... N similar lines ...]`; then, if still over the ratio, the head and the
  tail are kept around `[... N lines elided by compactgate ...]` (a third head, two thirds tail:
  errors sit at the end). A log in fenced blocks (pasted into a message between sentences) is
  compressed block by block, and the prose around the blocks is left alone; the few lines
  typed before an unfenced log's first log line are kept whole.
- Prose and "other": head and tail around an elision marker at the ratio (lines, or words when
  the text has few lines). Used for prose only when `compress_prose` is set.

`detect` guesses the type of an unmarked message: JSON (parses), log (timestamps, levels, stack
frames on most lines), code (mostly fenced blocks, or parses as Python, or most lines look like
code), else prose. A client's `"compactgate": {"type": ...}` mark takes precedence.
"""

from __future__ import annotations

import itertools
import operator
import re
from collections.abc import Callable
from typing import Literal

from .minify import FENCE_RE, fences, minify_code, minify_fences, minify_json, python_module

Kind = Literal["code", "text", "plan_ref", "log", "json", "other"]

LOG_LINE_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|\b\d{2}:\d{2}:\d{2}\b"
    r"|\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL|SEVERE)\b"
    r"|^\s+at \S+\(|^\s*File \".*\", line \d+|^\s*\[\s*\d+(?:\.\d+)?\]"
)
# LOG_LINE_RE split so that the regex engine can skip ahead (a pattern that opens with `\b` or
# an alternation of classes is tried at every position): the same lines match (tested).
_LOG_STAMP_RE = re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|\d(?<!\w\d)\d:\d{2}:\d{2}\b")
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "NOTICE", "WARN", "ERROR", "FATAL", "CRITICAL", "SEVERE")
_LOG_LEVEL_RE = re.compile(
    r"\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL|SEVERE)\b"
)
_LOG_FRAME_RE = re.compile(r"\s+at \S+\(|\s*File \".*\", line \d+|\s*\[\s*\d+(?:\.\d+)?\]")
_CODE_START = (  # a line that starts like code; CODE_LINE_RE also takes one ending in ; or {
    r"\s*(?:def |class |import |from \S+ import |return\b|if\b.*[:{]\s*$|for\b.*[:{]\s*$"
    r"|while\b.*[:{]\s*$|#include|function\b|const |let |var |public |private |fn |func "
    r"|package |[})\]];?\s*$)"
)
CODE_LINE_RE = re.compile("^" + _CODE_START + r"|[;{]\s*$")
_CODE_START_RE = re.compile(_CODE_START)  # matched at a line's start; the end is a plain look
NUMBER_RE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")
# What NUMBER_RE can replace in ASCII text: lines with equal keys are equal without these.
_NUMBER_CHARS = str.maketrans("", "", "0123456789abcdefABCDEFx")
SAMPLE_LINES = 24
LEAD_LINES = 5  # lines a user may type before a pasted log, kept whole
ELISION = "[... {n} lines elided by compactgate ...]"
WORD_ELISION = "[... {n} words elided by compactgate ...]"
REPEATED = "[previous line repeated {n} more times]"
SIMILAR = "[... {n} similar lines ...]"


def detect(text: str) -> Kind:
    stripped = text.strip()
    if not stripped:
        return "text"
    if stripped[0] in "[{" and minify_json(stripped) is not None:
        return "json"
    if "\n" not in stripped:  # one line: too few for a log or code, and no fence
        return "text"
    # enough lines to tell, and detection stays cheap on huge outputs
    sample = list(itertools.islice(filter(str.strip, stripped.split("\n")), SAMPLE_LINES))
    if len(sample) >= 5 and _log_lines(sample, (len(sample) + 1) // 2):
        return "log"
    fenced = sum(len(m.group(0)) for m in fences(stripped))
    if fenced * 2 >= len(stripped):
        return "code"
    if len(sample) >= 3:
        if _code_lines(sample, (len(sample) * 3 + 4) // 5):
            return "code"
        if python_module(stripped) is not None:
            return "code"
    return "text"


def _log_lines(lines: list[str], needed: int) -> bool:
    """Whether LOG_LINE_RE finds something in at least `needed` of `lines`. A regex only runs
    on a line that has what its branch needs (a colon, a level word, a bracket)."""
    joined = "\n".join(lines)
    stamps = ":" in joined
    levels = any(map(joined.__contains__, LOG_LEVELS))
    frames = "(" in joined or "[" in joined or 'File "' in joined
    if not (stamps or levels or frames):
        return needed <= 0
    left = len(lines)
    for line in lines:
        if needed <= 0 or needed > left:
            break
        left -= 1
        if (
            (stamps and ":" in line and _LOG_STAMP_RE.search(line))
            or (levels and _LOG_LEVEL_RE.search(line))
            or (frames and _LOG_FRAME_RE.match(line))
        ):
            needed -= 1
    return needed <= 0


def _code_lines(lines: list[str], needed: int) -> bool:
    """Whether CODE_LINE_RE finds something in at least `needed` of `lines` (its `[;{]\\s*$`
    branch is a look at the line's end)."""
    left = len(lines)
    for line in lines:
        if needed <= 0 or needed > left:
            break
        left -= 1
        if line.rstrip()[-1:] in (";", "{") or _CODE_START_RE.match(line):
            needed -= 1
    return needed <= 0


def _typed_lead(text: str) -> str:
    """The lines before a log's first log line, when it is among the first `LEAD_LINES + 1`
    lines (with their line breaks): what a user typed before pasting the log."""
    lines = text.split("\n", LEAD_LINES + 1)[: LEAD_LINES + 1]
    for k, line in enumerate(lines):
        if LOG_LINE_RE.search(line) is not None:
            return "".join([f"{lead}\n" for lead in lines[:k]])
    return ""


def _in_fences(text: str, change: Callable[[str], str]) -> str:
    """`text` with each fenced block's body changed by `change`; the fences and the prose
    around them left alone."""

    def one(match: re.Match[str]) -> str:
        indent, fence, info, body = match.group(1), match.group(2), match.group(3), match.group(4)
        new = change(body)
        new = new if new.endswith("\n") else new + "\n"  # the closing fence on its own line
        return f"{indent}{fence}{info}\n{new}{indent}{fence}"

    return FENCE_RE.sub(one, text)


def collapse_repeats(text: str) -> str:
    lines = text.split("\n")
    # A line's key is NUMBER_RE.sub("0", line) (digits never span a newline). Keys are only
    # worked out for lines that differ but agree once every character NUMBER_RE may replace is
    # deleted (equal keys need that); in non-ASCII text (other digits) all keys are.
    ascii_only = text.isascii()
    source = text.translate(_NUMBER_CHARS) if ascii_only else NUMBER_RE.sub("0", text)
    skeletons = source.split("\n")
    keys: dict[int, str] = {}

    def key(i: int) -> str:
        if i not in keys:
            keys[i] = NUMBER_RE.sub("0", lines[i])
        return keys[i]

    # lines that continue the run of the line before them (same key); runs are maximal
    follows = [
        j
        for j in itertools.compress(
            range(1, len(lines)), map(operator.eq, skeletons, itertools.islice(skeletons, 1, None))
        )
        if not ascii_only or lines[j - 1] == lines[j] or key(j - 1) == key(j)
    ]
    if not follows:
        return text
    out: list[str] = []
    done = 0  # lines before this are in `out`
    k = 0
    while k < len(follows):
        start, end = follows[k] - 1, follows[k] + 1
        k += 1
        while k < len(follows) and follows[k] == end:
            end += 1
            k += 1
        out += lines[done:start]
        run = lines[start:end]
        if all(line == run[0] for line in run):
            out += [run[0], REPEATED.format(n=len(run) - 1)]
        elif len(run) >= 3 and run[0].strip():
            out += [run[0], SIMILAR.format(n=len(run) - 2), run[-1]]
        else:
            out += run
        done = end
    out += lines[done:]
    return "\n".join(out)


def compact_log(text: str, ratio: float) -> str:
    collapsed = collapse_repeats(text)
    return elide_lines(collapsed, int(len(text) * ratio), head_share=1 / 3)


# Elision ---------------------------------------------------------------------------------------


def elide(text: str, ratio: float) -> str:
    """Head and tail of `text` at about `ratio` of its length, lines or words."""
    goal = int(len(text) * ratio)
    if text.count("\n") >= 4:
        return elide_lines(text, goal, head_share=0.5)
    return elide_words(text, goal)


def elide_lines(text: str, goal: int, head_share: float) -> str:
    return _elide(text, "\n", goal, int(goal * head_share), ELISION, min_cut=2)


def elide_words(text: str, goal: int) -> str:
    return _elide(text, " ", goal, goal // 2, WORD_ELISION, min_cut=4)


def _elide(text: str, separator: str, goal: int, head_room: int, marker: str, min_cut: int) -> str:
    """The first parts of `text` that fit `head_room` characters and the last that fit the rest
    of `goal`, with `marker` naming how many were cut between; `text` as it is when it fits
    already or fewer than `min_cut` parts would go (a marker would save nothing)."""
    if len(text) <= goal:
        return text
    parts = text.split(separator)
    tail_room = goal - head_room
    head, used = 0, 0
    while head < len(parts) and used + len(parts[head]) + 1 <= head_room:
        used += len(parts[head]) + 1
        head += 1
    tail, used = 0, 0
    while tail < len(parts) - head and used + len(parts[-1 - tail]) + 1 <= tail_room:
        used += len(parts[-1 - tail]) + 1
        tail += 1
    cut = len(parts) - head - tail
    if cut < min_cut:
        return text
    return separator.join([*parts[:head], marker.format(n=cut), *parts[len(parts) - tail :]])


def compress(
    text: str, kind: Kind, ratio: float, *, lossy: bool, prose: bool, code_blocks: bool = True
) -> str:
    """`text` compressed as `kind`; `lossy=False` allows only the lossless transforms.

    `prose` allows eliding prose; `code_blocks` allows minifying fenced code inside prose.
    """
    if kind == "plan_ref" or ratio >= 1.0:
        return text
    if kind == "json":
        return minify_json(text) or text
    if kind == "code":
        return minify_code(text)
    if kind == "log":
        if next(fences(text), None) is not None:  # pasted between sentences: only the blocks
            return _in_fences(
                text, lambda b: compact_log(b, ratio) if lossy else collapse_repeats(b)
            )
        lead = _typed_lead(text)  # a sentence typed before a pasted log stays whole
        rest = text[len(lead) :]
        return lead + (compact_log(rest, ratio) if lossy else collapse_repeats(rest))
    if kind == "other":
        return elide(text, ratio) if lossy else text
    # prose: code blocks inside it are still code
    has_fence = code_blocks and next(fences(text), None) is not None
    small = minify_fences(text) if has_fence else text
    return elide(small, ratio) if lossy and prose else small
