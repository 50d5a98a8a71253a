"""Internal rounds in a stream the client is already reading (Responses and Messages).

When the model calls one of the gateway's expansion tools, the gateway runs the call, asks the
model again, and splices the new answer into the stream the client is reading, so the client
sees one answer whose text may have started before the internal call:

- events of the first round are relayed as they arrive, until an internal call starts; from
  there the rest of that round is held back (read, not relayed);
- each later round's preamble is dropped and its items are relayed with their positions
  (`output_index`, block `index`) shifted past what the client has already seen, and with
  `sequence_number` continuing the client's count;
- the last round's terminal event describes the whole answer (every item the client saw, usage
  summed over the rounds).

A `Round` (one per dialect, on `HeldRound`) decides, event by event, what the client gets;
`splice` drives the rounds. Nothing is re-encoded in the first round unless an event must be
dropped. The dialects also take from here what every one of them needs: `Call`, `add_usage`, and
`clashes` (a client tool named like one of the gateway's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from ..upstream import UpstreamResponse


@dataclass(frozen=True, slots=True)
class Call:
    """An internal tool call: its id, which of our tools, and its arguments (JSON text)."""

    id: str
    name: str
    arguments: str


@dataclass(slots=True)
class Carry:
    """What the client has seen so far, across rounds."""

    shown: int = 0  # output items / content blocks relayed
    sequence: int = 0  # the next sequence_number the client expects (Responses)
    items: list[Any] = field(default_factory=list)  # finished output items relayed (Responses)
    usage: dict[str, int] = field(default_factory=dict)  # summed over the rounds
    first: dict[str, Any] = field(default_factory=dict)  # the first round's identity (id, model)
    client_calls: int = 0  # client tool calls relayed


class Round(Protocol):
    """One upstream answer being read: which events the client gets, and what it called."""

    calls: list[Call]  # internal calls found (complete once the round has ended)

    def event(self, raw: bytes, name: bytes, data: bytes) -> bytes | None: ...

    def next_payload(self, payload: dict[str, Any], results: Sequence[str]) -> dict[str, Any]:
        """The request for the next round: the history plus this round and the results."""
        ...


class HeldRound:
    """What both dialects' rounds keep: where they stand, and whether the rest of the round is
    held back (an internal call started in it)."""

    def __init__(self, number: int, carry: Carry, final: bool, names: frozenset[str]) -> None:
        self.number = number
        self.carry = carry
        self.final = final  # no round after this one: internal calls are dropped, not run
        self.names = names
        self.calls: list[Call] = []
        self._internal: set[int] = set()  # positions of this round's internal calls
        self._holding = False  # an internal call started: the rest of this round is held back
        self._offset = carry.shown if number else 0  # items the client saw in earlier rounds

    def _held(self, raw: bytes) -> bytes | None:
        """An event relayed as it came, unless the round is being held back."""
        return None if self._holding else raw


def json_object(data: bytes) -> dict[str, Any] | None:
    """An event's data as a JSON object, or None (not JSON, or not an object)."""
    try:
        parsed = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return parsed if isinstance(parsed, dict) else None


def clashes(payload: Mapping[str, Any], names: frozenset[str]) -> bool:
    """Whether the client has a tool of the same name as one of the gateway's (never shadowed)."""
    return any(
        isinstance(tool, Mapping) and tool.get("name") in names
        for tool in payload.get("tools") or ()
    )


class EventReader:
    """Splits a byte stream into complete SSE events: (raw event, name, data)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[tuple[bytes, bytes, bytes]]:
        data = self._pending + chunk
        if b"\r\n" in data:
            data = data.replace(b"\r\n", b"\n")
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return []
        complete, self._pending = data[: end + 2], data[end + 2 :]
        events = []
        for block in complete.split(b"\n\n")[:-1]:
            if not block.strip():
                continue
            name = b""
            lines = []
            for line in block.split(b"\n"):
                if line.startswith(b"event:"):
                    name = line[6:].strip()
                elif line.startswith(b"data:"):
                    lines.append(line[5:].lstrip(b" "))
            events.append((block + b"\n\n", name, b"\n".join(lines)))
        return events

    def rest(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest


def sse(name: str, document: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(document) + b"\n\n"


def add_usage(total: dict[str, int], usage: Any, keys: Sequence[str]) -> None:
    """Add the integer fields `keys` of `usage` to `total`."""
    if not isinstance(usage, dict):
        return
    for key in keys:
        value = usage.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            total[key] = total.get(key, 0) + value


Execute = Callable[[Call], Awaitable[str]]
Resend = Callable[[bytes], Awaitable[UpstreamResponse]]


async def splice(
    make_round: Callable[[int, Carry, bool], Round],
    response: UpstreamResponse,
    head: bytes,
    payload: dict[str, Any],
    execute: Execute,
    resend: Resend,
    max_rounds: int,
    error_event: Callable[[str], bytes],
    rounds_done: list[int],
) -> AsyncIterator[bytes]:
    """The bytes the client gets, round after round (`rounds_done[0]` counts internal rounds)."""
    carry = Carry()
    number = 0
    while True:
        current = make_round(number, carry, number >= max_rounds)
        reader = EventReader()
        try:
            chunks: list[bytes] = [head] if head else []
            head = b""
            for chunk in chunks:
                for raw, name, data in reader.feed(chunk):
                    out = current.event(raw, name, data)
                    if out:
                        yield out
            async for chunk in response.chunks():
                for raw, name, data in reader.feed(chunk):
                    out = current.event(raw, name, data)
                    if out:
                        yield out
            if rest := reader.rest():
                yield rest
        finally:
            response.close()
        if not current.calls or number >= max_rounds:
            return
        results = [await execute(call) for call in current.calls]
        payload = current.next_payload(payload, results)
        number += 1
        rounds_done[0] = number
        response = await resend(orjson.dumps(payload))
        if response.status >= 400:
            body = await response.read()
            response.release()
            yield error_event(
                f"The upstream answered {response.status} to an internal round: "
                + body[:500].decode("utf-8", "replace")
            )
            return
