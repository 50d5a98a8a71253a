"""Many sessions of one agent under one tenant: the parse of a resent body, against a fresh parse.

    python -m benchmarks.bench_sessions [--sessions 1,4,8,32,64] [--turns 6]

Every session of an agent sends the same instructions and tools, so its bodies open with the
same bytes; a team behind one gateway key (or one provider key) is one tenant. Here N sessions
of the benchmark's Chat, Codex-like Responses and Claude-Code-like Messages bodies (the same
head, each session its own history, one message more each turn) take turns through one
gateway's parse (`Endpoint.parse`: the resumed body and the resent messages), in-process, with
no upstream. Printed per API and N: CPU µs per request of that parse, of a parse from scratch
of the same bodies in the same run, their ratio, and the share of array elements taken over
from a previous body. A ratio near 1 means the sessions cost each other their memo.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import orjson

from gateway.config import parse_config
from gateway.devtools.parts import parts
from gateway.wire import CHAT, MESSAGES, RESPONSES, Wire

from . import agent_bodies, targets, workloads
from .workloads import CONV_MARK

JSON = dict[str, Any]
# One model, for the gateway to be built: it only parses the bodies, no upstream is called.
CONFIG = {"models": [{"name": "m", "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}


def sessions(api: str, count: int) -> tuple[Wire, str, JSON, int, list[list[Any]]]:
    """The API's wire, its array field, the body's other fields, how many leading items all
    sessions share, and each session's own items after those."""
    if api == "chat":
        wire, array, keep = CHAT, "messages", 1
        template = workloads.agent(targets.PASSTHROUGH_MODEL).template
    elif api == "responses":
        wire, array, keep = RESPONSES, "input", 3
        template = agent_bodies.codex(targets.RESPONSES_MODEL).template
    else:
        wire, array, keep = MESSAGES, "messages", 0
        template = agent_bodies.claude(targets.MESSAGES_MODEL).template
    payload = orjson.loads(template)
    history = orjson.dumps(payload[array][keep:])
    own = [orjson.loads(history.replace(CONV_MARK, b"cv%08d" % k)) for k in range(count)]
    return wire, array, payload, keep, own


def turn(api: str, session: int, number: int) -> list[JSON]:
    """An assistant answer and the user's next message (each API's shape)."""
    if api == "responses":
        return [
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"Done {number}."}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"Session {session}: next {number}."}],
            },
        ]
    return [
        {"role": "assistant", "content": f"Done {number}."},
        {"role": "user", "content": f"Session {session}: next {number}."},
    ]


def bodies(api: str, count: int, turns: int) -> tuple[Wire, list[bytes]]:
    """The bodies the sessions send, in the order they send them: one turn of each in turn."""
    wire, array, payload, keep, own = sessions(api, count)
    head = payload[array][:keep]
    sent = []
    for number in range(turns):
        for session in range(count):
            own[session] = own[session] + turn(api, session, number)
            sent.append(orjson.dumps({**payload, array: head + own[session]}))
    return wire, sent


def cpu_per_call(parse: Callable[[bytes], object], sent: list[bytes]) -> float:
    """CPU µs per body of `parse` over `sent`."""
    start = time.process_time()
    for body in sent:
        parse(body)
    return (time.process_time() - start) / len(sent) * 1e6


def measure(api: str, count: int, turns: int) -> tuple[float, float, float]:
    """CPU µs per request of the gateway's parse and of a fresh parse, and the share of array
    elements taken over, for `count` sessions after their first turn (nothing kept yet)."""
    wire, sent = bodies(api, count, turns)
    first, later = sent[:count], sent[count:]
    gateway = parts(parse_config(CONFIG))
    for body in first:
        gateway.parse(wire, body, "team")
    before = gateway.resent.bodies.reused
    memo = cpu_per_call(lambda body: gateway.parse(wire, body, "team"), later)
    fresh = cpu_per_call(lambda body: wire.parse(body, 10_000), later)
    array = "input" if api == "responses" else "messages"
    items = sum(len(orjson.loads(body)[array]) for body in later)
    return memo, fresh, (gateway.resent.bodies.reused - before) / items


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_sessions")
    parser.add_argument("--sessions", default="1,4,8,32,64")
    parser.add_argument("--turns", type=int, default=6)
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("api        sessions  memo µs  fresh µs  memo/fresh  items taken over")
    for api in ("chat", "responses", "messages"):
        for count in (int(n) for n in args.sessions.split(",")):
            memo, fresh, taken = measure(api, count, args.turns)
            print(
                f"{api:<10} {count:>8} {memo:>8.0f} {fresh:>9.0f} {memo / fresh:>11.2f}"
                f" {taken:>17.0%}"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
