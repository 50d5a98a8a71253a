"""Minifying JSON and code without changing what they mean (design D5.2): the part of
`policies.chunking` that rewrites text a model reads as data or source.

- JSON: whitespace outside strings is removed, nothing else; only when the text parses, and the
  result must parse to the same value (numbers, key order and duplicates are untouched because
  the text is never re-serialised).
- Code: comment-only lines are dropped and runs of blank lines become one blank line; no other
  line is touched, so indentation never changes. Python (detected by parsing) is handled with
  the tokenizer, so a `#` or a blank line inside a string is never dropped, and the result must
  have the same AST as the input or the input is returned. Other languages: `//` comment lines.
  Fenced blocks in Markdown are handled one by one, the prose around them is left alone.
"""

from __future__ import annotations

import ast
import io
import json
import re
import threading
import tokenize
import warnings
from collections.abc import Iterator

FENCE_RE = re.compile(r"^([ \t]*)(```|~~~)([^\n]*)\n(.*?)^\1\2[ \t]*$", re.M | re.S)
FENCES = ("```", "~~~")
JSON_WS_RE = re.compile(r'("(?:[^"\\]|\\.)*")|\s+', re.S)


def fences(text: str) -> Iterator[re.Match[str]]:
    """`FENCE_RE.finditer(text)`, without scanning texts that have no fence at all."""
    if FENCES[0] not in text and FENCES[1] not in text:
        return iter(())
    return FENCE_RE.finditer(text)


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
    if next(fences(text), None) is not None:
        return minify_fences(text)
    return _minify_block(text, "")


def minify_fences(text: str) -> str:
    """Only the fenced code blocks of a Markdown text minified; the prose is left alone."""

    def one(match: re.Match[str]) -> str:
        indent, fence, info, body = match.group(1), match.group(2), match.group(3), match.group(4)
        return f"{indent}{fence}{info}\n{_minify_block(body, info.strip().lower())}{indent}{fence}"

    return FENCE_RE.sub(one, text)


def _minify_block(code: str, language: str) -> str:
    tree = python_module(code) if language in ("", "py", "python", "python3") else None
    if tree is not None:
        small = _minify_python(code)
        if small is not None and _same_ast(tree, small):
            return small
        return code
    if language in ("py", "python", "python3"):
        return code  # says Python but does not parse: leave it exactly as it is
    return _minify_generic(code)


_WARNINGS_LOCK = threading.Lock()


def python_module(code: str) -> ast.Module | None:
    """The module `code` parses to, or None. The compiler's warnings about the text (prose such
    as "2nd" reads as an invalid decimal literal) are silenced: they would reach the gateway's
    stderr, and where warnings are errors (the tests) they would change the answer. The warning
    filters are process-wide, so two threads (the gateway runs some chains in a worker thread)
    must not interleave their save and restore: that could leave "ignore" installed for good."""
    try:
        with _WARNINGS_LOCK, warnings.catch_warnings(action="ignore"):
            return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _same_ast(tree: ast.Module, code: str) -> bool:
    other = python_module(code)
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
