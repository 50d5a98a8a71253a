"""The emulated edits reported in a stream: only the message_delta event changes, however the
upstream cut the stream into chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.agents.context_management import Applied, reported_in_stream

EVENTS = [
    b'event: message_start\ndata: {"type":"message_start","message":{"id":"m1"}}\n\n',
    b'event: content_block_start\ndata: {"type":"content_block_start","index":0}\n\n',
    b'event: ping\ndata: {"type":"ping"}\n\n',
    b'event: content_block_delta\ndata: {"type":"content_block_delta","delta":{"text":"hi"}}\n\n',
    b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},'
    b'"usage":{"output_tokens":3}}\n\n',
    b'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]
EDIT = {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 9}


async def chunked(data: bytes, cuts: list[int]) -> AsyncIterator[bytes]:
    start = 0
    for cut in sorted(cuts):
        yield data[start:cut]
        start = cut
    yield data[start:]


def relayed(data: bytes, cuts: list[int], applied: Applied) -> bytes:
    async def collect() -> bytes:
        return b"".join([c async for c in reported_in_stream(chunked(data, cuts), applied)])

    return asyncio.run(collect())


@given(st.lists(st.integers(0, len(b"".join(EVENTS))), max_size=12))
def test_only_the_message_delta_changes_wherever_the_stream_is_cut(cuts: list[int]) -> None:
    data = b"".join(EVENTS)
    out = relayed(data, cuts, Applied([EDIT]))
    events = out.split(b"\n\n")[:-1]
    assert len(events) == len(EVENTS)
    for before, after in zip(EVENTS, events, strict=True):
        if b"message_delta" in before:
            payload = orjson.loads(after.split(b"data:", 1)[1])
            assert payload["context_management"] == {"applied_edits": [EDIT]}
            assert payload["usage"] == {"output_tokens": 3}
        else:
            assert after + b"\n\n" == before


@given(st.lists(st.integers(0, len(b"".join(EVENTS))), max_size=12))
def test_nothing_changes_when_nothing_was_applied(cuts: list[int]) -> None:
    data = b"".join(EVENTS)
    assert relayed(data, cuts, Applied()) == data
