"""Prefix stability over a long agent session: how often a forwarded request extends the last.

Run: `python -m benchmarks.bench_cache [--turns 200] [--windows 8192,32768,131072]
[--target 0.6]`. A few seconds per API and chain; no network (the gateway's pipeline in this
process decides what each request would forward, exactly as a request through the server does).

A deterministic agent works for `--turns` requests: a task, then tool calls whose outputs are
about 3 000 characters of log or code, a new user message every eighth step. The same session
is sent as Chat Completions, Responses and Anthropic Messages, each request the whole history
so far (as agents do); the session and its bodies come from tests/agent_session.py, which
tests/test_prefix_stability.py checks the same measure on. For every API, chain and window it
prints:

* `extends`: the share of requests whose forwarded conversation starts, byte for byte, with the
  whole previous forwarded conversation (and whose other fields are unchanged): the provider's
  prefix cache covers all of the previous request. Compared item by item (for Messages, block by
  block: a block appended to the last turn, as a user's text after a tool result, extends it);
* `events`: requests that did not extend the previous one (a compaction event), and turns per
  event;
* `max/limit`: the largest forwarded conversation as a share of the budget (never over 1);
* `ceiling`: the most `extends` any policy could reach on this session and window if it keeps
  the system prompt and the newest step whole and never lets a request pass the trigger: after
  each event it keeps only those, and it appends until the next step would cross the trigger
  (events as late and as deep as possible; no policy has fewer events). When the ceiling is under
  a target, no chain can meet that target at this window.

Provider caches hit on the longest shared prefix, so an event still reuses what it left alone;
`extends` counts only whole hits.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from tests.agent_session import CONVERSATION, WIRES, body, parts_at, pieces, session

CHAINS: dict[str, list[dict[str, Any]] | None] = {
    "default": None,
    "tool_output_cache,fifo": [{"type": "tool_output_cache"}, {"type": "fifo"}],
    "agent (example)": [
        {"type": "tool_output_cache"},
        {"type": "content_type_chunking"},
        {"type": "fifo", "keep_last_turns": 1},
        {"type": "sliding_window", "keep_last_turns": 1},
    ],
    "sliding_window": [{"type": "sliding_window"}],
}


async def run(
    api: str,
    window: int,
    chain: list[dict[str, Any]] | None,
    steps: list[dict[str, Any]],
    target: float = 0.6,
) -> dict[str, float]:
    gw = parts_at(window, chain, target)
    route = gw.router.resolve("m")
    assert route is not None
    key = CONVERSATION[api]
    previous: tuple[list[bytes], dict[str, Any]] | None = None
    extends = events = compacted = 0
    largest = 0.0
    sizes: list[int] = []  # the uncompacted conversation's tokens, request by request
    fixed = trigger = 0
    for end in range(1, len(steps) + 1):
        request = WIRES[api].parse(orjson.dumps(body(api, steps[:end])), 1 << 30)
        prepared = await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))
        sent = orjson.loads(prepared.body)
        items = pieces(api, sent.pop(key))
        sent.pop("tools", None)  # the gateway may add its expansion tools once it masks
        compacted += prepared.changed_steps != []
        sizes.append(prepared.tokens_before - prepared.tokens_by_region["tools"])
        if prepared.conversation is not None:  # the client's own system prompt, not a ledger
            fixed = sum(
                m.tokens
                for m in prepared.conversation.messages
                if m.role in ("system", "developer")
            )
        if prepared.budget is not None:
            trigger = prepared.budget.trigger
            largest = max(
                largest,
                (prepared.tokens_after - prepared.tokens_by_region["tools"])
                / (prepared.budget.limit + 1),
            )
        if previous is not None:
            before, fields = previous
            if items[: len(before)] == before and fields == sent:
                extends += 1
            else:
                events += 1
        previous = (items, sent)
    total = len(steps) - 1
    return {
        "extends": extends / total,
        "ceiling": ceiling(sizes, fixed, trigger) / total,
        "events": events,
        "compacted": compacted,
        "largest": largest,
    }


def ceiling(sizes: Sequence[int], fixed: int, trigger: int) -> int:
    """The most requests that can extend the previous one (see the module docstring).

    `sizes` are the uncompacted conversation's tokens after each step, `fixed` what every request
    keeps (the system prompt). Greedy is optimal here: an event kept as small as allowed and
    taken as late as allowed leaves every later request the most room to append.
    """
    if not trigger:
        return len(sizes) - 1
    extends, current = 0, sizes[0]
    for before, after in itertools.pairwise(sizes):
        step = after - before
        if current + step <= trigger:
            current += step
            extends += 1
        else:
            current = fixed + step
    return extends


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--windows", default="8192,32768,131072")
    parser.add_argument("--apis", default="chat,responses,messages")
    parser.add_argument("--chains", default=",".join(CHAINS))
    parser.add_argument("--target", type=float, default=0.6, help="the policies' target_ratio")
    args = parser.parse_args(argv)
    steps = session(args.turns)
    chains = [c for c in CHAINS if c in args.chains]
    print(
        f"{args.turns}-request agent session, tool outputs ~3000 characters, "
        f"trigger 0.8, target {args.target}"
    )
    print(
        f"{'window':>7} {'api':<10} {'chain':<24} {'extends':>8} {'events':>7} "
        f"{'turns/event':>11} {'compacted':>9} {'max/limit':>9} {'ceiling':>8}"
    )
    for window in (int(w) for w in args.windows.split(",")):
        for api in args.apis.split(","):
            for chain in chains:
                r = await run(api, window, CHAINS[chain], steps, args.target)
                per = (args.turns - 1) / r["events"] if r["events"] else float("inf")
                print(
                    f"{window:>7} {api:<10} {chain:<24} {r['extends']:>8.1%} {r['events']:>7.0f} "
                    f"{per:>11.1f} {r['compacted']:>9.0f} {r['largest']:>9.2f} {r['ceiling']:>8.1%}"
                )
                sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
