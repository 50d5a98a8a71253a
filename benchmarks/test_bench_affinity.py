"""The affinity benchmark's own tools: the prompt cache of its fake upstream reads what a request
shares with earlier ones by whole blocks of prefix, per replica and shared; each session's turns
grow and end where an agent would send them."""

from __future__ import annotations

import itertools

import orjson

from benchmarks.bench_affinity import cut_points, session_bodies
from benchmarks.prefix_cache_upstream import BLOCK, Caches, prompt_of


def test_a_prompt_reads_its_prefix_seen_before_by_whole_blocks() -> None:
    caches = Caches()
    first = bytes(range(256)) * 40  # 10 blocks
    assert caches.read("r0", first) == 0
    assert caches.read("r0", first) == 10 * BLOCK
    changed = first[: 3 * BLOCK + 5] + b"x" + first[3 * BLOCK + 6 :]
    assert caches.read("r0", changed) == 3 * BLOCK  # up to the block that changed
    grown = first + b"more" * BLOCK
    assert caches.read("r1", grown) == 0  # another replica's cache: nothing
    total = caches.stats()["total"]
    assert total["shared_cached"] == 10 * BLOCK + 3 * BLOCK + 10 * BLOCK  # the one upstream's
    assert total["scope_cached"] == 10 * BLOCK + 3 * BLOCK
    assert total["requests"] == 4


def test_each_turn_of_a_session_extends_the_one_before() -> None:
    bodies = [orjson.loads(b) for b in session_bodies(6, 6)]  # even: Chat Completions
    assert len(bodies) == 6
    for before, after in itertools.pairwise(bodies):
        assert after["messages"][: len(before["messages"])] == before["messages"]
        assert len(after["messages"]) > len(before["messages"])
    for body in bodies:
        last = body["messages"][-1]
        assert last["role"] in ("user", "tool")
        assert b"cv00000006" in prompt_of(body)
    other = orjson.loads(session_bodies(8, 6)[0])
    assert other["messages"][0] != bodies[0]["messages"][0]  # sessions share nothing


def test_a_messages_session_grows_and_keeps_most_of_its_prompt() -> None:
    """Odd sessions are Claude Code's: a turn's prompt repeats most of the one before (all but
    its last messages, which an agent's next turn replaces)."""
    bodies = [orjson.loads(b) for b in session_bodies(7, 5)]
    assert all(b["model"] == "bench-claude" and b["system"] for b in bodies)
    for before, after in itertools.pairwise(bodies):
        old, new = prompt_of(before), prompt_of(after)
        same = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), 0)
        assert len(new) > len(old) and same > 0.9 * len(old)
        assert after["messages"][-1]["role"] == "user"


def test_cut_points_never_split_a_call_from_its_results() -> None:
    messages = [
        {"role": "user"},
        {"role": "assistant"},
        {"role": "tool"},
        {"role": "tool"},
        {"role": "assistant"},
        {"role": "user"},
    ]
    assert cut_points(messages, 10) == [4, 6]
