"""The salience scorer's fast patterns find exactly what its plain patterns find.

`policies/salience.py` skips patterns a sentence cannot match (no digit, no CJK character, ...)
and writes lookbehind-first patterns character first. The plain patterns below are the ones it
used before, kept here as the oracle: for any text, the cue kind, the number of kinds of
concrete detail, whether it is stated as a fact, and where its sentences are must be the same.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from policies import salience, salience_cues, salience_details
from policies.salience import KIND_SCORES, sentences
from tests.fidelity_sessions import LANGUAGES, SHAPES, session

ORACLE_CUES = tuple(
    (
        kind,
        re.compile(
            "|".join(
                f"(?:{t[kind]})" for t in (salience_cues.EN, salience_cues.ZH, salience_cues.JA)
            ),
            re.I,
        ),
    )
    for kind in KIND_SCORES
)
ORACLE_DETAILS = tuple(
    re.compile(p)
    for p in (
        r"(?i:[$€£¥]\s?\d[\d,.]*|\d[\d,.]*\s?(?:%|ms|s\b|sec|seconds?|min(?:utes?)?|hours?|"
        r"days?|weeks?|months?|years?|[kmgt]i?b\b|bytes?|tokens?|px|rpm|rps|qps|requests?|"
        r"users?|usd|eur|gbp|jpy|cny|rmb|dollars?|euros?|yen|km|kg|mb/s|gb/s|"
        r"cores?|replicas?|nodes?|times|x\b|元|円|万|億|亿|个|件|人|台|天|日|時間|小时|分钟|分|秒|"
        r"週間|周|年|月|号|歳|岁))",
        r"(?i:\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b|\b\d{1,2}:\d{2}\b|\d{1,4}年\d{1,2}月|"
        r"\d{1,2}月\d{1,2}[日号]|"
        r"\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.? \d{1,2}"
        r"(?:st|nd|rd|th)?\b|"
        r"\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b)",
        r"(?<![0-9A-Za-z.])v?\d+\.\d+(?:\.\d+)*(?![0-9A-Za-z])|\bport \d+\b|:\d{2,5}\b|"
        r"(?<![0-9A-Za-z.])\d{3,}(?![0-9A-Za-z])",
        r"(?i:(?<![A-Za-z0-9._-])(?:~|\.{1,2})?/[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)+|"
        r"(?:^|(?<=[\s(`'\"]))/[A-Za-z0-9_.-]+|[A-Za-z0-9_-]+\.(?:py|js|ts|tsx|go|rs|java|rb|c|h|"
        r"cpp|md|txt|json|ya?ml|toml|ini|cfg|sql|sh|csv|html|css|lock|env|log)(?![A-Za-z0-9]))",
        r"(?i:\bhttps?://\S+|\b[\w.+-]+@[\w-]+\.[\w.]+\b|\b[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|"
        r"io|dev|internal|local|cn|jp)\b)",
        r"\b[a-z]+_[a-z0-9_]+\b|\b[a-z]+[A-Z][a-zA-Z0-9]+\b|\b[A-Z][A-Z0-9]*_[A-Z0-9_]+\b|"
        r"\b[A-Z]{2,}-\d+\b|`[^`\s]{2,}`|\b[a-z]+(?:-[a-z0-9]+)*-\d+\b",
        r"(?<=[a-z,] )[A-Z][a-z]+|(?<![A-Za-z])[A-Z][a-z]+[A-Z][A-Za-z]*|"
        r"(?<![A-Za-z])[A-Z]{2,6}s?(?![A-Za-z])|"
        r"(?<=[\u3040-\u9fff])[A-Za-z][\w.+-]*|[A-Za-z][\w.+-]*(?=[\u3040-\u9fff])|"
        r"(?i:\bmy name is\b|\bi'?m called\b|\bcall me\b|\bowns\b|\bin charge of\b|"
        r"\bresponsible for\b|\bworks? on\b)",
        r"「[^」]{1,30}」|“[^”]{1,30}”|《[^》]{1,30}》|(?:名叫|叫做|名字是|我叫|姓|负责)[\u4e00-\u9fff]{1,4}|"
        r"[\u4e00-\u9fff\u30a0-\u30ff]{1,6}(?:さん|様|氏)|名前は",
    )
)

# Letters, digits and marks the patterns care about, and their Unicode look-alikes (a
# case-insensitive "s" matches "ſ", "k" the Kelvin sign, full-width and Arabic-Indic digits
# are digits).
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;/@_-`'\"()~$€%+\n"
    "ſKİı０１２٣不要必须决定目标名叫姓负责年月日号元秒分周さん様氏名前はしないで必ず訂正以内ダメゴール"
    "「」“”《》：，。"
)
WORDS = (
    "never", "Don't", "must", "always", "actually", "prefer", "goal", "my name is", "owns",
    "works on", "PostgreSQL", "AWS", "Monday", "sunday", "v1.2.3", "port 8080", "10.0.3.7",
    "/srv/app", "./run.sh", "main.py", "api.example.com", "ops@example.com", "https://x.io/a",
    "snake_case", "camelCase", "MAX_SIZE", "JIRA-123", "`cfg`", "build-42", "500ms", "$20",
    "3 GB", "2026-11-26", "12:30", "Jan 5th", "不要", "必须", "名叫张三", "田中さん", "「计划」",
    "UTC时间", "在Kubernetes上", "締め切り", "5月3日", "3个",
)  # fmt: skip

ORACLE_STATED = re.compile(
    r"\b(?:is|are|was|were|runs|lives|sits|uses|has|have|costs|equals|means|belongs|"
    r"called|named|located|hosted|stored|owned|owns|deployed|scheduled|rotates?|expires?)\b|"
    r"是|在|叫|为|有|位于|部署|です|である|にある|にあり|ています|されます|あります|います|は.{1,20}(?:だ|です)",
    re.I,
)
ORACLE_SENTENCE = re.compile(r"[^\n。！？!?]*?(?:[。！？!?]+|\.(?=\s|$)|\n|$)")


def oracle(text: str) -> tuple[str | None, int]:
    kind = next((k for k, cue in ORACLE_CUES if cue.search(text)), None)
    return kind, sum(1 for p in ORACLE_DETAILS if p.search(text))


def fast(text: str) -> tuple[str | None, int]:
    seen = salience_details.seen_of(text, salience_details.lowered(text))
    return salience._cue(seen), salience_details.detail_count(seen)


@settings(max_examples=800, deadline=None)
@given(
    st.lists(
        st.one_of(st.sampled_from(WORDS), st.text(alphabet=ALPHABET, max_size=12)),
        max_size=12,
    ).map(" ".join)
)
def test_the_fast_patterns_find_what_the_plain_ones_find(text: str) -> None:
    assert fast(text) == oracle(text)


def test_on_every_sentence_of_the_fidelity_sessions() -> None:
    for language in LANGUAGES:
        for shape in SHAPES:
            s = session(0, language, shape, turns=20)
            for message in s.messages:
                content = message.get("content")
                if isinstance(content, str):
                    for sentence in sentences(content):
                        assert fast(sentence) == oracle(sentence), sentence


def test_look_alike_letters_count_as_their_ascii_letters() -> None:
    for text in (
        "you \u017fhould not do it",
        "We mu\u017ft go",
        "\u0130n charge of it",
        "\u0131 prefer",
    ):
        assert fast(text) == oracle(text), text


texts = st.lists(
    st.one_of(
        st.sampled_from(
            (*WORDS, "is", "Is", "\u0130s", "has", "HAS", "costs", "rotate", "expires", "は今日だ")
        ),
        st.text(alphabet=ALPHABET + "!?！？.\t", max_size=12),
    ),
    max_size=12,
).map(lambda words: " ".join(words))


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_a_fact_is_stated_where_the_plain_pattern_says_so(text: str) -> None:
    seen = salience_details.seen_of(text, salience_details.lowered(text))
    assert salience._stated(seen) == (ORACLE_STATED.search(text) is not None)


@settings(max_examples=1500, deadline=None)
@given(st.one_of(texts, st.text(alphabet=". \n\t!?。！？a1", max_size=20)))
def test_sentences_end_where_the_plain_pattern_ends_them(text: str) -> None:
    spans = [m.span() for m in salience._SENTENCE.finditer(text)]
    assert spans == [m.span() for m in ORACLE_SENTENCE.finditer(text)]
