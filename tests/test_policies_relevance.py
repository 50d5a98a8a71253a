"""`prioritize_recent` and `discard_low_rel` (design D5.8) and BM25 relevance."""

from __future__ import annotations

import itertools

from policies import check
from policies.relevance import bm25_scores, tokenize
from policies.steps.discard_low_rel import DiscardLowRel, DiscardLowRelConfig
from policies.steps.prioritize_recent import PrioritizeRecent, PrioritizeRecentConfig
from tests.policy_strategies import budget, conv, env, msg

TOPICS = ["database index migration", "kitchen recipe pasta", "garden tomato plants", "tax forms"]


def history(turns: int = 20, query: str = "how do I speed up the database index migration?"):
    data = [msg("system", "s")]
    for t in range(turns):
        topic = TOPICS[t % len(TOPICS)]
        data += [
            msg("user", f"tell me about {topic} " + "filler " * 60),
            msg("assistant", f"{topic} " * 40),
        ]
    data.append(msg("user", query))
    return data


def test_defaults_are_the_documented_ones() -> None:
    prioritize = PrioritizeRecentConfig()
    assert (prioritize.rel_threshold, prioritize.recent_bias, prioritize.priority_boost) == (
        0.5,
        0.2,
        1.5,
    )
    assert DiscardLowRelConfig().discard_percent == 0.3
    assert prioritize.scorer == "bm25" and prioritize.placeholder_role == "system"


def test_tokenize_and_bm25_are_deterministic_and_normalised() -> None:
    assert tokenize("Déjà vu: 数据库 Index_2") == ["déjà", "vu", "数", "据", "库", "index_2"]
    scores = bm25_scores(["database index", "pasta", "database", ""], "database index")
    assert scores[0] == 1.0 and scores[1] == 0.0 and 0 < scores[2] < 1 and scores[3] == 0.0
    assert bm25_scores(["x"], "") == [0.0]
    assert bm25_scores(["数据库 迁移", "番茄"], "数据库") == [1.0, 0.0]


def test_prioritize_recent_keeps_relevant_and_recent_turns() -> None:
    conversation = conv(history())
    step = PrioritizeRecent(PrioritizeRecentConfig(stop_at_target=False))
    result = step.apply(conversation, budget(3000), env())
    users = [m.text for m in result.conversation.messages if m.role == "user" and m.origin >= 0]
    assert users[-1].startswith("how do I speed up")
    old = users[:-5]  # the last 20 % of 21 Turns (5) are kept whatever they are about
    assert old and all("database" in u for u in old)
    placeholders = [m for m in result.conversation.messages if m.origin == -1]
    assert placeholders and all(m.role == "system" for m in placeholders)
    assert (
        placeholders[0].text.startswith("[Omitted ")
        and "low-relevance earlier turns]" in placeholders[0].text
    )
    assert result.detail["scorer"] == "bm25"
    assert check(conversation, result.conversation) == []


def test_one_placeholder_per_run_of_dropped_turns() -> None:
    conversation = conv(history())
    result = PrioritizeRecent(PrioritizeRecentConfig(stop_at_target=False)).apply(
        conversation, budget(3000), env()
    )
    out = result.conversation.messages
    for a, b in itertools.pairwise(out):
        assert not (a.origin == -1 and b.origin == -1)
    total = sum(int(m.text.split()[1]) for m in out if m.origin == -1)
    assert total == result.detail["turns_dropped"]


def test_stop_at_target_drops_only_what_is_needed() -> None:
    conversation = conv(history())
    eager = PrioritizeRecent(PrioritizeRecentConfig(stop_at_target=False))
    lazy = PrioritizeRecent(PrioritizeRecentConfig())
    limits = budget(10_000)
    assert (
        lazy.apply(conversation, limits, env()).removed
        < eager.apply(conversation, limits, env()).removed
    )


def test_priority_one_boost_keeps_a_borderline_turn() -> None:
    data = history(turns=10, query="database migration and pasta")
    conversation = conv(data)
    step = PrioritizeRecent(PrioritizeRecentConfig(stop_at_target=False, rel_threshold=0.6))
    plain = step.apply(conversation, budget(2000), env()).conversation
    pasta = 3  # the first "kitchen recipe pasta" user message
    assert conversation.messages[pasta] not in plain.messages
    boosted = step.apply(conv(data, priorities={pasta: 1}), budget(2000), env()).conversation
    assert any(m.origin == pasta for m in boosted.messages)


def test_discard_low_rel_drops_at_most_its_share() -> None:
    conversation = conv(history())
    step = DiscardLowRel(DiscardLowRelConfig(stop_at_target=False))
    result = step.apply(conversation, budget(3000), env())
    assert result.detail["turns_dropped"] == 21 - 15  # keeps ceil(21 * 0.7)
    dropped_users = {m.origin for m in conversation.messages if m.role == "user"} - {
        m.origin for m in result.conversation.messages
    }
    assert all("database" not in conversation.messages[i].text for i in dropped_users)
    assert check(conversation, result.conversation) == []


def test_embeddings_scorer_uses_the_injected_function_and_falls_back_to_bm25() -> None:
    conversation = conv(history())
    seen = {}

    def relevance(texts, query):
        seen["n"] = len(texts)
        return [1.0 if "tax" in t else 0.0 for t in texts]

    config = PrioritizeRecentConfig(scorer="embeddings", stop_at_target=False)
    result = PrioritizeRecent(config).apply(conversation, budget(3000), env(relevance=relevance))
    assert result.detail["scorer"] == "embeddings" and seen["n"] == 21
    kept = [m.text for m in result.conversation.messages if m.role == "user" and m.origin >= 0][:-5]
    assert kept and all("tax" in t for t in kept)
    fallback = PrioritizeRecent(config).apply(conversation, budget(3000), env())
    assert fallback.detail["scorer"] == "bm25"


def test_user_placeholders_and_a_second_pass() -> None:
    conversation = conv(history())
    config = PrioritizeRecentConfig(stop_at_target=False, placeholder_role="user")
    step = PrioritizeRecent(config)
    result = step.apply(conversation, budget(3000), env())
    assert any(m.origin == -1 and m.role == "user" for m in result.conversation.messages)
    assert check(conversation, result.conversation) == []
    again = step.apply(result.conversation, budget(3000), env())
    assert again.conversation is result.conversation  # one pass per request
