"""The Responses and Messages adapters: every policy chain, compacting an agent session, must
render a body the provider accepts, with every untouched item exactly as the client sent it.

Property tests run the real chains (default, fifo, sliding window, emergency, recovery) on
generated sessions at budgets that force compaction, render the result with the adapter, and
check the providers' rules on the body that would be forwarded (`tests/wire_strategies.py`).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.devtools.parts import parts
from gateway.errors import InvalidRequestError
from gateway.wire import MESSAGES, RESPONSES, wire_of
from policies import build_policy, run_chain
from policies.conversation import drop
from policies.invariants import check
from tests.policy_strategies import budget, env
from tests.wire_strategies import (
    conversation_of,
    messages_bodies,
    messages_violations,
    responses_bodies,
    responses_violations,
)

CHAINS = [
    None,  # the default chain
    [{"type": "fifo"}],
    [{"type": "tool_output_cache"}, {"type": "sliding_window"}],
    [{"type": "emergency"}],
    [{"type": "content_type_chunking"}, {"type": "discard_low_rel"}, {"type": "fifo"}],
]


def compact(wire: Any, body: dict[str, Any], steps: Any, share: float) -> tuple[Any, Any, bool]:
    """Parse `body`, run the chain at `share` of its size, render: (request, forwarded payload,
    whether the last-resort recovery truncated the latest user message)."""
    request = wire.parse(orjson.dumps(body), 10_000)
    conversation = conversation_of(request)
    size = conversation.tokens
    policy = build_policy("p", steps)
    result = run_chain(conversation, budget(max(8, int(size * share))), policy, env(), force=True)
    assert not check(conversation, result.conversation, allow_truncated=True)
    sent = request.forward_payload(result.conversation.messages, None)
    return request, sent, result.recovery is not None


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(responses_bodies(), st.sampled_from(CHAINS), st.sampled_from([0.9, 0.5, 0.25, 0.05]))
def test_responses_compacted_by_any_chain_keep_pairs_reasoning_and_bytes(
    body: dict[str, Any], steps: Any, share: float
) -> None:
    request, sent, recovered = compact(RESPONSES, body, steps, share)
    assert responses_violations(request.layout.items, sent["input"]) == []
    assert sent.get("instructions") == body.get("instructions")
    users = [i for i in body["input"] if i.get("role") == "user"]
    if not recovered:  # the latest user message is there, as sent
        assert users[-1] in sent["input"]


@SETTINGS
@given(messages_bodies(), st.sampled_from(CHAINS), st.sampled_from([0.9, 0.5, 0.25, 0.05]))
def test_messages_compacted_by_any_chain_keep_pairs_signatures_and_breakpoints(
    body: dict[str, Any], steps: Any, share: float
) -> None:
    request, sent, recovered = compact(MESSAGES, body, steps, share)
    assert messages_violations(request.payload, sent, recovered) == []
    if not recovered:  # the latest user message's own text, as sent
        assert _texts(sent["messages"][-1]) == _texts(body["messages"][-1])
    if "system" in body:
        assert sent["system"][: len(body["system"])] == body["system"]


@SETTINGS
@given(st.one_of(responses_bodies(), messages_bodies()), st.data())
def test_any_drop_the_policies_may_make_renders_a_valid_body(
    body: dict[str, Any], data: Any
) -> None:
    """Adversarial: whatever subset a step asks `drop` to remove (it keeps tool groups and
    protected messages whole), the rendered body keeps the provider's rules."""
    wire = RESPONSES if "input" in body else MESSAGES
    request = wire.parse(orjson.dumps(body), 10_000)
    conversation = conversation_of(request)
    indices = data.draw(st.sets(st.integers(0, len(conversation) - 1)))
    result, _ = drop(conversation, indices)
    sent = request.forward_payload(result.messages, None)
    if wire is RESPONSES:
        assert responses_violations(request.layout.items, sent["input"]) == []
    else:
        assert messages_violations(request.payload, sent) == []


