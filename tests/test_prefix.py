"""Reusing the previous request's counts for an unchanged prefix (gateway/prefix.py)."""

from __future__ import annotations

from gateway.prefix import PrefixCounts
from gateway.tokenizers import load_tokenizer
from gateway.tokens import CountCache, MessageCounter


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
