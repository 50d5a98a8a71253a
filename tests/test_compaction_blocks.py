"""Anthropic's `compact_20260112` emulated (`context_management: emulate`), through the
official anthropic SDK, plain and streamed, against the fake upstream, which does not implement
compaction and refuses a `compaction` block (as most upstreams would) and any broken tool pair.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.agents.blocks import compacted, open_turn, read_back
from gateway.agents.remote import SUMMARY_INTRO
from gateway.summaries.transcript import SYSTEM_PROMPT
from tests.configs import one_model
from tests.in_process import AppGateway, AppStarter, LocalUpstream
from tests.wire_strategies import messages_bodies, messages_violations

SUMMARY = "SUMMARY-c41e: porting the parser; steps 0-9 ran the test suite; keep public names."
EDIT = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50_000}}
BETAS = ["compact-2026-01-12"]
TOOL = {"name": "shell", "input_schema": {"type": "object", "properties": {}}}


def settings_for(upstream: LocalUpstream, mode: str = "emulate") -> dict[str, Any]:
    model = {"tokenizer": "chars:4", "context_window": 400_000, "context_management": mode}
    return {
        **one_model(upstream.base_url, **model),
        "summaries": {"precompute": False, "retry_failed_after_s": 0},
    }


def history(steps: int = 10) -> list[dict[str, Any]]:
    """An agent session of ~6k tokens per tool round, ending in the round's tool result."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Port the parser, run tests."}]
    for step in range(steps):
        use = {"type": "tool_use", "id": f"toolu_{step}", "name": "shell", "input": {"n": step}}
        messages.append({"role": "assistant", "content": [use]})
        out = "\n".join(f"module_{step}.py:{n}: ok {'x' * 200}" for n in range(110))
        result = {"type": "tool_result", "tool_use_id": use["id"], "content": out}
        messages.append({"role": "user", "content": [result]})
    return messages


def summary_calls(upstream: LocalUpstream) -> list[dict[str, Any]]:
    return [r for r in upstream.requests() if (r["json"] or {}).get("system") == SYSTEM_PROMPT]


def client_calls(upstream: LocalUpstream) -> list[dict[str, Any]]:
    return [r for r in upstream.requests() if (r["json"] or {}).get("system") != SYSTEM_PROMPT]


def blocks_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [b for m in payload["messages"] if isinstance(m["content"], list) for b in m["content"]]


def script(upstream: LocalUpstream, answer: dict[str, Any] | None = None) -> None:
    summary = {"kind": "ok", "content": f"<summary>{SUMMARY}</summary>"}
    upstream.script([summary, answer or {"kind": "ok", "content": "Done."}])


async def create(gw: AppGateway, messages: list[Any], **extra: Any) -> Any:
    return await gw.anthropic().beta.messages.create(
        model="m", max_tokens=500, messages=messages, tools=[TOOL], betas=BETAS, **extra
    )


async def test_past_the_trigger_the_answer_begins_with_the_compaction_block(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(settings_for(local_upstream))
    script(local_upstream)
    messages = history()

    answer = await create(gw, messages, context_management={"edits": [EDIT]})

    assert [b.type for b in answer.content] == ["compaction", "text"]
    assert answer.content[0].content == SUMMARY and answer.content[1].text == "Done."
    assert answer.context_management is not None
    [edit] = answer.context_management.applied_edits
    assert edit.type == "compact_20260112" and edit.cleared_input_tokens > 50_000
    [made] = summary_calls(local_upstream)
    assert "module_0.py" in orjson.dumps(made["json"]).decode()  # the history was summarised
    [sent] = client_calls(local_upstream)
    forwarded = orjson.dumps(sent["json"]).decode()
    assert "compaction" not in {b.get("type") for b in blocks_of(sent["json"])}
    assert "context_management" not in sent["json"]
    assert SUMMARY in forwarded and "module_0.py" not in forwarded  # the summary replaced it
    assert sent["json"]["messages"][-2:] == messages[-2:]  # the open turn, verbatim

    # The client sends the block back: everything before it is dropped, nothing is summarised.
    follow_up = [
        *messages,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in answer.content]},
        {"role": "user", "content": "Go on."},
    ]
    for extra in ({"context_management": {"edits": [EDIT]}}, {}):
        again = await create(gw, follow_up, **extra)
        assert [b.type for b in again.content] == ["text"]  # under the trigger: no new block
        sent = client_calls(local_upstream)[-1]["json"]
        forwarded = orjson.dumps(sent).decode()
        assert "compaction" not in {b.get("type") for b in blocks_of(sent)}
        assert SUMMARY in forwarded and "module_9.py" not in forwarded
        assert sent["messages"][-1] == {"role": "user", "content": "Go on."}
    assert len(summary_calls(local_upstream)) == 1


