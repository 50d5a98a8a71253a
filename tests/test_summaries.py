"""The summary service (gateway/summaries/) in-process, with a stub summariser: keys, the two
cache tiers, single-flight, failures, bounded waits, shutdown, and the ahead-of-need prediction
checked against what the real crossing request asks for."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import orjson
import pytest

from gateway.config import SummariesConfig, parse_config
from gateway.devtools.parts import Parts, parts
from gateway.ops.metrics import Metrics
from gateway.routing import Route, Router
from gateway.store import MemoryStore, SafeStore
from gateway.summaries import Job, SummaryAsk, SummaryService
from gateway.summaries.cache import LocalAnswers, encode
from gateway.summaries.prediction import growth
from gateway.summaries.summarizer import SummarizerError
from gateway.wire import parse_chat_request
from policies import Conversation, Message
from policies.summaries import SummaryAnswer, SummaryRequest

HEADERS = ((b"authorization", b"Bearer sk-a"),)
WAIT = SummaryAsk(HEADERS, wait=True)
NO_WAIT = SummaryAsk(HEADERS, wait=False)


class Stub:
    """Stands in for gateway.summaries.Summarizer."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.delay = delay
        self.fail = fail
        self.calls: list[SummaryRequest] = []

    def fingerprint(self) -> str:
        return "stub"

    def model_of(self, request: SummaryRequest, route: Route) -> str:
        return request.model or route.name

    async def summarize(
        self,
        request: SummaryRequest,
        route: Route,
        headers: Sequence[tuple[bytes, bytes]],
        api: str = "chat",
    ) -> SummaryAnswer:
        self.calls.append(request)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise SummarizerError("stub failure")
        return SummaryAnswer.ready(f"summary #{len(self.calls)}")


def route() -> Route:
    config = parse_config({"models": [{"name": "m", "upstream": {"base_url": "http://x/v1"}}]})
    found = Router(config).resolve("m")
    assert found is not None
    return found


def service(
    stub: Stub, store: MemoryStore | None = None, metrics: Metrics | None = None, **config: Any
) -> SummaryService:
    options: dict[str, Any] = {"retry_failed_after_s": 0, **config}
    safe = SafeStore(
        store if store is not None else MemoryStore(), metrics or Metrics(), shared=False
    )
    return SummaryService(SummariesConfig(**options), safe, stub, metrics or Metrics())  # type: ignore[arg-type]


def request(text: str = "hello", **kwargs: Any) -> SummaryRequest:
    messages = ({"role": "user", "content": text}, {"role": "assistant", "content": "hi"})
    return SummaryRequest("compaction", messages, "Summarise.", 100, **kwargs)


def cache_count(metrics: Metrics, result: str) -> float:
    labels = {"result": result}
    return metrics.registry.get_sample_value("compactgate_summary_cache_total", labels) or 0.0


# -- keys and tiers --------------------------------------------------------------------------


def test_key_covers_tenant_model_and_request() -> None:
    svc, r = service(Stub()), route()
    base = svc.key(request(), r, "tenant-a")
    assert base == svc.key(request(), r, "tenant-a")
    assert base != svc.key(request(), r, "tenant-b")
    assert base != svc.key(request(model="cheap"), r, "tenant-a")
    assert base != svc.key(request("other"), r, "tenant-a")
    assert base.startswith("summary:")


def test_local_answers_are_bounded_and_keep_only_ready_ones() -> None:
    local = LocalAnswers(max_bytes=1500)
    for i in range(10):
        local.put(f"k{i}", SummaryAnswer.ready("x" * 100))
    assert local.bytes <= 1500
    assert local.get("k0") is None and local.get("k9") is not None
    local.put("failed", SummaryAnswer("failed"))
    assert local.get("failed") is None


