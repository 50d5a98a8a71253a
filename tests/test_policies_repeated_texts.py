"""A text repeated within a request is looked up once, and that never changes what is forwarded.

`ledger` works out each distinct text's statements once per pass, only for the messages its
cut reaches, and checks its entries against each distinct kept text once;
`content_type_chunking` looks each (text, mark, priority) up in the memo once per pass. The
plain steps below look every message up on its own, as before (the plain ledger goes through
every message a later step may remove, then keeps those before the cut): for any conversation
that repeats texts (with different marks and priorities, with and without uids), the chain
forwards the same messages and reports the same steps.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Conversation, Env, Message, run_chain
from policies.chain import Policy
from policies.memo import Memo
from policies.salience import normalised
from policies.steps.content_type_chunking import ContentTypeChunking, ContentTypeChunkingConfig
from policies.steps.fifo import Fifo, FifoConfig
from policies.steps.ledger import Ledger, LedgerConfig
from policies.steps.ledger_entries import texts_of
from tests.policy_strategies import budget, conv, env, msg

pytestmark = pytest.mark.unit


class Everything:
    """The would-be entries found as the ledger once found them: every message gone through
    first, then those before the reach kept."""

    def __init__(self, said: list[tuple[str, str, float, int]]) -> None:
        self.said = said

    def before(self, reach: int) -> list[tuple[str, str, float, int]]:
        return [s for s in self.said if s[3] < reach]

    def remember(self) -> None:
        pass


class PlainLedger(Ledger):
    def _said(self, conversation: Conversation, env: Env) -> Any:
        messages, protected = conversation.messages, conversation.protected()
        seen: set[str] = set()
        out = []
        for i, message in enumerate(messages):
            if protected[i] or message.origin < 0 or message.role not in self.config.roles:
                continue
            for text, key, value in self._candidates(texts_of(message), env):
                if key not in seen:
                    seen.add(key)
                    out.append((text, key, value, i))
        return Everything(out)

    def _present(self, messages: Sequence[Message], env: Env) -> str:
        return "\n".join(normalised(m.text) for m in messages)


class PlainChunking(ContentTypeChunking):
    def _compressed_text(self, message: Message, memo: Memo, known: Any) -> Any:
        return super()._compressed_text(message, memo, {})


USER_TEXTS = (
    "Never touch the production database.",
    "Ok, thanks.",
    "Sounds good, go ahead.",
    "The staging server is at 10.7.45.13. It is shared with another team.",
    "Actually, the service listens on port 6645, not 8080.",
    "What does this error mean?",
    "Open src/handlers/export.py and look at the second function.",
    "Make sure every new endpoint has a test.\nOk, thanks.",
    "never touch   the production DATABASE.",
)
ASSISTANT_TEXTS = (
    "Looking into it now, one moment while I read the file and the tests around it.",
    json.dumps(
        {"rows": [{"id": i, "name": f"row {i}", "tags": ["a", "b"]} for i in range(12)]}, indent=2
    ),
    "\n".join(f"2026-11-26 10:00:{i:02d} INFO worker started job {i % 3}" for i in range(40)),
    "def f(x):\n    # add one\n    return x + 1\n\n\n\n# done\n" * 6,
    "The staging server is at 10.7.45.13. It is shared with another team.",
)


@st.composite
def conversations(draw: st.DrawFn) -> Conversation:
    turns = draw(st.integers(4, 30))
    datas: list[dict[str, Any]] = [msg("system", "You are helpful.")]
    for _ in range(turns):
        datas.append(msg("user", draw(st.sampled_from(USER_TEXTS))))
        datas.append(msg("assistant", draw(st.sampled_from(ASSISTANT_TEXTS))))
    datas.append(msg("user", "Continue with the plan."))
    marks = st.sampled_from((None, "code", "log", "other", "message"))
    kinds = {i: k for i in range(1, len(datas) - 1) if (k := draw(marks)) is not None}
    priorities = {i: 1 for i in range(1, len(datas) - 1) if draw(st.booleans()) and i % 3 == 0}
    made = conv(datas, priorities=priorities, kinds=kinds)
    if draw(st.booleans()):  # uids as the gateway gives them; equal uids, equal messages
        made = Conversation(tuple(replace(m, uid=i + 1) for i, m in enumerate(made.messages)))
    return made


def _forwarded(result: Any) -> tuple[list[Any], list[Any], list[Any]]:
    return (
        [dict(m.data) for m in result.conversation.messages],
        [m.kind for m in result.conversation.messages],
        [r.as_dict() for r in result.steps],
    )


@settings(max_examples=150, deadline=None)
@given(conversations(), st.sampled_from((0.25, 0.5, 0.8)), st.sampled_from((0.02, 0.1, 0.3)))
def test_repeated_texts_looked_up_once_forward_what_plain_lookups_forward(
    conversation: Conversation, fraction: float, share: float
) -> None:
    chunking = ContentTypeChunkingConfig()
    ledger = LedgerConfig(share=share)
    fast = Policy("fast", (ContentTypeChunking(chunking), Ledger(ledger), Fifo(FifoConfig())))
    plain = Policy("plain", (PlainChunking(chunking), PlainLedger(ledger), Fifo(FifoConfig())))
    limits = budget(max(64, int(conversation.tokens * fraction / 0.6)))
    expected = run_chain(conversation, limits, plain, env())
    assert _forwarded(run_chain(conversation, limits, fast, env())) == _forwarded(expected)
    shared = env()  # a memo that has seen the conversation: the second run reads it back
    run_chain(conversation, limits, fast, shared)
    assert _forwarded(run_chain(conversation, limits, fast, shared)) == _forwarded(expected)
    # a smaller window: the ledger's cut reaches further than the remembered part went
    smaller = budget(max(64, int(conversation.tokens * fraction / 0.6) // 2))
    expected = run_chain(conversation, smaller, plain, env())
    assert _forwarded(run_chain(conversation, smaller, fast, shared)) == _forwarded(expected)
