"""POST /v1/compress, agentgateway's compressor contract (design D9.10).

`{"messages": [...], "model": "..."}` in, `{"messages": [...], "tokens_saved": N}` out: long
OpenAI chat and Anthropic Messages conversations come back inside the model's window with the
invariants every forwarded request keeps (tool pairs, cache markers and block fields, the
latest user message, order), deterministic and prefix-stable, `tokens_saved` the model's own
count; a conversation that fits comes back as it was; bad bodies are OpenAI-shaped 4xx; auth,
tenants, metrics, events and the bound on time are those of the other endpoints. The same
conversation through `/v1/chat/completions` is forwarded as the very list `/v1/compress`
answers: one engine.

The gateway runs in-process (tests/in_process.py); nothing here needs an upstream but the
same-bytes and timeout tests, which use the fake one.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from typing import Any

import orjson
import pytest
import yaml

from gateway.counting.tokenizers import load_tokenizer
from gateway.counting.tokens import MessageCounter
from tests.conftest import REPO_ROOT
from tests.in_process import AppGateway, AppStarter, LocalUpstream

WINDOW = 8192
TOKENIZER = "tiktoken:o200k_base"
MODEL = {"name": "m", "context_window": WINDOW, "max_output_tokens": 1024, "tokenizer": TOKENIZER}
JSON = dict[str, Any]


def config(**extra: Any) -> JSON:
    return {"models": [{**MODEL, "upstream": {"base_url": "http://127.0.0.1:9/v1"}}], **extra}


def chat_agent(turns: int, size: int = 300) -> list[JSON]:
    """A system prompt, then `turns` Turns of question, tool call, tool result and answer; a
    user states a preference early on; the latest user message last."""
    messages: list[JSON] = [{"role": "system", "content": "You are a careful coding agent."}]
    for t in range(turns):
        said = " Always use tabs, never spaces." if t == 2 else ""
        messages += [
            {"role": "user", "content": f"Turn {t}: read src/f{t}.py and fix it.{said}"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{t}",
                        "type": "function",
                        "function": {"name": "read", "arguments": json.dumps({"p": f"f{t}"})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"call_{t}", "content": f"line {t} " * size},
            {"role": "assistant", "content": f"f{t}.py is fixed."},
        ]
    messages.append({"role": "user", "content": "Now run the tests, please."})
    return messages


def anthropic_agent(turns: int, size: int = 300) -> list[JSON]:
    """An Anthropic Messages history as agentgateway sends it: no system prompt, tool_use and
    tool_result blocks, cache_control markers on recent blocks, a signed thinking block in the
    latest assistant message, the latest user message last."""
    messages: list[JSON] = []
    for t in range(turns):
        said = " Never push to main." if t == 2 else ""
        messages += [
            {"role": "user", "content": [{"type": "text", "text": f"Turn {t}: check f{t}.{said}"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Reading f{t}."},
                    {"type": "tool_use", "id": f"toolu_{t}", "name": "read", "input": {"p": t}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": f"toolu_{t}",
                        "content": f"row {t} " * size,
                        **({"cache_control": {"type": "ephemeral"}} if t == turns - 2 else {}),
                    }
                ],
            },
            {
                "role": "assistant",
                "content": (
                    [{"type": "thinking", "thinking": "done", "signature": "c2lnbmF0dXJl"}]
                    if t == turns - 1
                    else []
                )
                + [{"type": "text", "text": f"f{t} checked."}],
            },
        ]
    messages.append(
        {
            "role": "user",
            "content": [
                {
                    "type": "text",
                    "text": "Summarise the failures.",
                    "cache_control": {"type": "ephemeral"},
                }
            ],
        }
    )
    return messages


async def compress(gw: AppGateway, messages: list[JSON], model: str = "m", **headers: str) -> Any:
    return await gw.http.post(
        f"{gw.base_url}/compress", json={"messages": messages, "model": model}, headers=headers
    )


def count(messages: list[JSON]) -> int:
    """The model's own count of a chat list (the gateway's counter, the model's tokenizer)."""
    return MessageCounter(load_tokenizer(TOKENIZER)).messages(messages)


