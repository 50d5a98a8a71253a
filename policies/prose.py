"""What in a user message is prose the user wrote: the only text the ledger may carry.

Rule: a line is prose unless it is material, and material is never carried. Material is:

- a whole message (or text part) a client wrote around what it sends (`FRAMES`: Aider's files,
  repo map and command output, Codex's AGENTS.md and environment context);
- a fenced block (``` or ~~~), with its fences;
- an XML-style block a client wraps around what it injects: a line that is only an opening tag,
  through the line that is only its closing tag (Claude Code's `<system-reminder>` with the
  project's CLAUDE.md, ... `</system-reminder>`);
- a line that looks like material on its own (`material_line`): code, a log line, a data or
  table row (mostly digits and symbols), line-numbered output, a diff or merge marker, a shell
  prompt, a `path:line:` match, a repo map's glyphs, a lone token (a path, a hash), a bracketed
  note alone on its line (a marker a client or the gateway wrote: "[... 6 lines elided by
  compactgate ...]", "[Old tool result content cleared]");
- in a paragraph (lines between blank lines) that is mostly material, every line between its
  first and last material line: a stray line of a log or a file that reads like a sentence
  ("collected 420 items") is material too, while a sentence typed right before or after a
  paste stays prose.

`prose_spans` gives the prose as (start, end) spans of the text itself, so whatever the ledger
takes from a span is the user's own words, in order.
"""

from __future__ import annotations

import re
import string

# How a client opens a message that holds material rather than the user's words. Matched on
# the message's first characters (blanks aside). Each row: the opening, and whose it is.
FRAMES: tuple[tuple[str, str], ...] = (
    ("I have *added these files to the chat*", "Aider: the files added to the chat"),
    ("Here are summaries of some files present in my git repo", "Aider: the repo map"),
    ("Here are some READ ONLY files", "Aider: read-only files"),
    ("I ran this command:", "Aider: /run, /test and /lint output"),
    ("# AGENTS.md instructions for", "Codex CLI: the project's AGENTS.md"),
    ("<environment_context>", "Codex CLI: the environment"),
    ("<user_instructions>", "Codex CLI: the user's instructions file"),
)
_OPENINGS = tuple(opening for opening, _ in FRAMES)

_FENCE = re.compile(r"^[ \t]*(```|~~~)")
_OPEN_TAG = re.compile(r"^\s*<([A-Za-z_][\w.-]*)(?:\s[^<>]*)?>\s*$")
_MATERIAL = re.compile(
    r"(?:\t| {4,}(?![-*•・] ))"  # indented code (an indented bullet is prose)
    r"|\s*\d+(?:\t|→|\| |: )"  # line-numbered output
    r"|\s*\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\s*\[?\d{2}:\d{2}:\d{2}"  # a log's time stamp
    r"|\s*\[?(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|FATAL|CRITICAL)\b[\]:\s]"  # level
    r"|(?:\+\+\+ |--- |@@ |<<<<<<< |=======\s*$|>>>>>>> |diff --git )"  # diff, merge markers
    r"|\s*[$>] \S"  # a shell prompt, a quoted line of output
    r"|[\w./-]+:\d+[:-]"  # path:line: (grep, compilers)
    r"|\s*[│├└⋮┃]"  # a repo map's or a tree's glyphs
    r"|\s*\[[^\[\]]*\]\s*$"  # a bracketed note alone: a marker ("[... 6 lines elided ...]")
    # a line shaped like code (a keyword and what follows it in code, so "let me know" is prose)
    r"|\s*(?:def \w+\(|class \w+\s*[(:{]|import [\w.]+\s*$|from [\w.]+ import \w"
    r"|return\b.*[;)\]]\s*$|func \w|package \w+\s*$|#include|(?:const|let|var) \w+\s*[:=]"
    r"|(?:public|private) \w|fn \w+\(|[})\]];?\s*$)"
)
# What a line needs for any rule of `material_line` but the lone token's (one scan of most lines):
# a character anywhere, or how the line starts (matched at its start only)
_SUSPECT = re.compile(r"[\d;{}()=<>\[\]|$:/\\@`│├└⋮┃\t]")
_SUSPECT_START = re.compile(
    r" {4}|[-+]{3}|\s*\[?[A-Z]{4}|\s*(?:def|class|import|from"
    r"|return|func|package|const|let|var|public|private|fn)\b"
)
_CODE_SIGNS = re.compile(r"[;{}]|==|!=|->|=>|::|\w\(|\)\s*:?\s*$|\w\[|^\s*[\w.]+\s*[+\-*/]?=\s")
# A character every match of `_CODE_SIGNS` has: a line without one has no sign of code
_CODE_MARK = re.compile(r"[;{}=>:()\[]")
_WORD = re.compile(r"[A-Za-z]{3,}|[\u3040-\u9fff]")
_CJK = re.compile("[\u3040-\u9fff]")
_ASCII_LETTERS = str.maketrans("", "", string.ascii_letters)
MOSTLY = 0.5  # a paragraph with at least this share of material lines is material


