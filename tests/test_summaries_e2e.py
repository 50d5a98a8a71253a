"""Summaries through the gateway (design D7): the fake upstream, real gateway processes, real Redis.

A summarisation call is told apart from the client's own calls by what only the summariser
sends: its system prompt, no tools. Windows are small (4 096 tokens, `chars:4`) so that a few
dozen messages cross the thresholds.

What one gateway does with one conversation runs in-process (tests/in_process.py); replicas
sharing Redis, shutdown, and the precomputation's timing against an agent's pace run against
real `compactgate serve` processes.
"""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from gateway.summaries.transcript import APPEND_NOTE, SYSTEM_PROMPT
from tests.conftest import GatewayProcess, GatewayStarter, Starter, fake_upstream_process
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppGateway, AppStarter, LocalUpstream
from tests.redis_server import RedisServer, start_redis

Upstream = FakeUpstream | LocalUpstream

WINDOW = 4096
TRIGGER = int((WINDOW - 256) * 0.8)  # about where compaction's threshold is (max_tokens 256)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
]


# -- helpers ---------------------------------------------------------------------------------


def model(fake: Upstream, name: str = "m", policy: str = "summ") -> dict[str, Any]:
    return {
        "name": name,
        "upstream": {"base_url": fake.base_url},
        "context_window": WINDOW,
        "tokenizer": "chars:4",
        "policy": policy,
        "retry": {"max_attempts": 1},
    }


def config_for(
    fake: Upstream,
    steps: list[dict[str, Any]] | None = None,
    store: str = "memory://",
    models: list[dict[str, Any]] | None = None,
    **summaries: Any,
) -> dict[str, Any]:
    return {
        "store": store,
        "models": models or [model(fake)],
        "policies": {
            "summ": {
                "steps": steps or [{"type": "compaction", "summary_tokens": 200}, {"type": "fifo"}]
            }
        },
        # No precomputation unless a test asks for it: the others count summariser calls.
        "summaries": {"retry_failed_after_s": 0, "wait_s": 30, "precompute": False, **summaries},
    }