async def test_a_stream_carries_the_block_first_and_the_upstreams_blocks_shifted(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(settings_for(local_upstream))
    script(
        local_upstream,
        {"kind": "tool_calls", "content": "Next.", "tool_calls": [{"name": "shell"}]},
    )
    async with gw.anthropic().beta.messages.stream(
        model="m",
        max_tokens=500,
        messages=history(),
        tools=[TOOL],
        betas=BETAS,
        context_management={"edits": [EDIT]},
    ) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_message()

    starts = [(e.index, e.content_block.type) for e in events if e.type == "content_block_start"]
    assert starts == [(0, "compaction"), (1, "text"), (2, "tool_use")]
    stops = [e.index for e in events if e.type == "content_block_stop"]
    assert stops == [0, 1, 2]
    assert [b.type for b in final.content] == ["compaction", "text", "tool_use"]
    assert final.content[0].content == SUMMARY and final.content[1].text == "Next."
    assert final.stop_reason == "tool_use"
    [delta] = [e for e in events if e.type == "message_delta"]
    assert delta.context_management is not None
    assert [e.type for e in delta.context_management.applied_edits] == ["compact_20260112"]
    sent = client_calls(local_upstream)[-1]["json"]
    assert "compaction" not in {b.get("type") for b in blocks_of(sent)}


@pytest.mark.parametrize("stream", [False, True])
async def test_pause_after_compaction_answers_with_the_block_alone(
    start_app: AppStarter, local_upstream: LocalUpstream, stream: bool
) -> None:
    gw = await start_app(settings_for(local_upstream))
    script(local_upstream)
    edit = {**EDIT, "pause_after_compaction": True, "instructions": "Keep file names."}
    if stream:
        async with gw.anthropic().beta.messages.stream(
            model="m",
            max_tokens=500,
            messages=history(),
            betas=BETAS,
            context_management={"edits": [edit]},
        ) as events:
            answer = await events.get_final_message()
    else:
        answer = await create(gw, history(), context_management={"edits": [edit]})
    assert [b.type for b in answer.content] == ["compaction"]
    assert answer.content[0].content == SUMMARY and answer.stop_reason == "compaction"
    [made] = summary_calls(local_upstream)
    assert "Keep file names." in orjson.dumps(made["json"]).decode()  # its own instructions
    assert client_calls(local_upstream) == []  # nothing sampled after the block


async def test_under_the_trigger_nothing_changes_and_a_low_trigger_is_refused(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(settings_for(local_upstream))
    answer = await create(gw, history(2), context_management={"edits": [EDIT]})
    assert [b.type for b in answer.content] == ["text"] and answer.context_management is None
    assert summary_calls(local_upstream) == []
    low = {**EDIT, "trigger": {"type": "input_tokens", "value": 1000}}
    response = await gw.http.post(
        f"{gw.url}/v1/messages",
        json={
            "model": "m",
            "max_tokens": 10,
            "messages": history(2),
            "context_management": {"edits": [low]},
        },
    )
    assert response.status_code == 400 and response.json()["type"] == "error"
    assert "50000" in response.json()["error"]["message"]
    assert len(local_upstream.requests()) == 1  # the first request only


async def test_a_summary_that_cannot_be_made_leaves_the_request_as_it_came(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(settings_for(local_upstream))
    refused = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    local_upstream.script([{"kind": "error", "status": 400, "body": refused}])
    answer = await create(gw, history(), context_management={"edits": [EDIT]})
    assert [b.type for b in answer.content] == ["text"]  # answered, with no compaction block
    assert answer.context_management is None
    sent = client_calls(local_upstream)[-1]["json"]
    assert "module_0.py" in orjson.dumps(sent).decode()  # the whole history went


@pytest.mark.parametrize("mode", ["strip", "native"])
async def test_a_block_sent_back_is_read_back_unless_the_model_is_native(
    start_app: AppStarter, local_upstream: LocalUpstream, mode: str
) -> None:
    """`strip` (an upstream that knows no context_management) reads blocks back too; `native`
    forwards them to the upstream that issued them (here, one that refuses them)."""
    gw = await start_app(settings_for(local_upstream, mode))
    messages = [
        *history(2),
        {"role": "assistant", "content": [{"type": "compaction", "content": SUMMARY}]},
        {"role": "user", "content": "Go on."},
    ]
    body = {"model": "m", "max_tokens": 100, "messages": messages}
    response = await gw.http.post(f"{gw.url}/v1/messages", json=body)
    [sent] = local_upstream.requests()
    if mode == "native":
        assert sent["json"]["messages"] == messages  # as it came: the upstream's own to read
        assert response.status_code == 400 and "compaction" in response.text
        return
    assert response.status_code == 200, response.text
    assert sent["json"]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": SUMMARY_INTRO + SUMMARY},
                *[{"type": "text", "text": "Go on."}],
            ],
        }
    ]


# -- properties of the rewrite -------------------------------------------------------------------


def pairing(original: dict[str, Any], messages: list[Any]) -> list[str]:
    problems = messages_violations(original, {**original, "messages": messages})
    return [p for p in problems if p.startswith("tool_")]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=messages_bodies(), data=st.data())
def test_no_forwarded_body_holds_a_block_or_a_broken_tool_pair(
    body: dict[str, Any], data: Any
) -> None:
    """Compacting keeps the open turn as it came; reading a block back (wherever it stands in
    its message, with a summary or none) keeps every pair whole. Neither leaves a block."""
    messages = body["messages"]
    start = open_turn(messages)
    if start:
        forwarded = compacted(messages, "S", start)
        assert all(b.get("type") != "compaction" for b in blocks_of({"messages": forwarded}))
        assert pairing(body, forwarded) == []
        not_text = [b for b in blocks_of({"messages": forwarded}) if b.get("type") != "text"]
        tail = blocks_of({"messages": messages[start:]})
        assert not_text == [b for b in tail if b.get("type") != "text"]
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if assistants:
        at = data.draw(st.sampled_from(assistants))
        content = messages[at]["content"]
        where = data.draw(st.integers(0, len(content)))
        block = {"type": "compaction", "content": data.draw(st.sampled_from(["S", None]))}
        messages[at] = {**messages[at], "content": [*content[:where], block, *content[where:]]}
    forwarded = read_back(messages)
    assert all(b.get("type") != "compaction" for b in blocks_of({"messages": forwarded}))
    assert pairing(body, forwarded) == []
    assert forwarded[-1] == messages[-1] or forwarded[-1]["role"] == "user"