@SETTINGS
@given(messages_bodies(), st.data())
def test_a_removed_blocks_breakpoint_moves_to_the_nearest_kept_block_before_it(
    body: dict[str, Any], data: Any
) -> None:
    """Whatever is dropped, the markers sent are exactly those of the kept blocks, plus, for
    each removed marked block, one on the nearest kept block before it (at most four and in
    a valid order to begin with, so none is over the limit)."""
    request = MESSAGES.parse(orjson.dumps(body), 10_000)
    conversation = conversation_of(request)
    indices = data.draw(st.sets(st.integers(0, len(conversation) - 1)))
    result, _ = drop(conversation, indices)
    sent = request.forward_payload(result.messages, None)
    blocks = [  # the parsed client's blocks: those sent unchanged are these very objects
        ((i, p), block)
        for i, message in enumerate(request.payload["messages"])
        if isinstance(message["content"], list)
        for p, block in enumerate(message["content"])
    ]
    kept: list[tuple[int, int]] = []
    marked_sent: set[tuple[int, int]] = set()
    at = 0
    for message in sent["messages"]:
        for block in message["content"] if isinstance(message["content"], list) else ():
            # drop() removes, never rewrites: a block sent is the client's, or a copy of it
            # that gained a marker (found by its contents: the first after the last one found)
            rest = range(at, len(blocks))
            same = next((k for k in rest if blocks[k][1] is block), None)
            at = (
                same
                if same is not None
                else next(k for k in rest if _bare(blocks[k][1]) == _bare(block))
            )
            kept.append(blocks[at][0])
            if "cache_control" in block:
                marked_sent.add(blocks[at][0])
            at += 1
    expected = {where for where, block in blocks if "cache_control" in block and where in kept}
    for where, block in blocks:
        before = [k for k in kept if k < where]
        if "cache_control" in block and where not in kept and before:
            expected.add(before[-1])
    assert marked_sent == expected


def _bare(block: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in block.items() if k != "cache_control"}


def _texts(message: dict[str, Any]) -> list[Any]:
    content = message["content"]
    return [content] if isinstance(content, str) else [b for b in content if b["type"] == "text"]


@settings(max_examples=40, deadline=None)
@given(st.one_of(responses_bodies(), messages_bodies()))
def test_an_unchanged_conversation_renders_to_the_body_as_sent(body: dict[str, Any]) -> None:
    wire = RESPONSES if "input" in body else MESSAGES
    request = wire.parse(orjson.dumps(body), 10_000)
    conversation = conversation_of(request)
    assert orjson.dumps(request.forward_payload(conversation.messages, None)) == request.body


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(responses_bodies(), messages_bodies()), st.sampled_from(CHAINS))
async def test_a_growing_session_renders_as_when_each_kept_message_is_compared(
    body: dict[str, Any], steps: Any
) -> None:
    """Through the pipeline, turn after turn (compaction events, then held results whose
    messages are the previous request's): the body forwarded is byte for byte the one
    rendered by comparing every kept message with the client's, and keeps the providers'
    rules. The pipeline tells the renderer which messages are unchanged by their uids."""
    wire = RESPONSES if "input" in body else MESSAGES
    key = "input" if wire is RESPONSES else "messages"
    gw = parts(parse_config(_config(steps)))
    route = gw.router.resolve("m")
    assert route is not None
    for turn in _turns(body, key):
        request = wire.parse(orjson.dumps(turn), 10_000)
        prepared = await gw.engine.prepare(request, route, "t", window=WINDOW)
        sent = orjson.loads(prepared.body)
        if prepared.chain is None or not prepared.chain.changed:
            continue
        compared = request.forward_payload(prepared.chain.conversation.messages, None)
        assert orjson.dumps(sent[key]) == orjson.dumps(compared[key])
        assert sent.get("system") == compared.get("system")
        if wire is RESPONSES:  # (the rules follow the client's objects, hence `compared`)
            assert responses_violations(request.layout.items, compared["input"]) == []
        else:
            recovered = prepared.chain.recovery is not None
            assert messages_violations(request.payload, compared, recovered) == []


WINDOW = 1200


def _config(steps: Any) -> dict[str, Any]:
    policy: dict[str, Any] = {"trigger_ratio": 0.8, "target_ratio": 0.5}
    if steps is not None:
        policy["steps"] = steps
    model = {
        "name": "m",
        "upstream": {"base_url": "http://127.0.0.1:9/v1"},
        "tokenizer": "chars:4",
        "context_window": WINDOW,
        "max_output_tokens": 100,
        "policy": "p",
    }
    return {"models": [model], "policies": {"p": policy}}