def chat_history(turns: int, size: int = 560, tag: str = "") -> list[dict[str, Any]]:
    """A plain chat: about (size / 2) tokens per turn with chars:4; `tag` makes it unique."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful assistant."}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}{tag}: " + "q" * size})
        messages.append({"role": "assistant", "content": f"Answer {i}: " + "a" * size})
    messages.append({"role": "user", "content": "And now?"})
    return messages


def chat_body(messages: list[dict[str, Any]], tools: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": messages, "max_tokens": 256}
    if tools:
        body["tools"] = TOOLS
    return body


def post(
    gateway: GatewayProcess,
    messages: list[dict[str, Any]],
    key: str = "sk-tenant-a",
    tools: bool = False,
    timeout: float = 30,
) -> tuple[httpx.Response, float]:
    started = time.perf_counter()
    response = httpx.post(
        f"{gateway.base_url}/chat/completions",
        json=chat_body(messages, tools),
        headers={"authorization": f"Bearer {key}"},
        timeout=timeout,
    )
    return response, time.perf_counter() - started


async def app_post(
    gateway: AppGateway,
    messages: list[dict[str, Any]],
    key: str = "sk-tenant-a",
    tools: bool = False,
) -> tuple[httpx.Response, float]:
    """post, to a gateway app in this event loop."""
    started = time.perf_counter()
    response = await gateway.http.post(
        f"{gateway.base_url}/chat/completions",
        json=chat_body(messages, tools),
        headers={"authorization": f"Bearer {key}"},
    )
    return response, time.perf_counter() - started


def body_of(record: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(base64.b64decode(record["body_b64"]))


def is_summary_call(record: dict[str, Any]) -> bool:
    messages = body_of(record).get("messages") or [{}]
    return messages[0].get("content") == SYSTEM_PROMPT


def summary_calls(fake: Upstream) -> list[dict[str, Any]]:
    return [r for r in fake.chat_requests() if is_summary_call(r)]


def client_calls(fake: Upstream) -> list[dict[str, Any]]:
    return [r for r in fake.chat_requests() if not is_summary_call(r)]


def forwarded_text(record: dict[str, Any]) -> str:
    return orjson.dumps(body_of(record)["messages"]).decode()


def authorization(record: dict[str, Any]) -> str:
    return {k.lower(): v for k, v in record["headers"]}.get("authorization", "")


def metric_in(text: str, name: str, labels: str = "") -> float:
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}}" if labels else f"{name} "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def metric(gateway: GatewayProcess, name: str, labels: str = "") -> float:
    return metric_in(httpx.get(f"{gateway.url}/metrics", timeout=10).text, name, labels)


async def app_metric(gateway: AppGateway, name: str, labels: str = "") -> float:
    return metric_in((await gateway.http.get(f"{gateway.url}/metrics")).text, name, labels)


def wait_until(condition: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)


async def eventually(condition: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """wait_until, letting the app in this event loop run meanwhile."""
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def summary_script(text: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "ok", "content": f"<summary>{text}</summary>", **extra}


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


# -- the three summarising steps through the gateway -----------------------------------------


@pytest.mark.parametrize(
    ("step", "placement_role"),
    [
        ({"type": "compaction", "summary_tokens": 200}, "user"),
        ({"type": "sandwich", "summary_tokens": 200}, "system"),
        ({"type": "summarize_old", "summary_length": 200}, "system"),
    ],
)
async def test_each_summarising_step_works_through_the_gateway(
    start_app: AppStarter,
    local_upstream: LocalUpstream,
    step: dict[str, Any],
    placement_role: str,
) -> None:
    gateway = await start_app(config_for(local_upstream, [step, {"type": "fifo"}]))
    local_upstream.script([summary_script(f"SUMMARY-OF-{step['type']}")])
    history = chat_history(16)
    response, _ = await app_post(gateway, history)  # over the limit: the summary is needed now
    assert response.status_code == 200
    assert response.headers["x-compactgate-steps"].split(",")[0] == step["type"]
    [sent] = client_calls(local_upstream)
    placed = [m for m in body_of(sent)["messages"] if f"SUMMARY-OF-{step['type']}" in str(m)]
    assert placed and placed[0]["role"] == placement_role
    # A history seen for the first time is summarised one compaction event after the other
    # (each link extends the one before); the request went on as soon as what was ready fit,
    # and the next link is made in the background. At most one call per link.
    body = {"model": "m", "messages": history, "max_tokens": 256}
    auth = {"authorization": "Bearer sk-tenant-a"}
    url = f"{gateway.base_url}/compactgate/plan"
    plan = (await gateway.http.post(url, json=body, headers=auth)).json()
    links = plan["steps"][0]["summary_links"]
    ok = 'outcome="ok"'

    async def every_call_made() -> bool:
        made = await app_metric(gateway, "compactgate_summarizer_calls_total", ok)
        return made == len(summary_calls(local_upstream))

    await eventually(every_call_made)
    calls = summary_calls(local_upstream)
    assert 1 <= len(calls) <= links
    assert all("tools" not in body_of(c) for c in calls)
    assert all(authorization(c) == "Bearer sk-tenant-a" for c in calls)
    assert await app_metric(gateway, "compactgate_summary_cache_total", 'result="miss"') >= 1


# -- shared between replicas -----------------------------------------------------------------


@pytest.mark.slow
def test_second_replica_serves_the_first_ones_summary(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, redis_server: RedisServer
) -> None:
    config = config_for(fake_upstream, store=redis_server.url)
    first, second = start_gateway(config), start_gateway(config)
    fake_upstream.script([summary_script("SHARED-SUMMARY")])
    messages = chat_history(16, tag="shared")
    response, _ = post(first, messages)
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    assert len(summary_calls(fake_upstream)) == 1

    response, _ = post(second, messages)
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    assert len(summary_calls(fake_upstream)) == 1  # no second summarisation
    sent = client_calls(fake_upstream)[-1]
    assert "SHARED-SUMMARY" in forwarded_text(sent)
    assert metric(second, "compactgate_summary_cache_total", 'result="hit"') >= 1
    assert metric(second, "compactgate_summarizer_calls_total", 'outcome="ok"') == 0


@pytest.mark.slow
def test_replicas_racing_on_one_conversation_summarise_once(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, redis_server: RedisServer
) -> None:
    config = config_for(fake_upstream, store=redis_server.url)
    gateways = [start_gateway(config), start_gateway(config)]
    fake_upstream.script([summary_script("RACED", kind="hang_before_headers", seconds=1)])
    messages = chat_history(16, tag="race")
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda i: post(gateways[i % 2], messages)[0], range(6)))
    assert [r.status_code for r in results] == [200] * 6
    assert all(r.headers["x-compactgate-steps"].startswith("compaction") for r in results)
    assert len(summary_calls(fake_upstream)) == 1
    assert all("RACED" in forwarded_text(r) for r in client_calls(fake_upstream))


# -- racing requests in one process ----------------------------------------------------------


@pytest.mark.slow
async def test_racing_identical_requests_cause_one_summarisation(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script("ONCE", kind="hang_before_headers", seconds=1)])
    messages = chat_history(16)
    results = [r for r, _ in await asyncio.gather(*(app_post(gateway, messages) for _ in range(5)))]
    assert all(r.status_code == 200 for r in results)
    assert all(r.headers["x-compactgate-steps"].startswith("compaction") for r in results)
    assert len(summary_calls(local_upstream)) == 1
    assert len(client_calls(local_upstream)) == 5
    assert await app_metric(gateway, "compactgate_summarizer_calls_total", 'outcome="ok"') == 1


# -- ahead of need ---------------------------------------------------------------------------


def agent_session(prior_turns: int = 8) -> list[dict[str, Any]]:
    """Earlier plain turns, then the current Turn, which grows by tool rounds."""
    messages = chat_history(prior_turns, size=520)[:-1]
    messages.append({"role": "user", "content": "Now read the files and fix the bug."})
    return messages


def tool_round(messages: list[dict[str, Any]], index: int) -> None:
    call_id = f"call_{index}"
    arguments = orjson.dumps({"path": f"f{index}.py"}).decode()
    function = {"name": "read_file", "arguments": arguments}
    call = {"id": call_id, "type": "function", "function": function}
    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    output = f"# f{index}\n" + "x" * 560
    messages.append({"role": "tool", "tool_call_id": call_id, "content": output})


@pytest.fixture
def summary_upstream(start_process: Starter) -> Iterator[FakeUpstream]:
    """A second fake upstream, for the summary model only (the step's `model:`)."""
    yield from fake_upstream_process(start_process)


def precompute_config(main: FakeUpstream, summarizer: FakeUpstream) -> dict[str, Any]:
    steps = [{"type": "compaction", "summary_tokens": 200, "model": "summarizer"}, {"type": "fifo"}]
    models = [model(main), {**model(summarizer, name="summarizer", policy="default")}]
    return config_for(main, steps, models=models, precompute=True)


@pytest.mark.slow
def test_precomputed_summary_is_ready_when_the_trigger_is_crossed(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, summary_upstream: FakeUpstream
) -> None:
    gateway = start_gateway(precompute_config(fake_upstream, summary_upstream))
    summary_upstream.script([summary_script("PRECOMPUTED", kind="hang_before_headers", seconds=2)])
    messages = agent_session()
    slowest = 0.0
    compacted_at = None
    for index in range(40):
        tool_round(messages, index)
        response, elapsed = post(gateway, messages, tools=True)
        assert response.status_code == 200
        slowest = max(slowest, elapsed)
        if response.headers["x-compactgate-steps"] != "none":
            compacted_at = index
            break
        if summary_upstream.chat_requests():
            # The precomputation is running (2 s); let it finish before the next tool round,
            # as a slow tool would.
            wait_until(lambda: summary_upstream.inflight()["completed"] == 1, 10)
    assert compacted_at is not None, "the conversation never crossed the trigger"
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    assert elapsed < 1.0, "the crossing request waited for its summary"
    assert slowest < 1.0
    assert len(summary_upstream.chat_requests()) == 1  # computed once, ahead of need
    assert "PRECOMPUTED" in forwarded_text(fake_upstream.chat_requests()[-1])
    assert metric(gateway, "compactgate_summary_cache_total", 'result="hit"') >= 1


@pytest.mark.slow
def test_a_precomputation_runs_while_the_next_request_is_at_the_upstream(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, summary_upstream: FakeUpstream
) -> None:
    """Summaries ahead of need without slowing the agent down: a precomputation's chain runs take milliseconds of
    CPU, so the gateway starts it once the agent's next call has been prepared and is at the
    upstream, never in the moment between a response and that call (`precompute_defer_s`)."""
    config = precompute_config(fake_upstream, summary_upstream)
    config["summaries"]["precompute_defer_s"] = 30  # only the next request starts it
    gateway = start_gateway(config)
    fake_upstream.script([{"kind": "hang_before_headers", "seconds": 0.3}] * 60)  # a model's time
    messages = agent_session()
    for index in range(40):
        tool_round(messages, index)
        before = len(summary_upstream.chat_requests())
        response, _ = post(gateway, messages, tools=True)
        assert response.status_code == 200
        during = len(summary_upstream.chat_requests())
        time.sleep(0.3)  # the agent's tool runs: nothing may start meanwhile
        assert len(summary_upstream.chat_requests()) == during, "started between two requests"
        if during > before:
            break
    else:
        raise AssertionError("no summary was made")
    # Made ahead of need, by the precomputation that the request in flight let start: that
    # request was under the trigger, so it did not ask for the summary itself.
    assert response.headers["x-compactgate-steps"] == "none"
    assert int(response.headers["x-compactgate-tokens-before"]) < TRIGGER
    assert index > 0 and len(summary_upstream.chat_requests()) == 1


@pytest.mark.slow
def test_a_request_that_fits_never_waits_for_a_summary_being_made(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, summary_upstream: FakeUpstream
) -> None:
    gateway = start_gateway(precompute_config(fake_upstream, summary_upstream))
    summary_upstream.script([summary_script("SLOW", kind="hang_before_headers", seconds=3)])
    messages = agent_session()
    index = 0
    while not summary_upstream.chat_requests():  # rounds until a precomputation starts
        tool_round(messages, index)
        response, elapsed = post(gateway, messages, tools=True)
        assert response.headers["x-compactgate-steps"] == "none" and elapsed < 1.0
        index += 1
        assert index < 40, "no precomputation started"
    # Three more rounds while it runs (3 s): the ones past the trigger are sent as they are.
    crossed = False
    for _ in range(3):
        tool_round(messages, index)
        index += 1
        response, elapsed = post(gateway, messages, tools=True)
        assert response.status_code == 200 and elapsed < 1.0
        assert response.headers["x-compactgate-steps"] == "none"
        crossed = crossed or int(response.headers["x-compactgate-tokens-before"]) > TRIGGER
    assert crossed and summary_upstream.inflight()["completed"] == 0
    wait_until(lambda: metric(gateway, "compactgate_summarizer_calls_total", 'outcome="ok"') == 1)
    tool_round(messages, index)
    response, elapsed = post(gateway, messages, tools=True)
    assert response.headers["x-compactgate-steps"].startswith("compaction") and elapsed < 1.0
    assert len(summary_upstream.chat_requests()) == 1


@pytest.mark.slow
def test_an_outgrown_summary_is_used_at_once_while_its_next_link_is_made(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, summary_upstream: FakeUpstream
) -> None:
    """Ahead of need: when the conversation outgrows its summary and the next link is still being made,
    requests go out at once with the summary there is and the newer messages verbatim: not
    held back for the new link, and not trimmed by the fallback step."""
    steps = [{"type": "sandwich", "summary_tokens": 200, "model": "summarizer"}, {"type": "fifo"}]
    models = [model(fake_upstream), model(summary_upstream, name="summarizer", policy="default")]
    gateway = start_gateway(config_for(fake_upstream, steps, models=models, precompute=True))
    summary_upstream.script(
        [summary_script("FIRST"), summary_script("SECOND", kind="hang_before_headers", seconds=5)]
    )
    messages = agent_session()
    for index in range(40):
        tool_round(messages, index)
        response, elapsed = post(gateway, messages, tools=True)
        assert response.status_code == 200 and elapsed < 1.0
        request_id = response.headers["x-compactgate-request-id"]
        feed = httpx.get(f"{gateway.base_url}/compactgate/events", timeout=10).json()["events"]
        event = next((e for e in feed if e["request_id"] == request_id), {"steps": []})
        report = next((s for s in event["steps"] if s["type"] == "sandwich"), {})
        if str(report.get("summary", "")).startswith("partial"):
            break
        if len(summary_upstream.chat_requests()) == 1:  # the first one: let it land
            wait_until(lambda: summary_upstream.inflight()["completed"] == 1)
    else:
        raise AssertionError("the conversation never outgrew its first summary")
    assert summary_upstream.inflight()["inflight"] == 1  # the second link is still being made
    sent = client_calls(fake_upstream)[-1]
    forwarded = forwarded_text(sent)
    assert "FIRST" in forwarded and "SECOND" not in forwarded
    assert response.headers["x-compactgate-steps"] == "sandwich"  # fifo dropped nothing
    assert body_of(sent)["messages"][-6:] == messages[-6:]  # the newest messages verbatim


@pytest.mark.slow
def test_shutdown_cancels_a_precomputation_in_flight(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, summary_upstream: FakeUpstream
) -> None:
    gateway = start_gateway(precompute_config(fake_upstream, summary_upstream))
    summary_upstream.script([{"kind": "hang_before_headers", "seconds": 60}])
    messages = agent_session()
    for index in range(40):
        tool_round(messages, index)
        post(gateway, messages, tools=True)
        if summary_upstream.chat_requests():
            break
    wait_until(lambda: summary_upstream.inflight()["inflight"] == 1)
    started = time.monotonic()
    assert gateway.process.stop(timeout=10) == 0
    assert time.monotonic() - started < 5
    wait_until(lambda: summary_upstream.inflight()["cancelled"] == 1)


# -- failures --------------------------------------------------------------------------------


async def test_summariser_failure_falls_back_to_the_next_step_and_is_not_cached(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([{"kind": "error", "status": 400, "body": {"error": {"message": "no"}}}])
    messages = chat_history(16)
    response, _ = await app_post(gateway, messages)
    assert response.status_code == 200
    assert response.headers["x-compactgate-steps"] == "fifo"  # failed: the next step
    assert await app_metric(gateway, "compactgate_summarizer_calls_total", 'outcome="error"') == 1

    local_upstream.reset()
    local_upstream.script([summary_script("SECOND-TRY")])
    response, _ = await app_post(gateway, messages)
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    assert len(summary_calls(local_upstream)) == 1  # the failure was not cached
    assert "SECOND-TRY" in forwarded_text(client_calls(local_upstream)[0])


@pytest.mark.slow
def test_slow_summary_is_waited_for_at_most_wait_s_and_then_used(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    gateway = start_gateway(config_for(fake_upstream, wait_s=0.5))
    fake_upstream.script([summary_script("LATE", kind="hang_before_headers", seconds=2)])
    messages = chat_history(16)
    response, elapsed = post(gateway, messages)
    assert response.headers["x-compactgate-steps"] == "fifo"
    assert 0.4 < elapsed < 1.5
    wait_until(lambda: metric(gateway, "compactgate_summarizer_calls_total", 'outcome="ok"') == 1)
    response, elapsed = post(gateway, messages)
    assert response.headers["x-compactgate-steps"].startswith("compaction") and elapsed < 1.0
    assert len(summary_calls(fake_upstream)) == 1
    assert "LATE" in forwarded_text(client_calls(fake_upstream)[-1])


def test_redis_outage_degrades_to_no_cache(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, start_process: Starter
) -> None:
    server = start_redis(start_process)
    gateway = start_gateway(config_for(fake_upstream, store=server.url))
    server.stop()
    response, _ = post(gateway, chat_history(16, tag="outage"))
    assert response.status_code == 200
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    assert metric(gateway, "compactgate_store_errors_total", 'op="get"') >= 1
    assert "store unavailable" in gateway.output()


# -- tenants ---------------------------------------------------------------------------------


async def test_one_tenants_summary_is_never_used_for_another(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    messages = chat_history(16)
    local_upstream.script([summary_script("ALPHA")])
    await app_post(gateway, messages, key="sk-tenant-a")
    local_upstream.script([summary_script("BRAVO")])
    response, _ = await app_post(gateway, messages, key="sk-tenant-b")
    assert response.headers["x-compactgate-steps"].startswith("compaction")
    calls = summary_calls(local_upstream)
    assert [authorization(c) for c in calls] == ["Bearer sk-tenant-a", "Bearer sk-tenant-b"]
    sent_b = client_calls(local_upstream)[-1]
    assert "BRAVO" in forwarded_text(sent_b) and "ALPHA" not in forwarded_text(sent_b)

    await app_post(gateway, messages, key="sk-tenant-a")
    assert len(summary_calls(local_upstream)) == 2  # A's own summary, from the cache
    sent_a = client_calls(local_upstream)[-1]
    assert "ALPHA" in forwarded_text(sent_a) and "BRAVO" not in forwarded_text(sent_a)


# -- append_summaries ------------------------------------------------------------------------


async def test_appended_summaries_keep_the_forwarded_prefix(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """With `append_summaries`, the second event's summary is asked for the new
    messages only and appended, so the forwarded summary begins with the first event's text."""
    steps = [
        {
            "type": "sandwich",
            "summary_tokens": 200,
            "model": "summarizer",
            "append_summaries": True,
        },
        {"type": "fifo"},
    ]
    async with LocalUpstream.serve() as summary_upstream:
        models = [
            model(local_upstream),
            model(summary_upstream, name="summarizer", policy="default"),
        ]
        gateway = await start_app(config_for(local_upstream, steps, models=models))
        summary_upstream.script([summary_script("FIRST-PART"), summary_script("SECOND-PART")])
        summaries: list[str] = []
        for turns in range(2, 40):
            response, _ = await app_post(gateway, chat_history(turns, size=200))
            assert response.status_code == 200
            placed = [
                str(m["content"])
                for m in body_of(client_calls(local_upstream)[-1])["messages"]
                if "FIRST-PART" in str(m.get("content"))
            ]
            if placed and placed[0] not in summaries:
                summaries.append(placed[0])
            if len(summaries) == 2:
                break
            if len(summary_upstream.chat_requests()) == 2:  # an outgrown summary is used meanwhile

                async def second_done() -> bool:
                    return summary_upstream.inflight()["completed"] == 2

                await eventually(second_done)
        later_requests = summary_upstream.chat_requests()
    assert len(summaries) == 2, summaries
    first, second = summaries
    assert first == "[Earlier conversation summary: FIRST-PART]"
    assert second == "[Earlier conversation summary: FIRST-PART\n\nSECOND-PART]"
    assert second.startswith(first[:-1])  # the frozen text, up to the template's closing bracket
    _, later = later_requests
    prompt = str(body_of(later)["messages"][-1]["content"])
    assert APPEND_NOTE in prompt and "<previous_summary>\nFIRST-PART\n</previous_summary>" in prompt
    assert "Question 0:" not in prompt  # the first event's messages are not sent again
