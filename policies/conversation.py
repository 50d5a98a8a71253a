"""The conversation model the policies work on: messages, Turns and safe cut points (design D1.6).

A `Message` wraps the OpenAI message exactly as it will be forwarded (`data`), plus what the
gateway learned about it: its token count and the client's pin/priority/type marks. Steps never
mutate a message; they build new ones.

A Turn is a user message and everything after it up to the next user message. Cutting at
a Turn boundary can never orphan a tool call from its results, because an assistant message with
`tool_calls` and its `tool` results always sit inside one Turn. Messages before the first user
message that are not system/developer form a leading partial Turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PROTECTED_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True, init=False)
class Message:
    """One chat message as it will be forwarded, with its count and the client's marks."""

    data: Mapping[str, Any]
    tokens: int
    pin: bool = False
    priority: int | None = None
    kind: str | None = None
    origin: int = -1  # index in the client's request; -1 for messages a step created
    # Set by the gateway for a message it has seen before in this conversation: two messages
    # with the same uid have equal `data`. Lets work that depends only on the data be memoised
    # across requests without serialising it. None: unknown (new content, or a step made it).
    uid: int | None = field(default=None, compare=False)  # never part of a message's equality
    # `data["role"]`, read once: every step looks at roles, and a property costs five times
    # a slot on the hundreds of messages of an agent's request.
    role: str = field(default="", init=False, compare=False, repr=False)

    def __init__(
        self,
        data: Mapping[str, Any],
        tokens: int,
        pin: bool = False,
        priority: int | None = None,
        kind: str | None = None,
        origin: int = -1,
        uid: int | None = None,
    ) -> None:
        # The generated __init__ of a frozen dataclass sets each field through a looked-up
        # `object.__setattr__`, twice as slow as the slots' own setters; the gateway builds a
        # Message for every message of every request that needs a policy.
        _set_data(self, data)
        _set_tokens(self, tokens)
        _set_pin(self, pin)
        _set_priority(self, priority)
        _set_kind(self, kind)
        _set_origin(self, origin)
        _set_uid(self, uid)
        role = data.get("role", "")
        _set_role(self, role if type(role) is str else str(role))

    @property
    def text(self) -> str:
        """The message's textual content (text parts joined); '' when there is none."""
        content = self.data.get("content")
        # a string, most contents, without the call (every step reads every message's text)
        return content if type(content) is str else content_text(content)

    @property
    def tool_call_ids(self) -> tuple[str, ...]:
        calls = self.data.get("tool_calls")
        if not calls:
            return ()
        return tuple([str(c.get("id", "")) for c in calls if is_mapping(c)])

    def with_data(self, data: Mapping[str, Any], tokens: int) -> Message:
        """The same message (same marks and origin) with new content (so no uid)."""
        return Message(data, tokens, self.pin, self.priority, self.kind, self.origin)


_set_data = Message.__dict__["data"].__set__
_set_tokens = Message.__dict__["tokens"].__set__
_set_pin = Message.__dict__["pin"].__set__
_set_priority = Message.__dict__["priority"].__set__
_set_kind = Message.__dict__["kind"].__set__
_set_origin = Message.__dict__["origin"].__set__
_set_uid = Message.__dict__["uid"].__set__
_set_role = Message.__dict__["role"].__set__


def is_mapping(value: Any) -> bool:
    """`isinstance(value, Mapping)`, quick for the dicts that parsed JSON is made of."""
    return type(value) is dict or isinstance(value, Mapping)


