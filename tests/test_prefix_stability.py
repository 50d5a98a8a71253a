"""Between compaction events a conversation's forwarded requests only append (the provider's
prompt cache keeps hitting), and an event ends at or under the target.

In process: the engine (`gateway.devtools.parts`) decides what each request of a long agent
session (tests/agent_session.py) forwards (`benchmarks.bench_cache` prints the same measure for
more windows and chains); one test sends a session through the app to the fake upstream and
checks what the upstream received.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.agent_session import CONVERSATION, WIRES, body, parts_at, pieces, session
from tests.configs import one_model
from tests.in_process import AppStarter, LocalUpstream

TOOL_CACHE_FIFO = [{"type": "tool_output_cache"}, {"type": "fifo"}]


async def forwarded(gw: Any, api: str, steps: list[dict[str, Any]]) -> tuple[Any, dict[str, Any]]:
    route = gw.router.resolve("m")
    request = WIRES[api].parse(orjson.dumps(body(api, steps)), 1 << 30)
    prepared = await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))
    return prepared, orjson.loads(prepared.body)


def pairs_broken(api: str, sent: dict[str, Any]) -> list[str]:
    """Tool results whose call is not before them (what every provider refuses)."""
    broken = []
    if api == "chat":
        calls: set[str] = set()
        for message in sent["messages"]:
            calls.update(c["id"] for c in message.get("tool_calls") or [])
            if message["role"] == "tool" and message["tool_call_id"] not in calls:
                broken.append(message["tool_call_id"])
    elif api == "responses":
        calls = set()
        for item in sent["input"]:
            if item.get("type") == "function_call":
                calls.add(item["call_id"])
            if item.get("type") == "function_call_output" and item["call_id"] not in calls:
                broken.append(item["call_id"])
    else:
        previous: set[str] = set()
        for turn in sent["messages"]:
            blocks = turn["content"] if isinstance(turn["content"], list) else []
            for block in blocks:
                if block.get("type") == "tool_result" and block["tool_use_id"] not in previous:
                    broken.append(block["tool_use_id"])
            previous = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    return broken


async def events_in(api: str, window: int, hold: float, requests: int) -> tuple[int, int]:
    """(extended, events) over a session of `requests` requests, each request checked: it fits,
    its tool pairs are whole, and a request that does not extend the previous forwarded one byte
    for byte only comes when the held result plus what the client appended passed the hold."""
    gw = parts_at(window, TOOL_CACHE_FIFO, hold=hold)
    steps = session(requests)
    previous: list[bytes] | None = None
    held_tokens = before = 0
    extended = events = 0
    for end in range(1, len(steps) + 1):
        prepared, sent = await forwarded(gw, api, steps[:end])
        forwarded_pieces = pieces(api, sent[CONVERSATION[api]])
        budget = prepared.budget
        tools = prepared.tokens_by_region["tools"]
        assert prepared.tokens_after <= budget.limit + tools + 10
        assert prepared.tokens_after - tools <= budget.hold + 10
        assert pairs_broken(api, sent) == []
        if previous is not None:
            if forwarded_pieces[: len(previous)] == previous:
                extended += 1
            else:
                events += 1
                # An event is due: appending would have passed the trigger (nothing held yet)
                # or, after the first event, the hold; it ends at or under the target.
                assert prepared.chain is not None and prepared.chain.triggered
                assert prepared.chain.tokens_after <= budget.target
                due = budget.hold if events > 1 else budget.trigger
                assert held_tokens + (prepared.tokens_before - before) > due
        previous = forwarded_pieces
        before = prepared.tokens_before
        held_tokens = prepared.tokens_after - tools
    return extended, events


@pytest.mark.parametrize("api", sorted(WIRES))
async def test_an_agent_session_appends_between_events(api: str) -> None:
    """Over 120 requests of 3 000-character tool outputs in a 32k window, nine in ten requests
    extend the previous forwarded one byte for byte, and every request fits."""
    extended, events = await events_in(api, 32_768, 0.95, 120)
    assert events >= 3  # the session did outgrow the window, more than once
    assert extended / 119 >= 0.9, (extended, events)


@pytest.mark.parametrize("api", sorted(WIRES))
async def test_holding_past_the_trigger_spares_cache_misses(api: str) -> None:
    """An event's result held until the messages nearly fill the budget (`hold_ratio` 0.95)
    rather than only to the trigger (0.8): the same session in a 16k window meets fewer events,
    and none of its requests passes the hold or the window."""
    at_trigger = await events_in(api, 16_384, 0.8, 80)
    held = await events_in(api, 16_384, 0.95, 80)
    assert held[1] < at_trigger[1], (held, at_trigger)
    assert held[0] > at_trigger[0]


@settings(max_examples=12, deadline=None)
@given(
    hold=st.floats(min_value=0.8, max_value=1.0),
    window=st.integers(min_value=6_000, max_value=24_000),
    api=st.sampled_from(sorted(WIRES)),
)
async def test_no_request_passes_the_hold_and_events_come_only_past_it(
    hold: float, window: int, api: str
) -> None:
    """Whatever the hold and the window: every forwarded request fits under the hold and the
    window, its tool pairs whole, and an event comes only when appending would have passed the
    hold (or, before the first, the trigger); `events_in` checks each request."""
    extended, events = await events_in(api, window, hold, 40)
    assert extended + events == 39


async def test_an_event_ends_at_the_target_when_masking_alone_cannot() -> None:
    """With `tool_output_cache, fifo`, masking old outputs leaves a long session between target
    and trigger (placeholders and calls add up); `fifo` then drops old Turns down to the target,
    so the next requests have room to append."""
    gw = parts_at(8192, TOOL_CACHE_FIFO)
    prepared, _ = await forwarded(gw, "chat", session(90))
    assert prepared.chain is not None
    masked_only = next(r for r in prepared.chain.steps if r.type == "tool_output_cache")
    assert masked_only.tokens_after > prepared.budget.target  # masking was not enough
    assert prepared.chain.tokens_after <= prepared.budget.target
    assert "fifo" in prepared.changed_steps


@settings(max_examples=25, deadline=None)
@given(edit=st.integers(min_value=0, max_value=200), api=st.sampled_from(sorted(WIRES)))
async def test_an_edited_history_is_never_answered_from_the_held_request(
    edit: int, api: str
) -> None:
    """A client that rewrites an earlier message (an agent's own pruning, an edit) gets its new
    history compacted, not the held result of the old one."""
    gw = parts_at(8192, TOOL_CACHE_FIFO)
    steps = session(40)
    await forwarded(gw, api, steps[:39])  # an event: held for the conversation
    changed = [dict(s) for s in steps]
    index = 1 + edit % 38
    mark = f"EDITED-{edit}"
    if "user" in changed[index]:
        changed[index]["user"] = mark + changed[index]["user"]
    else:
        changed[index]["cmd"] = mark + changed[index]["cmd"]
    prepared, sent = await forwarded(gw, api, changed)
    fresh = parts_at(8192, TOOL_CACHE_FIFO)
    original, _ = await forwarded(fresh, api, changed)
    assert prepared.body == original.body  # as if the gateway had never seen the old history
    assert pairs_broken(api, sent) == []


async def test_the_upstream_receives_appended_requests(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Through the app: what reaches the upstream between events is the previous forwarded
    request with the new messages after it."""
    gw = await start_app(
        {
            "models": [
                {
                    "name": "m",
                    "upstream": {"base_url": local_upstream.base_url},
                    "tokenizer": "tiktoken:o200k_base",  # exact: never recalibrated midway
                    "context_window": 16_384,
                    "policy": "p",
                }
            ],
            "policies": {"p": {"steps": TOOL_CACHE_FIFO}},
        }
    )
    steps = session(60)
    received: list[list[Any]] = []
    for end in range(1, len(steps) + 1):
        local_upstream.reset()
        response = await gw.http.post(
            f"{gw.base_url}/chat/completions", json=body("chat", steps[:end])
        )
        assert response.status_code == 200, response.text
        [sent] = local_upstream.chat_requests()
        received.append(sent["json"]["messages"])
    events = sum(
        1 for before, after in itertools.pairwise(received) if after[: len(before)] != before
    )
    compacted = sum(1 for sent in received if any("ref=" in str(m.get("content")) for m in sent))
    assert compacted >= 20 and 2 <= events <= 8, (compacted, events)


CACHE_KEYS = {
    "chat": {"prompt_cache_key": "conv-7", "user": "u-1", "metadata": {"k": "v"}},
    "responses": {"prompt_cache_key": "conv-7", "user": "u-1", "metadata": {"k": "v"}},
    "messages": {"metadata": {"user_id": "u-1"}},
}


@pytest.mark.parametrize("api", sorted(WIRES))
async def test_cache_keys_tools_and_system_survive_every_compaction(api: str) -> None:
    """The fields providers key their prompt cache on, the tool definitions and the system
    prompt reach the upstream byte for byte, however much the history was compacted (the
    expansion tools and their note, once offered, come after the client's own)."""
    gw = parts_at(8192, TOOL_CACHE_FIFO)
    steps = session(60)
    compacted = 0
    for end in (20, 35, 50, 60):
        client = {**body(api, steps[:end]), **CACHE_KEYS[api]}
        if api == "messages":
            client["system"] = [
                {
                    "type": "text",
                    "text": "You are a coding agent.",
                    "cache_control": {"type": "ephemeral"},
                }
            ]
        route = gw.router.resolve("m")
        request = WIRES[api].parse(orjson.dumps(client), 1 << 30)
        prepared = await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))
        sent = orjson.loads(prepared.body)
        compacted += bool(prepared.changed_steps)
        for key, value in CACHE_KEYS[api].items():
            assert sent[key] == value
        own_tools = [orjson.dumps(t) for t in client["tools"]]
        assert [orjson.dumps(t) for t in sent["tools"][: len(own_tools)]] == own_tools
        head = {"chat": "messages", "responses": "instructions", "messages": "system"}[api]
        if api == "chat":
            assert sent["messages"][0] == client["messages"][0]
        elif isinstance(client[head], list):  # a note on the expansion tools may follow
            own = [orjson.dumps(b) for b in client[head]]
            assert [orjson.dumps(b) for b in sent[head][: len(own)]] == own
        else:
            assert sent[head].startswith(client[head])
    assert compacted >= 3


async def test_session_headers_reach_the_upstream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Codex sends `session_id` (and OpenAI-compatible servers route caches by it); it goes
    upstream unchanged on a compacted request."""
    gw = await start_app(
        one_model(local_upstream.base_url, tokenizer="chars:4", context_window=8192)
    )
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json=body("chat", session(40)),
        headers={"session_id": "s-123", "x-session-affinity": "a-9"},
    )
    assert response.status_code == 200 and response.headers["x-compactgate-steps"] != "none"
    [sent] = local_upstream.chat_requests()
    headers = {k.lower(): v for k, v in sent["headers"]}
    assert headers["session_id"] == "s-123" and headers["x-session-affinity"] == "a-9"