def _turns(body: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The requests an agent sent on its way to `body`: its history up to each user message,
    or tool output, after which no call is left unanswered."""
    items = body[key]
    turns = []
    for end in range(1, len(items) + 1):
        last = items[end - 1]
        if last.get("role") != "user" and not str(last.get("type", "")).endswith("_output"):
            continue
        history = items[:end]
        calls = {i["call_id"] for i in history if "call_id" in i and "output" not in i}
        if calls <= {i["call_id"] for i in history if "output" in i}:
            turns.append({**body, key: history})
    return turns


def test_a_masked_function_output_changes_only_the_output() -> None:
    body = {
        "model": "m",
        "input": [
            {"type": "message", "role": "user", "content": "read it"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "E1"},
            {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "c1",
                "name": "cat",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "c1", "output": "x" * 5000},
            {"type": "message", "role": "user", "content": "thanks"},
        ],
    }
    request = RESPONSES.parse(orjson.dumps(body), 100)
    conversation = conversation_of(request)
    tool = next(m for m in conversation.messages if m.role == "tool")
    masked = tool.with_data({**tool.data, "content": "[tool output trimmed; ref=ref_1]"}, 10)
    messages = tuple(masked if m is tool else m for m in conversation.messages)
    sent = request.forward_payload(messages, "real-model")
    assert sent["model"] == "real-model"
    assert sent["input"][3] == {
        "type": "function_call_output",
        "call_id": "c1",
        "output": "[tool output trimmed; ref=ref_1]",
    }
    assert sent["input"][:3] == body["input"][:3]  # reasoning and call untouched, same bytes


def test_a_removed_breakpoint_moves_to_the_nearest_kept_block_before_it() -> None:
    old_result = {"type": "tool_result", "tool_use_id": "t1", "content": "old output"}
    body = {
        "model": "m",
        "max_tokens": 100,
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "first task"}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "B", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    old_result,
                    {"type": "text", "text": "second", "cache_control": {"type": "ephemeral"}},
                ],
            },
            {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            {"role": "user", "content": "go on"},
        ],
    }
    request = MESSAGES.parse(orjson.dumps(body), 100)
    conversation = conversation_of(request)
    # drop the canonical user message "second" (it carried the marker) but keep the rest
    kept = tuple(
        m
        for m in conversation.messages
        if m.data.get("content")
        != [{"type": "text", "text": "second", "source": body["messages"][2]["content"][1]}]
    )
    assert len(kept) == len(conversation.messages) - 1
    sent = request.forward_payload(kept, None)
    moved = sent["messages"][2]["content"]
    assert moved == [{**old_result, "cache_control": {"type": "ephemeral"}}]
    assert body["messages"][2]["content"][0] == old_result  # the client's body is not modified
    assert messages_violations(request.payload, sent) == []


def test_more_than_four_breakpoints_and_a_1h_after_a_5m_marker_are_dropped() -> None:
    five = {"type": "ephemeral"}
    hour = {"type": "ephemeral", "ttl": "1h"}
    blocks = [{"type": "text", "text": f"b{i}", "cache_control": five} for i in range(4)]
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": "s", "cache_control": five}],
        "messages": [
            {
                "role": "user",
                "content": [*blocks, {"type": "text", "text": "late", "cache_control": hour}],
            },
        ],
    }
    request = MESSAGES.parse(orjson.dumps(body), 10)
    conversation = conversation_of(request)
    changed = conversation.messages[1].with_data({**conversation.messages[1].data}, 1)
    sent = request.forward_payload((conversation.messages[0], changed), None)
    markers = [b for b in sent["messages"][0]["content"] if "cache_control" in b]
    assert len(markers) == 3  # four in all with the system's; the 1h one after 5m ones dropped
    assert all(b["cache_control"] == five for b in markers)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {
                "model": "m",
                "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}],
            },
            "input[0]",
        ),
        ({"model": "m", "input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"type": "message", "role": "user", "content": 7}]},
            "input[0].content",
        ),
        ({"model": "m", "input": ["just a string"]}, "input[0]"),
        ({"model": "m", "input": 3}, "input"),
        (
            {"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": 1}]},
            "input[0].name",
        ),
    ],
)
def test_malformed_responses_input_is_a_400_naming_the_item(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        RESPONSES.parse(orjson.dumps(body), 100)
    assert caught.value.param == param
    assert caught.value.status == 400


def test_an_output_without_its_call_is_accepted_when_the_history_is_upstream() -> None:
    body = {
        "model": "m",
        "previous_response_id": "resp_1",
        "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}],
    }
    request = RESPONSES.parse(orjson.dumps(body), 100)
    assert request.stateful


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "x"}]},
            "messages.0.role",
        ),
        (
            {
                "model": "m",
                "max_tokens": 5,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}],
                    }
                ],
            },
            "messages.0.content.0",
        ),
    ],
)
def test_malformed_messages_are_a_400_naming_the_field(body: dict, param: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        MESSAGES.parse(orjson.dumps(body), 100)
    assert caught.value.param == param
    assert b'"type":"invalid_request_error"' in MESSAGES.error_body(caught.value)


def test_the_plan_guesses_the_api_from_the_body() -> None:
    assert wire_of(b'{"model": "m", "input": "hi"}').name == "responses"
    assert wire_of(b'{"model": "m", "system": "s", "messages": []}').name == "messages"
    assert (
        wire_of(b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}').name == "chat"
    )
    assert wire_of(b"{}", "messages").name == "messages"