def content_text(content: Any) -> str:
    """Text of a message `content`: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                parts.append(part["text"])
        return "\n".join(parts)
    return ""


@dataclass(frozen=True, slots=True, init=False)
class Turn:
    """Messages [start, end) of a conversation; `start` is a user message unless `leading`."""

    start: int
    end: int
    leading: bool = False

    def __init__(self, start: int, end: int, leading: bool = False) -> None:
        # As for Message: a conversation of a hundred Turns is split on every request.
        _set_start(self, start)
        _set_end(self, end)
        _set_leading(self, leading)


_set_start = Turn.__dict__["start"].__set__
_set_end = Turn.__dict__["end"].__set__
_set_leading = Turn.__dict__["leading"].__set__


@dataclass(frozen=True, slots=True)
class Conversation:
    """An ordered, immutable list of messages with the derived facts policies need."""

    messages: tuple[Message, ...]
    # Derived facts, computed once on first use (the object is immutable, so they never go stale).
    _turns: tuple[Turn, ...] | None = field(default=None, compare=False, repr=False)
    _latest: int = field(default=-2, compare=False, repr=False)  # -2: not computed, -1: none
    _tokens: int = field(default=-1, compare=False, repr=False)  # -1: not computed
    _roles: tuple[str, ...] | None = field(default=None, compare=False, repr=False)
    _protected: tuple[bool, ...] | None = field(default=None, compare=False, repr=False)
    _groups: tuple[tuple[int, ...], ...] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, messages: Iterable[Message]) -> Conversation:
        return cls(tuple(messages))

    def with_contents(self, messages: Sequence[Message]) -> Conversation:
        """This conversation with some messages' contents replaced (`Message.with_data`, which
        keeps roles, marks and order): the derived facts that do not depend on contents or
        counts (roles, Turns, latest user message, protected flags) carry over."""
        assert len(messages) == len(self.messages)
        return Conversation(
            tuple(messages),
            _turns=self._turns,
            _latest=self._latest,
            _roles=self._roles,
            _protected=self._protected,
        )

    @property
    def tokens(self) -> int:
        if self._tokens < 0:
            object.__setattr__(self, "_tokens", sum([m.tokens for m in self.messages]))
        return self._tokens

    def __len__(self) -> int:
        return len(self.messages)

    def data(self) -> list[Mapping[str, Any]]:
        """The message dicts as they will be forwarded."""
        return [m.data for m in self.messages]

    def roles(self) -> tuple[str, ...]:
        """Every message's role, in order."""
        if self._roles is None:
            object.__setattr__(self, "_roles", tuple([m.role for m in self.messages]))
        assert self._roles is not None
        return self._roles

    def latest_user_index(self) -> int | None:
        if self._latest == -2:
            roles = self.roles()
            found = len(roles) - 1
            while found >= 0 and roles[found] != "user":
                found -= 1
            object.__setattr__(self, "_latest", found)
        return None if self._latest < 0 else self._latest

    def is_protected(self, index: int) -> bool:
        """The client's system/developer prompts, pinned messages, the latest user message
        (design D1.1, D1.3, D1.4). A system message a step created (origin -1: a summary, a
        placeholder) is not protected: when nothing else is left, it can go too."""
        message = self.messages[index]
        return _client_prompt(message) or message.pin or index == self.latest_user_index()

    def protected(self) -> tuple[bool, ...]:
        """`is_protected` of every index, worked out once."""
        if self._protected is None:
            messages = self.messages
            flags = [m.pin for m in messages]
            for i, role in enumerate(self.roles()):
                if role in PROTECTED_ROLES and messages[i].origin >= 0:
                    flags[i] = True
            latest = self.latest_user_index()
            if latest is not None:
                flags[latest] = True
            object.__setattr__(self, "_protected", tuple(flags))
        assert self._protected is not None
        return self._protected

    def head_end(self) -> int:
        """Index after the client's leading system/developer messages (the untouchable head)."""
        messages, roles = self.messages, self.roles()
        i = 0
        while i < len(roles) and roles[i] in PROTECTED_ROLES and messages[i].origin >= 0:
            i += 1
        return i

    def turns(self) -> tuple[Turn, ...]:
        """The Turns after the head, in order (parseTurnBoundaries)."""
        if self._turns is None:
            object.__setattr__(self, "_turns", _turns(self.roles(), self.head_end()))
        assert self._turns is not None
        return self._turns

    def tool_groups(self) -> tuple[tuple[int, ...], ...]:
        """`tool_groups` of the messages, worked out once (several steps and `drop` need them).

        Not carried over by `with_contents`: a step may rewrite the tool calls themselves."""
        if self._groups is None:
            groups = tuple(tuple(g) for g in _tool_groups(self.messages, self.roles()))
            object.__setattr__(self, "_groups", groups)
        assert self._groups is not None
        return self._groups


