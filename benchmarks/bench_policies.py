"""Speed and cache stability of the policy engine (issue 4 "Speed", "Cache stability").

Run: `python -m benchmarks.bench_policies [--repeat 30]`. No network, no LLM; well under a
minute. Token counts are precomputed on every message (as the gateway's incremental counter
leaves them); steps that create or shorten a message count it with a chars/4 counter.

1. Whole default chain (tool_output_cache, content_type_chunking, fifo) on 1,000 messages /
   ~200k tokens against a 128k window: median ms (target < 10 ms, 000), and every registered
   step alone on the same history (summarising steps answered by an in-memory source).
2. 004's 50-unit chain: 50 units of ~200 tokens, limit 5,000, chain summarize_old,
   prioritize_recent, content_type_chunking, discard_low_rel, max_iterations 3 (target < 2 s).
3. Cache stability: a simulated 200-request agent session (user tasks, tool calls, some
   parallel, large tool outputs) through the default chain, in a small window with big outputs
   (32k, 40-400 lines) and a larger one (128k, 10-200 lines); the share of requests whose
   forwarded messages start with the previous request's forwarded messages.
   The same session through a naive trimmer (drop the oldest messages until under the limit,
   on every request) is printed alongside for comparison.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

from policies import Budget, Conversation, Env, Message, build_policy, run_chain
from policies.conversation import content_text
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
    return Env(count=count, summaries=Source(), ref_for=ref_for)


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


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def big_history(rng: random.Random) -> Conversation:
    """1,000 messages of an agent session, about 200k tokens."""
    return conversation(agent_messages(rng, 560, (12, 40))[:1000])


def bench_speed(repeat: int) -> None:
    rng = random.Random(4)
    conv = big_history(rng)
    budget = Budget(context_window=128_000, reserved_output=16_000, fixed_tokens=2_000)
    policy = build_policy("default")
    result = run_chain(conv, budget, policy, env())
    ms = median_ms(lambda: run_chain(conv, budget, policy, env()), repeat)
    print("1. whole default chain, no LLM")
    print(f"   history: {len(conv)} messages, {conv.tokens} tokens; limit {budget.limit}")
    print(
        f"   result: {result.tokens_after} tokens, steps {result.changed_steps()}, "
        f"fits {result.fits}"
    )
    cpu = []
    for _ in range(repeat):
        start = time.process_time()
        run_chain(conv, budget, policy, env())
        cpu.append((time.process_time() - start) * 1000)
    cpu_ms = statistics.median(cpu)
    print(f"   wall median {ms:.2f} ms; CPU median {cpu_ms:.2f} ms, best {min(cpu):.2f} ms")
    print(f"   (target < 10 ms): ratio wall {ms / 10:.2f}, CPU {cpu_ms / 10:.2f}")
    print("   each step alone on the same history (median ms):")
    for name in sorted(STEPS):
        config_cls, _ = STEPS[name]
        step = build_step(config_cls())
        step_ms = median_ms(lambda step=step: step.apply(conv, budget, env()), max(3, repeat // 3))
        print(f"     {name:<22} {step_ms:8.2f}")


def bench_004(repeat: int) -> None:
    rng = random.Random(50)
    datas: list[Data] = [{"role": "system", "content": "Agent: Coding. " + words(rng, 40)}]
    for u in range(50):
        role = "user" if u % 2 == 0 else "assistant"
        datas.append({"role": role, "content": "\n\n".join(words(rng, 50) for _ in range(3))})
    conv = conversation(datas)
    budget = Budget(context_window=5_000, reserved_output=0, trigger_ratio=0.8, target_ratio=0.6)
    steps = [
        {"type": t}
        for t in ("summarize_old", "prioritize_recent", "content_type_chunking", "discard_low_rel")
    ]
    policy = build_policy("hybrid", steps, max_iterations=3)
    result = run_chain(conv, budget, policy, env())
    ms = median_ms(lambda: run_chain(conv, budget, policy, env()), repeat)
    print("2. 004's 50-unit chain (summaries from memory)")
    print(
        f"   {len(conv) - 1} units, {conv.tokens} tokens -> {result.tokens_after}; "
        f"limit {budget.limit}"
    )
    print(f"   steps {result.changed_steps()}, fits {result.fits}")
    print(f"   median {ms:.2f} ms (target < 2000 ms): ratio to target {ms / 2000:.5f}")


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


def bench_cache(requests: int, window: int, output_lines: tuple[int, int]) -> None:
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
    for end in ends:
        conv = conversation(datas[:end])
        result = run_chain(conv, budget, policy, env())
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
        f"chain triggered on {triggered}, mean tokens sent {tokens_sent // len(ends)}"
    )
    print(f"     prefix kept, default chain: {kept}/{compared} = {kept / compared:.1%}")
    print(f"     prefix kept, naive trim:    {naive_kept}/{compared} = {naive_kept / compared:.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    started = time.perf_counter()
    bench_speed(args.repeat)
    bench_004(args.repeat)
    print("3. cache stability: share of requests that start with the previous request's messages")
    bench_cache(args.requests, 32_000, (40, 400))
    bench_cache(args.requests, 128_000, (10, 200))
    print(f"total {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