def test_a_local_answer_read_lately_outlives_one_stored_later() -> None:
    local = LocalAnswers(max_bytes=1000)  # room for two of these answers
    local.put("k0", SummaryAnswer.ready("x" * 100))
    local.put("k1", SummaryAnswer.ready("y" * 100))
    assert local.get("k0") is not None
    local.put("k2", SummaryAnswer.ready("z" * 100))
    assert local.get("k1") is None
    assert local.get("k0") is not None and local.get("k2") is not None


# -- fetch -----------------------------------------------------------------------------------


async def test_computed_once_then_served_from_both_tiers() -> None:
    stub, store, metrics = Stub(), MemoryStore(), Metrics()
    svc = service(stub, store, metrics)
    r, wanted = route(), request()
    answers = await svc.fetch([wanted, wanted], r, "t", WAIT)
    assert answers[wanted.canonical()].text == "summary #1"
    assert len(stub.calls) == 1
    assert await store.get(svc.key(wanted, r, "t")) == encode(SummaryAnswer.ready("summary #1"))
    again = await svc.fetch([wanted], r, "t", WAIT)
    assert again[wanted.canonical()].text == "summary #1" and len(stub.calls) == 1
    fresh = service(Stub(), store)  # another replica: empty local tier, same store
    shared = await fresh.fetch([wanted], r, "t", WAIT)
    assert shared[wanted.canonical()].text == "summary #1"
    assert cache_count(metrics, "miss") == 1 and cache_count(metrics, "hit") == 1
    source = svc.source(r, "t")  # the chain's synchronous view of the local tier
    assert source.get(wanted).text == "summary #1"
    assert svc.source(r, "other-tenant").get(wanted).status == "missing"


async def test_not_waiting_answers_missing_while_it_is_made() -> None:
    stub = Stub(delay=0.2)
    svc, r, wanted = service(stub), route(), request()
    answers = await svc.fetch([wanted], r, "t", NO_WAIT)
    assert answers[wanted.canonical()].status == "missing"
    await asyncio.sleep(0.3)
    answers = await svc.fetch([wanted], r, "t", NO_WAIT)
    assert answers[wanted.canonical()].text == "summary #1" and len(stub.calls) == 1


async def test_racing_fetches_share_one_computation() -> None:
    stub = Stub(delay=0.1)
    svc, r, wanted = service(stub), route(), request()
    results = await asyncio.gather(*(svc.fetch([wanted], r, "t", WAIT) for _ in range(8)))
    assert {res[wanted.canonical()].text for res in results} == {"summary #1"}
    assert len(stub.calls) == 1


async def test_replicas_sharing_a_store_compute_once() -> None:
    store = MemoryStore()  # one store object stands for the shared Redis here
    first, second = Stub(delay=0.2), Stub(delay=0.2)
    one, two = service(first, store), service(second, store)
    r, wanted = route(), request()
    a, b = await asyncio.gather(
        one.fetch([wanted], r, "t", WAIT), two.fetch([wanted], r, "t", WAIT)
    )
    assert a[wanted.canonical()].text == b[wanted.canonical()].text
    assert len(first.calls) + len(second.calls) == 1


async def test_failure_is_answered_failed_and_never_cached() -> None:
    stub, store = Stub(fail=True), MemoryStore()
    svc, r, wanted = service(stub, store, retry_failed_after_s=60), route(), request()
    answers = await svc.fetch([wanted], r, "t", WAIT)
    assert answers[wanted.canonical()].status == "failed"
    assert len(store) == 0 and svc.local.get(svc.key(wanted, r, "t")) is None
    await svc.fetch([wanted], r, "t", WAIT)  # within retry_failed_after_s: not tried again
    assert len(stub.calls) == 1
    retrying = service(stub, store)  # retry_failed_after_s = 0
    await retrying.fetch([wanted], r, "t", WAIT)
    assert len(stub.calls) == 2


