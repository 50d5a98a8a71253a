"""Per-type text compression for `content_type_chunking` (004 Strategy 3, made safe).

Every function here is pure and keeps one promise per content type:

- JSON: whitespace outside strings is removed, nothing else; only when the text parses, and the
  result must parse to the same value (numbers, key order and duplicates are untouched because
  the text is never re-serialised).
- Code: comment-only lines are dropped and runs of blank lines become one blank line; no other
  line is touched, so indentation never changes. Python (detected by parsing) is handled with
  the tokenizer, so a `#` or a blank line inside a string is never dropped, and the result must
  have the same AST as the input or the input is returned. Other languages: `//` comment lines.
  Fenced blocks in Markdown are handled one by one, the prose around them is left alone.
- Logs: runs of identical lines become one line plus `[previous line repeated N more times]`,
  runs of near-identical lines (same once digits and hex ids are ignored) keep their first and
  last line around `[... N similar lines ...]`; then, if still over the ratio, the head and the
  tail are kept around `[... N lines elided by compactgate ...]` (a third head, two thirds tail:
  errors sit at the end).
- Prose and "other": head and tail around an elision marker at the ratio (lines, or words when
  the text has few lines). Used for prose only when `compress_prose` is set.

`detect` guesses the type of an unmarked message: JSON (parses), log (timestamps, levels, stack
frames on most lines), code (mostly fenced blocks, or parses as Python, or most lines look like
code), else prose. A client's `"compactgate": {"type": ...}` mark takes precedence.
"""

from __future__ import annotations

import ast
import io
import json
import re
import tokenize
from typing import Literal

Kind = Literal["code", "text", "plan_ref", "log", "json", "other"]

FENCE_RE = re.compile(r"^([ \t]*)(```|~~~)([^\n]*)\n(.*?)^\1\2[ \t]*$", re.M | re.S)
LOG_LINE_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}|\b\d{2}:\d{2}:\d{2}\b"
    r"|\b(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL|SEVERE)\b"
    r"|^\s+at \S+\(|^\s*File \".*\", line \d+|^\s*\[\s*\d+(?:\.\d+)?\]"
)
CODE_LINE_RE = re.compile(
    r"^\s*(?:def |class |import |from \S+ import |return\b|if\b.*[:{]\s*$|for\b.*[:{]\s*$"
    r"|while\b.*[:{]\s*$|#include|function\b|const |let |var |public |private |fn |func "
    r"|package |[})\]];?\s*$)|[;{]\s*$"
)
NUMBER_RE = re.compile(r"0x[0-9a-fA-F]+|[0-9a-fA-F]{8,}|\d+")
JSON_WS_RE = re.compile(r'("(?:[^"\\]|\\.)*")|\s+', re.S)
SAMPLE_LINES = 24
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
    lines = [line for line in stripped.split("\n") if line.strip()]
    sample = lines[:SAMPLE_LINES]  # enough to tell, and detection stays cheap on huge outputs
    if len(lines) >= 5 and sum(1 for line in sample if LOG_LINE_RE.search(line)) * 2 >= len(sample):
        return "log"
    fenced = sum(len(m.group(0)) for m in FENCE_RE.finditer(stripped))
    if fenced * 2 >= len(stripped):
        return "code"
    if len(lines) >= 3:
        if sum(1 for line in sample if CODE_LINE_RE.search(line)) * 5 >= len(sample) * 3:
            return "code"
        if _python_module(stripped) is not None:
            return "code"
    return "text"


# JSON ------------------------------------------------------------------------------------------


