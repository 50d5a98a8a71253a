"""The pipeline on every wire API: the same budget, the same chain, each API's own fields.

In process (the engine built on its own, `tests.parts`, no upstream call): what the plan
endpoint and every real request compute before anything is sent.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.devtools.parts import Parts, parts
from gateway.errors import InvalidRequestError
from gateway.wire import CHAT, MESSAGES, RESPONSES

WINDOW = 4000


def gateway(**model: Any) -> Parts:
    config = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                "tokenizer": "chars:4",
                "context_window": WINDOW,
                **model,
            }
        ]
    }
    return parts(parse_config(config))


def bodies(turns: int, max_output: int) -> dict[str, dict[str, Any]]:
    """One conversation in the three APIs, each asking for `max_output` tokens its own way."""
    chat: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for t in range(turns):
        chat.append({"role": "user", "content": f"question {t} " + "word " * 60})
        chat.append({"role": "assistant", "content": f"answer {t} " + "word " * 60})
    chat.append({"role": "user", "content": "And now?"})
    rest = chat[1:]
    return {
        "chat": {"model": "m", "messages": chat, "max_completion_tokens": max_output},
        "responses": {
            "model": "m",
            "instructions": "Be brief.",
            "input": [{"type": "message", **m} for m in rest],
            "max_output_tokens": max_output,
        },
        "messages": {
            "model": "m",
            "system": "Be brief.",
            "messages": rest,
            "max_tokens": max_output,
        },
    }


WIRES = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}


async def prepare(gw: Parts, api: str, body: dict[str, Any]) -> Any:
    route = gw.router.resolve("m")
    assert route is not None
    request = WIRES[api].parse(orjson.dumps(body), 10_000)
    return await gw.engine.prepare(request, route, "t", window=gw.effective_window(route))


@pytest.mark.parametrize("api", sorted(WIRES))
async def test_the_output_reserve_is_the_requests_limit_clamped_by_the_models(api: str) -> None:
    """Claude Code asks for up to 128k output tokens; a model configured to write at most 500
    needs no more room than that, so the request is not compacted for nothing."""
    body = bodies(2, 30_000)[api]
    clamped = await prepare(gateway(max_output_tokens=500), api, body)
    assert clamped.budget.reserved_output == 500
    with pytest.raises(InvalidRequestError, match="leave no room"):  # a 400 without the clamp
        await prepare(gateway(), api, body)


@pytest.mark.parametrize("api", sorted(WIRES))
async def test_every_api_is_compacted_to_the_same_budget(api: str) -> None:
    """The same conversation over the trigger is compacted on every API: under the limit, the
    system prompt and the latest question kept, and forwarded in the client's API."""
    prepared = await prepare(gateway(), api, bodies(30, 200)[api])
    assert prepared.api == api
    assert prepared.tokens_before > prepared.budget.limit
    assert prepared.tokens_after <= prepared.budget.trigger
    assert prepared.changed_steps
    sent = orjson.loads(prepared.body)
    if api == "chat":
        assert sent["messages"][0] == {"role": "system", "content": "Be brief."}
        assert sent["messages"][-1] == {"role": "user", "content": "And now?"}
    elif api == "responses":
        assert sent["instructions"] == "Be brief."
        assert sent["input"][-1] == {"type": "message", "role": "user", "content": "And now?"}
    else:  # the system prompt kept as its first block; the ledger's block may follow it
        system = sent["system"]
        assert system == "Be brief." or system[0] == {"type": "text", "text": "Be brief."}
        assert sent["messages"][-1] == {"role": "user", "content": "And now?"}


async def test_a_conversation_held_upstream_is_forwarded_as_sent_or_truncated_on_request() -> None:
    body = {
        "model": "m",
        "previous_response_id": "resp_1",
        "input": [{"type": "message", "role": "user", "content": "word " * 20_000}],
    }
    prepared = await prepare(gateway(), "responses", body)
    assert prepared.body == orjson.dumps(body)
    assert prepared.changed_steps == []
    opted_in = await prepare(gateway(stateful_truncation=True), "responses", body)
    assert orjson.loads(opted_in.body) == {**body, "truncation": "auto"}


turns = st.lists(
    st.tuples(
        st.integers(0, 10),  # how many of the previous request's messages are kept
        st.lists(
            st.tuples(
                st.sampled_from(["system", "developer", "user", "assistant"]),
                st.sampled_from(["a", "bb " * 9, "ccc " * 40]),
            ),
            min_size=1,
            max_size=4,
        ),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(turns)
async def test_a_resent_conversation_reports_what_a_first_sight_of_it_does(
    plan: list[tuple[int, list[tuple[str, str]]]],
) -> None:
    """The figures of a request forwarded as it came (tokens by role and by region, before and
    after) are the same whether the gateway has seen the conversation's earlier requests (and
    reads only what is new) or sees this request first."""
    seen = gateway(context_window=1_000_000)
    messages: list[dict[str, Any]] = []
    for keep, added in plan:
        messages = [*messages[:keep], *({"role": r, "content": c} for r, c in added)]
        body = {"model": "m", "messages": messages}
        warm = await prepare(seen, "chat", body)
        cold = await prepare(gateway(context_window=1_000_000), "chat", body)
        assert warm.chain is None and cold.chain is None  # both forwarded as they came
        assert dict(warm.counts_by_role) == dict(cold.counts_by_role)
        assert list(warm.counts_by_role) == list(cold.counts_by_role)  # first-appearance order
        assert dict(warm.tokens_by_region) == dict(cold.tokens_by_region)
        assert (warm.tokens_before, warm.tokens_after) == (cold.tokens_before, cold.tokens_after)
        assert warm.body == cold.body


async def test_a_conversations_late_counts_run_in_turn_and_count_only_what_is_new() -> None:
    """Requests of one conversation forwarded on their upper bound before the first one's exact
    count is made: each exact figure is what a fresh count gives, and the later counts take
    the earlier one's work instead of looking the whole conversation up again (under load they
    used to queue ahead of the first count and keep the memo from ever catching up)."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "Be brief. " * 50}]
    history += [
        {"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "word " * 300}
        for i in range(30)
    ]
    gw = gateway(tokenizer="tiktoken:o200k_base", context_window=1_000_000)
    route = gw.router.resolve("m")
    assert route is not None
    prepared = []
    for turn in range(4):
        body = {"model": "m", "messages": [*history, {"role": "user", "content": f"now {turn}"}]}
        request = CHAT.parse(orjson.dumps(body), 10_000)
        p = await gw.engine.prepare(request, route, "t", window=1_000_000, count_late=True)
        assert p.bounded and p.late is not None
        prepared.append((body, p))
    cache = route.counter.cache
    before = cache.hits + cache.misses
    await asyncio.wait([p.late for _, p in prepared if p.late is not None])
    for body, p in prepared:
        fresh = await prepare(gateway(tokenizer="tiktoken:o200k_base"), "chat", body)
        assert p.settled().tokens_before == fresh.tokens_before
    assert cache.hits + cache.misses - before < 2 * len(history)  # not 4 x the conversation
