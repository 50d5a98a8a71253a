"""Salience and the durable-facts ledger: what the user stated survives compaction.

The sessions come from `benchmarks/fidelity_sessions.py` (the fidelity benchmark's generator);
a few hand-written statements in each language that the generator never uses check that the
rules are not fitted to it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fidelity_sessions import LANGUAGES, SHAPES, forwarded_text, session, survived
from gateway.config import parse_config
from gateway.counting.prefix import PrefixCounts
from gateway.devtools.parts import parts
from gateway.wire import CHAT, MESSAGES, RESPONSES
from policies import Conversation, build_policy, check, run_chain
from policies.relevance import task_query
from policies.salience import normalised, salience, salient, score
from policies.steps.discard_low_rel import DiscardLowRel, DiscardLowRelConfig
from policies.steps.ledger import KIND, Ledger, LedgerConfig
from policies.steps.prioritize_recent import PrioritizeRecent, PrioritizeRecentConfig
from tests.policy_strategies import FakeSummaries, budget, conv, env, msg

pytestmark = pytest.mark.unit

DEFAULT = build_policy("default")
WITHOUT_LEDGER = build_policy(
    "no ledger",
    [{"type": "tool_output_cache"}, {"type": "content_type_chunking"}, {"type": "fifo"}],
)

# Statements the generator never uses, one or more per kind and language.
HELD_OUT = [
    "Please never run migrations on Fridays.",
    "Keep all secrets out of the repository.",
    "Use UTC for every timestamp.",
    "My name is Daniel and I work on the payments team.",
    "The release is scheduled for December 3rd.",
    "Wait, I was wrong: the bucket is in eu-west-1, not us-east-1.",
    "Let's stick with PostgreSQL rather than MySQL.",
    "I'd like the output as a markdown table.",
    "The main objective is reducing memory usage.",
    "请不要在周五部署。",
    "所有时间戳都用UTC。",
    "我叫李明，负责支付系统。",
    "其实桶在eu-west-1，不是us-east-1。",
    "核心模块里不允许引入外部依赖。",
    "金曜日にはデプロイしないでください。",
    "私の名前は山本です。決済チームにいます。",
    "リリースは12月3日の予定です。",
    "コアモジュールに外部依存を入れてはいけません。",
    "APIキーは毎週ローテーションされます。",
]
FILLER = [
    "Ok, thanks.",
    "Looks good!",
    "Continue with the plan.",
    "Run the tests again.",
    "Can you show me the diff?",
    "Hmm, that did not work.",
    "好的，谢谢。",
    "继续。",
    "再运行一次测试。",
    "这个报错是什么意思？",
    "了解しました。",
    "続けてください。",
    "もう一度テストを実行して。",
]


@pytest.mark.parametrize("text", HELD_OUT)
def test_statements_score_as_salient_in_every_language(text: str) -> None:
    statement = score(text)
    assert statement.score >= LedgerConfig().min_salience, statement
    assert statement.kind is not None


@pytest.mark.parametrize("text", FILLER)
def test_acknowledgements_requests_and_questions_do_not(text: str) -> None:
    assert salience(text) < LedgerConfig().min_salience


def test_kinds_rank_rules_above_bare_facts_and_questions_below_statements() -> None:
    assert score("Never deploy on Fridays.").kind == "prohibition"
    assert score("We decided to use Redis for the queue.").kind == "decision"
    assert score("Never deploy on Fridays.").score > score("The server is at 10.0.0.7.").score
    assert (
        score("Should we never deploy on Fridays?").score < score("Never deploy on Fridays.").score
    )


def test_a_passage_keeps_the_sentence_that_carries_a_rule_on() -> None:
    text = "Ok. Don't delete /srv/shared. It is shared with another team. Run the tests."
    [passage] = salient(text, 0.45)
    assert passage.text == "Don't delete /srv/shared. It is shared with another team."


@given(st.text(max_size=300))
def test_salience_is_a_pure_bounded_function_of_the_text(text: str) -> None:
    first = salience(text)
    assert 0.0 <= first <= 1.0 and salience(text) == first
    for passage in salient(text, 0.45):
        assert passage.text in text  # word for word, from the message itself


CUE_WORDS = [
    "Never",
    "DO NOT",
    "Always",
    "From Now On",
    "MUST",
    "Actually",
    "I Prefer",
    "The Goal Is",
]


@given(
    st.lists(st.sampled_from(CUE_WORDS), max_size=3),
    st.text(alphabet="abcXYZ .,!?'", max_size=40),
    st.booleans(),
)
def test_a_cue_counts_whatever_its_case(cues: list[str], filler: str, upper: bool) -> None:
    """A cue is a cue in any case: "NEVER", "Never" and "never" name the same kind."""
    text = "We " + " ".join(cues) + " " + filler + " deploy on friday."
    flipped = text.upper() if upper else text.lower()
    kind = score(text).kind
    if cues:
        assert kind not in (None, "fact") and score(flipped).kind == kind


# -- the ledger --------------------------------------------------------------------------------


def early_rule_session(turns: int = 30) -> list[dict[str, Any]]:
    data = [msg("system", "You are a coding assistant.")]
    data.append(msg("user", "Let's fix the parser tests."))
    data.append(msg("assistant", "Looking at them now."))
    data.append(msg("user", "Ok. Never touch the production database without asking me."))
    data.append(msg("assistant", "Understood."))
    for t in range(turns):
        data.append(msg("user", f"Run the tests again, round {t}."))
        data.append(msg("assistant", "I ran them; two failures remain in the parser. " * 8))
    data.append(msg("user", "Continue with the plan."))
    return data


def ledger_of(conversation: Any) -> list[str]:
    found = [m for m in conversation.messages if m.kind == KIND]
    assert len(found) <= 1
    return found[0].text.split("\n")[1:] if found else []


def test_an_early_rule_survives_a_generic_last_message_only_with_the_ledger() -> None:
    conversation = conv(early_rule_session())
    rule = "Never touch the production database without asking me."
    limits = budget(conversation.tokens // 2)
    kept = run_chain(conversation, limits, DEFAULT, env()).conversation
    lost = run_chain(conversation, limits, WITHOUT_LEDGER, env()).conversation
    assert normalised(rule) not in forwarded_text([dict(m.data) for m in lost.messages])
    assert ledger_of(kept) == [f"- {rule}"]
    at = next(i for i, m in enumerate(kept.messages) if m.kind == KIND)
    assert at == 1 and kept.messages[0].text == "You are a coding assistant."  # after the prompt
    assert check(conversation, kept) == []


def test_nothing_is_carried_that_a_kept_message_still_holds() -> None:
    conversation = conv(early_rule_session(turns=3))
    result = run_chain(conversation, budget(conversation.tokens + 500), DEFAULT, env(), force=True)
    assert ledger_of(result.conversation) == []  # nothing dropped: no ledger message at all


def test_an_entry_split_across_two_kept_messages_is_not_taken_for_present() -> None:
    """The kept texts an entry is looked for in are kept apart: the end of one and the start of
    the next do not make a statement nobody made."""
    rule = "Never touch the production database without asking me."
    data = early_rule_session()[:-1]
    data += [
        msg("user", "Careful, never touch the production database with"),
        msg("assistant", "Yes?"),
        msg("user", "out asking me. Continue with the plan."),
    ]
    conversation = conv(data)
    kept = run_chain(conversation, budget(conversation.tokens // 2), DEFAULT, env()).conversation
    texts = [m.text for m in kept.messages if m.kind != KIND]
    assert texts[-3] == "Careful, never touch the production database with"  # both kept
    assert texts[-1] == "out asking me. Continue with the plan."
    assert not any(rule in text for text in texts)  # the early message went
    assert f"- {rule}" in ledger_of(kept)


def test_a_summary_that_kept_the_rule_replaces_its_entry_and_one_that_lost_it_does_not() -> None:
    conversation = conv(early_rule_session())
    rule = "Never touch the production database without asking me."

    class Verbatim(FakeSummaries):
        def get(self, request: Any) -> Any:
            answer = super().get(request)
            return type(answer).ready(f"The user said: {rule} " + answer.text, answer.retain)

    policy = build_policy("s", [{"type": "ledger"}, {"type": "summarize_old"}, {"type": "fifo"}])
    limits = budget(conversation.tokens // 2)
    lossy = run_chain(conversation, limits, policy, env(FakeSummaries())).conversation
    faithful = run_chain(conversation, limits, policy, env(Verbatim())).conversation
    assert ledger_of(lossy) == [f"- {rule}"]
    assert ledger_of(faithful) == []
    assert normalised(rule) in forwarded_text([dict(m.data) for m in faithful.messages])


def test_the_ledger_is_bounded_and_the_least_salient_leave_first() -> None:
    data = [msg("system", "s")]
    for t in range(40):
        data.append(msg("user", f"The build server number {t} is at 10.0.0.{t + 2}."))  # facts
        data.append(msg("assistant", "Noted. " * 30))
    data.insert(3, msg("user", "Never force-push to the release branch."))
    data.append(msg("user", "Continue."))
    conversation = conv(data)
    limits = budget(conversation.tokens // 3)
    result = run_chain(conversation, limits, DEFAULT, env()).conversation
    [block] = [m for m in result.messages if m.kind == KIND]
    assert block.tokens <= limits.limit * LedgerConfig().share
    assert "- Never force-push to the release branch." in block.text.split("\n")
    assert 0 < len(ledger_of(result)) < 40  # some facts had to leave


def test_a_statement_said_twice_is_one_entry() -> None:
    data = early_rule_session()
    data.insert(5, msg("user", "never touch the production   database without asking me."))
    result = run_chain(conv(data), budget(conv(data).tokens // 2), DEFAULT, env()).conversation
    assert len(ledger_of(result)) == 1


def test_a_later_event_appends_to_the_ledger() -> None:
    """A longer conversation drops more Turns; the entries of the earlier event stay first, in
    the order they were said (the forwarded prefix up to them is stable)."""
    data = early_rule_session(turns=20)
    data[5] = msg("user", "We decided to use Redis for the job queue.")
    longer = [
        *data[:-1],
        msg("user", "Also, always write commit messages in English."),
        msg("assistant", "Will do. " * 40),
        *early_rule_session(turns=20)[3:],
    ]
    limits = budget(conv(data).tokens // 2)
    first = ledger_of(run_chain(conv(data), limits, DEFAULT, env()).conversation)
    second = ledger_of(run_chain(conv(longer), limits, DEFAULT, env()).conversation)
    assert first and second[: len(first)] == first and len(second) > len(first)


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    language=st.sampled_from(LANGUAGES),
    shape=st.sampled_from(SHAPES),
    fraction=st.sampled_from((0.5, 0.3)),
)
def test_planted_statements_survive_within_the_bound_and_the_invariants(
    seed: int, language: Any, shape: Any, fraction: float
) -> None:
    s = session(seed, language, shape, turns=24)
    conversation = conv(s.messages)
    limits = budget(int(conversation.tokens * fraction / 0.6))
    result = run_chain(conversation, limits, DEFAULT, env())
    assert check(conversation, result.conversation) == []
    text = forwarded_text([dict(m.data) for m in result.conversation.messages])
    lost = [p.text for p in s.planted if not survived(p, text)]
    left_out = sum(r.detail.get("left_out", 0) for r in result.steps if r.type == "ledger")
    assert not lost or left_out, lost  # a statement is lost only when the ledger was full
    blocks = [m for m in result.conversation.messages if m.kind == KIND]
    assert all(m.tokens <= limits.limit * LedgerConfig().share for m in blocks)
    for line in ledger_of(result.conversation):  # only what was dropped is carried
        others = [m for m in result.conversation.messages if m.kind != KIND]
        assert normalised(line[2:]) not in forwarded_text([dict(m.data) for m in others])


def test_the_ledger_step_alone_is_idempotent() -> None:
    conversation = conv(early_rule_session())
    step, limits = Ledger(LedgerConfig()), budget(conversation.tokens // 2)
    once = step.apply(conversation, limits, env())
    assert once.added == 1
    again = step.apply(once.conversation, limits, env())
    assert again.conversation is once.conversation


# -- relevance steps -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        PrioritizeRecent(PrioritizeRecentConfig(stop_at_target=False)),
        DiscardLowRel(DiscardLowRelConfig(stop_at_target=False)),
    ],
)
def test_relevance_steps_never_drop_a_turn_where_the_user_stated_a_rule(step: Any) -> None:
    conversation = conv(early_rule_session())
    result = step.apply(conversation, budget(conversation.tokens // 2), env())
    assert result.removed  # they did drop routine Turns
    assert any(
        "Never touch the production database" in m.text for m in result.conversation.messages
    )
    off = type(step)(step.config.model_copy(update={"keep_salience": 1.01}))
    dropped = off.apply(conversation, budget(conversation.tokens // 2), env()).conversation
    assert not any("Never touch the production database" in m.text for m in dropped.messages)


def test_the_task_query_holds_the_first_and_latest_user_messages_and_recent_turns() -> None:
    conversation = conv(early_rule_session())
    turns = conversation.turns()
    query = task_query(conversation, turns, 2)
    assert "parser" in query and "continue" in query and "29" in query  # first, latest, recent
    assert "15" not in query and "production" not in query


# -- every wire API ------------------------------------------------------------------------------


def bodies() -> dict[str, dict[str, Any]]:
    chat = early_rule_session(turns=40)
    rest = chat[1:]
    system = chat[0]["content"]
    return {
        "chat": {"model": "m", "messages": chat, "max_completion_tokens": 100},
        "responses": {
            "model": "m",
            "instructions": system,
            "input": [{"type": "message", **m} for m in rest],
            "max_output_tokens": 100,
        },
        "messages": {"model": "m", "system": system, "messages": rest, "max_tokens": 100},
    }


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
async def test_the_ledger_is_forwarded_on_every_api(api: str) -> None:
    config = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                "tokenizer": "chars:4",
                "context_window": 2000,
            }
        ]
    }
    gw = parts(parse_config(config))
    route = gw.router.resolve("m")
    assert route is not None
    wire = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}[api]
    request = wire.parse(orjson.dumps(bodies()[api]), 10_000)
    prepared = await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))
    assert "ledger" in prepared.changed_steps and "fifo" in prepared.changed_steps
    sent = orjson.loads(prepared.body)
    rule = "Never touch the production database without asking me."
    text = orjson.dumps(sent).decode()
    assert rule in text
    first_user = next(
        m for m in sent.get("messages", sent.get("input", [])) if m.get("role") == "user"
    )
    assert rule not in orjson.dumps(first_user).decode()  # the Turn itself was dropped
    if api == "messages":  # the gateway's block joins the top-level system prompt
        assert rule in orjson.dumps(sent["system"]).decode()
        assert "You are a coding assistant." in orjson.dumps(sent["system"]).decode()


# -- remembered work -----------------------------------------------------------------------------


def _forwarded(result: Any) -> tuple[list[Any], list[dict[str, Any]]]:
    return [dict(m.data) for m in result.conversation.messages], [r.as_dict() for r in result.steps]


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 5),
    language=st.sampled_from(LANGUAGES),
    shape=st.sampled_from(SHAPES),
    start=st.integers(6, 40),
    changes=st.lists(
        st.tuples(st.sampled_from(["append", "edit", "truncate", "resend"]), st.integers(0, 999)),
        min_size=1,
        max_size=5,
    ),
    fraction=st.sampled_from((0.5, 0.25)),
)
def test_a_conversation_resent_to_one_process_compacts_as_a_fresh_one_would(
    seed: int,
    language: Any,
    shape: Any,
    start: int,
    changes: list[tuple[str, int]],
    fraction: float,
) -> None:
    """The gateway gives a resent message the uid it had and keeps one memo across requests;
    the chain then looks up what it worked out before (the ledger's statements, by the uids of
    the messages it reads). Whatever the client changes between requests (new messages, an
    edited earlier message, history cut from the front), the forwarded request and the step
    reports are those of a fresh run with no uids and no memo."""
    pool = session(seed, language, shape, turns=40).messages
    system, rest = pool[0], pool[1:]
    history = list(rest[:start])
    prefix, shared = PrefixCounts(), env()
    for change, pick in changes:
        if change == "append":
            history += rest[len(history) : len(history) + 1 + pick % 6]
        elif change == "edit":
            users = [i for i, m in enumerate(history) if m["role"] == "user"]
            if users:
                i = users[pick % len(users)]
                statement = HELD_OUT[pick % len(HELD_OUT)]
                history[i] = {**history[i], "content": f"{history[i]['content']} {statement}"}
        elif change == "truncate":
            history = history[1 + pick % 6 :]
        messages = orjson.loads(orjson.dumps([system, *history, msg("user", "Continue.")]))
        uids = prefix.measure("t", "t", messages, lambda m: 0, 0).uids
        seen = conv(messages)
        seen = Conversation(
            tuple(replace(m, uid=uid) for m, uid in zip(seen.messages, uids, strict=True))
        )
        limits = budget(max(64, int(seen.tokens * fraction / 0.6)))
        fresh = run_chain(conv(messages), limits, DEFAULT, env())
        remembered = run_chain(seen, limits, DEFAULT, shared)
        assert _forwarded(remembered) == _forwarded(fresh)