async def test_without_credentials_only_stored_summaries_are_used() -> None:
    stub = Stub()
    svc, r, wanted = service(stub), route(), request()
    answers = await svc.fetch([wanted], r, "t", SummaryAsk(None, wait=True))
    assert answers[wanted.canonical()].status == "failed" and not stub.calls


async def test_wait_is_bounded_and_the_summary_still_lands() -> None:
    stub = Stub(delay=0.3)
    svc, r, wanted = service(stub, wait_s=0.05), route(), request()
    answers = await svc.fetch([wanted], r, "t", WAIT)
    assert answers[wanted.canonical()].status == "failed"  # for this request only
    await asyncio.sleep(0.4)
    answers = await svc.fetch([wanted], r, "t", WAIT)
    assert answers[wanted.canonical()].text == "summary #1" and len(stub.calls) == 1


async def test_close_cancels_background_work() -> None:
    stub = Stub(delay=30)
    svc, r, wanted = service(stub), route(), request()
    task = svc.compute(svc.key(wanted, r, "t"), wanted, r, HEADERS)
    await asyncio.sleep(0.01)
    await asyncio.wait_for(svc.close(), 2)
    assert task.cancelled()
    answers = await svc.fetch([request("new")], r, "t", WAIT)
    assert answers[request("new").canonical()].status == "failed"  # closed: nothing new starts


# -- ahead of need ---------------------------------------------------------------------------


def test_growth_averages_the_last_requests() -> None:
    def message(role: str, tokens: int) -> Message:
        return Message(data={"role": role, "content": ""}, tokens=tokens)

    sizes = [("user", 50), ("assistant", 10), ("tool", 90), ("assistant", 10), ("tool", 290)]
    sizes += [("assistant", 10), ("tool", 590)]
    conversation = Conversation(tuple(message(role, tokens) for role, tokens in sizes))
    assert growth(conversation) == (100 + 300 + 600) // 3
    assert growth(Conversation((message("user", 70),))) == 70


