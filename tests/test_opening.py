"""The key of a conversation's opening messages, remembered for the very same objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.counting.opening import OpeningKey
from gateway.counting.prefix import _key as prefix_key
from gateway.wire.validated import _key as validated_key

POOL = [{"role": "system", "content": "a"}, {"role": "user", "content": "b"}, {"content": "a"}]

# Each ask: a scope, and for each of up to three messages a pool entry and whether it is the
# pool's own object (as a parse taken over from the previous request hands out) or a copy.
asks = st.lists(
    st.tuples(
        st.sampled_from(["t|a", "t|b", "u|a"]),
        st.lists(st.tuples(st.integers(0, len(POOL) - 1), st.booleans()), max_size=3),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(asks)
def test_a_remembered_key_is_the_key_made_afresh(plan: list[tuple[str, Any]]) -> None:
    """Whatever scopes and objects come in whatever order, the key is `make`'s."""
    for make in (prefix_key, validated_key):
        remembered = OpeningKey(make)
        for scope, picks in plan:
            messages: Sequence[Any] = [POOL[i] if same else dict(POOL[i]) for i, same in picks]
            assert remembered(scope, messages) == make(scope, messages)
