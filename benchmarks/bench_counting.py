"""Counting a first-seen request until it fits: the event loop alone against the event loop
joined by helper threads (`server.count_threads`), in one process, taking turns request by
request so that the machine's load hits them alike.

Run: `python -m benchmarks.bench_counting [--requests 40] [--threads 0,2]`. Each request is
the benchmark's 200-message agent body (about 60k o200k tokens, 222 KB by its upper bound) with
every message new, counted by `Counting.until` against a 128k window's trigger, as
`Pipeline` does when the bound reaches it (with the tighter of its two bounds; about seven
tenths of it is counted). Prints, per
setting, the median time and CPU (every thread of the process) per request and their ratios to
the first setting, with the load average: threads only pay with an idle core. `--floor` also
times tiktoken alone over the texts of the messages that must be counted, on one thread and
split over two: what no change to the counting around it can go below.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson

from gateway.counting.cache import CountCache
from gateway.counting.runner import Counting
from gateway.counting.tokenizers import load_tokenizer, utf8_length
from gateway.counting.tokens import PRIMING_TOKENS, MessageCounter
from policies.budget import Budget

from . import targets, workloads

SAFETY_MARGIN = 32  # server.safety_margin_tokens, by default


def trigger(counter: MessageCounter, body: bytes) -> int:
    """The 128k model's trigger for the body's messages, as `Pipeline` works it out when it
    decides on the bound: the window less the output asked for, the tools' bound, the reply's
    priming and the margin, times the trigger ratio."""
    assert counter.bound is not None
    payload = orjson.loads(body)
    tools = counter.bound.tools(payload["tools"])
    fixed = tools + PRIMING_TOKENS + SAFETY_MARGIN
    return Budget(targets.COUNT_WINDOW, payload["max_tokens"], fixed).trigger


async def run(requests: int, settings: list[int]) -> dict[int, list[tuple[float, float]]]:
    body = workloads.agent(targets.COUNT_MODEL)
    tokenizer = load_tokenizer("tiktoken:o200k_base")
    setups = [(threads, Counting(threads=threads)) for threads in settings]
    figures: dict[int, list[tuple[float, float]]] = {threads: [] for threads in settings}
    room = trigger(MessageCounter(tokenizer, CountCache(0)), body.template)
    number = 0
    try:
        for turn in range(requests):
            for threads, counting in setups if turn % 2 else setups[::-1]:
                messages = orjson.loads(body.first_time(number))["messages"]
                number += 1
                counter = MessageCounter(tokenizer, CountCache())
                assert counter.bound is not None
                bound = counter.bound
                sizes = [min(bound.message(m), bound.narrow(m)) for m in messages]
                wall, cpu = time.perf_counter(), time.process_time()
                await counting.until(counter, "t", messages, sizes, lambda b: b <= room)
                wall = time.perf_counter() - wall
                await asyncio.sleep(0.03)  # a helper still counting its last message ends
                figures[threads].append((wall * 1000, (time.process_time() - cpu) * 1000))
    finally:
        for _, counting in setups:
            await counting.close()
    return figures


def needed_texts(counter: MessageCounter, messages: list[Any], room: int) -> list[str]:
    """The texts tiktoken must read for the messages `until` counts (in message order, until
    the counted part plus the tighter bound of the rest fits `room`)."""
    bound = counter.bound
    assert bound is not None
    sizes = [min(bound.message(m), bound.narrow(m)) for m in messages]
    total, taken = sum(sizes), []
    for message, size in zip(messages, sizes, strict=True):
        if total <= room:
            break
        total += counter.uncached(message) - size
        taken.append(message)
    return counter.recorded(lambda: [counter.uncached(m) for m in taken])


def floor(requests: int) -> None:
    """tiktoken alone over the texts that must be counted: on the event loop's thread, and split
    between it and one more thread (turn about, request by request)."""
    body = workloads.agent(targets.COUNT_MODEL)
    tokenizer = load_tokenizer("tiktoken:o200k_base")
    counter = MessageCounter(tokenizer, CountCache(0))
    room = trigger(counter, body.template)
    count = tokenizer.count
    figures: dict[int, list[tuple[float, float]]] = {1: [], 2: []}
    sizes = []
    with ThreadPoolExecutor(1) as helper:
        for turn in range(requests):
            texts = needed_texts(counter, orjson.loads(body.first_time(turn))["messages"], room)
            sizes.append(sum(map(utf8_length, texts)))
            for threads in (1, 2) if turn % 2 else (2, 1):
                wall, cpu = time.perf_counter(), time.process_time()
                if threads == 1:
                    _count_all(count, texts)
                else:
                    other = helper.submit(_count_all, count, texts[1::2])
                    _count_all(count, texts[::2])
                    other.result()
                wall = time.perf_counter() - wall
                figures[threads].append((wall * 1000, (time.process_time() - cpu) * 1000))
    print(f"tiktoken alone over the {statistics.median(sizes) / 1000:.0f} KB of text counted:")
    one = statistics.median(w for w, _ in figures[1])
    for threads, runs in figures.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"  {threads} thread(s): {wall:.2f} ms ({wall / one:.2f}x), CPU {cpu:.2f} ms")


def _count_all(count: Callable[[str], int], texts: list[str]) -> None:
    for text in texts:
        count(text)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_counting")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--threads", default="0,2", help="count_threads settings to compare")
    parser.add_argument(
        "--floor", action="store_true", help="also time tiktoken alone on what must be counted"
    )
    args = parser.parse_args()
    settings = [int(value) for value in args.threads.split(",")]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    figures = asyncio.run(run(args.requests, settings))
    first = figures[settings[0]]
    base_wall = statistics.median(w for w, _ in first)
    base_cpu = statistics.median(c for _, c in first)
    for threads in settings:
        wall = statistics.median(w for w, _ in figures[threads])
        cpu = statistics.median(c for _, c in figures[threads])
        print(
            f"count_threads={threads}: {wall:.2f} ms ({wall / base_wall:.2f}x), "
            f"CPU {cpu:.2f} ms ({cpu / base_cpu:.2f}x)"
        )
    if args.floor:
        floor(args.requests)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
