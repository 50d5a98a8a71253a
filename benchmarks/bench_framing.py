"""What checking a relayed stream costs (`gateway.wire.framing.StreamCheck`, design D15.5).

Run: `python -m benchmarks.bench_framing [--events 2000]`. A few seconds; no network.

Every event a relayed 2xx stream carries is now checked (its lines SSE fields, its data JSON, the
last event noted). Measured against what the relay already did to each event before: the usage
tap (`Wire.usage_tap`), which reads an event only when it mentions usage. The streams are the
gateway's own answers in each API's format (`gateway.wire.answers`) with their text delta
repeated `--events` times, fed one event per chunk as upstreams send them; best of five runs.
Printed per API: the microseconds per event of each, and the check over the tap.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from gateway.wire import WIRES, Usage, Wire, answers
from gateway.wire.framing import StreamCheck
from gateway.wire.usage import sse_events


def stream(api: str, events: int) -> list[bytes]:
    """An answer of `api`, streamed, its text delta repeated to `events` deltas (the way a
    model's answer arrives), one event per chunk."""
    _, raw = answers.answer(api, "word ", "m", Usage(10, 5), True)
    chunks = []
    for name, data in sse_events(raw):
        head = b"event: " + name + b"\n" if name else b""
        event = head + b"data: " + data + b"\n\n"
        repeat = events if b"delta" in data and b'"word ' in data else 1
        chunks.extend([event] * repeat)
    return chunks


def checked(wire: Wire, chunks: list[bytes]) -> None:
    check = StreamCheck(wire)
    for chunk in chunks:
        check.feed(chunk)
    check.end()


def tapped(wire: Wire, chunks: list[bytes]) -> None:
    tap = wire.usage_tap()
    for chunk in chunks:
        tap.feed(chunk)


def per_event(feed: Callable[[Wire, list[bytes]], None], wire: Wire, chunks: list[bytes]) -> float:
    """Microseconds per event of `feed` over the whole stream, best of five runs."""
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        feed(wire, chunks)
        best = min(best, time.perf_counter() - started)
    return best / len(chunks) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_framing")
    parser.add_argument("--events", type=int, default=2000)
    args = parser.parse_args()
    for api in ("chat", "responses", "messages"):
        wire = WIRES[api]
        chunks = stream(api, args.events)
        check_us, tap_us = per_event(checked, wire, chunks), per_event(tapped, wire, chunks)
        print(
            f"{api:9} {len(chunks):5} events: check {check_us:.2f} us/event, "
            f"usage tap {tap_us:.2f} us/event, check/tap {check_us / tap_us:.1f}"
        )


if __name__ == "__main__":
    main()