def _client_prompt(message: Message) -> bool:
    return message.role in PROTECTED_ROLES and message.origin >= 0


def parse_turn_boundaries(messages: Sequence[Message], head_end: int = 0) -> list[int]:
    """Start index of every Turn after `head_end`."""
    return _turn_starts([m.role for m in messages], head_end)


def parse_turns(messages: Sequence[Message], head_end: int = 0) -> tuple[Turn, ...]:
    return _turns([m.role for m in messages], head_end)


def _turn_starts(roles: Sequence[str], head_end: int) -> list[int]:
    starts = [i for i in range(head_end, len(roles)) if roles[i] == "user"]
    if head_end < len(roles) and (not starts or starts[0] != head_end):
        starts.insert(0, head_end)
    return starts


def _turns(roles: Sequence[str], head_end: int) -> tuple[Turn, ...]:
    starts = _turn_starts(roles, head_end)
    if not starts:  # nothing after the head
        return ()
    ends = [*starts[1:], len(roles)]
    return tuple([Turn(s, e, roles[s] != "user") for s, e in zip(starts, ends, strict=True)])


def find_safe_boundary(messages: Sequence[Message], target: int, head_end: int = 0) -> int:
    """Snap a cut index to the nearest Turn boundary.

    Ties go to the earlier boundary (cut less). Returns `head_end` when there is no boundary.
    """
    starts = parse_turn_boundaries(messages, head_end)
    if not starts:
        return head_end
    return min(starts, key=lambda s: (abs(s - target), s))


def safe_cuts(conversation: Conversation, start: int) -> list[int]:
    """Cut points in `(start, len]` that leave every tool group whole on one side (design D1.6).

    A cut at `i` falls between messages `i - 1` and `i`; it is safe when no group of
    `Conversation.tool_groups` has messages on both sides. These are the groups `drop` keeps or
    removes whole, so a range ending at a safe cut is dropped exactly as asked; and they are
    worked out once per conversation, for both.
    """
    cuts: list[int] = []
    free = start + 1  # the first cut not yet known to fall inside a group
    for group in conversation.tool_groups():  # in the order of their first messages
        first, last = group[0], group[-1]
        if first >= free:
            cuts.extend(range(free, first + 1))  # up to the cut just before the group
        free = max(free, last + 1)
    cuts.extend(range(free, len(conversation) + 1))
    return cuts


def drop(conversation: Conversation, indices: Iterable[int]) -> tuple[Conversation, int]:
    """The conversation without `indices`, never breaking an invariant; returns (result, dropped).

    Protected messages (design D1.1, D1.3, D1.4) are never dropped. Tool calls and their results
    are kept or dropped together (design D1.2): if any message of an assistant-with-tool_calls
    group is kept, the whole group is kept. Order is kept (design D1.5).
    """
    messages = conversation.messages
    count = len(messages)
    protected = conversation.protected()
    gone = bytearray(count)  # 1: dropped
    for i in indices:
        if 0 <= i < count and not protected[i]:
            gone[i] = 1
    if 1 not in gone:
        return conversation, 0
    for group in conversation.tool_groups():
        first, last = group[0], group[-1]
        if last - first + 1 == len(group):  # the usual group: a call and its results in a row
            span = gone[first : last + 1]
            if 1 in span and 0 in span:
                gone[first : last + 1] = bytes(len(span))
        else:
            flags = [gone[i] for i in group]
            if 0 in flags and 1 in flags:
                for i in group:
                    gone[i] = 0
    dropped = gone.count(1)
    if not dropped:
        return conversation, 0
    return _subset(conversation, gone.translate(_KEEP)), dropped


