"""The salience scorer's look at a whole message never changes a score.

`policies/salience.py` first looks at a whole text for any cue or concrete detail, and skips
splitting and scoring its sentences when there is none (most messages), and the cue patterns
when there is no cue. The scores must be exactly those of scoring every sentence on its own:
for any text in English, Chinese or Japanese, with cues and details planted among end marks,
line breaks, list bullets and look-alike letters.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies import salience, salience_details
from policies.conversation import content_text
from policies.salience import _cue, salient, score, sentences, statements
from policies.salience_details import lowered, seen_of
from tests.fidelity_sessions import LANGUAGES, SHAPES, session

# Cues of every kind and details of every kind, in the three languages, some at a word's edge
# ("!never", "Stop!/etc") where a sentence's start and the text around it differ.
WORDS = (
    "never", "Don't", "must", "always", "actually", "prefer", "goal", "we decided",
    "Important:", "note:", "keep it out of", "not this but", "for every table", "my name is",
    "owns", "works on", "PostgreSQL", "GitHub", "AWS", "Ana Costa", "Monday", "Jan 5th",
    "v1.2.3", "port 8080", "10.0.3.7", ":5432", "/srv/app", "/etc", "./run.sh", "main.py",
    "api.example.com", "ops@example.com", "https://x.io/a", "snake_case", "camelCase",
    "MAX_SIZE", "JIRA-123", "`cfg`", "build-42", "500ms", "$20", "3 GB", "2026-11-26", "12:30",
    "不要", "必须", "决定", "目标", "名叫张三", "负责王五", "「计划」", "UTC时间", "在Kubernetes上",
    "5月3日", "3个", "2026年5月", "しないで", "必ず", "訂正", "以内", "ダメ", "ゴール", "田中さん",
    "名前は", "締め切り", "ok", "thanks", "好的", "了解しました", "Continue with the plan",
)  # fmt: skip
# Letters, digits, marks and look-alikes ("ſ" is an "s" to a case-insensitive pattern, "K"
# the Kelvin sign a "k"; "Σ" lower-cases to "σ" or "ς" by where it stands).
ALPHABET = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;/@_-`'\"()~$€%+\n\t"
    "ſKİıΣσς０١不要必须决定名叫年月日さん様しないで必ず訂正「」“”《》：，。！？!?•*"
)
SEPARATORS = (
    " ",
    "",
    "\n",
    ". ",
    ".",
    "! ",
    "!",
    "? ",
    "?",
    "。",
    "！",
    "\n- ",
    "\n* ",
    "\n1. ",
    "\n\n",
)

texts = st.lists(
    st.tuples(
        st.one_of(st.sampled_from(WORDS), st.text(alphabet=ALPHABET, max_size=10)),
        st.sampled_from(SEPARATORS),
    ),
    max_size=14,
).map(lambda parts: "".join(word + sep for word, sep in parts))


def ungated_statements(text: str) -> list[salience.Statement]:
    return [score(s) for s in sentences(text)]


@settings(max_examples=1500, deadline=None)
@given(texts)
@example("Done!/etc is ours.")
@example("Stop!never touch it")
@example("ΑΣ. We must go")
def test_a_text_the_gate_passes_over_has_no_sentence_that_scores(text: str) -> None:
    cues, may = salience._may_score(text)
    for sentence in sentences(text):
        if not cues:
            assert _cue(seen_of(sentence, lowered(sentence))) is None, sentence
        if not may:
            assert score(sentence).score == 0.0, sentence


@settings(max_examples=1500, deadline=None)
@given(texts)
def test_a_text_the_detail_scans_pass_over_has_no_detail(text: str) -> None:
    seen = seen_of(text, lowered(text))
    if not salience_details.may_detail(text, seen.lower, seen.cjk):
        assert salience_details.detail_count(seen) == 0


@settings(max_examples=1500, deadline=None)
@given(texts, st.sampled_from((0.0, 0.3, 0.45, 0.6, 0.9)))
def test_gated_scores_equal_ungated_scores(text: str, threshold: float) -> None:
    expected = ungated_statements(text)
    assert statements(text) == expected
    assert salience.salience(text) == max((s.score for s in expected), default=0.0)
    assert salient(text, threshold) == salience._passages(text, threshold, True)


def test_on_every_message_of_the_fidelity_sessions() -> None:
    for language in LANGUAGES:
        for shape in SHAPES:
            for message in session(1, language, shape, turns=20).messages:
                text = content_text(message.get("content"))
                assert statements(text) == ungated_statements(text), text
                assert salient(text, 0.45) == salience._passages(text, 0.45, True), text


def test_the_gate_passes_over_plain_chat() -> None:
    """What the gate is for: most messages have nothing to score."""
    for text in ("Why is this test slow?", "Ok, thanks.", "Can you show me the diff?", "好的。"):
        assert salience._may_score(text) == (False, False), text
