"""Speed and memory of the token-counting layer (issue 3 "Speed", R2.5).

Run: `python -m benchmarks.bench_tokens [--encoding o200k_base] [--repeat 25]`. Takes a few
seconds; no network. Builds a deterministic 200-message agent history of about 60k o200k tokens
(a system prompt, user turns, assistant tool calls, some parallel, large tool results of code and
logs, some Chinese and Japanese text) and prints:

* cold count: `MessageCounter.messages` on the whole history with an empty cache;
* warm count: the same history plus one new message, with the history already cached, and its
  ratio to the cold count (target < 5 %);
* raw `encode_ordinary` over exactly the strings the counter tokenizes vs our cold count (target
  overhead < 20 %, ratio < 1.20);
* the chars heuristic, ms per 1K characters (target < 0.1 ms);
* the cache's memory (accounted, and measured with tracemalloc) vs the bytes of the messages it
  describes (target <= 2x).

Timings are the median of `--repeat` runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
import tracemalloc
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from gateway.tokenizers import CharsTokenizer, TiktokenTokenizer, load_tokenizer
from gateway.tokens import CountCache, MessageCounter

Message = dict[str, Any]

_WORDS = (
    "request context window budget policy summary token message assistant tool result file "
    "function error retry upstream gateway config model stream chunk header value index test "
    "build deploy cache memory limit offset line search match update delete create return"
).split()
_CJK = (
    "上下文窗口令牌预算策略摘要消息助手工具结果文件函数错误重试网关配置模型流式缓存内存限制"
    "ツール結果要約"
)


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _cjk(rng: random.Random, chars: int) -> str:
    return "".join(rng.choice(_CJK) for _ in range(chars)) + "。"


def _code(rng: random.Random, lines: int) -> str:
    out = []
    for i in range(lines):
        name = rng.choice(_WORDS)
        out.append(f"{i + 1:5d}    def {name}_{i}(self, {rng.choice(_WORDS)}: int) -> str:")
        out.append(f"         return self.{rng.choice(_WORDS)}[{rng.randint(0, 999)}]  # {name}")
    return "\n".join(out)


def _log(rng: random.Random, lines: int) -> str:
    return "\n".join(
        f"2025-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00Z "
        f"{rng.choice(['INFO', 'WARN', 'ERROR'])} {rng.choice(_WORDS)}: {_prose(rng, 8)}"
        for _ in range(lines)
    )


def build_history(seed: int = 3, messages: int = 200) -> list[Message]:
    """A deterministic agent conversation: user turns, tool calls, large tool results."""
    rng = random.Random(seed)
    history: list[Message] = [{"role": "system", "content": _prose(rng, 400)}]
    call_number = 0
    while len(history) < messages:
        turn = len(history)
        user_text = _prose(rng, 40) if turn % 3 else _cjk(rng, 60) + " " + _prose(rng, 10)
        history.append({"role": "user", "content": user_text})
        for _step in range(rng.randint(1, 3)):
            parallel = 2 if rng.random() < 0.25 else 1
            calls = []
            for _ in range(parallel):
                call_number += 1
                arguments = {"path": f"src/{rng.choice(_WORDS)}.py", "query": _prose(rng, 6)}
                calls.append(
                    {
                        "id": f"call_{call_number:024d}",
                        "type": "function",
                        "function": {
                            "name": rng.choice(["read_file", "grep", "run_tests"]),
                            "arguments": orjson.dumps(arguments).decode(),
                        },
                    }
                )
            history.append({"role": "assistant", "content": None, "tool_calls": calls})
            for call in calls:
                kind = rng.random()
                if kind < 0.5:
                    result = _code(rng, rng.randint(14, 54))
                elif kind < 0.85:
                    result = _log(rng, rng.randint(11, 34))
                else:
                    result = _cjk(rng, rng.randint(200, 540))
                history.append({"role": "tool", "tool_call_id": call["id"], "content": result})
        history.append({"role": "assistant", "content": _prose(rng, rng.randint(20, 80))})
    return history[:messages]


def _strings(message: Mapping[str, Any]) -> Iterator[str]:
    """The strings the counter tokenizes for one message of `build_history`."""
    for field, value in message.items():
        if isinstance(value, str):
            yield value
        elif field == "tool_calls":
            for call in value:
                yield call["function"]["name"]
                yield call["function"]["arguments"]


def _median_ms(run: Callable[[], object], repeat: int, setup: Callable[[], None] | None) -> float:
    samples = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        start = time.perf_counter_ns()
        run()
        samples.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--encoding", default="o200k_base")
    parser.add_argument("--repeat", type=int, default=25)
    args = parser.parse_args(argv)

    started = time.perf_counter()
    tokenizer = load_tokenizer(f"tiktoken:{args.encoding}")
    assert isinstance(tokenizer, TiktokenTokenizer)
    load_s = time.perf_counter() - started
    history = build_history()
    described = sum(len(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)) for m in history)
    chars = sum(len(s) for m in history for s in _strings(m))
    counter = MessageCounter(tokenizer, CountCache())
    total = counter.messages(history)
    print(f"tokenizer {tokenizer.name}: loaded offline in {load_s * 1000:.0f} ms")
    print(
        f"history: {len(history)} messages, {total} tokens, {chars} chars, "
        f"{described} canonical JSON bytes"
    )

    # Cold: a fresh cache every run.
    def fresh() -> None:
        counter.cache.clear()

    cold_ms = _median_ms(lambda: counter.messages(history), args.repeat, fresh)

    # Warm: history cached; one new message appended (a different one every run).
    counter.cache.clear()
    counter.messages(history)
    rng = random.Random(7)
    appended: list[Message] = []

    def next_message() -> None:
        appended[:] = [{"role": "user", "content": _prose(rng, 60)}]

    warm_ms = _median_ms(lambda: counter.messages(history + appended), args.repeat, next_message)
    hits_before = counter.cache.hits
    counter.messages(history)
    assert counter.cache.hits - hits_before >= len(history) - 5, "history not served from cache"

    # Raw encode_ordinary over the same strings.
    strings = [s for m in history for s in _strings(m)]
    encode = tokenizer.encoding.encode_ordinary
    raw_ms = _median_ms(lambda: [encode(s) for s in strings], args.repeat, None)
    uncached = MessageCounter(tokenizer, CountCache(0))
    uncached_ms = _median_ms(lambda: uncached.messages(history), args.repeat, None)

    # Chars heuristic.
    heuristic = CharsTokenizer(2.5)
    text_1k = "".join(strings)[:1000]
    loops = 10_000
    start = time.perf_counter_ns()
    for _ in range(loops):
        heuristic.count(text_1k)
    chars_count_ms = (time.perf_counter_ns() - start) / 1e6 / loops
    chars_counter = MessageCounter(heuristic)
    chars_history_ms = _median_ms(lambda: chars_counter.messages(history), args.repeat, None)

    # Cache memory: accounted and measured.
    cache = CountCache()
    measured_counter = MessageCounter(tokenizer, cache)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    measured_counter.messages(history)
    measured = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    cached_described = sum(
        size
        for m in history
        if (size := len(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)))
        >= CountCache.MIN_DESCRIBED_BYTES
    )

    print()
    print(f"cold count                  {cold_ms:8.2f} ms  ({total / cold_ms / 1000:.2f} M tok/s)")
    print(
        f"warm count (+1 message)     {warm_ms:8.3f} ms  ratio {warm_ms / cold_ms:6.2%}"
        f"  (target < 5 %)"
    )
    print(
        f"raw encode_ordinary         {raw_ms:8.2f} ms  ours cold / raw {cold_ms / raw_ms:5.3f}"
        f"  (target < 1.20); ours without cache / raw {uncached_ms / raw_ms:5.3f}"
    )
    print(
        f"chars heuristic             {chars_count_ms * 1000:8.3f} us per 1K chars (count), "
        f"{chars_history_ms / (chars / 1000):.4f} ms per 1K chars (whole history, framing "
        f"included)  (target < 0.1 ms)"
    )
    print(
        f"cache memory                {cache.bytes} B accounted, {measured} B measured "
        f"for {len(cache)} entries describing {cached_described} B: "
        f"{cache.bytes / cached_described:.3f}x accounted, {measured / cached_described:.3f}x "
        f"measured  (target <= 2x)"
    )


if __name__ == "__main__":
    main()
