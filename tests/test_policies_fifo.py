"""`fifo` (design D5.4): how much it drops when some messages in the old Turns must stay.

A kept message (pinned, or a summary an earlier step put in) frees nothing when its Turn goes:
if fifo counted it as room, it would drop too few Turns and send a request still over budget.
"""

from __future__ import annotations

from policies import Conversation, Message, check
from policies.steps.fifo import Fifo, FifoConfig
from tests.policy_strategies import budget, chat, conv, count, env, msg


def test_a_pinned_message_in_an_old_turn_frees_no_room() -> None:
    data = chat(30, words=40)
    data[1] = msg("user", "the spec: " + "must hold " * 600)  # ~1 200 tokens, in the oldest Turn
    conversation = conv(data, pins=[1])
    window = budget(4000)
    assert conversation.tokens > window.trigger
    result = Fifo(FifoConfig()).apply(conversation, window, env())
    assert conversation.messages[1] in result.conversation.messages  # pinned
    assert result.conversation.tokens <= window.trigger  # it dropped enough Turns to fit
    assert check(conversation, result.conversation) == []


def test_an_earlier_steps_summary_frees_no_room() -> None:
    base = conv(chat(30, words=40)).messages
    text = "[Earlier conversation summary: " + "decided things " * 400 + "]"
    data = {"role": "system", "content": text}
    summary = Message(data, count(data), kind="summary:summarize_old")  # origin -1: a step's
    conversation = Conversation((base[0], summary, *base[1:]))
    window = budget(4000)
    assert conversation.tokens > window.trigger
    result = Fifo(FifoConfig()).apply(conversation, window, env())
    assert result.conversation.messages[:2] == (base[0], summary)  # kept, right after the head
    assert result.conversation.tokens <= window.trigger
    assert check(Conversation(base), result.conversation) == []  # against the client's messages
