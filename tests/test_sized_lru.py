"""The bounded memo under the per-conversation memos: however requests arrive, a worker keeps
no more conversations and no more bytes than configured, and the latest request that fits is
kept (so the conversation's next request finds it)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.counting.sized_lru import SizedLru


@given(
    puts=st.lists(st.tuples(st.integers(0, 6), st.integers(0, 120)), min_size=1, max_size=60),
    max_entries=st.integers(1, 5),
    max_bytes=st.integers(1, 200),
)
def test_bounds_hold_and_the_latest_entry_that_fits_is_kept(
    puts: list[tuple[int, int]], max_entries: int, max_bytes: int
) -> None:
    lru: SizedLru[int, int] = SizedLru(max_entries, max_bytes)
    latest: dict[int, int] = {}  # what each key was last stored with (its size)
    for n, (key, size) in enumerate(puts):
        lru.put(key, n, size)
        latest[key] = n
        assert len(lru) <= max_entries
        assert lru.bytes <= max_bytes
        kept = [k for k in latest if lru.get(k) is not None]
        assert lru.bytes == sum(puts[latest[k]][1] for k in kept)
        assert all(lru.get(k) == latest[k] for k in kept)  # never an older value
        assert (lru.get(key) == n) == (size <= max_bytes)


@pytest.mark.parametrize("by_use", [False, True])
def test_by_use_a_read_keeps_an_entry_longer(by_use: bool) -> None:
    lru: SizedLru[str, int] = SizedLru(2, 100, by_use=by_use)
    lru.put("a", 1, 10)
    lru.put("b", 2, 10)
    assert lru.get("a") == 1
    lru.put("c", 3, 10)  # one entry too many: the least recently stored (or used) leaves
    assert (lru.get("a"), lru.get("b")) == ((1, None) if by_use else (None, 2))
    assert lru.get("c") == 3