AGENT_CONFIG = {
    "models": [
        {
            "name": "m",
            "upstream": {"base_url": "http://127.0.0.1:9/v1"},
            "context_window": 4096,
            "tokenizer": "chars:4",
            "policy": "p",
        }
    ],
    "policies": {"p": {"steps": [{"type": "compaction", "summary_tokens": 200}, {"type": "fifo"}]}},
}
TOOLS = [{"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}]


def agent_messages(rounds: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(8):
        messages.append({"role": "user", "content": f"Earlier question {turn}: " + "q" * 520})
        messages.append({"role": "assistant", "content": f"Earlier answer {turn}: " + "a" * 520})
    messages.append({"role": "user", "content": "Read the files."})
    for i in range(rounds):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": "x" * 560})
    return messages


def stubbed(
    config: dict[str, Any] = AGENT_CONFIG, stub: Stub | None = None
) -> tuple[Parts, Stub, Route]:
    """A gateway whose summaries come from `stub` (no upstream is called), and its route `m`."""
    gateway = parts(parse_config(config))
    stub = stub or Stub()
    gateway.summaries.summarizer = stub  # type: ignore[assignment]
    r = gateway.router.resolve("m")
    assert r is not None
    return gateway, stub, r


async def test_precompute_predicts_the_summary_the_crossing_request_asks_for() -> None:
    gateway, stub, r = stubbed()
    predicted: list[SummaryRequest] = []
    crossed = None
    for rounds in range(1, 30):
        body = orjson.dumps({"model": "m", "messages": agent_messages(rounds), "tools": TOOLS,
                             "max_tokens": 256})  # fmt: skip
        chat = parse_chat_request(body, 1000)
        prepared = await gateway.engine.prepare(chat, r, "t", window=4096, headers=HEADERS)
        if prepared.changed_steps:
            crossed = rounds
            break
        job = Job(chat, r, "t", HEADERS, 4096, prepared.chain)
        predicted += await gateway.precompute.precompute(job)
    assert crossed is not None and prepared.changed_steps == ["compaction"]
    assert len(predicted) == 1 and len(stub.calls) == 1  # computed ahead, used at the crossing
    await gateway.summaries.close()


@pytest.mark.slow
async def test_a_precomputation_leaves_a_summary_being_made_to_the_one_making_it() -> None:
    """The next response's precomputation, finding its predicted summary being made, returns at
    once: it neither holds a slot for the summary's duration nor asks for it again."""
    gateway, stub, r = stubbed(stub=Stub(delay=2.0))
    making: asyncio.Task[list[SummaryRequest]] | None = None
    again: list[SummaryRequest] | None = None
    for rounds in range(1, 30):
        body = orjson.dumps({"model": "m", "messages": agent_messages(rounds), "tools": TOOLS,
                             "max_tokens": 256})  # fmt: skip
        chat = parse_chat_request(body, 1000)
        prepared = await gateway.engine.prepare(chat, r, "t", window=4096, headers=HEADERS)
        assert not prepared.changed_steps  # a summary was predicted before the crossing
        job = Job(chat, r, "t", HEADERS, 4096, prepared.chain)
        if making is not None:
            again = await gateway.precompute.precompute(job)
            break
        task = asyncio.create_task(gateway.precompute.precompute(job))
        while not task.done() and not stub.calls:
            await asyncio.sleep(0.01)
        if stub.calls:
            making = task
    assert making is not None and again == []
    assert not making.done()  # the second returned while the first was still making it
    assert len(await making) == 1 and len(stub.calls) == 1
    await gateway.summaries.close()


async def test_no_precompute_far_from_the_trigger() -> None:
    gateway, stub, r = stubbed()
    body = orjson.dumps({"model": "m", "messages": agent_messages(0)[:5], "tools": TOOLS})
    chat = parse_chat_request(body, 1000)
    prepared = await gateway.engine.prepare(chat, r, "t", window=4096, headers=HEADERS)
    assert (
        await gateway.precompute.precompute(Job(chat, r, "t", HEADERS, 4096, prepared.chain)) == []
    )
    gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, prepared)
    gateway.precompute.request_prepared("t", r)  # the next request: the precomputation runs
    await asyncio.gather(*gateway.summaries._tasks)
    assert not stub.calls
    await gateway.summaries.close()


@pytest.mark.parametrize("mode", ["observe"])
async def test_shadow_mode_never_precomputes(mode: str) -> None:
    config = {**AGENT_CONFIG, "mode": mode}
    gateway, stub, r = stubbed(config)
    assert r.mode == "observe"
    chat = parse_chat_request(orjson.dumps({"model": "m", "messages": agent_messages(6)}), 1000)
    gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, None)
    gateway.precompute.request_prepared("t", r)
    await asyncio.gather(*gateway.summaries._tasks)
    assert not stub.calls
    await gateway.summaries.close()


def chat_messages(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: " + "q" * 400})
        messages.append({"role": "assistant", "content": f"Answer {turn}: " + "a" * 400})
    messages.append({"role": "user", "content": "Go on."})
    return messages


async def test_summarize_old_is_precomputed_while_fifo_trims_after_it() -> None:
    """`summarize_old`'s range moves with the Turn count even when `fifo` brought the request
    under the precompute point: the summary each request needs is made after the one before."""
    steps = [{"type": "summarize_old", "summary_length": 100}, {"type": "fifo"}]
    # fifo trims to half the limit, under the precompute point (0.6)
    config = {**AGENT_CONFIG, "policies": {"p": {"steps": steps, "target_ratio": 0.5}}}
    gateway, stub, r = stubbed(config)
    made_in_request = 0
    trimmed = 0
    for turns in range(14, 60):
        body = orjson.dumps({"model": "m", "messages": chat_messages(turns), "max_tokens": 256})
        chat = parse_chat_request(body, 1000)
        before = len(stub.calls)
        prepared = await gateway.engine.prepare(chat, r, "t", window=4096, headers=HEADERS)
        assert prepared.chain is not None
        if prepared.changed_steps:
            made_in_request += len(stub.calls) - before
            trimmed += "fifo" in prepared.changed_steps
        # As the app does: the last response's precomputation runs while this request is at the
        # upstream, after it was prepared (so it cannot have helped this request).
        gateway.precompute.request_prepared("t", r)
        await asyncio.gather(*gateway.summaries._tasks)
        gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, prepared)
    assert trimmed >= 10  # fifo trimmed after the summary on most requests
    assert made_in_request <= 1  # only the very first summary, before anything was predicted
    await gateway.summaries.close()


async def past_the_precompute_point(gateway: Parts, r: Route) -> tuple[Any, Any]:
    """The first request of the agent session whose precomputation makes a summary."""
    for rounds in range(1, 30):
        body = orjson.dumps({"model": "m", "messages": agent_messages(rounds), "tools": TOOLS,
                             "max_tokens": 256})  # fmt: skip
        chat = parse_chat_request(body, 1000)
        prepared = await gateway.engine.prepare(chat, r, "t", window=4096, headers=HEADERS)
        dry = parts(parse_config(AGENT_CONFIG))  # asks a stub that records, on its own
        dry.summaries.summarizer = Stub()  # type: ignore[assignment]
        dry_route = dry.router.resolve("m")
        assert dry_route is not None
        if await dry.precompute.precompute(Job(chat, dry_route, "t", HEADERS, 4096)):
            await dry.summaries.close()
            return chat, prepared
        await dry.summaries.close()
    raise AssertionError("the session never reached the precompute point")


async def test_a_precomputation_waits_for_the_tenants_next_request() -> None:
    """Its chain runs hold the GIL for milliseconds: started as the response ends they would
    slow the agent's next call. It starts once that call is prepared (and at the upstream)."""
    config = {**AGENT_CONFIG, "summaries": {"precompute_defer_s": 30}}
    gateway, stub, r = stubbed(config)
    chat, prepared = await past_the_precompute_point(gateway, r)
    gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, prepared)
    await asyncio.sleep(0.2)
    assert not stub.calls  # nothing runs while the client is away
    gateway.precompute.request_prepared("another tenant", r)
    await asyncio.sleep(0.2)
    assert not stub.calls  # another tenant's request is not this one's next
    gateway.precompute.request_prepared("t", r)
    await asyncio.wait_for(asyncio.gather(*gateway.summaries._tasks), 10)
    assert len(stub.calls) == 1
    assert not gateway.precompute._deferred  # nothing left listening
    await gateway.summaries.close()


