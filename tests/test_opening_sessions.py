"""Sessions of one agent that open alike each keep their own memo entries.

Every Codex session of a repository sends the same instructions and developer messages, so a
team behind one tenant shares the opening keys of the per-conversation memos. A model-based
property test holds `OpeningSessions` to its rules (the match, what replaces what, the bounds);
then many such sessions take turns through the resent-message memo (a Codex-like Responses
parse), the validated-message memo and the prefix counts, and each turn must reuse its own
session's previous request.
"""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.counting.openings import OpeningSessions
from gateway.counting.prefix import PrefixCounts
from gateway.devtools.parts import parts
from gateway.wire import RESPONSES
from gateway.wire.validated import ValidatedMessages
from tests.configs import one_model


class _Request:
    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages


def _shared(messages: list[Any], old: list[Any]) -> int:
    count = 0
    for new, kept in zip(messages, old, strict=False):
        if new is not kept:
            break
        count += 1
    return count


operations = st.lists(
    st.tuples(
        st.sampled_from(("a", "b")),  # the key
        st.integers(0, 5),  # which earlier request's messages the new one starts from
        st.integers(0, 4),  # how many of them it keeps
        st.integers(0, 3),  # new messages
        st.integers(1, 40),  # its size
        st.booleans(),  # whether it replaces the request it was matched with
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(operations, st.integers(1, 4))
def test_a_key_keeps_the_latest_requests_and_matches_by_shared_objects(
    steps: list[tuple[str, int, int, int, int, bool]], per_key: int
) -> None:
    """Against a plain model: `get` returns the kept request sharing the longest run of
    leading objects (the latest on a tie); `put` drops the request it replaces, then the
    oldest while a key is over `PER_KEY` requests or half of the bytes."""
    import gateway.counting.openings as module

    saved, module.PER_KEY = module.PER_KEY, per_key
    try:
        memo: OpeningSessions[str, _Request] = OpeningSessions(10, 100)
        model: dict[str, list[tuple[_Request, int]]] = {"a": [], "b": []}
        made: list[_Request] = [_Request([])]
        for key, source, keep, new, size, replace in steps:
            base = made[source % len(made)].messages[:keep]
            messages = base + [object() for _ in range(new)]
            kept = model[key]
            expected = None
            most = -1
            for request, _ in reversed(kept):
                shared = _shared(messages, request.messages)
                if shared > most:
                    expected, most = request, shared
            found = memo.get(key, messages)
            assert found is expected
            request = _Request(messages)
            made.append(request)
            memo.put(key, request, size, found if replace else None)
            if replace and found is not None:
                kept[:] = [entry for entry in kept if entry[0] is not found]
            while kept and (len(kept) >= per_key or sum(s for _, s in kept) + size > 50):
                del kept[0]
            kept.append((request, size))
            assert memo.bytes == sum(s for entries in model.values() for _, s in entries)
    finally:
        module.PER_KEY = saved


def _codex_body(session: int, turns: int) -> bytes:
    """A Codex-like Responses body: the instructions and developer messages every session of
    the repository sends, then the session's own turns."""
    opening = [
        {"type": "message", "role": "developer", "content": "You are Codex. " * 300},
        {"type": "message", "role": "developer", "content": "Repository rules. " * 300},
    ]
    history = []
    for turn in range(turns):
        history.append(
            {"type": "message", "role": "user", "content": f"Session {session}, step {turn}."}
        )
        history.append({"type": "message", "role": "assistant", "content": f"Done {turn}."})
    body = {"model": "m", "instructions": "Be brief.", "input": opening + history}
    return orjson.dumps(body)


def test_codex_sessions_that_open_alike_each_reuse_their_own_parse() -> None:
    """Twenty sessions of one tenant taking turns: after its first turn, each request takes
    over its own session's previous parse for every item it resends."""
    gateway = parts(parse_config(one_model("http://127.0.0.1:9/v1")))
    sessions = 20
    for session in range(sessions):
        gateway.parse(RESPONSES, _codex_body(session, 30), "team")
    gateway.resent.reused = 0
    for turns in (31, 32):
        for session in range(sessions):
            request = gateway.parse(RESPONSES, _codex_body(session, turns), "team")
            assert request.messages[-1]["content"] == f"Done {turns - 1}."
    # both developer messages and every turn the session sent before (`input`'s items)
    assert gateway.resent.reused == sessions * ((2 + 2 * 30) + (2 + 2 * 31))


def _session_messages(opening: list[Any], own: list[Any]) -> list[Any]:
    return [*opening, *own]


def test_sessions_that_open_alike_each_keep_their_counts_and_checks() -> None:
    """The prefix counts and the validated messages of sessions that share their opening
    messages: each turn counts and checks only what its session added."""
    opening = [
        {"role": "system", "content": "You are Codex."},
        {"role": "user", "content": "Rules."},
    ]
    counts, checks = PrefixCounts(), ValidatedMessages()
    histories = {
        session: [{"role": "user", "content": f"{session}: task {n}"} for n in range(3)]
        for session in range(20)
    }
    counted: list[Any] = []
    for turn in range(3):
        for session, own in histories.items():
            own.append({"role": "assistant", "content": f"{session}: step {turn}"})
            messages = [*opening, *(dict(message) for message in own)]  # equal, not the same
            known = checks.known("team", messages)
            assert known.count == (len(messages) - 1 if turn else 2 if session else 0)
            checks.remember(known, messages, 100, False)
            counted.clear()
            counts.measure("team|m", "chars:4", messages, lambda m: counted.append(m) or 1, 100)
            assert len(counted) == (1 if turn else len(messages) - (2 if session else 0))
