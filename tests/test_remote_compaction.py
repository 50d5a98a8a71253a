"""Responses remote compaction on any upstream (`/v1/responses/compact`, `compaction_trigger`).

Driven with the official openai SDK. The fake upstream does not implement remote compaction
unless told to (as llama.cpp and most OpenAI-compatible servers), and rejects with 400
`invalid_encrypted_content` any compaction item it did not issue (as a real upstream would the
gateway's), so a gateway item that reached it unread fails the test that sent it. A summarisation
call is told apart from the client's own by the summariser's system prompt (`instructions`).

One gateway runs in-process; two replicas sharing a real Redis run as processes.
"""

from __future__ import annotations

import asyncio
import base64
import socket
from typing import Any

import httpx
import openai
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.agents.remote import has_type
from gateway.config import parse_config
from gateway.routing import Router
from gateway.summaries.transcript import SYSTEM_PROMPT
from tests.conftest import GatewayStarter, Starter
from tests.fake_agent_apis import compact_requests
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppGateway, AppStarter, LocalUpstream
from tests.redis_server import RedisServer, start_redis

Upstream = FakeUpstream | LocalUpstream
SUMMARY = "SUMMARY-7f3a: the user is porting the parser; tests in tests/test_parse.py fail."


def config_for(upstream: Upstream, store: str = "memory://", **model: Any) -> dict[str, Any]:
    return {
        "store": store,
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": upstream.base_url},
                "context_window": 32_000,
                "tokenizer": "chars:4",
                "retry": {"max_attempts": 1},
                **model,
            }
        ],
        "summaries": {"precompute": False, "retry_failed_after_s": 0},
    }


def history(tag: str = "") -> list[dict[str, Any]]:
    """A short agent session in Responses items: messages, a call and its output."""
    return [
        {"type": "message", "role": "user", "content": f"Port the parser to the new API {tag}"},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "shell",
            "arguments": '{"cmd": "pytest tests/test_parse.py"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "2 failed, 40 passed"},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Two tests fail.", "annotations": []}],
        },
        {"type": "message", "role": "user", "content": "Fix them, keep the public names."},
    ]


def body_of(record: dict[str, Any]) -> dict[str, Any]:
    return orjson.loads(base64.b64decode(record["body_b64"]))


def summary_calls(upstream: Upstream) -> list[dict[str, Any]]:
    return [
        r
        for r in upstream.requests()
        if r["path"] == "/v1/responses" and body_of(r).get("instructions") == SYSTEM_PROMPT
    ]


def client_calls(upstream: Upstream) -> list[dict[str, Any]]:
    return [
        r
        for r in upstream.requests()
        if r["path"] == "/v1/responses" and body_of(r).get("instructions") != SYSTEM_PROMPT
    ]


def summary_script(text: str = SUMMARY) -> dict[str, Any]:
    return {"kind": "ok", "content": f"<summary>{text}</summary>"}


def dumped(items: list[Any]) -> list[dict[str, Any]]:
    """Output items as the client sends them back."""
    return [i.model_dump(exclude_none=True, warnings=False) for i in items]


def texts(item: dict[str, Any]) -> str:
    content = item["content"]
    return content if isinstance(content, str) else "".join(p["text"] for p in content)


async def compact(gateway: AppGateway, items: list[dict[str, Any]], key: str = "sk-a") -> Any:
    return await gateway.openai(api_key=key).responses.compact(model="m", input=items)


@pytest.mark.parametrize(
    ("base_url", "setting", "mode"),
    [
        ("https://api.openai.com/v1", "auto", "native"),
        ("http://127.0.0.1:8081/v1", "auto", "emulate"),
        ("https://llm.example.internal/v1", "auto", "emulate"),
        ("https://api.openai.com/v1", "emulate", "emulate"),
        ("http://127.0.0.1:8081/v1", "native", "native"),
    ],
)
def test_which_upstreams_compact_natively(base_url: str, setting: str, mode: str) -> None:
    model = {"name": "m", "upstream": {"base_url": base_url}, "responses_compact": setting}
    route = Router(parse_config({"models": [model]})).resolve("m")
    assert route is not None and route.responses_compact == mode


