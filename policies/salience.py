"""How much a statement must survive compaction, whatever the latest message is about.

A user who said "never touch the production database" once, early, still means it two hundred
turns later, when the latest message is "continue". Relevance to the latest message cannot see
that; salience is a property of the statement alone: a pure, deterministic score in 0..1 of one
sentence, from what kind of statement it is.

Kinds, strongest first: `prohibition` (never, do not, 禁止, 不要, しないで), `instruction` (always,
from now on, 务必, 必ず), `correction` (actually, I meant, 更正, 訂正), `constraint` (must, at most,
deadline, 必须, 以内), `decision` (we decided, 决定, 決めました), `preference` (I prefer, 偏好,
の方がいい), `goal` (the goal is, 目标, 目標), and `fact`: concrete details (numbers with units,
dates, versions, paths, addresses, identifiers, proper names). A sentence with a kind's cue and
concrete details scores higher than either alone. Acknowledgements and filler ("ok, thanks",
"好的", "了解しました") score 0; a question is a request for now, not a durable statement, so it
scores lower.

Rules rather than a model: the score must be the same on every replica and every run (the ledger
it feeds is part of a cached prefix), explainable when an operator asks why a sentence was kept,
cost tens of microseconds per sentence, once per distinct message (the gateway remembers it
across requests), and need nothing downloaded. Cue lists for three languages are small; a
small classifier would need shipped weights and a runtime, and would still need these rules to
say why.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

from .salience_cues import ANY_CJK, ANY_EN, CUES, KIND_SCORES, by_first_letter
from .salience_details import Seen, detail_count, detail_kinds, lowered, may_detail, seen_of

FACT_BASE = 0.45  # one concrete detail; each further one adds FACT_STEP, up to three
FACT_STEP = 0.1
DETAIL_BONUS = 0.1  # a cued sentence that also carries concrete details
QUESTION_FACTOR = 0.6  # a question asks for something now; its cue is weaker evidence
REQUEST_FACTOR = 0.7  # so does a one-off request ("run the tests in src/"): details, not a rule
STATED_BONUS = 0.1  # details said as a fact ("the server is at 10.0.3.7") rather than asked for
MIN_CHARS = 8  # shorter sentences carry no durable statement
PASSAGE_SENTENCES = 3  # a salient sentence and at most two that carry it on
LEAD_IN_WORDS = 2  # a salient sentence this short ("Correction.") leads in to the next one
LEAD_IN_CJK = 6  # ... in CJK characters ("訂正します。")

_CJK = re.compile("[\u3040-\u9fff]")
_LATIN = re.compile("[a-z]")
_NON_WORD = re.compile(r"\W")


def _cue(seen: Seen) -> str | None:
    """The kind of the strongest cue in a sentence, if any."""
    lower = seen.lower
    latin = _LATIN.search(lower) is not None and ANY_EN.search(lower) is not None
    cjk = seen.cjk and ANY_CJK.search(lower) is not None
    if latin or cjk:
        for kind, english, chinese_japanese in CUES:
            if (latin and english.search(lower)) or (cjk and chinese_japanese.search(lower)):
                return kind
    return None


def _may_score(text: str) -> tuple[bool, bool]:
    """(whether a sentence of `text` may have a cue, whether one may score above 0), from one
    look at the whole text, before it is split: most messages have neither a cue nor a detail.

    A sentence scores only with a cue or a detail, and whatever a cue or detail pattern finds in
    a sentence it also finds in the whole text. A sentence is a stretch of the text that starts
    after a blank, a line break or an end mark ("!", "。") and ends before a blank (or with its end
    mark), and no pattern tells those apart from a string's ends: a word boundary, a lookbehind
    for a letter or a digit, a lookahead for one, all see the same there. The one exception,
    `^` in the path pattern, needs a "/" all the same. Lower-casing the whole text lower-cases
    each sentence the same way (no pattern tells "σ" from "ς")."""
    lower = lowered(text)
    cjk = _CJK.search(text) is not None
    if (_LATIN.search(lower) is not None and ANY_EN.search(lower) is not None) or (
        cjk and ANY_CJK.search(lower) is not None
    ):
        return True, True
    return False, may_detail(text, lower, cjk)


_FILLER_WORDS = (
    r"ok(?:ay)?|k|sure|yes|yeah|yep|no|nope|thanks?(?: you)?|thank you(?: so much)?|ty|great|"
    r"cool|nice|perfect|got it|sounds good|looks good|lgtm|go on|continue|go ahead|"
    r"continue with the plan|keep going|next|done|right|fine|alright|good|hmm+|ah|oh|well|"
    r"好的?|好|谢谢|谢了|嗯|对|行|可以|继续|收到|明白了?|没问题|看起来不错|不错|很好|"
    r"はい|ええ|了解(?:です|しました)?|ありがとう(?:ございます)?|続けて(?:ください)?|"
    r"わかりました|分かりました|OKです|お願いします|いいですね|良さそうですね|うーん"
)
_FILLER = re.compile(rf"^\W*(?:{_FILLER_WORDS})(?:\W+(?:{_FILLER_WORDS}))*\W*$", re.I)

# Sentences end at . ! ? and their CJK forms (kept with the sentence), at a line break, and
# before a list bullet; a period inside a number, a path or a version does not end one.
# Written as a run of other characters and of periods that end nothing, rather than a lazy
# run: the same matches, without trying every end at every character.
_SENTENCE = re.compile(
    r"[^\n。！？!?.]*(?:\.(?!\s|$)[^\n。！？!?.]*)*(?:[。！？!?]+|\.(?=\s|$)|\n|$)"
)
_BULLET = re.compile(r"^\s*(?:[-*•・]\s*|\d+[.)]\s+)")
_BULLETS = frozenset("-*•・")
_NUMBER_MARK = re.compile(r"^\d+[.)]$")  # "1." split off its item by the sentence rule


# A sentence stating a fact: a copula or a verb of having or being located, in each language.
# English on the lower-cased sentence, the cues grouped by their first letter; Chinese and
# Japanese only when it has a CJK character (each of those cues has one).
_STATED_EN = re.compile(
    by_first_letter(
        (
            *("is", "are", "was", "were", "runs", "lives", "sits", "uses", "has", "have"),
            *("costs", "equals", "means", "belongs", "called", "named", "located", "hosted"),
            *("stored", "owned", "owns", "deployed", "scheduled", "rotates?", "expires?"),
        )
    )
)
_STATED_CJK = re.compile(
    r"是|在|叫|为|有|位于|部署|です|である|にある|にあり|ています|されます|あります|います|"
    r"は.{1,20}(?:だ|です)"
)


def _stated(seen: Seen) -> bool:
    return _STATED_EN.search(seen.lower) is not None or (
        seen.cjk and _STATED_CJK.search(seen.text) is not None
    )


# A sentence asking for one action now: it starts with a verb of doing or a polite request
# (`_REQUEST`, matched at the start), or ends with a Japanese one (`_REQUEST_JA`, looked for only
# in a sentence with "して": a scan of every position is the slow part).
_REQUEST = re.compile(
    r"^\W*(?:please |now |then |ok,? |okay,? |next,? )?(?:run|open|show|check|look|try|fix|add|"
    r"print|list|read|cat|see|grep|find|search|rerun|build|install|create|write|update|"
    r"change|edit|rename|move|delete|remove|test|debug|explain|tell|give|let'?s|can you|"
    r"could you|would you)\b|^\W*(?:再|重新)?(?:请|帮我|看一下|运行|打开|查看|试)",
    re.I,
)
_REQUEST_JA = re.compile(r"(?:してください|して下さい|して)\W*$", re.I)


# A sentence that refers back to the one before it: a pronoun or a connective, in each language.
_REFERS_BACK = re.compile(
    r"^\W*(?:(?:it|this|that|these|those|they|them|because|since|so|otherwise|also|but|and|"
    r"which|as|then|except|unless|even)\b|该|这|那|因为|所以|否则|但|并且|而且|它|其|"
    r"それ|これ|この|その|あの|なぜなら|だから|ただし|でも|また|別の)",
    re.I,
)


class Statement(NamedTuple):
    """One sentence of a message, how much it must survive, and why."""

    text: str
    score: float
    kind: str | None  # the strongest cue's kind, "fact" for details alone, None for neither


def sentences(text: str) -> list[str]:
    """The sentences of `text`, each stripped, in order; list bullets removed."""
    return [text[start:end] for start, end in _spans(text)]


def _spans(text: str) -> list[tuple[int, int]]:
    """Where each sentence of `text` is, without surrounding blanks and list bullets."""
    return [(start, end) for start, end, _ in _items(text)]


def _items(text: str) -> list[tuple[int, int, bool]]:
    """`_spans`, each told whether it is a list item (it started with a bullet or a number)."""
    out = []
    numbered = False
    for match in _SENTENCE.finditer(text):
        piece = match.group()
        start, end = match.start(), match.end()
        rest = piece.lstrip()
        first = rest[:1]  # (a bullet or a digit after the blanks, or no list item)
        bullet = _BULLET.match(piece) if first in _BULLETS or first.isdigit() else None
        lead = bullet.end() if bullet else len(piece) - len(rest)
        start += lead
        end -= len(piece) - len(piece.rstrip())
        if end <= start:
            continue
        if (
            text[start].isdigit()  # (what `_NUMBER_MARK` starts with, and more)
            and _NUMBER_MARK.match(text[start:end])
            and "\n" not in piece.rstrip(" \t")
        ):
            numbered = True  # "1." of "1. item": the item that follows is a list item
            continue
        out.append((start, end, bullet is not None or numbered))
        numbered = False
    return out


def items(text: str) -> list[tuple[int, int]]:
    """Where each sentence of `text` is (start, end), as `sentences` cuts them."""
    return _spans(text)


# Kinds of concrete detail that name code (a path or a file, an identifier), and a capitalised
# word (a name, an acronym, a Latin word in CJK text), rather than state a fact about the world
# (a number, a date, a version, an address, a name in CJK text).
_CODE_DETAILS = frozenset({3, 5})
_NAME_DETAILS = frozenset({6})


class Signals(NamedTuple):
    """What one sentence has, for a ranking of sentences that score below a threshold."""

    kind: str | None  # the strongest cue's kind
    facts: int  # kinds of concrete detail other than code names and capitalised words
    code: bool  # a code name: a path, a file, an identifier
    name: bool  # a capitalised word: a name, an acronym ("None" in a question is one too)
    request: bool  # it asks for one action now
    question: bool
    filler: bool  # an acknowledgement or filler, by the filler words alone
    rest: str  # the sentence without the filler words it opens with ("ok, ...")


_LEADING_FILLER = re.compile(rf"^\W*(?:(?:{_FILLER_WORDS})(?:\W+|$))+", re.I)


def signals(
    sentence: str, cues: bool = True, details: bool = True, looks: Looks | None = None
) -> Signals:
    """The signals of one sentence (told, as `passages` is, whether it may have a cue, and
    whether it may have a concrete detail: `look`; `looks`: as `passage_spans` takes it)."""
    text = sentence.strip()
    if _FILLER.match(text):
        return Signals(None, 0, False, False, False, False, True, "")
    kind: str | None = None
    found: frozenset[int] = frozenset()
    if cues or details:  # (with neither, nothing of the look is needed)
        look = _looked(text, cues, details, looks)
        kind = look[1]
        if details and look[2]:
            kinds: frozenset[int] | None = look[3]
            if kinds is None:
                kinds = look[3] = detail_kinds(look[0])
            found = kinds
    lead = _LEADING_FILLER.match(text)
    return Signals(
        kind,
        len(found - _CODE_DETAILS - _NAME_DETAILS),
        bool(found & _CODE_DETAILS),
        bool(found & _NAME_DETAILS),
        _REQUEST.match(text) is not None
        or ("して" in text and _REQUEST_JA.search(text) is not None),
        _is_question(text),
        False,
        text[lead.end() :] if lead else text,
    )


def stated(sentence: str) -> bool:
    """Whether a sentence is said as a fact: a copula, a verb of having or being located."""
    text = sentence.strip()  # (`_stated` of its `seen_of`, without the scans it does not need)
    return _STATED_EN.search(lowered(text)) is not None or (
        _CJK.search(text) is not None and _STATED_CJK.search(text) is not None
    )


def score(sentence: str) -> Statement:
    """How much one sentence must survive (0..1), and its kind."""
    return _score(sentence, True)


def _score(sentence: str, cues: bool, looks: Looks | None = None) -> Statement:
    """`score`, told whether the sentence may have a cue at all (`_may_score` of its text)."""
    text = sentence.strip()
    if (len(text) < MIN_CHARS and not _has_cjk(text)) or _FILLER.match(text) or len(text) < 2:
        return Statement(text, 0.0, None)
    look = _looked(text, cues, True, looks)
    seen, kind, may = look[0], look[1], look[2]
    if kind is None and not may:
        return Statement(text, 0.0, None)
    # a cued sentence only asks whether it has a detail; a bare fact counts up to three
    details = 0
    if may:
        kinds: frozenset[int] | None = look[3]
        if kinds is not None:
            details = min(len(kinds), 1 if kind is not None else 3)
        elif kind is not None:
            details = detail_count(seen, 1)
        else:  # all of them: `signals` reads them back
            kinds = look[3] = detail_kinds(seen)
            details = min(len(kinds), 3)
    if kind is not None:
        value = KIND_SCORES[kind] + (DETAIL_BONUS if details else 0.0)
    elif details:
        kind = "fact"
        value = FACT_BASE + FACT_STEP * (min(details, 3) - 1)
        # "show me where X is called": a request, whatever its verbs
        if _REQUEST.match(text) or _REQUEST_JA.match(text):
            value *= REQUEST_FACTOR
        elif _stated(seen):
            value += STATED_BONUS
    else:
        return Statement(text, 0.0, None)
    if _is_question(text):
        value *= QUESTION_FACTOR
    return Statement(text, round(min(1.0, value), 3), kind)


# What `_score` and `signals` both work out of one stripped sentence, kept between them for one
# cue flag: [`seen_of`, the cue's kind, whether it may have a detail (None: not asked yet), its
# `detail_kinds` (None: not worked out yet)].
Looks = dict[str, list[Any]]


def _looked(text: str, cues: bool, details: bool, looks: Looks | None) -> list[Any]:
    look = looks.get(text) if looks is not None else None
    if look is None:
        seen = seen_of(text, lowered(text))
        look = [seen, _cue(seen) if cues else None, None, None]
        if looks is not None:
            looks[text] = look
    if details and look[2] is None:
        look[2] = may_detail(text, look[0].lower, look[0].cjk)
    return look


def statements(text: str) -> list[Statement]:
    """Every sentence of `text` with its score, in order."""
    cues, may = _may_score(text)
    if not may:
        return [Statement(s.strip(), 0.0, None) for s in sentences(text)]
    return [_score(s, cues) for s in sentences(text)]


def salience(text: str) -> float:
    """A message's salience: its most salient sentence's score (0 when it has none)."""
    cues, may = _may_score(text)
    if not may:
        return 0.0
    return max((_score(s, cues).score for s in sentences(text)), default=0.0)


def look(text: str) -> tuple[bool, bool]:
    """(whether a sentence of `text` may have a cue, whether one may score above 0): one cheap
    look at the whole text, for `passages` of its parts."""
    return _may_score(text)


def passages(part: str, threshold: float, cues: bool) -> list[Statement]:
    """`salient` of a part of a text whose `look` said `cues` (true when it may have a cue)."""
    return _passages(part, threshold, cues)


def salient(text: str, threshold: float) -> list[Statement]:
    """The passages of `text` that must survive, word for word, in order: each sentence scoring
    at least `threshold`, with the sentences right after it that carry it on ("Don't delete
    /srv/x. It is shared with another team."), up to `PASSAGE_SENTENCES`. Filler, a question or
    a request for now ends a passage."""
    cues, may = _may_score(text) if threshold > 0 else (True, True)
    return _passages(text, threshold, cues) if may else []


def passage_spans(
    part: str, threshold: float, cues: bool, looks: Looks | None = None
) -> tuple[list[tuple[int, int]], list[tuple[int, int, Statement]]]:
    """Where each sentence of `part` is (`items`), and `passages` with where each is in `part`
    (start, end: the passage is that slice), from one split into sentences. `looks` (one dict
    per `cues`) keeps what scoring found in each sentence for `signals` of the same ones."""
    found = _items(part)
    spans = [(start, end) for start, end, _ in found]
    return spans, _passage_spans(part, threshold, cues, found, looks)


def _passages(text: str, threshold: float, cues: bool) -> list[Statement]:
    """`salient`, told whether the text may have a cue at all."""
    return [statement for _, _, statement in _passage_spans(text, threshold, cues)]


def _passage_spans(
    text: str,
    threshold: float,
    cues: bool,
    found: list[tuple[int, int, bool]] | None = None,
    looks: Looks | None = None,
) -> list[tuple[int, int, Statement]]:
    """`_passages` with their spans (`found`: the text's `_items`, when worked out already). A
    list under a salient lead-in ("A few ground rules before we start:") is one passage with
    it, however long."""
    out: list[tuple[int, int, Statement]] = []
    passage: list[tuple[int, int, Statement]] = []
    listing = False  # the passage is a salient lead-in and its list
    for start, end, item in _items(text) if found is None else found:
        statement = _score(text[start:end], cues, looks)
        if passage and item and (listing or _leads_list(passage)):
            listing = True
            passage.append((start, end, statement))
            continue
        if (
            passage
            and not listing
            and len(passage) < PASSAGE_SENTENCES
            and _carries_on(passage[-1][2], statement, threshold)
        ):
            passage.append((start, end, statement))
            continue
        if passage:
            out.append((passage[0][0], passage[-1][1], _joined(text, passage)))
        passage = [(start, end, statement)] if statement.score >= threshold else []
        listing = False
    if passage:
        out.append((passage[0][0], passage[-1][1], _joined(text, passage)))
    return out


def _leads_list(passage: Sequence[tuple[int, int, Statement]]) -> bool:
    return len(passage) == 1 and passage[0][2].text.endswith((":", "："))


def _carries_on(lead: Statement, statement: Statement, threshold: float) -> bool:
    """Whether a sentence after a salient one belongs with it: salient itself, or it refers
    back ("It is shared with another team."), or the salient one only leads in ("Correction:",
    "訂正します。")."""
    if statement.score >= threshold:
        return True
    text = statement.text
    if _FILLER.match(text) or _REQUEST.match(text) or _REQUEST_JA.match(text):
        return False
    if _is_question(text):
        return False
    return _leads_in(lead.text) or _REFERS_BACK.match(text) is not None


def _leads_in(text: str) -> bool:
    """A sentence that only announces the next one: "Correction:", "Important.", "訂正します。"."""
    if text.endswith((":", "：")):
        return True
    core = _NON_WORD.sub("", text)
    return len(core) <= LEAD_IN_CJK if _has_cjk(core) else len(text.split()) <= LEAD_IN_WORDS


def _joined(text: str, passage: Sequence[tuple[int, int, Statement]]) -> Statement:
    best = max((s for _, _, s in passage), key=lambda s: s.score)
    return Statement(text[passage[0][0] : passage[-1][1]], best.score, best.kind)


def _is_question(text: str) -> bool:
    return text.endswith(("?", "？")) or text.endswith(("か。", "か", "吗", "吗。", "呢"))


def _has_cjk(text: str) -> bool:
    return _CJK.search(text) is not None


def normalised(text: str) -> str:
    """The form two statements are compared in: whitespace collapsed, case folded."""
    return " ".join(text.split()).casefold()


def kinds() -> Sequence[str]:
    """Every kind a statement can have, strongest first, then `fact`."""
    return (*KIND_SCORES, "fact")
