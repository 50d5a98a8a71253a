"""What of the user's prose the ledger carries, and in what rank (design D5.3).

Rule: every sentence the user wrote as prose is carried, word for word, except filler,
acknowledgements ("ok", "nice, that worked", "Continuing with the plan.") and routine requests.
A routine request asks for one piece of work on code now ("Rename load_x to fetch_x
everywhere.", "Run the tests again.", "Can you check why the build fails?"): it opens with a
verb of such work, politeness aside (Chinese asks with no mark, so there the verb alone makes a
request), has no cue, negation or concrete fact (code names and capitalised words aside), and
at most `ROUTINE_WORDS` words or `ROUTINE_CJK` CJK characters. The work it asked for is done by
the time its Turn goes, so it is left out, even when the code it names makes it salient. Naming
code is not enough ("Use the existing logger in app/log.py." is a standing instruction), a
longer request may carry a standing wish in a clause, and one not about code may be a wish
("Could you keep the answers short?"): all are carried. What goes first when the block is full
is decided by rank alone, and a salient passage (`policies.salience`) outranks every other
sentence. So a statement that no salience rule recognises (said politely, indirectly, in words
no cue list has) still reaches the model, only behind those that one does.

The rank of a sentence that scores below the threshold, always below it: a base, more for each
kind of concrete fact (a number, a date, a version, an address, a name; up to three), a little
for a code name, more for a stance (said in the first person, or with a cue too weak to pass
the threshold), halved for a request or a question.

An acknowledgement is a short sentence with no cue, detail, negation or first person, once the
filler words it opens with are set aside (at most `ACK_WORDS` words, `ACK_CJK` CJK characters,
a kana counting half; an English one also without a verb of being or having): it is never
carried. Among equal ranks the older sentence goes first (the ledger's `_bounded`). Pure and
deterministic, like salience: the block is part of a cached prefix.
"""

from __future__ import annotations

import re

from ..salience import Looks, Signals, Statement, items, passage_spans, score, signals, stated
from .ledger_entries import lines_of

PLAIN = 0.2  # any other sentence
FACT_STEP = 0.05  # per kind of concrete fact, up to three
CODE = 0.02  # a code name
STANCE = 0.05  # first person, or a cue too weak to pass the threshold
ASKED = 0.5  # a request or a question states less than a plain sentence
ACK_WORDS = 4
ROUTINE_WORDS = 12
ROUTINE_CJK = 30
ACK_CJK = 5
_BELOW = 0.01  # how far under the threshold the best plain sentence stays

_FIRST_PERSON = re.compile(
    r"\b(?:i|we|my|our|ours|us|mine|myself|ourselves)\b|我|咱|私|僕|俺|うち|弊社|当社", re.I
)
# (case matters for "none" only: Python's None is no negation)
_NEGATION = re.compile(
    r"\b(?:[Nn]o|[Nn]ot|[Nn]ever|none|[Nn]othing|[Nn]obody|[Ww]ithout)\b|n't\b|"
    "不|没|別|别|无|無|ない|ません"
)
_CJK = re.compile("[\u3040-\u9fff]")
_KANA = re.compile("[\u3040-\u30ff]")
_ENDS = frozenset(".!?。！？:：;；")
_COLONS = frozenset(":：")
_WORDISH = re.compile(r"[\w\u3040-\u9fff]")
_LATIN_WORD = re.compile(r"[A-Za-z0-9_./-]+")
# A command of one piece of work on code, politeness aside: its verb.
_ACTION = re.compile(
    r"\W*(?:(?:please|now|then|ok|okay|next|so|and|also|again)\W+)*"
    r"(?:(?:can|could|would|will) you\W+(?:please\W+)?|let'?s\W+)?"
    r"(?:re)?(?:run|open|show|check|look|try|fix|add|print|list|read|grep|find|search|build|"
    r"install|create|edit|rename|move|delete|remove|test|debug|explain|refactor|split|wire|"
    r"revert|retry|lint|format|profile)\b",
    re.I,
)
_ORDER_ZH = re.compile("跑一下|修一下|改名成|删掉|拆成|重构一下|加个|补上")
_ASK_JA = re.compile("てください|て下さい|てくれ|てもらえ|ていただけ")  # asking, in any verb
_ACTION_JA = re.compile("実行|修正|直して|追加|削除|消して|リネーム|リファクタ")


def rank(
    sentence: str,
    threshold: float,
    cues: bool = True,
    details: bool = True,
    looks: Looks | None = None,
) -> float:
    """A sentence's rank below `threshold` (0: never carried), as the module's rule says (told
    whether the sentence may have a cue, and a detail, as `salience.look` tells; `looks`: what
    scoring found in it, as `salience.passage_spans` keeps it)."""
    found = signals(sentence, cues, details, looks)
    if found.filler:
        return 0.0
    # a CJK character in `rest`: looked for once, for both tests (each asks a sentence with no
    # cue or concrete fact, and only such a sentence)
    cjk = None
    if found.kind is None and not found.facts:
        cjk = _CJK.search(found.rest) is not None
    if _acknowledgement(found, cjk) or _routine(found, sentence, cjk):
        return 0.0
    value = PLAIN + FACT_STEP * min(found.facts + found.name, 3) + (CODE if found.code else 0.0)
    if found.kind is not None or _FIRST_PERSON.search(found.rest):
        value += STANCE
    if found.request or found.question:
        value *= ASKED
    return min(value, _ceiling(threshold))


