"""The ledger's and its helpers' shortcuts give what their plain rules give.

For CPU (issue 40) the ledger and what it calls test the cheap conditions first and skip what
cannot change an answer: entries merged after one count of each key over all keys, the
acknowledgement and routine tests looking for the first person and a negation last, a
request's Japanese ending looked for only with "して", a list bullet tried only before a bullet
or a digit, a line's letters counted without a call per character, the code-sign scan skipped
without a character every sign has. The plain rules below are the ones the code used before,
kept here as the oracle: for any input the answers must be the same.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import prose, salience
from policies.steps import ledger_rank
from policies.steps.ledger_entries import Entry, merged

# -- merged ------------------------------------------------------------------------------------


def oracle_merged(entries: list[Entry], keys: list[str]) -> list[Entry]:
    return [
        entry
        for k, entry in enumerate(entries)
        if not any(
            keys[k] in other and (len(other) > len(keys[k]) or j < k)
            for j, other in enumerate(keys)
            if j != k
        )
    ]


keys = st.lists(st.text(alphabet="ab ", max_size=5).map(lambda t: " ".join(t.split())), max_size=8)


@settings(max_examples=1500, deadline=None)
@given(keys)
def test_merged_keeps_what_the_pairwise_rule_keeps(texts: list[str]) -> None:
    entries = [Entry(t, None, k) for k, t in enumerate(texts)]
    assert merged(entries, list(texts)) == oracle_merged(entries, list(texts))


# -- the acknowledgement and routine tests --------------------------------------------------------


def oracle_rank(sentence: str, threshold: float) -> float:
    """`ledger_rank.rank` with the tests in their plain order."""
    found = salience.signals(sentence)
    rest = found.rest

    def acknowledgement() -> bool:
        if found.kind is not None or found.facts or found.code or found.name:
            return False
        if not ledger_rank._WORDISH.search(rest):
            return True
        if ledger_rank._FIRST_PERSON.search(rest) or ledger_rank._NEGATION.search(rest):
            return False
        if ledger_rank._CJK.search(rest):
            return ledger_rank._cjk_length(rest, kana=0.5) <= ledger_rank.ACK_CJK
        return len(rest.split()) <= ledger_rank.ACK_WORDS and not salience.stated(rest)

    def routine() -> bool:
        if found.kind is not None or found.facts or ledger_rank._NEGATION.search(sentence):
            return False
        if ledger_rank._CJK.search(rest):
            if ledger_rank._cjk_length(rest) > ledger_rank.ROUTINE_CJK:
                return False
            if ledger_rank._ORDER_ZH.search(rest) is not None:
                return True
            asked = found.request or found.question or ledger_rank._ASK_JA.search(rest)
            return bool(asked) and ledger_rank._ACTION_JA.search(rest) is not None
        words = len(rest.split()) <= ledger_rank.ROUTINE_WORDS
        return words and ledger_rank._ACTION.match(rest) is not None

    if found.filler or acknowledgement() or routine():
        return 0.0
    value = ledger_rank.PLAIN + ledger_rank.FACT_STEP * min(found.facts + found.name, 3)
    value += ledger_rank.CODE if found.code else 0.0
    if found.kind is not None or ledger_rank._FIRST_PERSON.search(rest):
        value += ledger_rank.STANCE
    if found.request or found.question:
        value *= ledger_rank.ASKED
    return min(value, ledger_rank._ceiling(threshold))


WORDS = (
    "ok thanks sure no not never nothing without don't I we my our us it this please now run "
    "open show fix rename test explain can you could let's the tests again diff why what is "
    "has must always prefer decided Sounds good go ahead Hmm done fine AWS app.py port 8080 "
    "好的 谢谢 我们 不要 跑一下 删掉 请 吗 我 私 してください 実行 修正 ない はい ありがとう"
).split()
sentences = st.lists(
    st.tuples(st.sampled_from(WORDS), st.sampled_from(("", " ", ", ", ". ", "? ", "。"))),
    min_size=1,
    max_size=9,
).map(lambda parts: "".join(word + sep for word, sep in parts).strip())


@settings(max_examples=2000, deadline=None)
@given(sentences, st.sampled_from((0.3, 0.45, 0.7)))
def test_rank_is_the_plain_rules_rank(sentence: str, threshold: float) -> None:
    assert ledger_rank.rank(sentence, threshold) == oracle_rank(sentence, threshold)


# -- requests and list bullets --------------------------------------------------------------------

ORACLE_REQUEST = re.compile(salience._REQUEST.pattern + "|" + salience._REQUEST_JA.pattern, re.I)


def oracle_items(text: str) -> list[tuple[int, int, bool]]:
    out = []
    numbered = False
    for match in salience._SENTENCE.finditer(text):
        piece = match.group()
        start, end = match.start(), match.end()
        bullet = salience._BULLET.match(piece)
        start += bullet.end() if bullet else len(piece) - len(piece.lstrip())
        end -= len(piece) - len(piece.rstrip())
        if end <= start:
            continue
        if salience._NUMBER_MARK.match(text[start:end]) and "\n" not in piece.rstrip(" \t"):
            numbered = True
            continue
        out.append((start, end, bullet is not None or numbered))
        numbered = False
    return out


texts = st.lists(
    st.sampled_from((*WORDS, "して", "してください", "- ", "* ", "• ", "1. ", "2) ", "\n", "١. ")),
    max_size=12,
).map(" ".join)


@settings(max_examples=2000, deadline=None)
@given(texts)
def test_requests_and_list_items_are_found_as_the_plain_patterns_find_them(text: str) -> None:
    stripped = text.strip()
    if stripped and not salience._FILLER.match(stripped):
        assert salience.signals(text).request == (ORACLE_REQUEST.search(stripped) is not None)
    assert salience._items(text) == oracle_items(text)


# -- material lines -------------------------------------------------------------------------------


def oracle_material(line: str) -> bool:
    stripped = line.strip()
    if not stripped:
        return False
    if " " not in stripped and not prose._CJK.search(stripped) and len(stripped) >= 3:
        return True
    start = prose._SUSPECT_START.pattern
    if re.search(f"{prose._SUSPECT.pattern}|^(?:{start})", line) is None:
        return False
    if prose._MATERIAL.match(line) or stripped.endswith((";", "{")):
        return True
    letters = sum(map(str.isalpha, stripped))
    visible = len(stripped) - sum(map(str.isspace, stripped))
    if visible >= 8 and letters * 2 < visible:
        return True
    signs = len(prose._CODE_SIGNS.findall(stripped))
    return signs >= 2 and len(prose._WORD.findall(stripped)) <= 2 * signs


lines = st.lists(
    st.sampled_from(
        [*"abXZ 0_.-:;{}()[]=<>!/+*$@`|\t→é中", "def ", "x(", "::", "->", "==", "    ", "İ"]
    ),
    max_size=24,
).map("".join)


@settings(max_examples=3000, deadline=None)
@given(lines)
def test_a_line_is_material_as_the_plain_rule_says(line: str) -> None:
    assert prose.material_line(line) == oracle_material(line)
