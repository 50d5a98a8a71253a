"""What a concrete detail is: the patterns `policies.salience` finds facts in a sentence with.

Rule: a concrete detail is a number with a unit or currency, a date or a time, a version, an IP
address or a port, a path or a file name, an address (URL, e-mail, host), an identifier
(snake_case, camelCase, CONSTANT_CASE, a ticket key, a backticked name), a proper name (capitalised
mid-sentence, with inner capitals, an acronym, a Latin word in CJK text, one introduced as a
name), or a name in CJK text. Each kind counts once, however often it matches. Every pattern has
a cheap test that is true whenever it could match, so most sentences are never scanned by the
slow ones; `may_detail` says from a few scans of a whole text whether any pattern can match in
it. Pure and deterministic, like the rest of salience.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import NamedTuple

# Letters a case-insensitive pattern takes for an ASCII letter that lower() keeps apart.
_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s"})
_CJK = re.compile("[\u3040-\u9fff]")
_UPPER = re.compile("[A-Z]")
_ASCII_LETTER = re.compile("[A-Za-z]")
_DIGIT = re.compile(r"\d")
_DOT_WORD = re.compile(r"\.\w")
_LOWER_UPPER = re.compile("[a-z][A-Z]")
_TOP_LEVEL = re.compile(r"\.(?:com|org|net|io|dev|internal|local|cn|jp)")
_MONTH = re.compile("jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec")
_CJK_NAME_MARK = re.compile("[「“《\u3040-\u9fff]")
# Words one of the name-introducing patterns needs, any of them (plain substrings, one scan).
_NAME_PHRASE = re.compile("name is|called|call me|owns|in charge of|responsible for|work")


class Seen(NamedTuple):
    """What a sentence has, worked out once: which detail patterns can match at all."""

    text: str
    lower: str
    digit: bool
    cjk: bool
    upper: bool  # an ASCII capital
    upper_or_latin: bool  # an ASCII letter


class _Detail(NamedTuple):
    """One way to find a kind of concrete detail: found when a pattern matches. `may` is a
    cheap test that is true whenever a pattern could match (each pattern needs what it checks),
    so most sentences are never scanned by the slow patterns; `digit`: the patterns need a
    digit too (a sentence without one never looks at the entry). None: nothing but the digit.
    A kind with several ways to be found has several entries, each with the test its own
    patterns need."""

    kind: int
    may: Callable[[Seen], bool] | None
    patterns: tuple[re.Pattern[str], ...]
    digit: bool = False


_FILE_EXTENSIONS = (
    "py|js|ts|tsx|go|rs|java|rb|c|h|cpp|md|txt|json|ya?ml|toml|ini|cfg|sql|sh|csv|html|css|lock|"
    "env|log"
)
# Concrete details: each kind found counts once, however often it matches. A pattern that
# starts with a lookbehind is written character first, the lookbehind after it (the same
# matches): the regular expression engine then skips ahead to the next candidate character
# instead of trying every position (a file name is found from its dot). A run of digits that
# the unit after it cannot start inside is matched possessively (`*+`: giving back never leads
# to a match) and only from its first digit (a match from inside the run has one from there).
_DETAILS: tuple[_Detail, ...] = (
    # a number with a unit or currency (also CJK units and counters)
    _Detail(
        0,
        None,
        (
            re.compile(r"[$€£¥]\s?\d"),
            re.compile(
                r"(?i:\d(?<!\d\d)[\d,.]*+\s?(?:%|ms|s\b|sec|seconds?|"
                r"min(?:utes?)?|hours?|days?|weeks?|months?|years?|[kmgt]i?b\b|bytes?|tokens?|"
                r"px|rpm|rps|qps|requests?|users?|usd|eur|gbp|jpy|cny|rmb|dollars?|euros?|yen|"
                r"km|kg|mb/s|gb/s|cores?|replicas?|nodes?|times|x\b|元|円|万|億|亿|个|件|人|台|天|"
                r"日|時間|小时|分钟|分|秒|週間|周|年|月|号|歳|岁))"
            ),
        ),
        True,
    ),
    # a date or a time: in digits, a month's name and a day, or a weekday's name
    _Detail(
        1,
        None,
        (re.compile(r"\d(?<!\w\d)(?:\d{3}[-/.]\d{1,2}[-/.]\d{1,2}\b|\d?:\d{2}\b)"),),
        True,
    ),
    _Detail(
        1,
        lambda s: "月" in s.text,
        (re.compile(r"\d{1,4}年\d{1,2}月|\d{1,2}月\d{1,2}[日号]"),),
        True,
    ),
    _Detail(
        1,
        lambda s: _MONTH.search(s.lower) is not None,  # look-alikes folded
        (
            re.compile(
                r"(?i:\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2}"
                r"(?:st|nd|rd|th)?\b)"
            ),
        ),
        True,
    ),
    _Detail(
        1,
        lambda s: "day" in s.lower,  # no look-alike letter in "day"
        (re.compile(r"(?i:\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b)"),),
    ),
    # a version, an IP address, a port
    # (bounded by what is not an ASCII letter or digit: in CJK text there is no \b before one)
    _Detail(
        2,
        None,
        (
            re.compile(
                r"(?<![0-9A-Za-z.])v?\d+\.\d+(?:\.\d+)*(?![0-9A-Za-z])|\bport \d+\b|:\d{2,5}\b|"
                r"(?<![0-9A-Za-z.])\d{3,}(?![0-9A-Za-z])"
            ),
        ),
        True,
    ),
    # a path or a file name (ASCII-bounded, as in CJK text nothing separates them)
    _Detail(
        3,
        lambda s: "/" in s.text,
        (
            re.compile(
                r"(?i:(?<![A-Za-z0-9._-])(?:~|\.{1,2})?/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+|"
                r"(?:^|(?<=[\s(`'\"]))/[A-Za-z0-9_.-]+)"
            ),
        ),
    ),
    _Detail(
        3,
        lambda s: _DOT_WORD.search(s.text) is not None,
        (re.compile(rf"(?i:\.(?<=[A-Za-z0-9_-]\.)(?:{_FILE_EXTENSIONS})(?![A-Za-z0-9]))"),),
    ),
    # an address: URL, e-mail, host name
    _Detail(4, lambda s: "://" in s.text, (re.compile(r"(?i:\bhttps?://\S+)"),)),
    _Detail(4, lambda s: "@" in s.text, (re.compile(r"(?i:\b[\w.+-]+@[\w-]+\.[\w.]+\b)"),)),
    _Detail(
        4,
        lambda s: _TOP_LEVEL.search(s.lower) is not None,  # look-alikes folded in `lower`
        (re.compile(r"(?i:\b[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|io|dev|internal|local|cn|jp)\b)"),),
    ),
    # an identifier: snake_case, camelCase, CONSTANT_CASE, a ticket or key like ABC-123
    _Detail(
        5,
        lambda s: "_" in s.text,
        (re.compile(r"\b[a-z]+_[a-z0-9_]+\b|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b"),),
    ),
    _Detail(
        5,
        lambda s: _LOWER_UPPER.search(s.text) is not None,
        (re.compile(r"\b[a-z]+[A-Z][a-zA-Z0-9]+\b"),),
    ),
    _Detail(
        5,
        lambda s: "-" in s.text,
        (re.compile(r"\b[A-Z]{2,}-\d+\b|\b[a-z]+(?:-[a-z0-9]+)*-\d+\b"),),
        True,
    ),
    _Detail(5, lambda s: "`" in s.text, (re.compile(r"`[^`\s]{2,}`"),)),
    # a proper name: capitalised in the middle of an English sentence, with inner capitals
    # (PostgreSQL, GitHub), an acronym (AWS, SLA)
    _Detail(
        6,
        lambda s: s.upper,
        (
            re.compile(r"[A-Z](?<=[a-z,] [A-Z])[a-z]+"),
            re.compile(r"[A-Z](?<![A-Za-z][A-Z])[a-z]+[A-Z][A-Za-z]*"),
            re.compile(r"[A-Z](?<![A-Za-z][A-Z])[A-Z]{1,5}s?(?![A-Za-z])"),
        ),
    ),
    # ... a Latin word inside CJK text (UTC, Kubernetes), counted with the above
    _Detail(
        6,
        lambda s: s.cjk and s.upper_or_latin,
        (
            re.compile("[A-Za-z](?<=[\u3040-\u9fff][A-Za-z])[\\w.+-]*"),
            re.compile("[A-Za-z][\\w.+-]*(?=[\u3040-\u9fff])"),
        ),
    ),
    # ... or introduced as one ("my name is", "owns", "is responsible for"), counted with them
    _Detail(
        6,
        lambda s: _NAME_PHRASE.search(s.lower) is not None,  # look-alikes folded in `lower`
        (
            re.compile(
                r"(?i:\bmy name is\b|\bi'?m called\b|\bcall me\b|\bowns\b|\bin charge of\b|"
                r"\bresponsible for\b|\bworks? on\b)"
            ),
        ),
    ),
    # a name in CJK text: quoted, or introduced as one (名叫, 叫做, 姓; さん, 様, 名前は)
    _Detail(
        7,
        lambda s: _CJK_NAME_MARK.search(s.text) is not None,
        (
            re.compile(
                r"「[^」]{1,30}」|“[^”]{1,30}”|《[^》]{1,30}》|"
                r"(?:名叫|叫做|名字是|我叫|姓|负责)[\u4e00-\u9fff]{1,4}|"
                r"[\u4e00-\u9fff\u30a0-\u30ff]{1,6}(?:さん|様|氏)|名前は"
            ),
        ),
    ),
)
# `_DETAILS` as `detail_count` walks it: (kind, cheap test, the patterns' bound search methods).
_DETAIL_TABLE = tuple((d.kind, d.may, tuple(p.search for p in d.patterns)) for d in _DETAILS)
# ... without the entries that need a digit: what a sentence without one walks.
_UNDIGITED = tuple(row for d, row in zip(_DETAILS, _DETAIL_TABLE, strict=True) if not d.digit)
# What every detail pattern needs, in a few scans of a whole text (`salience._may_score`): a digit,
# a path's, an address's or an identifier's mark, a quote, a dot before a word character (a
# file name, a host); lower case then upper case (camelCase, GitHub), a capital after a
# lower-case word (a name mid-sentence), two capitals (an acronym); a weekday's or a
# name-introducing phrase (in the lower-cased text, look-alike letters folded); in CJK text,
# a name's mark or a Latin letter next to a CJK character (over any word characters between).
_MAY_MARK = re.compile("[\\d/_@`「“《]")
_MAY_CAPITAL = re.compile("[A-Z](?:(?<=[a-z][A-Z])|(?<=[a-z,] [A-Z])[a-z]|(?<![A-Za-z][A-Z])[A-Z])")
_MAY_PHRASE = re.compile(
    "day|my name is|i'?m called|call me|owns|in charge of|responsible for|works? on"
)
_MAY_CJK_NAME = re.compile("名叫|叫做|名字是|我叫|姓|负责|さん|様|氏|名前は")
_MAY_CJK_LATIN = re.compile("[\u3040-\u9fff][A-Za-z]|[A-Za-z][\\w.+-]*[\u3040-\u9fff]")


def lowered(text: str) -> str:
    """`text` lower-cased, with the letters a case-insensitive pattern takes for an ASCII letter
    folded to it (the fold only when the text has a letter beyond ASCII)."""
    return text.lower() if text.isascii() else text.translate(_FOLD).lower()


def seen_of(text: str, lower: str) -> Seen:
    upper = _UPPER.search(text) is not None
    return Seen(
        text,
        lower,
        _DIGIT.search(text) is not None,
        _CJK.search(text) is not None,
        upper,
        upper or _ASCII_LETTER.search(text) is not None,
    )


def may_detail(text: str, lower: str, cjk: bool) -> bool:
    """Whether `text` (lower-cased: `lower`; with a CJK character: `cjk`) may have a concrete
    detail: false only when no detail pattern matches in it."""
    return (
        _MAY_MARK.search(text) is not None
        or _MAY_CAPITAL.search(text) is not None
        or _MAY_PHRASE.search(lower) is not None
        or _DOT_WORD.search(text) is not None
        or (cjk and (_MAY_CJK_NAME.search(text) or _MAY_CJK_LATIN.search(text)) is not None)
    )


def _found(seen: Seen) -> Iterator[int]:
    """The kinds of concrete detail a sentence has, each once, found as they are asked for."""
    text = seen.text
    found: set[int] = set()
    for kind, may, searches in _DETAIL_TABLE if seen.digit else _UNDIGITED:
        if kind in found or (may is not None and not may(seen)):
            continue
        for search in searches:
            if search(text) is not None:
                found.add(kind)
                yield kind
                break


def detail_count(seen: Seen, enough: int = len(_DETAILS)) -> int:
    """How many kinds of concrete detail a sentence has, counted up to `enough`."""
    count = 0
    for _ in _found(seen):
        count += 1
        if count >= enough:
            break
    return count


def detail_kinds(seen: Seen) -> frozenset[int]:
    """Which kinds of concrete detail a sentence has (all of them: `detail_count` counts)."""
    return frozenset(_found(seen))