async def test_without_a_next_request_a_precomputation_starts_after_precompute_defer_s() -> None:
    config = {**AGENT_CONFIG, "summaries": {"precompute_defer_s": 0.3}}
    gateway, stub, r = stubbed(config)
    chat, prepared = await past_the_precompute_point(gateway, r)
    loop = asyncio.get_running_loop()
    started = loop.time()
    gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, prepared)
    await asyncio.sleep(0.1)
    assert not stub.calls
    await asyncio.wait_for(asyncio.gather(*gateway.summaries._tasks), 10)
    assert len(stub.calls) == 1 and loop.time() - started >= 0.3
    assert not gateway.precompute._deferred  # the timed-out waiter was removed
    await gateway.summaries.close()


async def test_shutdown_cancels_a_deferred_precomputation() -> None:
    config = {**AGENT_CONFIG, "summaries": {"precompute_defer_s": 30}}
    gateway, stub, r = stubbed(config)
    chat, prepared = await past_the_precompute_point(gateway, r)
    gateway.precompute.after_response(chat, r, "t", HEADERS, 4096, prepared)
    await asyncio.sleep(0.05)
    await asyncio.wait_for(gateway.summaries.close(), 5)
    assert not stub.calls and not gateway.precompute._deferred
    assert gateway.precompute._queued == 0