def in_order(out: list[JSON], original: list[JSON]) -> bool:
    """Every message of `out` that is one of the client's comes in the client's order."""
    positions = [original.index(m) for m in out if m in original]
    return positions == sorted(positions)


def chat_pairs_intact(messages: list[JSON]) -> bool:
    """Each assistant tool call is answered by one tool result before the next assistant or
    user message, and each tool result answers such a call."""
    open_calls: set[str] = set()
    for message in messages:
        role = message["role"]
        if role == "tool":
            if message["tool_call_id"] not in open_calls:
                return False
            open_calls.discard(message["tool_call_id"])
            continue
        if open_calls:
            return False
        if role == "assistant":
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
    return not open_calls


def anthropic_pairs_intact(messages: list[JSON]) -> bool:
    """Each tool_use is answered in the next message, and each tool_result answers a tool_use
    of the message before it."""
    previous: set[str] = set()
    for message in messages:
        blocks = message["content"] if isinstance(message["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        if results != previous if message["role"] == "user" else previous:
            return False
        previous = {b["id"] for b in blocks if b.get("type") == "tool_use"}
    return not previous


def _unmasked(message: JSON) -> JSON:
    """`message` with the text of its tool results left out (what masking may change)."""
    if not isinstance(message["content"], list):
        return message
    blocks = [
        {k: v for k, v in b.items() if k != "content"} if b.get("type") == "tool_result" else b
        for b in message["content"]
    ]
    return {**message, "content": blocks}


def limit_of(response: Any) -> int:
    """What the messages may take: the window less the output reserve (max_output_tokens)."""
    return WINDOW - MODEL["max_output_tokens"]


# -- OpenAI chat --------------------------------------------------------------------------------


async def test_long_chat_comes_back_inside_the_window_with_every_invariant(
    start_app: AppStarter,
) -> None:
    gw = await start_app(config())
    original = chat_agent(60)
    assert count(original) > 5 * WINDOW
    response = await compress(gw, original)
    assert response.status_code == 200, response.text
    answer = response.json()
    out = answer["messages"]
    assert count(out) <= limit_of(response)
    assert out[0] == original[0]  # the system prompt, unchanged and first
    assert out[-1] == original[-1]  # the latest user message, unchanged and last
    assert chat_pairs_intact(out)
    assert in_order(out, original)
    assert "Always use tabs, never spaces." in json.dumps(out)  # the ledger carried it
    assert answer["tokens_saved"] == count(original) - count(out)  # the model's own count
    assert response.headers["x-compactgate-steps"] != "none"


async def test_a_conversation_that_fits_comes_back_unchanged(start_app: AppStarter) -> None:
    gw = await start_app(config())
    original = chat_agent(2, size=20)
    response = await compress(gw, original)
    assert response.status_code == 200
    assert response.json() == {"messages": original, "tokens_saved": 0}
    assert response.headers["x-compactgate-steps"] == "none"


async def test_deterministic_and_prefix_stable(start_app: AppStarter) -> None:
    """The same list gives the same bytes, on this gateway and on another sharing the refs'
    key; a conversation that only grew keeps its compacted prefix (design D3)."""
    shared = {"tool_outputs": {"ref_secret": "one key for every replica"}}
    gw, other = await start_app(config(**shared)), await start_app(config(**shared))
    original = chat_agent(60)
    first = (await compress(gw, original)).content
    assert (await compress(gw, original)).content == first
    assert (await compress(other, original)).content == first
    grown = [*original, {"role": "assistant", "content": "Tests pass."}]
    grown.append({"role": "user", "content": "Good. Commit it."})
    before = orjson.loads(first)["messages"]
    assert len(before) < len(original)  # compacted
    after = (await compress(gw, grown)).json()["messages"]
    assert after[: len(before)] == before
    assert after[len(before) :] == grown[len(original) :]


async def test_same_bytes_as_the_chat_endpoint_forwards(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """One engine: what /v1/chat/completions forwards for a conversation is, byte for byte,
    the list /v1/compress answers for it (expansion off: it adds tools to a chat request,
    which a compressor's caller cannot run)."""
    model = {**MODEL, "upstream": {"base_url": local_upstream.base_url}}
    settings = {"tool_outputs": {"expand": False, "ref_secret": "k"}}
    chat = await start_app({"models": [model], **settings})
    engine = await start_app({"models": [model], **settings})
    original = chat_agent(60)
    local_upstream.script([{"kind": "ok", "content": "ok"}])
    sent = await chat.http.post(
        f"{chat.base_url}/chat/completions", json={"model": "m", "messages": original}
    )
    assert sent.status_code == 200
    [forwarded] = local_upstream.chat_requests()
    compressed = (await compress(engine, original)).json()["messages"]
    assert orjson.dumps(compressed) == orjson.dumps(forwarded["json"]["messages"])
    assert len(compressed) < len(original)


async def test_masked_tool_outputs_are_stored_for_the_tenant(start_app: AppStarter) -> None:
    """A masked output's full text is in the store under its ref, for the caller's tenant
    only (design D13.4); the answer offers no expansion tools and no note about them (the
    caller forwards only the messages)."""
    gw = await start_app(config(tenant_header="x-tenant"))
    original = chat_agent(60)
    out = (await compress(gw, original, **{"x-tenant": "ag"})).json()["messages"]
    refs = [r for m in out for r in re.findall(r"ref_[0-9a-f]{24}", str(m.get("content")))]
    assert refs
    core = gw.app.core
    read = core.tool_outputs.config.read_tool
    found = await core.tool_outputs.execute("h:ag", read, json.dumps({"ref_id": refs[0]}))
    turn = re.search(r"line (\d+) line \1 ", found)
    assert turn is not None, found[:300]
    assert {
        "role": "tool",
        "tool_call_id": f"call_{turn[1]}",
        "content": f"line {turn[1]} " * 300,
    } in original
    other = await core.tool_outputs.execute("h:other", read, json.dumps({"ref_id": refs[0]}))
    assert "line" not in other
    assert not any("tool_output_cache_grep" in str(m) for m in out)


# -- Anthropic Messages ------------------------------------------------------------------------


async def test_anthropic_conversation_keeps_pairs_markers_and_blocks(
    start_app: AppStarter,
) -> None:
    gw = await start_app(config())
    original = anthropic_agent(150)
    response = await compress(gw, original)
    assert response.status_code == 200, response.text
    answer = response.json()
    out = answer["messages"]
    assert answer["tokens_saved"] > 0
    assert int(response.headers["x-compactgate-tokens-after"]) <= limit_of(response)
    assert {m["role"] for m in out} <= {"user", "assistant"}  # no system prompt was sent
    # The ledger (a system block on /v1/messages) comes first, as user text blocks.
    assert out[0]["role"] == "user" and out[0] not in original
    assert "Never push to main." in json.dumps(out[0])
    assert anthropic_pairs_intact(out)
    assert out[-1] == original[-1]  # latest user message, its cache_control included
    # The last Turns come back as sent (blocks, the signed thinking, the markers), but for
    # the text of masked tool results: every other field of those blocks stays.
    assert [_unmasked(m) for m in out[-8:]] == [_unmasked(m) for m in original[-8:]]
    assert out[-2] == original[-2]  # the latest assistant message (pinned), signature and all
    markers = json.dumps(out).count('"cache_control"')
    assert markers == json.dumps(original).count('"cache_control"') <= 4
    assert in_order(out, original)


async def test_anthropic_list_that_fits_comes_back_unchanged(start_app: AppStarter) -> None:
    gw = await start_app(config())
    original = anthropic_agent(2, size=10)
    response = await compress(gw, original)
    assert response.json() == {"messages": original, "tokens_saved": 0}


async def test_responses_items_keep_their_shape(start_app: AppStarter) -> None:
    """Responses input items (agentgateway sends `input` as its `messages` for /v1/responses):
    function calls stay with their outputs, items keep their types."""
    gw = await start_app(config())
    items: list[JSON] = [  # Codex's instructions item: a developer message (a chat role too)
        {
            "type": "message",
            "role": "developer",
            "content": [{"type": "input_text", "text": "Be brief."}],
        }
    ]
    for t in range(60):
        items += [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": f"q{t}"}],
            },
            {"type": "function_call", "call_id": f"fc{t}", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"fc{t}", "output": f"out {t} " * 300},
        ]
    items.append(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    )
    response = await compress(gw, items)
    assert response.status_code == 200, response.text
    out = response.json()["messages"]
    assert out[-1] == items[-1]
    calls = [i["call_id"] for i in out if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in out if i.get("type") == "function_call_output"]
    assert calls == outputs and calls
    assert out != items and int(response.headers["x-compactgate-tokens-after"]) <= limit_of(
        response
    )
    assert response.json()["tokens_saved"] > 0


# -- errors, models, access ----------------------------------------------------------------------

BAD_BODIES: list[tuple[bytes, str | None]] = [
    (b"not json", None),
    (b"[]", None),
    (b'{"messages": [{"role": "user", "content": "hi"}]}', "model"),
    (b'{"model": "m"}', "messages"),
    (b'{"model": "m", "messages": []}', "messages"),
    (b'{"model": "m", "messages": {"role": "user"}}', "messages"),
    (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
    (b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
    (
        b'{"model": "m", "messages": [{"role": "tool", "tool_call_id": "a", "content": "x"},'
        b' {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "a"}]}]}',
        "messages[1]",
    ),
    (b'{"model": 7, "messages": [{"role": "user", "content": "hi"}]}', "model"),
]


@pytest.mark.parametrize(("body", "param"), BAD_BODIES)
async def test_bad_bodies_are_openai_shaped_400s(
    start_app: AppStarter, body: bytes, param: str | None
) -> None:
    gw = await start_app(config())
    response = await gw.http.post(
        f"{gw.base_url}/compress", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


async def test_unknown_model_is_404_and_no_models_means_the_defaults(
    start_app: AppStarter,
) -> None:
    gw = await start_app(config())
    unknown = await compress(gw, chat_agent(1), model="nope")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    bare = await start_app({})  # no models: the registry's window and tokenizer for the name
    fits = await compress(bare, chat_agent(60), model="gpt-4o")  # 128k: ~56k tokens fit
    assert fits.json()["tokens_saved"] == 0
    huge = await compress(bare, chat_agent(400), model="gpt-4o")
    assert huge.status_code == 200
    assert int(huge.headers["x-compactgate-tokens-after"]) < 128_000
    assert huge.json()["tokens_saved"] > 0


async def test_keys_tenants_and_model_globs_apply(start_app: AppStarter) -> None:
    key = "sk-engine"
    digest = hashlib.sha256(key.encode()).hexdigest()
    gw = await start_app(
        config(auth={"keys": [{"key_sha256": digest, "tenant": "ag", "models": ["m"]}]})
    )
    assert (await compress(gw, chat_agent(1))).status_code == 401
    other = await compress(gw, chat_agent(1), model="x", authorization=f"Bearer {key}")
    assert other.status_code == 403
    ok = await compress(gw, chat_agent(1), authorization=f"Bearer {key}")
    assert ok.status_code == 200


async def test_metrics_events_and_log_line_name_the_compress_api(start_app: AppStarter) -> None:
    gw = await start_app(config())
    response = await compress(gw, chat_agent(60))
    saved = response.json()["tokens_saved"]
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert 'compactgate_requests_total{api="compress",model="m",status="200"} 1.0' in metrics
    assert f'compactgate_tokens_saved_total{{api="compress",model="m"}} {float(saved)}' in metrics
    feed = (await gw.http.get(f"{gw.base_url}/compactgate/events")).json()
    [event] = [e for e in feed["events"] if e.get("api") == "compress"]
    assert event["tokens_saved"] == saved and event["answered"]
    assert "api=compress" in gw.logs()


async def test_compacting_is_bounded_in_time(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """A summary that must be waited for, from an upstream that hangs: the answer is 503
    `compress_timeout` after `server.compress_timeout_s`, and the gateway serves on."""
    model = {**MODEL, "upstream": {"base_url": local_upstream.base_url}, "policy": "summary"}
    gw = await start_app(
        {
            "server": {"compress_timeout_s": 0.5},
            "models": [model],
            "policies": {"summary": {"steps": [{"type": "compaction"}]}},
            "summaries": {"wait_s": 30},
        }
    )
    local_upstream.script([{"kind": "hang_before_headers", "seconds": 20}])
    started = time.perf_counter()
    response = await compress(gw, chat_agent(60), authorization="Bearer sk-a")
    took = time.perf_counter() - started
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "compress_timeout"
    assert took < 5
    fits = await compress(gw, chat_agent(1))
    assert fits.status_code == 200


# -- docs/integrations/agentgateway.md ----------------------------------------------------------

AGENTGATEWAY_PAGE = REPO_ROOT / "docs" / "integrations" / "agentgateway.md"
# What agentgateway forwards to its engine when `forwardHeaderMatches` is left empty.
AGENTGATEWAY_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "prompt-caching-2024-07-31",
    "cache-control": "no-transform",
}


def agentgateway_block() -> JSON:
    text = AGENTGATEWAY_PAGE.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    loaded = yaml.safe_load(block)
    assert isinstance(loaded, dict)
    return loaded


def one_sided_ids(messages: list[JSON]) -> set[str]:
    """Tool-call ids on only one side of a call and its result, across the three APIs: what
    agentgateway refuses to take from an engine when the original had no such id."""
    calls: set[str] = set()
    results: set[str] = set()
    for m in messages:
        calls |= {c.get("id") for c in m.get("tool_calls") or () if isinstance(c, dict)}
        if isinstance(m.get("tool_call_id"), str):
            results.add(m["tool_call_id"])
        for block in m["content"] if isinstance(m.get("content"), list) else ():
            if block.get("type") == "tool_use":
                calls.add(block.get("id"))
            elif block.get("type") == "tool_result":
                results.add(block.get("tool_use_id"))
        if m.get("type") == "function_call":
            calls.add(m.get("call_id"))
        elif m.get("type") == "function_call_output":
            results.add(m.get("call_id"))
    return calls ^ results


def test_the_documented_agentgateway_block_uses_its_field_names_and_defaults() -> None:
    [model] = agentgateway_block()["llm"]["models"]
    policy = model["contextCompression"]
    assert set(policy) <= {"target", "path", "failureMode", "minSizeBytes", "forwardHeaderMatches"}
    assert set(policy["target"]) == {"host"} and ":" in policy["target"]["host"]
    assert policy["path"] == "/v1/compress"
    assert policy["failureMode"] == "failOpen" and policy["minSizeBytes"] == 16 * 1024


@pytest.mark.parametrize("shape", ["chat", "anthropic"])
async def test_agentgateways_call_gets_an_answer_it_accepts(
    start_app: AppStarter, shape: str
) -> None:
    """Called as agentgateway calls its engine (the documented path, its default headers, the
    raw message list over 16 KiB), the answer passes agentgateway's checks: 200, a non-empty
    array of objects, no tool id left on one side, and `tokens_saved` an integer."""
    gw = await start_app(config())
    path = agentgateway_block()["llm"]["models"][0]["contextCompression"]["path"]
    original = chat_agent(60) if shape == "chat" else anthropic_agent(60)
    if shape == "anthropic":
        assert "system" not in json.dumps([m["role"] for m in original])
    body = orjson.dumps({"messages": original, "model": "m"})
    assert len(body) > 16 * 1024
    response = await gw.http.post(
        f"{gw.url}{path}",
        content=body,
        headers={"content-type": "application/json", **AGENTGATEWAY_HEADERS},
    )
    assert response.status_code == 200
    answer = response.json()
    messages = answer["messages"]
    assert messages and all(isinstance(m, dict) for m in messages)
    assert not one_sided_ids(messages) - one_sided_ids(original)
    assert isinstance(answer["tokens_saved"], int) and answer["tokens_saved"] > 0