def line_rank(line: str, threshold: float, plain: bool) -> float:
    """The rank of an entry read back from the block: its salience score when it passes the
    threshold (or when only salient passages are carried), else its plain rank."""
    value = score(line).score
    return value if value >= threshold or not plain else max(value, rank(line, threshold))


def carried(
    part: str, threshold: float, limit: int, cues: bool, plain: bool, may: bool = True
) -> list[tuple[str, float]]:
    """(line, rank) of what the ledger carries from one prose span, in the order said: its
    salient passages (`lines_of`), and with `plain` the runs of other sentences that are not
    filler, each run one line (a run longer than `limit` sentence by sentence). A sentence
    wrapped onto the next line goes on with its run; the span's last sentence, when it ends
    with a colon and is not salient, introduces what follows the prose and is left out.
    `cues` and `may`: whether a sentence of the part may have a cue, may score at all
    (`salience.look`)."""
    looks: Looks = {}  # what scoring a sentence found, for ranking it
    spans, salient = passage_spans(part, threshold, cues, looks) if may else (items(part), [])
    if not plain:
        return [(line, s.score) for _, _, s in salient for line in lines_of(s, threshold, limit)]
    out: list[tuple[str, float]] = []
    run: list[tuple[int, int, float]] = []
    at = 0  # the next salient passage
    for k, (start, end) in enumerate(spans):
        while at < len(salient) and salient[at][1] <= start:
            at += 1
        if at < len(salient) and salient[at][0] <= start:  # inside a salient passage
            _flush(part, run, limit, out)
            passage = salient[at][2]
            if salient[at][0] == start and not _code_order(
                passage, salient[at][1] == end, looks if cues else None
            ):
                out += [(line, passage.score) for line in lines_of(passage, threshold, limit)]
            continue
        value = rank(part[start:end], threshold, cues, may, looks)
        if k == len(spans) - 1 and part[end - 1] in _COLONS:
            value = 0.0  # it introduces what follows the prose: a paste, a file
        if value > 0 or (run and _continues(part, run[-1][1], start)):
            run.append((start, end, value))
        else:
            _flush(part, run, limit, out)
    _flush(part, run, limit, out)
    return out


def _flush(
    part: str, run: list[tuple[int, int, float]], limit: int, out: list[tuple[str, float]]
) -> None:
    """A run of plain sentences as lines, appended to `out`; the run is emptied."""
    if not run:
        return
    line = " ".join(part[run[0][0] : run[-1][1]].split())
    if len(line) <= limit:
        out.append((line, max(value for _, _, value in run)))
    else:
        for start, end, value in run:
            statement = Statement(part[start:end], value, None)
            out += [(text, value) for text in lines_of(statement, 0.0, limit)]
    run.clear()


def _code_order(passage: Statement, one: bool, looks: Looks | None) -> bool:
    """Whether a salient passage is a routine request all the same: one sentence, salient only
    for the code it names (a fact by its identifiers or paths alone). `looks`: what scoring
    found in its sentence, when it looked for cues."""
    return (
        one
        and passage.kind == "fact"
        and _routine(signals(passage.text, looks=looks), passage.text)
    )


def _continues(part: str, end: int, start: int) -> bool:
    """Whether the sentence at `start` goes on from the one ending at `end`: that one ends with
    no end mark and this one starts in lower case (a line wrapped mid-sentence)."""
    return not part[end - 1].isspace() and part[end - 1] not in _ENDS and part[start].islower()


def _routine(found: Signals, sentence: str, cjk: bool | None = None) -> bool:
    """A short request for work on code: by its verb, not by the code it names ("Use the
    existing logger in app/log.py, please" is a standing instruction). `cjk`: whether
    `found.rest` has a CJK character, when known. (The negation, the slowest test, last.)"""
    if found.kind is not None or found.facts:
        return False
    rest = found.rest
    if _CJK.search(rest) is not None if cjk is None else cjk:
        if _cjk_length(rest) > ROUTINE_CJK:
            return False
        if _ORDER_ZH.search(rest) is not None:  # Chinese asks with no mark: by its verb
            asked = True
        else:
            asked = found.request or found.question or _ASK_JA.search(rest) is not None
            asked = asked and _ACTION_JA.search(rest) is not None
    else:
        asked = len(rest.split()) <= ROUTINE_WORDS and _ACTION.match(rest) is not None
    # a negation states a limit ("no print debugging left in commits")
    return asked and _NEGATION.search(sentence) is None


def _acknowledgement(found: Signals, cjk: bool | None = None) -> bool:
    """(`cjk`: whether `found.rest` has a CJK character, when known. The first person and a
    negation, the slowest tests, last.)"""
    if found.kind is not None or found.facts or found.code or found.name:
        return False
    rest = found.rest
    if not _WORDISH.search(rest):  # nothing but filler words, marks and emoji
        return True
    if _CJK.search(rest) is not None if cjk is None else cjk:
        short = _cjk_length(rest, kana=0.5) <= ACK_CJK
    else:
        short = len(rest.split()) <= ACK_WORDS and not stated(rest)
    return short and _FIRST_PERSON.search(rest) is None and _NEGATION.search(rest) is None


def _cjk_length(text: str, kana: float = 1.0) -> float:
    """A CJK sentence's length: its CJK characters (a kana counting `kana`: Japanese spells
    in kana what Chinese says in one character), and each Latin word or number as one."""
    kanas = len(_KANA.findall(text))
    return len(_CJK.findall(text)) - kanas * (1 - kana) + len(_LATIN_WORD.findall(text))


def _ceiling(threshold: float) -> float:
    return max(0.0, threshold - _BELOW)
