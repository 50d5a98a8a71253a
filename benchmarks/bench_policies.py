"""Speed and cache stability of the policy engine.

Run: `python -m benchmarks.bench_policies [--repeat 30]`. No network, no LLM; well under a
minute. Token counts are precomputed on every message (as the gateway's incremental counter
leaves them); steps that create or shorten a message count it with a chars/4 counter. Every
timed run gets its own copy of the history (new string objects, as a request parsed from JSON
has), built before the clock starts.

1. Whole default chain (tool_output_cache, content_type_chunking, fifo) on 1,000 messages /
   ~200k tokens against a 128k window (target < 10 ms), and against a 32k window (where
   all three steps run). Two figures each: `cold`, a fresh `Env` per run (nothing remembered
   between requests), and `warm`, the gateway's state carried from one request to the next
   (its process-wide ref memo, as `gateway.engine.decide` keeps, and one `policies.memo.Memo`): a
   growing conversation resends the history it sent before. Median wall time and CPU time.
   Then every registered step alone on the same history, cold (summarising steps answered by
   an in-memory source), and `content_type_chunking` warm.
2. A 50-unit breaking chain: 50 units of ~200 tokens, limit 5,000, chain summarize_old,
   prioritize_recent, content_type_chunking, discard_low_rel, max_iterations 3 (target < 2 s).
3. Cache stability: a simulated 200-request agent session (user tasks, tool calls, some
   parallel, large tool outputs) through the default chain, in a small window with big outputs
   (32k, 40-400 lines) and a larger one (128k, 10-200 lines); the share of requests whose
   forwarded messages start with the previous request's forwarded messages.
   The same session through a naive trimmer (drop the oldest messages until under the limit,
   on every request) is printed alongside for comparison.

A summary with the issue's figures closes the output.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from policies import Budget, Conversation, Env, Message, Policy, build_policy, check, run_chain
from policies.conversation import content_text
from policies.memo import Memo
from policies.registry import STEPS, build_step
from policies.summaries import SummaryAnswer, SummaryRequest

Data = dict[str, Any]

WORDS = (
    "the request handler reads the config file and retries the upstream call when the pool is "
    "empty; tests cover the timeout path, the parser and the cache eviction order"
).split()


def count(data: Mapping[str, Any]) -> int:
    text = content_text(data.get("content"))
    calls = data.get("tool_calls")
    return 4 + (len(text) + (len(repr(calls)) if calls else 0) + 3) // 4


def ref_for(text: str) -> str:
    return (
        "ref_" + hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=12).hexdigest()
    )


class Source:
    """Summaries from memory: answers instantly, like a warm gateway cache."""

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        digest = hashlib.blake2b(request.canonical(), digest_size=6).hexdigest()
        return SummaryAnswer.ready(f"summary {digest} of {len(request.messages)} messages")


def env() -> Env:
    """A fresh Env: nothing remembered from an earlier request."""
    return Env(count=count, summaries=Source(), ref_for=ref_for)


class Warm:
    """What a gateway process keeps from one request to the next: the refs of the outputs it
    masked (memoised, as `gateway.engine.decide` does) and a `Memo` of per-text results."""

    def __init__(self) -> None:
        self.refs: dict[str, str] = {}
        self.memo = Memo()

    def ref_for(self, text: str) -> str:
        ref = self.refs.get(text)
        if ref is None:
            ref = self.refs[text] = ref_for(text)
        return ref

    def env(self) -> Env:
        return Env(count=count, summaries=Source(), ref_for=self.ref_for, memo=self.memo)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tool_output(rng: random.Random, lines: int) -> str:
    kind = rng.random()
    if kind < 0.4:  # a log
        return "\n".join(
            f"2025-03-0{rng.randint(1, 9)} 12:{i % 60:02d}:{rng.randint(0, 59):02d} INFO "
            f"worker {rng.randint(1, 4)} {words(rng, 6)}"
            for i in range(lines)
        )
    if kind < 0.7:  # code
        return "\n".join(
            f"    # {words(rng, 5)}"
            if i % 5 == 0
            else f"    value_{i} = compute({i}, '{rng.choice(WORDS)}')"
            for i in range(lines)
        )
    return "\n".join(words(rng, 12) for _ in range(lines))


def agent_messages(rng: random.Random, requests: int, output_lines: tuple[int, int]) -> list[Data]:
    """System prompt, then one new message group per request: a task, or a tool round."""
    messages: list[Data] = [
        {"role": "system", "content": "You are a coding agent. " + words(rng, 200)}
    ]
    call = 0
    for r in range(requests):
        if r % 12 == 0:
            messages.append({"role": "user", "content": f"Task {r // 12}: " + words(rng, 60)})
            continue
        parallel = 2 if rng.random() < 0.2 else 1
        ids = [f"call_{call + k}" for k in range(parallel)]
        call += parallel
        messages.append(
            {
                "role": "assistant",
                "content": words(rng, 20) if rng.random() < 0.5 else None,
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": "run", "arguments": '{"cmd": "make test"}'},
                    }
                    for i in ids
                ],
            }
        )
        for i in ids:
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": i,
                    "content": tool_output(rng, rng.randint(*output_lines)),
                }
            )
        if rng.random() < 0.3:
            messages.append({"role": "assistant", "content": words(rng, 40)})
    return messages


def conversation(datas: list[Data]) -> Conversation:
    return Conversation(
        tuple(Message(data=d, tokens=count(d), origin=i) for i, d in enumerate(datas))
    )


@dataclass(frozen=True)
class Timing:
    wall_ms: float  # median
    cpu_ms: float  # median

    def __str__(self) -> str:
        return f"{self.wall_ms:7.2f} ms wall, {self.cpu_ms:7.2f} ms CPU"


def timed(
    run: Callable[[Conversation], object], fresh: Callable[[], Conversation], repeat: int
) -> Timing:
    """Median of `repeat` runs, each on its own copy of the history (made before the clock)."""
    copies = [fresh() for _ in range(repeat)]
    walls, cpus = [], []
    for conv in copies:
        wall, cpu = time.perf_counter(), time.process_time()
        run(conv)
        cpus.append((time.process_time() - cpu) * 1000)
        walls.append((time.perf_counter() - wall) * 1000)
    return Timing(statistics.median(walls), statistics.median(cpus))


def copier(datas: list[Data]) -> Callable[[], Conversation]:
    """Fresh copies of a history, as a request parsed from JSON brings them (new strings)."""
    raw = orjson.dumps(datas)
    return lambda: conversation(orjson.loads(raw))


def big_history(rng: random.Random) -> list[Data]:
    """1,000 messages of an agent session, about 200k tokens."""
    return agent_messages(rng, 560, (12, 40))[:1000]


def chain_timings(
    fresh: Callable[[], Conversation], budget: Budget, policy: Policy, repeat: int
) -> tuple[Timing, Timing]:
    """(cold, warm) timings of the chain on copies of one history."""
    cold = timed(lambda conv: run_chain(conv, budget, policy, env()), fresh, repeat)
    warm_state = Warm()
    run_chain(fresh(), budget, policy, warm_state.env())  # the request before
    warm = timed(lambda conv: run_chain(conv, budget, policy, warm_state.env()), fresh, repeat)
    return cold, warm


def bench_speed(repeat: int) -> dict[str, Timing]:
    fresh = copier(big_history(random.Random(4)))
    conv = fresh()
    policy = build_policy("default")
    figures: dict[str, Timing] = {}
    print("1. whole default chain, no LLM, counts cached")
    print(f"   history: {len(conv)} messages, {conv.tokens} tokens")
    for window in (128_000, 32_000):
        budget = Budget(context_window=window, reserved_output=window // 8, fixed_tokens=2_000)
        result = run_chain(conv, budget, policy, env())
        steps = ", ".join(f"{r.type} {r.tokens_before}->{r.tokens_after}" for r in result.steps)
        print(f"   window {window // 1000}k (limit {budget.limit}): {steps}; fits {result.fits}")
        cold, warm = chain_timings(fresh, budget, policy, repeat)
        print(f"     cold (fresh Env)      {cold}")
        print(f"     warm (gateway state)  {warm}")
        checked = timed(
            lambda conv, budget=budget: check(
                conv, run_chain(conv, budget, policy, env()).conversation
            ),
            fresh,
            repeat,
        )
        print(f"     cold + invariant check {checked} (the gateway checks before sending)")
        figures[f"chain {window // 1000}k cold"] = cold
        figures[f"chain {window // 1000}k warm"] = warm
    budget = Budget(context_window=128_000, reserved_output=16_000, fixed_tokens=2_000)
    print("   each step alone on the same history, 128k window, cold:")
    for name in sorted(STEPS):
        config_cls, _ = STEPS[name]
        step = build_step(config_cls())
        timing = timed(
            lambda conv, step=step: step.apply(conv, budget, env()), fresh, max(3, repeat // 3)
        )
        print(f"     {name:<22} {timing}")
        figures[f"{name} cold"] = timing
    step = build_step(STEPS["content_type_chunking"][0]())
    warm_state = Warm()
    step.apply(fresh(), budget, warm_state.env())
    timing = timed(
        lambda conv: step.apply(conv, budget, warm_state.env()), fresh, max(3, repeat // 3)
    )
    print(f"     {'content_type_chunking':<22} {timing} (warm)")
    figures["content_type_chunking warm"] = timing
    return figures


def bench_004(repeat: int) -> Timing:
    rng = random.Random(50)
    datas: list[Data] = [{"role": "system", "content": "Agent: Coding. " + words(rng, 40)}]
    for u in range(50):
        role = "user" if u % 2 == 0 else "assistant"
        datas.append({"role": role, "content": "\n\n".join(words(rng, 50) for _ in range(3))})
    fresh = copier(datas)
    conv = fresh()
    budget = Budget(context_window=5_000, reserved_output=0, trigger_ratio=0.8, target_ratio=0.6)
    steps = [
        {"type": t}
        for t in ("summarize_old", "prioritize_recent", "content_type_chunking", "discard_low_rel")
    ]
    policy = build_policy("hybrid", steps, max_iterations=3)
    result = run_chain(conv, budget, policy, env())
    timing = timed(lambda conv: run_chain(conv, budget, policy, env()), fresh, repeat)
    print("2. 004's 50-unit chain (summaries from memory), cold")
    print(
        f"   {len(conv) - 1} units, {conv.tokens} tokens -> {result.tokens_after}; "
        f"limit {budget.limit}"
    )
    print(f"   steps {result.changed_steps()}, fits {result.fits}")
    print(f"   {timing} (target < 2000 ms)")
    return timing


def naive_trim(conv: Conversation, limit: int) -> list[Mapping[str, Any]]:
    """Drop the oldest non-system messages (whole tool groups) until under the limit."""
    kept = list(conv.messages)
    i = 1
    while sum(m.tokens for m in kept) > limit and i < len(kept) - 1:
        drop = 1
        if kept[i].role == "assistant" and kept[i].data.get("tool_calls"):
            while i + drop < len(kept) and kept[i + drop].role == "tool":
                drop += 1
        del kept[i : i + drop]
        if i < len(kept) and kept[i].role == "tool":
            del kept[i]
    return [m.data for m in kept]


def bench_cache(requests: int, window: int, output_lines: tuple[int, int]) -> float:
    rng = random.Random(200)
    datas = agent_messages(rng, requests, output_lines)
    budget = Budget(context_window=window, reserved_output=window // 8, fixed_tokens=1_000)
    policy = build_policy("default")
    # request k carries the history up to the end of its message group
    ends = [
        i + 1
        for i in range(1, len(datas))
        if i + 1 == len(datas) or datas[i + 1]["role"] in ("user", "assistant")
    ][:requests]
    previous: list[Mapping[str, Any]] | None = None
    naive_previous: list[Mapping[str, Any]] | None = None
    kept = naive_kept = triggered = compared = 0
    tokens_sent = 0
    chain_ms: list[float] = []
    warm = Warm()  # one gateway process serves the whole session
    for end in ends:
        conv = conversation(datas[:end])
        start = time.perf_counter()
        result = run_chain(conv, budget, policy, warm.env())
        chain_ms.append((time.perf_counter() - start) * 1000)
        sent = result.conversation.data()
        naive = naive_trim(conv, budget.limit)
        triggered += result.triggered
        tokens_sent += result.tokens_after
        if previous is not None and naive_previous is not None:
            compared += 1
            kept += sent[: len(previous)] == previous
            naive_kept += naive[: len(naive_previous)] == naive_previous
        previous, naive_previous = sent, naive
    print(
        f"   window {window}, tool outputs of {output_lines[0]}-{output_lines[1]} lines: "
        f"{len(ends)} requests, final history {conv.tokens} tokens in {end} messages, "
        f"chain triggered on {triggered}, mean tokens sent {tokens_sent // len(ends)}, "
        f"chain {statistics.mean(chain_ms):.2f} ms per request (mean, warm)"
    )
    print(f"     prefix kept, default chain: {kept}/{compared} = {kept / compared:.1%}")
    print(f"     prefix kept, naive trim:    {naive_kept}/{compared} = {naive_kept / compared:.1%}")
    return kept / compared


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    started = time.perf_counter()
    figures = bench_speed(args.repeat)
    chain_004 = bench_004(args.repeat)
    print("3. cache stability: share of requests that start with the previous request's messages")
    kept_32k = bench_cache(args.requests, 32_000, (40, 400))
    kept_128k = bench_cache(args.requests, 128_000, (10, 200))
    print(f"total {time.perf_counter() - started:.1f} s")
    print()
    print("summary (issue 4, Speed and Cache stability), medians:")
    for label, key, target in (
        ("whole default chain, 1,000 messages, 128k window", "chain 128k", 10.0),
        ("whole default chain, 1,000 messages, 32k window ", "chain 32k", 10.0),
    ):
        cold, warm = figures[f"{key} cold"], figures[f"{key} warm"]
        print(
            f"  {label}: cold {cold.wall_ms:.2f} ms ({cold.cpu_ms:.2f} CPU), warm "
            f"{warm.wall_ms:.2f} ms ({warm.cpu_ms:.2f} CPU); target < {target:g} ms"
        )
    ctc_cold, ctc_warm = (
        figures["content_type_chunking cold"],
        figures["content_type_chunking warm"],
    )
    print(
        f"  content_type_chunking alone on that history: cold {ctc_cold.wall_ms:.2f} ms, "
        f"warm {ctc_warm.wall_ms:.2f} ms"
    )
    print(f"  004's 50-unit chain: {chain_004.wall_ms:.2f} ms; target < 2000 ms")
    print(f"  prefix kept across a 200-request session: {kept_128k:.1%} @128k, {kept_32k:.1%} @32k")


if __name__ == "__main__":
    main()
