"""What each wire API adds on the request path: Responses and Messages against Chat Completions.

Run: `python -m benchmarks.bench_wire_apis [--rounds 300]`. Under a minute; no network.

The same agent conversation (`tests.agent_session.session`: tool calls with ~3 000-character
outputs) is sent as Chat Completions, Responses and Anthropic Messages. For each API the
gateway's own work on a request is timed: parsing the body into the canonical conversation,
counting, compacting when needed, rendering the forwarded body back into the API, and reading
the answer's usage. Two sizes: a conversation that fits (forwarded as it came: the common case)
and one four times the window (compacted). Rounds interleave the three APIs so that all see the
machine in the same state; each request is a conversation seen before (the gateway's prefix
memo warm, as in an agent loop), one step longer than the last (back to the start every eight,
so the size stays put).

Times are this process's CPU time (`time.process_time`): the loop does no I/O, and on a
shared machine other processes' load then moves the ratios less than it moves wall time.

Printed: the load average before and after, p50 and p90 per API and size, and the ratio of
each API's p50 to chat's (target <= 1.2: an API must not cost more than chat on the same
conversation).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Sequence

import orjson

from tests.agent_session import WIRES, body, parts_at, session

ANSWERS = {
    "chat": {"usage": {"prompt_tokens": 1000, "completion_tokens": 10}},
    "responses": {"usage": {"input_tokens": 1000, "output_tokens": 10}},
    "messages": {"usage": {"input_tokens": 1000, "output_tokens": 10}},
}


async def measure(rounds: int, steps: int, window: int) -> dict[str, list[float]]:
    gw = parts_at(window, None)
    route = gw.router.resolve("m")
    assert route is not None
    conversation = session(steps + 8)
    answers = {api: orjson.dumps(ANSWERS[api]) for api in WIRES}
    times: dict[str, list[float]] = {api: [] for api in WIRES}
    for round_ in range(rounds):
        size = steps + round_ % 8  # one step longer than the last, back to the start every eight
        bodies = {api: orjson.dumps(body(api, conversation[:size])) for api in WIRES}
        for api, wire in WIRES.items():
            started = time.process_time()
            request = gw.parse(wire, bodies[api], "t")  # as the endpoint parses
            prepared = await gw.engine.prepare(
                request, route, "t", window=gw.effective_window(route)
            )
            assert prepared.body
            wire.usage(answers[api])
            times[api].append(time.process_time() - started)
    return times


def report(label: str, times: dict[str, list[float]]) -> None:
    chat = statistics.median(times["chat"])
    for api, values in times.items():
        p50 = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        print(
            f"{label:<28} {api:<10} p50 {p50 * 1e3:7.3f} ms  p90 {p90 * 1e3:7.3f} ms  "
            f"ratio to chat {p50 / chat:5.2f}"
        )


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)
    print("load average before: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    # 40 steps of ~800 tokens: about 32k tokens of history.
    report("fits (32k in a 128k window)", await measure(args.rounds, 40, 131_072))
    report("compacted (32k in an 8k window)", await measure(args.rounds, 40, 8_192))
    print("load average after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
