"""Runs one checkout's default chain on given request bodies, as that checkout's gateway runs it.

Started by `benchmarks.bench_chain_ab` as `python chain_worker.py BODIES` with PYTHONPATH set to
the checkout under test, so it imports only what every checkout since the chain took message
uids has (`policies`, the prefix memo: `gateway.counting.prefix`, `gateway.prefix` before the
packages) and nothing of this checkout's benchmarks.

Each request is parsed afresh from its bytes and its messages get uids from the prefix memo.
"first": a new memo and prefix memo per request (a conversation this process never saw);
"resent": one of each across requests (the client sends the same history again).

On stdin, one command a line: `time SHAPE SEEN CHAIN N` prints the CPU ms of each of N
requests; `count SHAPE SEEN CHAIN N RUN` makes one warm-up request and then N, running the chain
on those N only when RUN is 1 (a valgrind run of each, subtracted, gives the chain's instructions
per request). CHAIN is `default` or `no-ledger` (the default chain without its ledger step).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

try:
    from gateway.counting.prefix import PrefixCounts
except ModuleNotFoundError:  # a checkout from before gateway/ had packages
    from gateway.prefix import PrefixCounts  # type: ignore[no-redef]
from policies import Budget, Conversation, Env, Message, build_policy, run_chain
from policies.conversation import content_text
from policies.registry import DEFAULT_STEPS

_CJK = re.compile("[\u2e80-\U0010ffff]")


def count_text(text: str) -> int:
    cjk = len(_CJK.findall(text))
    return (len(text) - cjk + 3) // 4 + cjk


def count(data: Mapping[str, Any]) -> int:
    calls = data.get("tool_calls")
    extra = sum(len(str(c)) for c in calls) // 4 if calls else 0
    return 4 + count_text(content_text(data.get("content"))) + extra


def env() -> Env:
    return Env(
        count=count, ref_for=lambda text: f"ref_{abs(hash(text)) % 10**12}", count_text=count_text
    )


def policy(chain: str) -> Any:
    steps = [c.model_dump() for c in DEFAULT_STEPS]
    if chain == "no-ledger":
        steps = [s for s in steps if s["type"] != "ledger"]
    return build_policy(chain, steps)


class Runner:
    """One shape, seen-kind and chain; `request` runs one request and returns its CPU seconds."""

    def __init__(self, body: bytes, seen: str, chain: str) -> None:
        self.body, self.seen, self.policy = body, seen, policy(chain)
        self.shared = (PrefixCounts(), env()) if seen == "resent" else None

    def request(self, run: bool = True) -> float:
        prefix, run_env = self.shared or (PrefixCounts(), env())
        messages = orjson.loads(self.body)
        counted = prefix.measure("bench", "approx", messages, count, 0)
        conversation = Conversation(
            tuple(
                Message(m, tokens, origin=i, uid=uid)
                for i, (m, tokens, uid) in enumerate(
                    zip(messages, counted.counts, counted.uids, strict=True)
                )
            )
        )
        tokens = conversation.tokens
        budget = Budget(int(tokens * 0.5 / 0.6), 0, 0, 0.8, 0.6)
        if not run:
            return 0.0
        started = time.process_time()
        run_chain(conversation, budget, self.policy, run_env)
        return time.process_time() - started


def main() -> int:
    bodies = orjson.loads(Path(sys.argv[1]).read_bytes())
    runners: dict[tuple[str, str, str], Runner] = {}
    for line in sys.stdin:
        command, shape, seen, chain, n, *rest = line.split()
        key = (shape, seen, chain)
        if key not in runners:
            runners[key] = Runner(bodies[shape].encode(), seen, chain)
        runner = runners[key]
        if command == "time":
            ms = [runner.request() * 1000 for _ in range(int(n))]
            print(" ".join(f"{v:.4f}" for v in ms), flush=True)
        else:
            runner.request()
            for _ in range(int(n)):
                runner.request(rest[0] == "1")
            print("done", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
