"""What an upstream's 2xx answer must look like to reach the client: its API's JSON, or its
API's event stream, checked as it passes (design D15.5).

The rule this module owns: a 2xx from the upstream is relayed only as what the client's API
promises. A whole answer must be a JSON object with the field every answer of that API has
(`Wire.answer_field`: `choices`, `output`, `content`). A stream must be Server-Sent Events
whose every line is a field (`data`, `event`, `id`, `retry`) or a comment, whose every `data`
is a JSON document (chat's `[DONE]` aside), and which ends with its API's last event
(`Wire.final_event`). An answer that breaks the rule is an `UpstreamMalformedError`: a 502 in
the client's API's shape while nothing has been sent, else the stream is cut where it broke (the
events before are relayed whole, the faulty one never) and ends with one error event, numbered
after the last one relayed on Responses (`StreamCheck.next_sequence`).

Bytes are never re-encoded: complete events go on exactly as they came (a partial event waits
for its end, and a line is judged as soon as it is complete, so a stream that is not SSE is
refused from its first line). A compressed stream (`content-encoding`) cannot be read and is
relayed unchecked.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import UpstreamMalformedError

if TYPE_CHECKING:
    from .base import Wire

FIELDS = (b"data", b"event", b"id", b"retry")
BOM = b"\xef\xbb\xbf"
MAX_EVENT_BYTES = 16 * 1024 * 1024  # an event that has not ended by then never will
NOT_AN_ANSWER = "The upstream answered 2xx with a body that is not a {api} answer ({why})."
NOT_A_STREAM = "The upstream's 2xx stream is not a {api} event stream ({why})."


def answer_problem(wire: Wire, body: bytes) -> UpstreamMalformedError | None:
    """Why a whole 2xx answer is not one of `wire`'s API (None: it is)."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        why = "truncated JSON" if body.lstrip()[:1] in (b"{", b"[") else "not JSON"
        return UpstreamMalformedError(NOT_AN_ANSWER.format(api=wire.name, why=why))
    if not isinstance(document, dict):
        why = f"JSON {type(document).__name__}, not an object"
        return UpstreamMalformedError(NOT_AN_ANSWER.format(api=wire.name, why=why))
    if wire.answer_field not in document:
        why = f"no `{wire.answer_field}`"
        return UpstreamMalformedError(NOT_AN_ANSWER.format(api=wire.name, why=why))
    return None


class StreamCheck:
    """One stream, read as it is relayed: `feed` gives back what may go on to the client (its
    complete, well-formed events) or raises; `end` raises for a stream that stopped early."""

    def __init__(self, wire: Wire) -> None:
        self._wire = wire
        self._pending = b""
        self._judged = 0  # bytes of `_pending` whose lines were found well-formed
        self.finished = False  # the API's last event has gone by
        self._sequence: int | None = None  # the highest sequence_number relayed
        self._events = 0

    @property
    def next_sequence(self) -> int:
        """The sequence_number an event added now must carry (Responses): one past the last
        relayed, or the count of events relayed when the upstream numbers none."""
        return self._events if self._sequence is None else self._sequence + 1

    async def begin(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks` checked, their first complete events read already: a stream that is not
        the API's raises here, before its caller has sent anything."""
        checked = self.checked(chunks)
        first = await anext(aiter(checked), b"")
        return _then(first, checked)

    async def checked(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`chunks` as the complete, checked events they carry; then `end`."""
        async for chunk in chunks:
            if out := self.feed(chunk):
                yield out
        self.end()

    def feed(self, chunk: bytes) -> bytes:
        data = self._pending + chunk
        end = _boundary(data)
        complete, self._pending = data[:end], data[end:]
        if complete:
            self._judged = 0
            text = (
                complete.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                if b"\r" in complete
                else complete
            )
            for block in text.split(b"\n\n"):
                if block:
                    self._event(block)
        if self._pending:
            self._judge_lines()
        return complete

    def end(self) -> None:
        if self._pending.strip():
            raise self._fault("it ended inside an event")
        if not self.finished:
            raise self._fault("it ended before its last event")

    # -- the rule --------------------------------------------------------------------------

    def _event(self, block: bytes) -> None:
        name = b""
        data: list[bytes] = []
        for line in block.split(b"\n"):
            if line.startswith(b"data: "):  # the usual lines, read without `_field`
                data.append(line[6:])
                continue
            if line.startswith(b"event: "):
                name = line[7:]
                continue
            field, value = _field(line)
            if field is None:
                raise self._fault(f"a line that is not an SSE field: {line[:60]!r}")
            if field == b"event":
                name = value
            elif field == b"data":
                data.append(value)
        if not data:
            return  # comments, ids, retry: nothing to read
        payload = b"\n".join(data)
        document: Any = None
        if payload != b"[DONE]":
            try:
                document = orjson.loads(payload)
            except orjson.JSONDecodeError:
                raise self._fault(f"an event whose data is not JSON: {payload[:60]!r}") from None
        self._events += 1
        if type(document) is dict:
            number = document.get("sequence_number")
            if type(number) is int:
                self._sequence = number if self._sequence is None else max(self._sequence, number)
        if self._wire.final_event(name, payload, document):
            self.finished = True

    def _judge_lines(self) -> None:
        """The complete lines of the partial event waiting must be fields already."""
        pending = self._pending
        if len(pending) > MAX_EVENT_BYTES:
            raise self._fault(f"an event longer than {MAX_EVENT_BYTES} bytes")
        last = max(pending.rfind(b"\n"), pending.rfind(b"\r"))
        if last < self._judged:
            return
        for line in pending[self._judged : last].replace(b"\r", b"\n").split(b"\n"):
            if line and _field(line)[0] is None:
                raise self._fault(f"a line that is not an SSE field: {line[:60]!r}")
        self._judged = last + 1

    def _fault(self, why: str) -> UpstreamMalformedError:
        return UpstreamMalformedError(NOT_A_STREAM.format(api=self._wire.name, why=why))


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


def _field(line: bytes) -> tuple[bytes | None, bytes]:
    """An SSE line's field and value; (b"", b"") for a comment, (None, b"") for what is none
    (a stream may open with a byte-order mark)."""
    line = line.removeprefix(BOM)
    if line.startswith(b":"):
        return b"", b""
    name, colon, value = line.partition(b":")
    if name not in FIELDS:
        return None, b""
    return name, value[1:] if value.startswith(b" ") else value if colon else b""


def _boundary(data: bytes) -> int:
    """Where the last complete event of `data` ends (0: none has)."""
    if b"\r" not in data:  # the usual framing: one scan
        return data.rfind(b"\n\n") + 2 if b"\n\n" in data else 0
    ends = [data.rfind(b"\n\n") + 2, data.rfind(b"\r\n\r\n") + 4, data.rfind(b"\r\r") + 2]
    found = [end for end, size in zip(ends, (2, 4, 2), strict=True) if end >= size]
    return max(found, default=0)
