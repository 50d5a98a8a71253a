"""Rewriting a relayed SSE stream event by event, and the gateway's own `include_usage` undone.

With `server.stream_usage: inject` the gateway asks a streaming upstream for usage (to
calibrate its estimates) even when the client did not. OpenAI then adds `"usage":null` to every
chunk and one final chunk with `"choices":[]` and the usage. The client did not ask for either,
so they are removed again here, event by event; nothing else in the stream is touched. Streams
the client asked usage for, and every stream in the default `passthrough` mode, never go
through this.
"""

from __future__ import annotations


class EventSplitter:
    """The complete events in a stream cut anywhere: each without its blank line; a partial
    event waits for its end (`flush` gives it back)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        data = self._pending + chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._pending = data
            return []
        complete, self._pending = data[: end + 2], data[end + 2 :]
        return complete.split(b"\n\n")[:-1]

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        return rest


class UsageStripper:
    def __init__(self) -> None:
        self._events = EventSplitter()
        self.usage_event = b""  # the removed usage chunk, for calibration

    def feed(self, chunk: bytes) -> bytes:
        """Complete events of `chunk` (plus what was held back), rewritten; holds partial ones."""
        out: list[bytes] = []
        for event in self._events.feed(chunk):
            if b'"choices":[]' in event and b'"usage":{' in event:
                self.usage_event = event + b"\n\n"
                continue
            out.append(
                event.replace(b',"usage":null', b"").replace(b'"usage":null,', b"") + b"\n\n"
            )
        return b"".join(out)

    def flush(self) -> bytes:
        return self._events.flush()
