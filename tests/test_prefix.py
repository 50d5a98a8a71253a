"""Reusing the previous request's counts for an unchanged prefix (gateway/counting/prefix.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.counting.cache import CountCache
from gateway.counting.prefix import SYSTEM_ROLES, PrefixCounts, equal_prefix
from gateway.counting.tokenizers import load_tokenizer
from gateway.counting.tokens import MessageCounter


def history(n: int) -> list[dict[str, object]]:
    return [{"role": "system", "content": "sys"}] + [
        {"role": "user" if i % 2 else "assistant", "content": f"message {i} " * 20}
        for i in range(n)
    ]


def test_counts_equal_a_fresh_count_and_only_new_messages_are_counted() -> None:
    counter = MessageCounter(load_tokenizer("tiktoken:o200k_base"), CountCache(0))
    calls: list[object] = []

    def count(message: object) -> int:
        calls.append(message)
        return counter.message(message)  # type: ignore[arg-type]

    memo = PrefixCounts()
    first = history(50)
    assert memo.measure("t|m", counter.tokenizer.name, first, count, 10_000).counts == [
        counter.message(m) for m in first
    ]
    calls.clear()
    second = [*history(50), {"role": "user", "content": "one more"}]
    assert memo.measure("t|m", counter.tokenizer.name, second, count, 10_000).counts == [
        counter.message(m) for m in second
    ]
    assert calls == [{"role": "user", "content": "one more"}]
    # an edited earlier message is recounted from there on
    third = [dict(m) for m in second]
    third[10]["content"] = "changed"
    calls.clear()
    assert memo.measure("t|m", counter.tokenizer.name, third, count, 10_000).counts == [
        counter.message(m) for m in third
    ]
    assert len(calls) == len(third) - 10


def test_scopes_and_tokenizers_never_share_counts() -> None:
    memo = PrefixCounts()
    messages = history(5)
    assert memo.measure("a|m", "chars:4", messages, lambda m: 1, 100).counts == [1] * 6
    assert memo.measure("b|m", "chars:4", messages, lambda m: 2, 100).counts == [2] * 6
    assert memo.measure("a|m", "chars:2", messages, lambda m: 3, 100).counts == [3] * 6


def test_memory_is_bounded() -> None:
    memo = PrefixCounts(max_conversations=3, max_bytes=1000)
    for i in range(10):
        memo.measure(f"t{i}|m", "chars:4", history(2), lambda m: 1, 300)
    assert len(memo._entries) <= 3 and memo._entries.bytes <= 1000


def test_uids_are_equal_only_for_equal_messages_of_the_same_conversation() -> None:
    """`Message.uid`: what the summary links are memoised by. A message keeps its uid
    while it is resent unchanged; an edited message and everything after it get new ones; the
    same messages in another scope (tenant or route) never share a uid."""
    memo = PrefixCounts()
    first = memo.measure("a|m", "chars:4", history(5), lambda m: 1, 100).uids
    second = memo.measure(
        "a|m", "chars:4", [*history(5), {"role": "user", "content": "x"}], lambda m: 1, 100
    ).uids
    assert second[:6] == first and len(set(second)) == 7
    edited = history(5)
    edited[3] = {"role": "user", "content": "changed"}
    third = memo.measure(
        "a|m", "chars:2", edited, lambda m: 1, 100
    ).uids  # a tokenizer change keeps uids
    assert third[:3] == first[:3] and not set(third[3:]) & set(second)
    other = memo.measure("b|m", "chars:4", history(5), lambda m: 1, 100).uids
    assert not set(other) & (set(first) | set(second) | set(third))


def weight(tokenizer: str, message: dict[str, Any]) -> int:
    """A stand-in count that differs by tokenizer, so a count kept across tokenizers shows."""
    return len(orjson.dumps(message)) * (1 if tokenizer == "t1" else 2)


POOL = [
    {"role": role, "content": text}
    for role in ("system", "developer", "user", "assistant", "tool")
    for text in ("a", "b")
] + [{"content": "no role"}]

# One request: from which earlier request it continues (or none), how many of that request's
# messages it keeps, what it appends (indices into POOL, copied or the very same objects), its
# scope and tokenizer, how many of its remaining messages its caller counts, and whether an
# earlier request's exact counts land now (`fill`, as a count made off the request path does).
steps = st.lists(
    st.tuples(
        st.integers(0, 8),
        st.integers(0, 12),
        st.lists(st.integers(0, len(POOL) - 1), max_size=4),
        st.booleans(),
        st.sampled_from(["a|m", "b|m"]),
        st.sampled_from(["t1", "t1", "t2"]),
        st.integers(0, 16),
        st.one_of(st.none(), st.integers(0, 8)),
    ),
    min_size=1,
    max_size=14,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_what_the_memo_knows_is_what_a_fresh_count_gives(plan: list[tuple[Any, ...]]) -> None:
    """Whatever order requests, partial counts and late fills come in (a late fill landing on
    a newer request of the conversation included), every count the memo hands out is the
    message's own count under the request's tokenizer, so is every upper bound, and the roles (each message's, their
    tally in first-appearance order, the system prompt's positions) are tallied afresh."""
    memo = PrefixCounts()
    sent: list[tuple[str, str, list[dict[str, Any]]]] = []
    for parent, keep, added, same_objects, scope, tokenizer, counted, late in plan:
        base = sent[parent % len(sent)][2][:keep] if sent and parent < 6 else []
        extra = [POOL[i] if same_objects else dict(POOL[i]) for i in added]
        messages = [*base, *extra] or [dict(POOL[0])]
        known = memo.known(scope, tokenizer, messages, 100)
        exact = [weight(tokenizer, m) for m in messages]
        assert known.counts == exact[: len(known.counts)]
        roles = [m.get("role", "") for m in messages]
        assert known.roles.names == roles
        assert list(known.roles.tally.items()) == list(Counter(roles).items())  # order too
        assert known.roles.system == [i for i, r in enumerate(roles) if r in SYSTEM_ROLES]
        assert memo.peek(scope, tokenizer, messages) == known.counts
        # Forwarded on its bound: the bounds of what is not counted are the messages' own
        # (never a placeholder, another tokenizer's or another conversation's).
        bounds = known.rest_bounds(messages, lambda m, t=tokenizer: weight(t, m) + 7)
        assert bounds == [weight(tokenizer, m) + 7 for m in messages[len(known.counts) :]]
        known.counts.extend(exact[len(known.counts) : counted])  # the caller counts some
        sent.append((scope, tokenizer, messages))
        if late is not None and late < len(sent):
            old_scope, old_tokenizer, old = sent[late]
            memo.fill(old_scope, old_tokenizer, old, [weight(old_tokenizer, m) for m in old])


def test_counts_made_late_serve_the_newer_requests_of_the_conversation() -> None:
    """Under load a conversation's next request arrives before the previous one's late count
    is made: that count still serves the messages the two share, so the request after them
    counts only what is new (else every request of a busy conversation measures it all)."""
    memo = PrefixCounts()
    count = len
    first = history(30)
    assert memo.known("t|m", "t1", first, 100).counts == []  # forwarded on its bound
    second = [*history(30)[:-1], {"role": "user", "content": "instead"}]
    assert memo.known("t|m", "t1", second, 100).counts == []  # the same, before the count
    memo.fill("t|m", "t1", first, [count(str(m)) for m in first])
    third = [*second, {"role": "user", "content": "more"}]
    known = memo.known("t|m", "t1", third, 100)
    assert known.counts == [count(str(m)) for m in third[:30]]
    memo.fill("t|m", "t2", third, [0] * len(third))  # another tokenizer's counts never land
    assert memo.peek("t|m", "t1", third) == known.counts


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 3), max_size=8),
    st.lists(st.integers(0, 3), max_size=8),
    st.integers(0, 8),
    st.integers(0, 8),
)
def test_equal_prefix_is_the_count_of_leading_equal_messages(
    old_values: list[int], new_values: list[int], shared_objects: int, copied_from: int
) -> None:
    """Whether the messages are the very objects of the old request (a parse taken over), equal
    copies, or different, `equal_prefix` is how many leading messages are equal."""
    old = [{"role": "user", "content": str(v)} for v in old_values]
    new = [{"role": "user", "content": str(v)} for v in new_values]
    for i in range(min(shared_objects, len(old), len(new))):
        new[i] = old[i] if i < copied_from else dict(old[i])
    expected = 0
    while expected < min(len(old), len(new)) and new[expected] == old[expected]:
        expected += 1
    assert equal_prefix(new, old) == expected


def test_a_conversation_waiting_for_its_late_count_bounds_only_what_each_request_adds() -> None:
    """Requests that arrive before a conversation's late count lands are forwarded on their
    bounds: each bounds only the messages it added, not the whole history again."""
    memo = PrefixCounts()
    bounded: list[object] = []

    def bound(message: object) -> int:
        bounded.append(message)
        return len(str(message))

    messages = history(30)
    for turn in range(4):
        known = memo.known("t|m", "t1", messages, 100)
        assert known.counts == []  # nothing counted yet
        assert known.rest_bounds(messages, bound) == [len(str(m)) for m in messages]
        assert len(bounded) == (31 if turn == 0 else 1)
        bounded.clear()
        messages = [*messages, {"role": "user", "content": f"turn {turn}"}]