def is_framed(text: str) -> bool:
    """Whether a client wrote this message around material (`FRAMES`)."""
    return text.lstrip().startswith(_OPENINGS)


def material_line(line: str) -> bool:
    """Whether one line looks like material rather than a sentence."""
    stripped = line.strip()
    if not stripped:
        return False
    if " " not in stripped and not _CJK.search(stripped) and len(stripped) >= 3:
        return True  # a lone token: a path, a hash, an identifier
    if _SUSPECT.search(line) is None and _SUSPECT_START.match(line) is None:
        return False  # no digit, no sign of code, a log or a table
    if _MATERIAL.match(line) or stripped.endswith((";", "{")):
        return True
    if stripped.isascii():  # (a letter is an ASCII one; counted by deleting them all)
        letters = len(stripped) - len(stripped.translate(_ASCII_LETTERS))
    else:
        letters = sum(map(str.isalpha, stripped))
    visible = len("".join(stripped.split()))  # (`split` drops what `isspace` says is blank)
    if visible >= 8 and letters * 2 < visible:
        return True  # mostly digits and symbols: a data row, a rule of '=', a number table
    if _CODE_MARK.search(stripped) is None:
        return False
    signs = len(_CODE_SIGNS.findall(stripped))
    return signs >= 2 and len(_WORD.findall(stripped)) <= 2 * signs


def prose_spans(text: str) -> list[tuple[int, int]]:
    """Where the prose is: (start, end) spans of `text`, each a run of prose lines."""
    if is_framed(text):
        return []
    if "\n" not in text:  # one line: prose unless it looks like material
        return [] if material_line(text) or not text.strip() else [(0, len(text))]
    lines = text.split("\n")
    blocked = _blocks(lines)
    material = [b or material_line(line) for b, line in zip(blocked, lines, strict=True)]
    _paragraphs(lines, material, blocked)
    spans: list[tuple[int, int]] = []
    at = 0
    start: int | None = None
    for i, line in enumerate(lines):
        if material[i]:
            if start is not None:
                spans.append((start, at - 1))
                start = None
        elif start is None and line.strip():
            start = at
        at += len(line) + 1
    if start is not None:
        spans.append((start, len(text)))
    return [(a, b) for a, b in spans if text[a:b].strip()]


def _blocks(lines: list[str]) -> list[bool]:
    """Lines inside fenced blocks and XML-style blocks (markers included)."""
    material = [False] * len(lines)
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        tag = _OPEN_TAG.match(lines[i]) if fence is None else None
        end = None
        if fence is not None:
            marker = fence.group(1)
            end = next(
                (k for k in range(i + 1, len(lines)) if lines[k].strip().startswith(marker)),
                len(lines) - 1,
            )
        elif tag is not None:
            closing = f"</{tag.group(1)}>"
            end = next((k for k in range(i + 1, len(lines)) if lines[k].strip() == closing), None)
        if end is None:
            i += 1
            continue
        for k in range(i, end + 1):
            material[k] = True
        i = end + 1
    return material


def _paragraphs(lines: list[str], material: list[bool], blocked: list[bool]) -> None:
    """In a paragraph that is mostly material, every line between its first and its last
    material line is material too (a sentence typed before or after a paste stays prose);
    in any paragraph, so is a line between two material lines. Blank lines and blocks
    (fenced, XML-style) end a paragraph."""
    start = 0
    for i in range(len(lines) + 1):
        if i < len(lines) and lines[i].strip() and not blocked[i]:
            continue
        marked = [k for k in range(start, i) if material[k]]
        if marked and len(marked) >= MOSTLY * (i - start) and i - start >= 3:
            for k in range(marked[0], marked[-1] + 1):
                material[k] = True
        else:
            for k in range(start + 1, i - 1):
                if material[k - 1] and material[k + 1]:
                    material[k] = True
        start = i + 1
