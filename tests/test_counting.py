"""Counting only what can matter: a request decided by its upper bound is not made to wait.

A byte-level BPE never gives a text more tokens than UTF-8 bytes, so `MessageCounter.bound`
bounds a request from above. A first-seen request whose bound fits under the trigger is
forwarded as the client sent it before it is counted; the exact count is made off the request
path, and everything that reports tokens (metrics, the log line, `/ui`) reports that exact count,
never the bound. A request whose bound reaches the trigger is counted before it goes (until the
count proves it fits), and one that does not fit is compacted as before. Counts made on one
replica are found by another through a shared Redis store. Driven in-process against the fake
upstream; the Redis test uses a real `redis-server`.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.counting.cache import CountCache
from gateway.counting.runner import OFFLOAD_MIN_BYTES, Counting
from gateway.counting.tokenizers import (
    CharsTokenizer,
    TiktokenTokenizer,
    load_tokenizer,
    utf8_length,
)
from gateway.counting.tokens import MessageCounter
from tests.conftest import Starter
from tests.in_process import AppGateway, AppStarter, LocalUpstream
from tests.redis_server import RedisServer, start_redis
from tests.test_metrics import metric, scrape

ENCODINGS = ("tiktoken:o200k_base", "tiktoken:cl100k_base")
COUNTERS = {spec: MessageCounter(load_tokenizer(spec), CountCache(0)) for spec in ENCODINGS}

# Every code point, lone surrogates included (a Python str can hold them; tiktoken replaces them).
ANY_TEXT = st.text(st.characters(codec=None, categories=None), max_size=200)
SAMPLES = (
    "",
    "hello",
    "héllo wörld",
    "上下文窗口令牌",
    "😀👍🏽🇫🇷",
    "\ud800",
    "a\udfffb",
    "\r\n\t  x",
)


# -- the bound -------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", ENCODINGS)
@pytest.mark.parametrize("text", SAMPLES)
def test_utf8_length_bounds_the_count_of_samples(spec: str, text: str) -> None:
    assert COUNTERS[spec].text(text) <= utf8_length(text)


@settings(max_examples=300, deadline=None)
@given(text=ANY_TEXT)
def test_utf8_length_is_never_below_a_tiktoken_count(text: str) -> None:
    for counter in COUNTERS.values():
        assert counter.text(text) <= utf8_length(text)


SPECIAL = st.sampled_from(["<|endoftext|>", "<|fim_prefix|>", "<|im_start|>", "<|endofprompt|>"])


@settings(max_examples=200, deadline=None)
@given(parts=st.lists(ANY_TEXT | SPECIAL, max_size=4))
def test_a_count_is_the_length_of_encode_ordinary(parts: list[str]) -> None:
    """Special-token strings are ordinary text; lone surrogates are replaced as tiktoken does."""
    text = "".join(parts)
    for counter in COUNTERS.values():
        tokenizer = counter.tokenizer
        assert isinstance(tokenizer, TiktokenTokenizer)
        assert tokenizer.count(text) == len(tokenizer.encoding.encode_ordinary(text))


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)
PNG_1X1 = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
    "60e6kgAAAABJRU5ErkJggg=="
)
PART = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, ANY_TEXT),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, ANY_TEXT),
    st.builds(
        lambda url, detail: {"type": "image_url", "image_url": {"url": url, "detail": detail}},
        st.sampled_from([PNG_1X1, "https://example.com/a.png", ""]),
        st.sampled_from(["low", "high", "auto"]),
    ),
    st.sampled_from(
        [
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}},
            {"type": "file", "file": {"file_id": "f"}},
            {"type": ["odd"], "x": 1},
        ]
    ),
    ANY_TEXT,
    JSONISH,
)
CALL = st.one_of(
    st.builds(
        lambda name, args: {
            "id": "c",
            "type": "function",
            "function": {"name": name, "arguments": args},
        },
        ANY_TEXT,
        ANY_TEXT | JSONISH,
    ),
    st.builds(lambda x: {"id": "c", "type": "custom", "custom": x}, JSONISH),
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "developer"]) | ANY_TEXT},
    optional={
        "content": st.none() | ANY_TEXT | st.lists(PART, max_size=4) | JSONISH,
        "name": ANY_TEXT,
        "tool_calls": st.lists(CALL, max_size=3) | JSONISH,
        "tool_call_id": ANY_TEXT,
        "function_call": st.builds(lambda n: {"name": n, "arguments": "{}"}, ANY_TEXT) | JSONISH,
        "reasoning_content": ANY_TEXT,
        "extra": JSONISH,
    },
)


@settings(max_examples=300, deadline=None)
@given(message=MESSAGE)
def test_the_bound_of_a_message_is_never_below_its_count(message: dict[str, Any]) -> None:
    for counter in COUNTERS.values():
        assert counter.bound is not None
        assert counter.bound.message(message) >= counter.message(message)
        assert counter.bound.narrow(message) >= counter.message(message)


PROPERTY = st.fixed_dictionaries(
    {},
    optional={
        "type": st.sampled_from(["string", "integer", "array", "object", "boolean"]),
        "description": ANY_TEXT,
        "enum": st.lists(ANY_TEXT | st.integers(), max_size=3),
    },
)
FUNCTION = st.fixed_dictionaries(
    {"name": ANY_TEXT},
    optional={
        "description": ANY_TEXT,
        "parameters": st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "properties": st.dictionaries(ANY_TEXT, PROPERTY, max_size=3),
            },
            optional={"required": st.lists(ANY_TEXT, max_size=2)},
        ),
    },
)


@settings(max_examples=200, deadline=None)
@given(
    functions=st.lists(FUNCTION, min_size=1, max_size=3),
    hosted=st.lists(st.dictionaries(ANY_TEXT, JSONISH, max_size=2), max_size=2),
    system=st.none() | ANY_TEXT,
)
def test_the_bound_of_tool_definitions_is_never_below_their_count(
    functions: list[dict[str, Any]], hosted: list[dict[str, Any]], system: str | None
) -> None:
    tools = [{"type": "function", "function": f} for f in functions] + hosted
    for counter in COUNTERS.values():
        assert counter.bound is not None
        assert counter.bound.tools(tools, system_text=system) >= counter.tools(
            tools, system_text=system
        )


def test_only_byte_level_bpe_tokenizers_have_a_bound() -> None:
    assert MessageCounter(load_tokenizer("tiktoken:o200k_base")).bound is not None
    assert MessageCounter(CharsTokenizer(2.5)).bound is None  # an estimate bounds nothing


# -- counting until it fits ------------------------------------------------------------------

# Enough text that the counting goes to the threads that share it (below this it is inline).
PADDING = {"role": "user", "content": "pad the history with plain words, 42 ok\n" * 900}
assert len(orjson.dumps(PADDING)) >= OFFLOAD_MIN_BYTES


@settings(max_examples=60, deadline=None)
@given(
    pieces=st.lists(st.tuples(ANY_TEXT, st.integers(1, 300)), min_size=1, max_size=10),
    share=st.floats(0, 1.2),
)
def test_counting_together_changes_no_count_and_no_decision(
    pieces: list[tuple[str, int]], share: float
) -> None:
    """However many threads share the counting, and whichever of them counts which message,
    a count made is the message's exact count, a request whose exact count fits is found to
    fit, and one that does not is counted whole."""
    messages = [{"role": "tool", "content": text * times} for text, times in pieces]
    messages.insert(len(messages) // 2, PADDING)
    tokenizer = load_tokenizer("tiktoken:o200k_base")
    exact = [COUNTERS["tiktoken:o200k_base"].message(m) for m in messages]
    bound = COUNTERS["tiktoken:o200k_base"].bound
    assert bound is not None
    sizes = [bound.message(m) for m in messages]
    limit = int(sum(exact) + share * (sum(sizes) - sum(exact)) - 100)

    async def count(threads: int) -> tuple[list[int | None], list[int]]:
        counting = Counting(threads=threads)
        try:
            counter = MessageCounter(tokenizer, CountCache())
            made = await counting.until(counter, "t", messages, sizes, lambda b: b <= limit)
            fresh = MessageCounter(tokenizer, CountCache())
            return made, await counting.exact(fresh, "t", messages, sizes)
        finally:
            await counting.close()

    for threads in (0, 2, 3):
        made, whole = asyncio.run(count(threads))
        assert whole == exact
        assert all(c is None or c == e for c, e in zip(made, exact, strict=True))
        if sum(exact) <= limit:
            assert sum(s if c is None else c for c, s in zip(made, sizes, strict=True)) <= limit
        else:
            assert made == exact


class _Watched(TiktokenTokenizer):
    """o200k, noting which thread counts each text and when. A text beginning "slow" takes a
    millisecond more (without the GIL, as tiktoken's own work); one beginning "fail" raises."""

    def __init__(self) -> None:
        base = load_tokenizer("tiktoken:o200k_base")
        assert isinstance(base, TiktokenTokenizer)
        super().__init__(base.name, base.encoding)
        self.calls: list[tuple[int, float]] = []

    def count(self, text: str) -> int:
        self.calls.append((threading.get_ident(), time.perf_counter()))
        if text.startswith("fail"):
            raise RuntimeError("the tokenizer failed")
        if text.startswith("slow"):
            time.sleep(0.001)
        return super().count(text)


def _tool_results(mark: str, number: int, words: int = 2000) -> list[dict[str, Any]]:
    return [
        {"role": "tool", "content": f"{mark} {i} " + "lorem ipsum " * words} for i in range(number)
    ]


def _exact(messages: list[dict[str, Any]]) -> list[int]:
    return [COUNTERS["tiktoken:o200k_base"].message(m) for m in messages]


async def test_a_late_count_gives_way_while_a_request_is_counted() -> None:
    """The background thread counts nothing new while the event loop counts a request (the
    message it had begun aside), so the request does not take turns at the GIL with it."""
    tokenizer, counting = _Watched(), Counting()
    late_messages = _tool_results("slow late", 60)
    try:
        late = asyncio.create_task(
            counting.exact(
                MessageCounter(tokenizer, CountCache()), "t", late_messages, background=True
            )
        )
        loop_thread = threading.get_ident()
        while not any(ident != loop_thread for ident, _ in tokenizer.calls):
            await asyncio.sleep(0.001)
        request_counter = MessageCounter(tokenizer, CountCache())
        mark = len(tokenizer.calls)  # the request's own counting begins after this
        await counting.exact(request_counter, "t", _tool_results("slow", 30))
        assert await asyncio.wait_for(late, 30) == _exact(late_messages)
    finally:
        await counting.close()
    # From the request's first text to its last (not from the call: bounding the messages
    # first is the event loop's Python, which a loaded machine may interrupt for the thread).
    ours = [at for ident, at in tokenizer.calls[mark:] if ident == loop_thread]
    begun, ended = ours[0], ours[-1]
    meanwhile = [at for ident, at in tokenizer.calls if ident != loop_thread and begun < at < ended]
    assert len(meanwhile) <= 1  # one it may have been about to begin as the request began


@settings(max_examples=30, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(("request", "failing request", "late")), st.integers(3, 5)),
        min_size=1,
        max_size=6,
    )
)
def test_late_counts_finish_whatever_requests_were_counted_meanwhile(
    steps: list[tuple[str, int]],
) -> None:
    """Requests counted (or failing half-way) while late counts wait never leave them waiting:
    every late count ends with the exact counts, and so does one started after them all."""

    async def run() -> None:
        tokenizer, counting = _Watched(), Counting()
        lates: list[tuple[asyncio.Task[list[int]], list[dict[str, Any]]]] = []

        def late(messages: list[dict[str, Any]]) -> None:
            counter = MessageCounter(tokenizer, CountCache())
            lates.append(
                (
                    asyncio.create_task(counting.exact(counter, "t", messages, background=True)),
                    messages,
                )
            )

        try:
            for number, (kind, size) in enumerate(steps):
                messages = _tool_results(f"step {number}", size, 1200)
                if kind == "late":
                    late(messages)
                elif kind == "request":
                    counter = MessageCounter(tokenizer, CountCache())
                    assert await counting.exact(counter, "t", messages) == _exact(messages)
                else:
                    messages[size // 2]["content"] = "fail " + messages[size // 2]["content"]
                    with pytest.raises(RuntimeError):
                        await counting.exact(MessageCounter(tokenizer, CountCache()), "t", messages)
                await asyncio.sleep(0)
            late(_tool_results("after", 3, 1200))
            for task, messages in lates:
                assert await asyncio.wait_for(task, 20) == _exact(messages)
        finally:
            await counting.close()

    asyncio.run(run())


async def test_closing_lets_a_late_count_waiting_for_requests_go() -> None:
    """A late count waiting while a request counts is let go when counting closes, even if that
    request never ends (its task gone with the loop): no thread is left for the interpreter to
    wait for at exit."""
    counting = Counting()
    counter = MessageCounter(_Watched(), CountCache())
    with counting._first.counting():  # a request counting, never to end here
        late = asyncio.create_task(
            counting.exact(counter, "t", _tool_results("late", 5), background=True)
        )
        await asyncio.sleep(0.05)
        assert not late.done()  # it waits for the request
        await counting.close()
        threads = list(counting._later._threads)
        assert threads
        for thread in threads:  # the request still counts
            thread.join(10)
            assert not thread.is_alive()


# -- the gateway -----------------------------------------------------------------------------


def history(mark: str, turns: int = 40) -> list[dict[str, Any]]:
    """An agent conversation of ~100 KB whose every message names `mark` (first seen)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": f"{mark}: you are an agent."}]
    for turn in range(turns):
        listing = "\n".join(
            f"{n:5d}  def step_{turn}_{n}(value): return value * {n} + {turn}  # {mark}"
            for n in range(30)
        )
        messages += [
            {"role": "user", "content": f"{mark} turn {turn}: read the file and fix it, 世界 😀"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "read", "arguments": f'{{"path": "f{turn}.py"}}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": listing},
        ]
    messages.append({"role": "user", "content": f"{mark}: and now?"})
    return messages


def exact_tokens(messages: list[dict[str, Any]]) -> int:
    return COUNTERS["tiktoken:o200k_base"].messages(messages)


def gpt(upstream: LocalUpstream, window: int, name: str = "m") -> dict[str, Any]:
    return {
        "name": name,
        "upstream": {"base_url": upstream.base_url},
        "context_window": window,
        "max_output_tokens": 1000,
        "tokenizer": "tiktoken:o200k_base",
    }


CLIENT = {"authorization": "Bearer sk-client"}  # one tenant for every request of a test


async def post(gw: AppGateway, body: bytes) -> Any:
    return await gw.http.post(
        f"{gw.base_url}/chat/completions",
        content=body,
        headers={"content-type": "application/json", **CLIENT},
    )


async def plan(gw: AppGateway, messages: list[dict[str, Any]]) -> Any:
    payload = {"model": "m", "messages": messages}
    return (
        await gw.http.post(f"{gw.base_url}/compactgate/plan", json=payload, headers=CLIENT)
    ).json()


async def eventually(check: Callable[[], Any], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_first_seen_request_that_fits_by_its_bound_goes_before_it_is_counted(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app({"models": [gpt(local_upstream, 1_000_000)]})
    counting = gw.app.core.engine.counting
    messages = history("fits")
    body = orjson.dumps({"model": "m", "messages": messages, "max_tokens": 50})
    exact = exact_tokens(messages)
    held = threading.Event()
    # The background counting thread is kept busy: the request must not wait for it.
    blocker = asyncio.ensure_future(counting.run(True, lambda: held.wait(30)))
    try:
        answer = await asyncio.wait_for(post(gw, body), 10)
        assert answer.status_code == 200
        [sent] = local_upstream.chat_requests()
        assert base64.b64decode(sent["body_b64"]) == body  # the client's own bytes
        assert answer.headers["x-compactgate-tokens-counted"] == "upper-bound"
        bound = int(answer.headers["x-compactgate-tokens-before"])
        assert bound >= exact
        await asyncio.sleep(0.1)
        # Nothing reports the bound as a count: the request is recorded once counted.
        assert metric(await scrape(gw), "compactgate_tokens_before_total", model="m") == 0
    finally:
        held.set()
        await blocker

    async def counted() -> bool:
        return metric(await scrape(gw), "compactgate_tokens_before_total", model="m") == exact

    await eventually(counted)
    assert metric(await scrape(gw), "compactgate_requests_total", model="m") == 1
    assert f"tokens_before={exact} " in gw.logs()

    # The next turn finds every earlier message counted: its figures are exact at once.
    messages.append({"role": "user", "content": "one more thing"})
    again = await post(gw, orjson.dumps({"model": "m", "messages": messages, "max_tokens": 50}))
    assert "x-compactgate-tokens-counted" not in again.headers
    assert int(again.headers["x-compactgate-tokens-before"]) == exact_tokens(messages)


@pytest.mark.parametrize("threads", [0, 2])
async def test_a_request_whose_bound_reaches_the_trigger_is_counted_until_it_fits(
    start_app: AppStarter, local_upstream: LocalUpstream, threads: int
) -> None:
    messages = history("narrow")
    exact = exact_tokens(messages)
    body = orjson.dumps({"model": "m", "messages": messages})
    bound = COUNTERS["tiktoken:o200k_base"].bound.messages(messages)  # type: ignore[union-attr]
    # A window whose trigger (80 % of what is left after the output) lies between the two.
    window = int((exact + bound) / 2 / 0.8) + 1000
    gw = await start_app(
        {"server": {"count_threads": threads}, "models": [gpt(local_upstream, window)]}
    )
    answer = await post(gw, body)
    assert answer.status_code == 200
    [sent] = local_upstream.chat_requests()
    assert base64.b64decode(sent["body_b64"]) == body  # it fits: forwarded as it came
    # Counted until it fits: what it reports is exact, or a bound narrowed below the trigger.
    assert exact <= int(answer.headers["x-compactgate-tokens-before"]) < (exact + bound) / 2

    async def counted() -> bool:
        return metric(await scrape(gw), "compactgate_tokens_before_total", model="m") == exact

    await eventually(counted)


async def test_a_request_counted_before_it_goes_does_not_wait_for_busy_counting_threads(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The threads that share a request's counting may all be busy (another request's count):
    the event loop counts it alone instead of queueing behind them."""
    messages = history("busy")
    exact = exact_tokens(messages)
    bound = COUNTERS["tiktoken:o200k_base"].bound.messages(messages)  # type: ignore[union-attr]
    window = int((exact + bound) / 2 / 0.8) + 1000
    gw = await start_app({"server": {"count_threads": 2}, "models": [gpt(local_upstream, window)]})
    counting = gw.app.core.engine.counting
    held = threading.Event()
    blockers = [asyncio.ensure_future(counting.run(False, lambda: held.wait(30))) for _ in range(2)]
    try:
        answer = await asyncio.wait_for(
            post(gw, orjson.dumps({"model": "m", "messages": messages})), 10
        )
        assert answer.status_code == 200
        assert exact <= int(answer.headers["x-compactgate-tokens-before"]) < (exact + bound) / 2
    finally:
        held.set()
        await asyncio.gather(*blockers)


async def test_a_first_seen_request_over_the_trigger_is_still_compacted(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    messages = history("over")
    exact = exact_tokens(messages)
    gw = await start_app(
        {
            "models": [{**gpt(local_upstream, exact // 2), "policy": "p"}],
            "policies": {"p": {"steps": [{"type": "fifo"}]}},
        }
    )
    answer = await post(gw, orjson.dumps({"model": "m", "messages": messages}))
    assert answer.status_code == 200
    assert "x-compactgate-tokens-counted" not in answer.headers  # counted before it went
    assert int(answer.headers["x-compactgate-tokens-before"]) == exact
    after = int(answer.headers["x-compactgate-tokens-after"])
    assert after < exact // 2 - 1000
    [sent] = local_upstream.chat_requests()
    assert exact_tokens(sent["json"]["messages"]) == after


async def test_the_plan_reports_exact_counts_of_a_first_seen_request(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app({"models": [gpt(local_upstream, 1_000_000)]})
    messages = history("plan")
    report = await plan(gw, messages)
    assert report["tokens_before"] == exact_tokens(messages) == report["tokens_after"]


# -- replicas --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


async def test_counts_made_on_one_replica_are_found_by_another_through_redis(
    start_app: AppStarter, local_upstream: LocalUpstream, redis_server: RedisServer
) -> None:
    config = {"store": redis_server.url, "models": [gpt(local_upstream, 1_000_000)]}
    one, two = await start_app(config), await start_app(config)
    messages = history("replicas")
    exact = exact_tokens(messages)
    first = await post(one, orjson.dumps({"model": "m", "messages": messages}))
    assert first.status_code == 200

    async def counted() -> bool:
        return metric(await scrape(one), "compactgate_tokens_before_total", model="m") == exact

    await eventually(counted)
    await asyncio.sleep(0.2)  # the counts are written to the store without waiting for it
    other = two.app.core.engine.counting
    assert (await plan(two, messages))["tokens_before"] == exact
    keyed = MessageCounter(load_tokenizer("tiktoken:o200k_base")).keys(messages)
    assert sum(key is not None for key in keyed) > 50
    # every message the second replica had to count, it found in the store instead
    assert other.shared == sum(key is not None for key in keyed)


async def test_a_request_forwarded_on_its_bound_is_compacted_after_a_context_error(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The window is misconfigured (the upstream's is smaller): the bound fitted the configured
    one, the upstream refuses, and the retry compacts against the window it stated."""
    gw = await start_app(
        {
            "models": [{**gpt(local_upstream, 1_000_000), "policy": "p"}],
            "policies": {"p": {"steps": [{"type": "fifo"}]}},
        }
    )
    local_upstream.configure({"context_limit": 12_000})
    messages = history("retry")
    answer = await post(gw, orjson.dumps({"model": "m", "messages": messages}))
    assert answer.status_code == 200
    assert answer.headers["x-compactgate-retries"] == "1"
    assert "x-compactgate-tokens-counted" not in answer.headers  # the retry was counted
    assert int(answer.headers["x-compactgate-tokens-before"]) == exact_tokens(messages)
    first, retried = local_upstream.chat_requests()
    assert len(retried["json"]["messages"]) < len(first["json"]["messages"])
