"""`ledger` (design D5.3): what the user stated survives the Turns that carried it.

Placed before the steps that drop or summarise, it collects what the user wrote as prose
(`policies/prose.py`: never a line of a file, code, a log or tool output) in the messages those
steps will remove, and puts it, word for word, in one block right after the system prompt:
every sentence but filler, acknowledgements and routine requests (`ledger_rank.py`), the
salient passages (`policies/salience.py`: rules, prohibitions, constraints, decisions,
preferences, goals, corrections, concrete facts) ranked above the rest. So a statement said
politely or indirectly, which no salience rule recognises, is carried all the same.

Only the Turns that go: the ledger works out which oldest Turns a Turn-dropping step after it
removes (fifo's stable cut, the last Turn kept), counting its own block as kept: the more Turns
go, the more it holds, the more must go; the cut only moves on, so the two settle in a few
rounds (the block's exact size is what fifo sees, so fifo never drops a Turn whose
statements the block lacks). So the ledger takes the room its statements need, that room
comes out of the Turns that go (filler and acknowledgements with them), and a request never
leaves bigger than it came. When the chain has run, `finish` takes out every entry that is
still present in a kept message or in a summary (a summary that kept a statement verbatim
makes its entry redundant; one that lost it leaves it in the ledger); an empty ledger leaves
no message.

Bounded: the block takes at most `share` of the budget's limit; when the statements do not fit,
the lowest ranked leave first (every other sentence before a salient passage, the older first
among equals). Deduplicated: a statement repeated
anywhere is one entry, and one that another entry holds whole is merged into it. Stable:
entries keep the order in which they were said, so a later event that drops more Turns appends
to the block; between events the gateway holds the forwarded result, block included. The block
is pinned (no later step drops or rewrites it) and a system message: the gateway, not the user,
is speaking (the Messages API gets it as a system block).

Never drops or rewrites a client's message: it only adds its own block, and takes it out again.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Sequence
from typing import ClassVar, Literal, NamedTuple

from pydantic import Field

from ..budget import Budget, stable_cut
from ..conversation import Conversation, Message, inserted
from ..prose import prose_spans
from ..salience import look, normalised
from ..step import Env, StepConfig, StepResult
from .ledger_entries import BULLET, Entry, merged, parse
from .ledger_rank import carried, line_rank
from .ledger_room import Sizes, room
from .ledger_said import Candidate, Collected

KIND = "ledger"
HEADER = "[Stated earlier in this conversation, kept word for word:]"
FRAMING_TOKENS = 8  # a message's own framing, on top of its text
_KIND = operator.attrgetter("kind")


class LedgerConfig(StepConfig):
    TYPE: ClassVar[str] = "ledger"
    type: Literal["ledger"] = "ledger"
    share: float = Field(
        0.5, gt=0, le=0.8, description="Most of the budget's limit the ledger may take"
    )
    min_salience: float = Field(
        0.45, ge=0, le=1, description="Sentences scoring less rank below every salient passage"
    )  # (with carry_all off, they stay out)
    carry_all: bool = Field(
        True,
        description="Carry every sentence of the user's prose but filler, the salient first; "
        "false: salient passages only",
    )
    roles: tuple[str, ...] = Field(("user",), min_length=1, description="Whose statements count")
    max_entry_chars: int = Field(
        400,
        ge=40,
        description="A longer passage goes sentence by sentence; a longer sentence is cut",
    )
    header: str = Field(HEADER, min_length=1)


class _Round(NamedTuple):
    """A round of `_reached`: the reach tried, the entries before it, those the cap keeps, and
    their block (None when none is kept)."""

    reach: int
    entries: list[Entry]
    kept: list[Entry]
    block: Message | None


class Ledger:
    type: ClassVar[str] = "ledger"

    def __init__(self, config: LedgerConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        at = _ledger_index(conversation)
        sizes = Sizes.of(conversation, at)
        cap = min(int(budget.limit * self.config.share), room(budget, sizes))
        if cap <= 0 and at is None:
            return StepResult.unchanged(conversation, reason="no room")
        said = self._said(conversation, env)
        last: list[_Round] = []  # the last round, when worked out
        reach = self._reach(conversation, budget, env, at, said, cap, sizes, last)
        block: Message | None = None
        if last and last[0].reach == reach:
            entries, kept, block = last[0].entries, last[0].kept, last[0].block
        else:
            entries = self._entries(conversation, at, said.before(reach), env)
            kept = self._bounded(entries, cap, env)
        said.remember()
        if at is not None:
            old = conversation.messages[at]
            if not kept:
                messages = conversation.messages[:at] + conversation.messages[at + 1 :]
                return StepResult(Conversation(messages), removed=1, detail={"entries": 0})
            message = block if block is not None else self._message(kept, env)
            if message.data == old.data:
                return StepResult.unchanged(conversation, reason="ledger unchanged")
            messages = (*conversation.messages[:at], message, *conversation.messages[at + 1 :])
            return StepResult(
                conversation.with_contents(messages),
                replaced=1,
                detail={"entries": len(kept), "left_out": len(entries) - len(kept)},
            )
        if not kept:
            reason = "ledger full" if entries else "nothing to keep"
            return StepResult.unchanged(conversation, reason=reason, left_out=len(entries))
        message = block if block is not None else self._message(kept, env)
        result = inserted(conversation, conversation.head_end(), [message])
        return StepResult(
            result,
            added=1,
            detail={"entries": len(kept), "left_out": len(entries) - len(kept)},
        )

    def _reach(
        self,
        conversation: Conversation,
        budget: Budget,
        env: Env,
        at: int | None,
        said: Collected,
        cap: int,
        sizes: Sizes | None,
        last: list[_Round],
    ) -> int:
        """The index before which messages will go: the oldest Turns that a Turn-dropping step
        after this one (fifo's stable cut, keeping the last Turn) removes once the ledger holds
        their statements. The ledger's own size is part of what is kept, so the cut and the
        ledger are worked out together: round by round the cut moves on (the ledger grows with
        it) until the cut fifo makes with this very block is no further on than the Turns the
        block holds the statements of; entries of Turns that stay go again in `finish`."""
        uids: list[object] = [m.uid for m in conversation.messages]
        if at is not None:  # the block (the step's own message, no uid) counts by its text
            uids[at] = conversation.messages[at].text
        if None not in uids:  # a resent conversation: remembered by its uids
            c = self.config
            settings = (c.min_salience, c.carry_all, c.max_entry_chars, c.roles, c.header)
            scope = (env.scope, tuple(uids), budget.trigger, budget.target, cap)
            key = ("ledger-reach", *scope, settings)
            return env.memo.get(
                key,
                lambda: self._reached(conversation, budget, env, said, cap, sizes, at, last),
                8 * len(uids),
            )
        return self._reached(conversation, budget, env, said, cap, sizes, at, last)

    def _reached(
        self,
        conversation: Conversation,
        budget: Budget,
        env: Env,
        said: Collected,
        cap: int,
        droppable: Sizes | None,
        at: int | None = None,
        last: list[_Round] | None = None,
    ) -> int:
        """`_reach`, worked out (`droppable`: the Turns' sizes; `last` is given the last
        round's reach, entries, kept entries and block, which `apply` then needs again)."""
        turns = conversation.turns()
        if len(turns) < 2 or droppable is None:
            return 0
        sizes, fixed = droppable
        cut = 0
        while True:
            reach = turns[cut].start
            entries = self._entries(conversation, at, said.before(reach), env)
            kept = self._bounded(entries, cap, env)
            # the block's exact size: fifo will see this very block, so its cut is the one
            # worked out here (stable_cut is not monotone in what is kept: no estimate will do)
            block = self._message(kept, env) if kept else None
            ledger = block.tokens if block is not None else 0
            moved = min(
                stable_cut(sizes, fixed + ledger, budget.trigger, budget.target), len(turns) - 1
            )
            if moved <= cut:
                if last is not None:
                    last.append(_Round(reach, entries, kept, block))
                return reach
            cut = moved

    def finish(self, conversation: Conversation, env: Env) -> Conversation:
        """The chain's result without the entries a kept message or a summary still holds."""
        at = _ledger_index(conversation)
        if at is None:
            return conversation
        present = self._present(
            [
                m
                for i, m in enumerate(conversation.messages)
                if i != at and (m.role in self.config.roles or m.origin < 0)
            ],
            env,
        )
        entries = self._block(conversation.messages[at].text, env)
        left = [e for e, key in entries if key not in present]
        if len(left) == len(entries):
            return conversation
        if not left:
            return Conversation(conversation.messages[:at] + conversation.messages[at + 1 :])
        messages = list(conversation.messages)
        messages[at] = self._message(left, env)
        return conversation.with_contents(messages)

    def _present(self, messages: Sequence[Message], env: Env) -> str:
        """The normalised texts of `messages`, one a line, each distinct text once: what an
        entry is looked for in (an entry is one line, so it is in the lines or in none).
        Remembered by their uids when all have one (a resent conversation's kept messages)."""
        uids = tuple([m.uid for m in messages])
        if None in uids:
            return _lines(messages, env)
        key = ("ledger-present", uids)
        found = env.memo.peek(key)
        if found is None:
            found = _lines(messages, env)
            env.memo.put(key, found, len(found) + 8 * len(uids))
        return found  # type: ignore[return-value]

    def _entries(
        self,
        conversation: Conversation,
        at: int | None,
        said: Sequence[tuple[str, str, float, int]],
        env: Env,
    ) -> list[Entry]:
        """The ledger's entries so far, then `said` (the would-be entries of the messages that
        go, in the order they were said), each statement once: a passage that another one
        holds whole is merged into it."""
        seen: set[str] = set()
        entries: list[Entry] = []
        keys: list[str] = []
        if at is not None:
            for entry, key in self._block(conversation.messages[at].text, env):
                if key not in seen:
                    seen.add(key)
                    entries.append(Entry(entry.text, entry.score, len(entries)))
                    keys.append(key)
        base = len(entries)
        for text, key, value, i in said:
            if key not in seen:
                seen.add(key)
                entries.append(Entry(text, value, base + i))
                keys.append(key)
        return merged(entries, keys)

    def _block(self, text: str, env: Env) -> tuple[tuple[Entry, str], ...]:
        """The entries of the ledger's block and their comparison keys (remembered: every
        round of every pass reads the block back)."""
        header = self.config.header
        return env.memo.get(
            ("ledger-block", header, text),
            lambda: tuple([(e, normalised(e.text)) for e in parse(text, header)]),
            2 * len(text),
        )

    def _said(self, conversation: Conversation, env: Env) -> Collected:
        """The would-be entries in the messages a later step may remove, each statement at its
        first place only (`ledger_said.py`: worked out only as far as the cut reaches).

        Remembered by the uids of those messages (equal uids, equal messages): a resent
        conversation is one lookup, not one per message (a new message or an edit makes new
        uids; the messages are then looked up one by one, by their text)."""
        messages, protected, roles = (
            conversation.messages,
            conversation.protected(),
            self.config.roles,
        )
        picked = [
            i
            for i, m in enumerate(messages)
            if m.role in roles and not protected[i] and m.origin >= 0  # (the role rules most out)
        ]
        uids = tuple([messages[i].uid for i in picked])
        find = functools.partial(self._candidates, env=env)
        if None in uids:
            return Collected(messages, picked, find)
        config = self.config
        key = ("ledger-said", config.min_salience, config.carry_all, config.max_entry_chars, uids)
        return Collected(messages, picked, find, env.memo, key)

    def _candidates(self, parts: tuple[str, ...], env: Env) -> tuple[Candidate, ...]:
        """A message's would-be entries: (line, comparison key, rank) of each passage it carries
        of its prose (`policies.prose`: never a line of a file, code, a log or tool output),
        text part by text part; remembered, since a client resends every message on every
        request."""
        config = self.config
        threshold, limit, plain = config.min_salience, config.max_entry_chars, config.carry_all
        key = ("ledger-candidates", threshold, limit, plain, parts)
        found = env.memo.peek(key)
        if found is None:
            out = []
            for text in parts:
                cues, may = look(text) if threshold > 0 else (True, True)
                if not may and not plain:  # most messages: never split into lines or sentences
                    continue
                for start, end in prose_spans(text):
                    found = carried(text[start:end], threshold, limit, cues, plain, may)
                    for line, value in found:
                        out.append((line, normalised(line), value))
            found = tuple(out)
            env.memo.put(key, found, sum(map(len, parts)))
        return found  # type: ignore[return-value]

    def _bounded(self, entries: list[Entry], cap: int, env: Env) -> list[Entry]:
        """The entries that fit in `cap` tokens: the lowest ranked leave first, the older first
        among equals; the rest keep their order."""
        sizes = [_line_tokens(e.text, env) for e in entries]
        total = sum(sizes) + env.text_tokens(self.config.header) + FRAMING_TOKENS
        if total <= cap:
            return entries
        config = self.config
        scores = [
            _score(e.text, config.min_salience, config.carry_all, env)
            if e.score is None
            else e.score
            for e in entries
        ]
        gone: set[int] = set()
        for k in sorted(range(len(entries)), key=lambda k: (scores[k], entries[k].order)):
            if total <= cap:
                break
            gone.add(k)
            total -= sizes[k]
        return [e for k, e in enumerate(entries) if k not in gone]

    def _message(self, entries: Sequence[Entry], env: Env) -> Message:
        lines = [self.config.header, *(BULLET + e.text for e in entries)]
        data = {"role": "system", "content": "\n".join(lines)}
        return Message(data, env.count(data), pin=True, kind=KIND)


def _ledger_index(conversation: Conversation) -> int | None:
    kinds = list(map(_KIND, conversation.messages))
    return kinds.index(KIND) if KIND in kinds else None


def _line_tokens(text: str, env: Env) -> int:
    """Tokens of an entry's line in the block (remembered: worked out every pass)."""
    key = ("ledger-line", env.scope, text)  # (the text's hash is worked out already)
    found = env.memo.peek(key)
    if found is None:
        line = BULLET + text + "\n"
        found = env.text_tokens(line)
        env.memo.put(key, found, len(line))
    return found  # type: ignore[return-value]


def _score(text: str, threshold: float, plain: bool, env: Env) -> float:
    """An entry's rank read back from the block (remembered: the block comes back on every
    pass and every request)."""
    return env.memo.get(
        ("ledger-entry-rank", threshold, plain, text),
        lambda: line_rank(text, threshold, plain),
        len(text),
    )


def _lines(messages: Sequence[Message], env: Env) -> str:
    """The normalised texts of `messages`, each distinct one once, one a line."""
    texts = dict.fromkeys([m.text for m in messages])
    return "\n".join([_normalised(text, env) for text in texts])


def _normalised(text: str, env: Env) -> str:
    return env.memo.get(("normalised", text), lambda: normalised(text), len(text))