def minify_json(text: str) -> str | None:
    """`text` without insignificant whitespace; None when it is not JSON or nothing changed."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict | list):
        return None
    small = JSON_WS_RE.sub(lambda m: m.group(1) or "", text)
    if len(small) >= len(text.strip()):
        return small if small != text else None
    try:
        if json.loads(small) != value:
            return None
    except ValueError:
        return None
    return small


# Code ------------------------------------------------------------------------------------------


def minify_code(text: str) -> str:
    """Comment-only lines and blank-line runs removed; indentation never changed."""
    if FENCE_RE.search(text):
        return minify_fences(text)
    return _minify_block(text, "")


def minify_fences(text: str) -> str:
    """Only the fenced code blocks of a Markdown text minified; the prose is left alone."""

    def one(match: re.Match[str]) -> str:
        indent, fence, info, body = match.group(1), match.group(2), match.group(3), match.group(4)
        return f"{indent}{fence}{info}\n{_minify_block(body, info.strip().lower())}{indent}{fence}"

    return FENCE_RE.sub(one, text)


def _minify_block(code: str, language: str) -> str:
    tree = _python_module(code) if language in ("", "py", "python", "python3") else None
    if tree is not None:
        small = _minify_python(code)
        if small is not None and _same_ast(tree, small):
            return small
        return code
    if language in ("py", "python", "python3"):
        return code  # says Python but does not parse: leave it exactly as it is
    return _minify_generic(code)


def _python_module(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _same_ast(tree: ast.Module, code: str) -> bool:
    other = _python_module(code)
    return other is not None and ast.dump(tree) == ast.dump(other)


def _minify_python(code: str) -> str | None:
    real: set[int] = set()
    comments: set[int] = set()
    skip = {tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    try:
        for token in tokenize.generate_tokens(io.StringIO(code).readline):
            if token.type == tokenize.COMMENT:
                comments.add(token.start[0])
            elif token.type not in skip:
                real.update(range(token.start[0], token.end[0] + 1))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    kept: list[str] = []
    blank = False
    for row, line in enumerate(code.splitlines(keepends=True), start=1):
        if row in real:
            kept.append(line)
            blank = False
        elif row in comments:
            if row == 1 and line.startswith("#!"):
                kept.append(line)
        elif not blank:
            kept.append(line)
            blank = True
    return "".join(kept)


def _minify_generic(code: str) -> str:
    kept: list[str] = []
    blank = False
    for line in code.splitlines(keepends=True):
        stripped = line.strip()
        if stripped.startswith("//"):
            continue
        if not stripped:
            if blank:
                continue
            blank = True
        else:
            blank = False
        kept.append(line)
    return "".join(kept)


# Logs ------------------------------------------------------------------------------------------


def collapse_repeats(text: str) -> str:
    lines = text.split("\n")
    keys = NUMBER_RE.sub("0", text).split("\n")  # one pass; digits never span a newline
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i + 1
        while j < len(lines) and keys[j] == keys[i]:
            j += 1
        run = lines[i:j]
        if len(run) >= 2 and all(line == run[0] for line in run):
            out += [run[0], REPEATED.format(n=len(run) - 1)]
        elif len(run) >= 3 and lines[i].strip():
            out += [run[0], SIMILAR.format(n=len(run) - 2), run[-1]]
        else:
            out += run
        i = j
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
    if len(text) <= goal:
        return text
    lines = text.split("\n")
    head_room = int(goal * head_share)
    tail_room = goal - head_room
    head, used = 0, 0
    while head < len(lines) and used + len(lines[head]) + 1 <= head_room:
        used += len(lines[head]) + 1
        head += 1
    tail, used = 0, 0
    while tail < len(lines) - head and used + len(lines[-1 - tail]) + 1 <= tail_room:
        used += len(lines[-1 - tail]) + 1
        tail += 1
    cut = len(lines) - head - tail
    if cut <= 1:
        return text
    return "\n".join([*lines[:head], ELISION.format(n=cut), *lines[len(lines) - tail :]])


def elide_words(text: str, goal: int) -> str:
    if len(text) <= goal:
        return text
    words = text.split(" ")
    head_room = goal // 2
    tail_room = goal - head_room
    head, used = 0, 0
    while head < len(words) and used + len(words[head]) + 1 <= head_room:
        used += len(words[head]) + 1
        head += 1
    tail, used = 0, 0
    while tail < len(words) - head and used + len(words[-1 - tail]) + 1 <= tail_room:
        used += len(words[-1 - tail]) + 1
        tail += 1
    cut = len(words) - head - tail
    if cut <= 3:
        return text
    return " ".join([*words[:head], WORD_ELISION.format(n=cut), *words[len(words) - tail :]])


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
        return compact_log(text, ratio) if lossy else collapse_repeats(text)
    if kind == "other":
        return elide(text, ratio) if lossy else text
    # prose: code blocks inside it are still code
    small = minify_fences(text) if code_blocks and FENCE_RE.search(text) else text
    return elide(small, ratio) if lossy and prose else small