# -- POST /v1/responses/compact on an upstream without it --------------------------------------


async def test_compact_answers_one_signed_item_on_an_upstream_without_it(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    items = history()
    compacted = await compact(gateway, items)

    assert compacted.object == "response.compaction"
    kinds = [item.type for item in compacted.output]
    assert kinds.count("compaction") == 1 and kinds[-1] == "compaction"
    # OpenAI's shape: the input's user messages, then the compaction item.
    assert [texts(item) for item in dumped(compacted.output[:-1])] == [
        items[0]["content"],
        items[4]["content"],
    ]
    content = compacted.output[-1].encrypted_content
    assert content.startswith("cgc1.") and "SUMMARY" not in content  # opaque: a reference
    assert compact_requests(local_upstream.requests()) == []  # never sent to the upstream
    [call] = summary_calls(local_upstream)
    assert "pytest tests/test_parse.py" in orjson.dumps(body_of(call)).decode()
    assert "tools" not in body_of(call)


async def test_the_next_request_carries_the_summary_to_the_upstream(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    compacted = await compact(gateway, history())
    client = gateway.openai(api_key="sk-a")
    follow_up = [*dumped(compacted.output), {"role": "user", "content": "Go on."}]

    answer = await client.responses.create(model="m", input=follow_up)

    assert answer.output_text == "fake answer"
    [sent] = client_calls(local_upstream)
    forwarded = body_of(sent)["input"]
    assert all(item.get("type") != "compaction" for item in forwarded)
    assert not any("compactgate" in item for item in forwarded)  # our marks stay with us
    [summary] = [item for item in forwarded if SUMMARY in str(item.get("content"))]
    assert summary["role"] == "user"
    assert forwarded[-1] == {"role": "user", "content": "Go on."}


async def test_a_second_compaction_of_the_same_history_uses_the_ready_summary(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    first = await gateway.openai(api_key="sk-a").responses.with_raw_response.compact(
        model="m", input=history()
    )
    again = await gateway.openai(api_key="sk-a").responses.with_raw_response.compact(
        model="m", input=history()
    )
    assert first.headers["x-compactgate-compaction"] == "summarised"
    assert again.headers["x-compactgate-compaction"] == "ready"
    assert len(summary_calls(local_upstream)) == 1
    # Each compaction is its own item, both readable.
    items = [first.parse().output[-1], again.parse().output[-1]]
    assert items[0].encrypted_content != items[1].encrypted_content


async def test_compacting_a_compacted_history_summarises_the_earlier_summary(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script(), summary_script("SECOND-SUMMARY")])
    compacted = await compact(gateway, history())
    later = [*dumped(compacted.output), {"role": "user", "content": "Now the lexer."}]

    second = await compact(gateway, later)

    assert [item.type for item in second.output].count("compaction") == 1
    assert SUMMARY in orjson.dumps(body_of(summary_calls(local_upstream)[1])).decode()
    user_texts = [texts(item) for item in dumped(second.output[:-1])]
    assert user_texts == [history()[0]["content"], history()[4]["content"], "Now the lexer."]


async def test_a_string_input_is_compacted_and_kept_as_the_user_message(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    compacted = await gateway.openai(api_key="sk-a").responses.compact(
        model="m", input="Port the parser to the new API."
    )
    user, item = dumped(compacted.output)
    assert texts(user) == "Port the parser to the new API." and user["role"] == "user"
    assert item["type"] == "compaction"


async def test_a_history_held_upstream_cannot_be_compacted_here(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.openai(api_key="sk-a").responses.compact(
            model="m", previous_response_id="resp_123", input=history()[-1:]
        )
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["param"] == "previous_response_id"
    assert local_upstream.requests() == []


# -- items that are not ours, or not valid -------------------------------------------------------


async def test_another_tenants_or_a_tampered_item_is_a_400_and_nothing_is_sent(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    item = dumped((await compact(gateway, history(), key="sk-a")).output)[-1]
    content = item["encrypted_content"]
    flipped = content[:-1] + ("A" if content[-1] != "A" else "B")
    cases = [("sk-b", item), ("sk-a", {**item, "encrypted_content": flipped})]
    before = len(local_upstream.requests())
    for key, sent in cases:
        with pytest.raises(openai.BadRequestError) as caught:
            await gateway.openai(api_key=key).responses.create(
                model="m", input=[sent, {"role": "user", "content": "Go on."}]
            )
        error = caught.value.body
        assert isinstance(error, dict)
        assert error["code"] == "invalid_encrypted_content"
        assert error["param"] == "input[0].encrypted_content"
    assert len(local_upstream.requests()) == before  # nothing half-sent


async def test_an_expired_summary_is_a_410_and_nothing_is_sent(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = config_for(local_upstream)
    config["summaries"]["remote_compaction_ttl_s"] = 0.2
    gateway = await start_app(config)
    local_upstream.script([summary_script()])
    item = dumped((await compact(gateway, history())).output)[-1]
    await asyncio.sleep(0.3)
    before = len(local_upstream.requests())
    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.openai(api_key="sk-a").responses.create(
            model="m", input=[item, {"role": "user", "content": "Go on."}]
        )
    assert caught.value.status_code == 410
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "compaction_expired"
    assert len(local_upstream.requests()) == before


async def test_a_summary_in_use_is_kept_after_its_last_use(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    config = config_for(local_upstream)
    config["summaries"]["remote_compaction_ttl_s"] = 1.0
    gateway = await start_app(config)
    local_upstream.script([summary_script()])
    item = dumped((await compact(gateway, history())).output)[-1]
    client = gateway.openai(api_key="sk-a")
    follow_up = [item, {"role": "user", "content": "Go on."}]
    for pause in (0.6, 0.7):  # 1.3 s after it was made, but never 1 s after its last use
        await asyncio.sleep(pause)
        answer = await client.responses.create(model="m", input=follow_up)
        assert answer.output_text == "fake answer"


@pytest.mark.slow  # the Redis client's connection attempts take seconds
async def test_without_a_reachable_store_nothing_is_issued_that_could_not_be_read_back(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    gateway = await start_app(config_for(local_upstream, store=f"redis://127.0.0.1:{port}/0"))
    local_upstream.script([summary_script()])
    with pytest.raises(openai.APIStatusError) as caught:
        await gateway.openai(api_key="sk-a", max_retries=0).responses.compact(
            model="m", input=history()
        )
    assert caught.value.status_code == 503
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "store_unavailable"


async def test_native_compaction_is_forwarded_and_its_item_passes_untouched(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    local_upstream.configure({"remote_compaction": True})
    gateway = await start_app(config_for(local_upstream, responses_compact="native"))
    compacted = await compact(gateway, history())
    [forwarded] = compact_requests(local_upstream.requests())
    assert body_of(forwarded)["input"] == history()
    item = dumped(compacted.output)[-1]
    assert not item["encrypted_content"].startswith("cgc1.")  # the upstream's own

    answer = await gateway.openai(api_key="sk-a").responses.create(
        model="m", input=[item, {"role": "user", "content": "Go on."}]
    )
    assert answer.output_text == "fake answer"  # the upstream read its own item
    [sent] = client_calls(local_upstream)
    assert body_of(sent)["input"][0] == item  # byte for byte what it issued
    assert summary_calls(local_upstream) == []


async def test_without_native_support_the_upstream_is_never_asked_to_compact(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """`auto` on an upstream that is not OpenAI's: emulated, even though a forward would 404."""
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    compacted = await compact(gateway, history())
    assert compacted.output[-1].type == "compaction"
    assert compact_requests(local_upstream.requests()) == []


# -- compaction_trigger ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_compaction_trigger_is_answered_with_exactly_one_compaction_item(
    start_app: AppStarter, local_upstream: LocalUpstream, stream: bool
) -> None:
    gateway = await start_app(config_for(local_upstream))
    local_upstream.script([summary_script()])
    client = gateway.openai(api_key="sk-a")
    items = [*history(), {"type": "compaction_trigger"}]
    if stream:
        events = [
            e async for e in await client.responses.create(model="m", input=items, stream=True)
        ]
        assert [e.type for e in events][-1] == "response.completed"
        assert [e.sequence_number for e in events] == list(range(len(events)))
        response = events[-1].response
    else:
        response = await client.responses.create(model="m", input=items)
    [item] = response.output
    assert item.type == "compaction" and item.encrypted_content.startswith("cgc1.")
    assert client_calls(local_upstream) == []  # only the summariser was called
    [call] = summary_calls(local_upstream)
    assert "compaction_trigger" not in orjson.dumps(body_of(call)).decode()

    await client.responses.create(
        model="m", input=[dumped([item])[0], {"role": "user", "content": "Go on."}]
    )
    [sent] = client_calls(local_upstream)
    assert SUMMARY in orjson.dumps(body_of(sent)).decode()


async def test_a_compaction_trigger_that_is_not_last_is_a_400_and_nothing_is_sent(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    items = [*history()[:1], {"type": "compaction_trigger"}, *history()[1:]]
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.openai(api_key="sk-a").responses.create(model="m", input=items)
    assert isinstance(caught.value.body, dict) and caught.value.body["param"] == "input[1]"
    assert local_upstream.requests() == []


# -- two replicas sharing Redis ---------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_server(start_process_session: Starter) -> RedisServer:
    return start_redis(start_process_session)


@pytest.mark.slow
def test_a_compaction_made_on_one_replica_is_read_back_on_the_other(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, redis_server: RedisServer
) -> None:
    config = config_for(fake_upstream, store=redis_server.url)
    first, second = start_gateway(config), start_gateway(config)
    fake_upstream.script([summary_script()])
    on_first = openai.OpenAI(base_url=first.base_url, api_key="sk-a", max_retries=0)
    on_second = openai.OpenAI(base_url=second.base_url, api_key="sk-a", max_retries=0)
    items = history("replicas")

    compacted = on_first.responses.compact(model="m", input=items)
    follow_up = [*dumped(compacted.output), {"role": "user", "content": "Go on."}]
    answer = on_second.responses.create(model="m", input=follow_up)

    assert answer.output_text == "fake answer"
    [sent] = client_calls(fake_upstream)
    assert SUMMARY in orjson.dumps(body_of(sent)["input"]).decode()
    # The same history compacted on the other replica: the summary is ready in the store.
    again = on_second.responses.with_raw_response.compact(model="m", input=items)
    assert again.headers["x-compactgate-compaction"] == "ready"
    assert len(summary_calls(fake_upstream)) == 1
    # Another tenant cannot use the item on either replica.
    other = httpx.post(
        f"{second.base_url}/responses",
        json={"model": "m", "input": follow_up},
        headers={"authorization": "Bearer sk-b"},
        timeout=30,
    )
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "invalid_encrypted_content"


# -- a summary made ahead of need ------------------------------------------------------------

CODEX_PROMPT = "You are performing a CONTEXT CHECKPOINT COMPACTION. Summarise for the next model."


def agent_session(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [
        {"type": "message", "role": "developer", "content": "You are a coding agent. " * 40},
        {"type": "message", "role": "user", "content": "Fix the build."},
    ]
    for step in range(steps):
        items.append(
            {"type": "function_call", "call_id": f"c{step}", "name": "exec", "arguments": "{}"}
        )
        out = "\n".join(f"line {n} of step {step}: ok" for n in range(60))
        items.append({"type": "function_call_output", "call_id": f"c{step}", "output": out})
    return items


async def test_compact_uses_the_agents_summary_made_ahead_of_need(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The agent's compaction prompt learnt on /v1/responses: the summary the gateway makes
    ahead of need also answers /v1/responses/compact on the same history, with no call."""
    gateway = await start_app(config_for(local_upstream))
    client = gateway.openai(api_key="sk-a")
    prompt = {"type": "message", "role": "user", "content": CODEX_PROMPT}
    await client.responses.create(model="m", input=[*agent_session(10), prompt])  # learnt
    for steps in range(1, 10):
        await client.responses.create(model="m", input=agent_session(steps))
    metric = 'compactgate_agent_compactions_total{agent="codex",outcome="prepared"}'
    for _ in range(200):
        if metric in (await gateway.http.get(f"{gateway.url}/metrics")).text:
            break
        await asyncio.sleep(0.02)
    calls = len(local_upstream.requests())

    raw = await client.responses.with_raw_response.compact(model="m", input=agent_session(9))

    assert raw.headers["x-compactgate-compaction"] == "ready"
    assert len(local_upstream.requests()) == calls  # no upstream call at all
    item = dumped(raw.parse().output)[-1]
    await client.responses.create(model="m", input=[item, {"role": "user", "content": "Go on."}])
    sent = body_of(local_upstream.requests()[-1])
    assert "SUMMARY of" in orjson.dumps(sent["input"]).decode()  # the fake's summary, read back


async def test_the_next_compaction_is_made_ahead_of_need_and_answered_at_once(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(config_for(local_upstream))
    client = gateway.openai(api_key="sk-a")
    local_upstream.script([summary_script()])
    first = await client.responses.compact(model="m", input=agent_session(10))
    compacted = dumped(first.output)

    def session(steps: int) -> list[dict[str, Any]]:
        return [*compacted, *agent_session(steps)[2:]]

    metric = 'compactgate_agent_compactions_total{agent="responses",outcome="prepared"}'

    def made() -> list[dict[str, Any]]:
        """The gateway's own compaction calls (its compaction prompt last) that reached it."""
        return [
            r
            for r in local_upstream.requests()
            if "getting too long" in orjson.dumps(body_of(r)["input"][-1]).decode()
        ]

    async def settled() -> None:
        """Every background compaction call started so far has been answered and kept."""
        await asyncio.sleep(0.05)
        for _ in range(200):
            text = (await gateway.http.get(f"{gateway.url}/metrics")).text
            kept = [line for line in text.splitlines() if line.startswith(metric)]
            if len(made()) == (float(kept[0].rsplit(" ", 1)[1]) if kept else 0):
                return
            await asyncio.sleep(0.02)
        raise AssertionError("a background compaction call never finished")

    for steps in range(1, 10):  # the conversation grows again, past 70 % of the first size
        await client.responses.create(model="m", input=session(steps))
        await settled()
    assert made()  # the gateway's own calls, in the background
    assert SUMMARY in orjson.dumps(body_of(made()[0])["input"]).decode()  # over the first summary
    calls = len(local_upstream.requests())

    raw = await client.responses.with_raw_response.compact(model="m", input=session(10))

    assert raw.headers["x-compactgate-compaction"] == "ready"
    assert len(local_upstream.requests()) == calls
    assert [item.type for item in raw.parse().output].count("compaction") == 1


_ITEMS = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(("message", "compaction", "compaction_trigger", 1, None)),
                "role": st.just("user"),
            },
        ),
        st.sampled_from(("compaction", 0, None, ["compaction"])),
    ),
    max_size=8,
)


@given(_ITEMS, st.sampled_from(("compaction", "compaction_trigger")))
def test_the_quick_look_for_an_item_type_is_the_plain_one(items: list[Any], kind: str) -> None:
    """Every Responses request is asked twice whether it holds a compaction item or a trigger;
    the quick look answers as the plain loop does, items that are not objects included."""
    plain = any(isinstance(item, dict) and item.get("type") == kind for item in items)
    assert has_type(items, kind) is plain