_KEEP = bytes([1, 0]) + bytes(254)  # `bytes.translate` table: dropped (1) -> 0, kept (0) -> 1


def _subset(conversation: Conversation, keep: bytes | bytearray) -> Conversation:
    """The messages where `keep` is 1 (in order), with the facts that do not change carried.

    Only for a `keep` that holds every tool group whole or not at all, and every protected
    message (what `drop` leaves). Roles and protected flags are per message. A tool result's
    group is the latest assistant before it that made the call, and removing whole groups and
    ungrouped messages never changes which one that is, so the remaining groups are the old
    ones renumbered. The latest user message is protected, so it stays the latest. The next
    step then does not work these out again.
    """
    # Position of each kept message in the result: how many are kept up to it, minus one.
    at = list(itertools.accumulate(keep, initial=-1))[1:].__getitem__
    groups = tuple([tuple(map(at, g)) for g in conversation.tool_groups() if keep[g[0]]])
    latest = conversation.latest_user_index()
    return Conversation(
        tuple(itertools.compress(conversation.messages, keep)),
        _latest=-1 if latest is None else at(latest),
        _roles=tuple(itertools.compress(conversation.roles(), keep)),
        _protected=tuple(itertools.compress(conversation.protected(), keep)),
        _groups=groups,
    )


def inserted(conversation: Conversation, at: int, new: Sequence[Message]) -> Conversation:
    """`new` messages (no tool calls or results) inserted before index `at`, with the roles
    and tool groups of the others carried over (renumbered)."""
    messages = conversation.messages
    assert all(not m.data.get("tool_calls") and m.role != "tool" for m in new)
    count = len(new)
    groups = tuple(
        tuple([i + count if i >= at else i for i in group]) for group in conversation.tool_groups()
    )
    roles = conversation.roles()
    if any(m.role == "user" for m in new):  # one may become the latest user message
        return Conversation((*messages[:at], *new, *messages[at:]), _groups=groups)
    latest = conversation.latest_user_index()
    protected = conversation.protected()
    # The new messages are no client prompts: not protected unless pinned.
    return Conversation(
        (*messages[:at], *new, *messages[at:]),
        _latest=-1 if latest is None else latest + count if latest >= at else latest,
        _roles=(*roles[:at], *(m.role for m in new), *roles[at:]),
        _protected=(*protected[:at], *(m.pin for m in new), *protected[at:]),
        _groups=groups,
    )


def tool_groups(messages: Sequence[Message]) -> list[list[int]]:
    """Index groups that must stay together: an assistant message with tool_calls and its results.

    Tool results follow their assistant message (OpenAI requires them immediately after it). A
    tool result whose call is not found stays in a group of its own.
    """
    return _tool_groups(messages, [m.role for m in messages])


def _tool_groups(messages: Sequence[Message], roles: Sequence[str]) -> list[list[int]]:
    groups: list[list[int]] = []
    owner: dict[str, int] = {}
    for i, role in enumerate(roles):
        if role == "assistant":
            calls = messages[i].data.get("tool_calls")
            if not calls:  # most messages
                continue
            number = len(groups)
            groups.append([i])
            for call in calls:  # `Message.tool_call_ids`, inlined: this runs on every request
                if is_mapping(call):
                    owner[_text(call.get("id", ""))] = number
        elif role == "tool":
            group = owner.get(_text(messages[i].data.get("tool_call_id", "")))
            if group is None:
                groups.append([i])
            else:
                groups[group].append(i)
    return [g for g in groups if len(g) > 1]


def _text(value: Any) -> str:
    return value if type(value) is str else str(value)
