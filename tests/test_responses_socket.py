"""The Responses API over a WebSocket (`/v1/responses` upgraded), as Codex CLI speaks it.

A real gateway process and the fake upstream (over HTTP SSE), driven by the `websockets` client
library and by the real Codex CLI with `supports_websockets = true`. A socket carries one
`response.create` after another; a follow-up names the previous response and sends only the new
items, and the upstream must still get the whole conversation (which the gateway compacts); a
context error is recovered as on HTTP; a bad frame gets an error frame and the socket stays
usable; the socket is authenticated like an HTTP request.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.http.socket import SocketHistory
from tests.agent_runs import (
    FINAL,
    STEPS,
    agent_config,
    outgrowing_codex_session,
    run_codex,
    shell_steps,
)
from tests.conftest import GatewayProcess, GatewayStarter
from tests.fake_agent_apis import prompt_tokens
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

KEY = "sk-socket-key"
FINALS = frozenset({"response.completed", "response.failed", "response.incomplete", "error"})
SHELL = {
    "type": "function",
    "name": "shell",
    "description": "Run a shell command.",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def config(fake: FakeUpstream) -> dict[str, Any]:
    model = {"upstream": {"base_url": fake.base_url}, "tokenizer": "chars:4"}
    return {
        "models": [
            {"name": "m", **model, "context_window": 200_000},
            # The overflow test teaches this one a smaller window; the others keep theirs.
            {"name": "tight", **model, "context_window": 200_000},
        ],
        "auth": {
            "keys": [{"key_sha256": hashlib.sha256(KEY.encode()).hexdigest(), "tenant": "team"}]
        },
    }


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    with gateway_process(config(fake_upstream_server), tmp_path_factory.mktemp("ws")) as gw:
        yield gw


def socket_url(gateway: GatewayProcess) -> str:
    return f"ws://127.0.0.1:{gateway.port}/v1/responses"


def open_socket(gateway: GatewayProcess, key: str | None = KEY, **headers: str) -> Any:
    sent = {"authorization": f"Bearer {key}"} if key else {}
    sent.update({k.replace("_", "-"): v for k, v in headers.items()})
    return connect(socket_url(gateway), additional_headers=sent, max_size=None)


async def answer(socket: ClientConnection, request: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one `response.create`; the frames of its answer, up to its final one."""
    await socket.send(json.dumps({"type": "response.create", **request}))
    return await frames_until_final(socket)


async def frames_until_final(socket: ClientConnection) -> list[dict[str, Any]]:
    frames = []
    while True:
        frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
        frames.append(frame)
        if frame["type"] in FINALS:
            return frames


def completed(frames: list[dict[str, Any]]) -> dict[str, Any]:
    assert frames[-1]["type"] == "response.completed", frames[-1]
    return frames[-1]["response"]


def done_items(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [f["item"] for f in frames if f["type"] == "response.output_item.done"]


def responses_requests(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r["json"] for r in fake.requests() if r["path"] == "/v1/responses"]


def metric(gateway: GatewayProcess, name: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- one socket, several requests ----------------------------------------------------------------


async def test_a_follow_up_on_the_socket_reaches_the_upstream_as_the_whole_conversation(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """Two `response.create` on one socket; the second names the first's response and sends
    only the tool's output, as Codex does. The upstream (which holds nothing: `store: false`)
    gets the first input, the first answer's items and the new item, in order."""
    fake_upstream.script(
        [
            {
                "kind": "tool_calls",
                "reasoning": True,
                "tool_calls": [{"name": "shell", "arguments": {"cmd": "ls"}}],
            },
            {"kind": "ok", "content": "Two files."},
        ]
    )
    first_input = [{"type": "message", "role": "user", "content": "What is here?"}]
    request = {"model": "m", "tools": [SHELL], "store": False, "stream": True}
    async with open_socket(gateway, x_compactgate_exchange="on") as socket:
        first = await answer(socket, {**request, "input": first_input})
        # The gateway's headers come first, in a frame of their own (asked for at the upgrade).
        assert first[0]["type"] == "compactgate.exchange"
        assert first[0]["headers"]["x-compactgate-request-id"]
        assert first[1]["type"] == "response.created"
        produced = done_items(first)
        call = next(item for item in produced if item["type"] == "function_call")
        assert [item["type"] for item in produced] == ["reasoning", "function_call"]
        new = [{"type": "function_call_output", "call_id": call["call_id"], "output": "a b"}]
        second = await answer(
            socket, {**request, "previous_response_id": completed(first)["id"], "input": new}
        )
        reply = completed(second)
    assert reply["output"][0]["content"][0]["text"] == "Two files."
    sent = responses_requests(fake_upstream)
    assert len(sent) == 2
    assert "previous_response_id" not in sent[1]
    assert sent[1]["input"] == [*first_input, *produced, *new]
    assert sent[1]["stream"] is True


async def test_a_context_error_is_recovered_on_the_socket(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """The upstream's window is smaller than the gateway was told: its context error is
    answered by compacting and retrying, and the socket gets only the successful answer."""
    history = [
        {"type": "message", "role": "user", "content": "question " + "word " * 1500},
        {"type": "message", "role": "assistant", "content": "answer " + "word " * 1500},
        {"type": "message", "role": "user", "content": "and now?"},
    ]
    fake_upstream.script([{"kind": "context_limit", "limit": 2000}])
    async with open_socket(gateway, x_compactgate_exchange="on") as socket:
        frames = await answer(socket, {"model": "tight", "input": history, "stream": True})
    assert completed(frames)["output"][0]["content"][0]["text"] == "fake answer"
    assert frames[0]["headers"]["x-compactgate-retries"] == "1"
    assert not [f for f in frames if f["type"] == "error"]
    first, retried = responses_requests(fake_upstream)
    assert prompt_tokens(retried, 4.0) < 2000 < prompt_tokens(first, 4.0)


async def test_bad_frames_get_error_frames_and_the_socket_stays_usable(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    async with open_socket(gateway) as socket:
        await socket.send("{not json")
        [bad] = await frames_until_final(socket)
        assert bad["type"] == "error" and bad["status"] == 400
        assert bad["error"]["type"] == "invalid_request_error"
        assert "not valid JSON" in bad["error"]["message"]
        await socket.send(b"\x00binary")
        [binary] = await frames_until_final(socket)
        assert binary["status"] == 400 and "text frames" in binary["error"]["message"]
        await socket.send(json.dumps({"type": "session.update"}))
        [unknown] = await frames_until_final(socket)
        assert unknown["status"] == 400 and unknown["error"]["param"] == "type"
        # Errors of the request path come in the same shape, with the gateway's headers.
        [missing] = await answer(socket, {"model": "no-such-model", "input": "hi"})
        assert missing["status"] == 404 and missing["error"]["code"] == "model_not_found"
        assert missing["headers"]["x-compactgate-request-id"]
        # An acknowledgement asks for no answer: the next frame read belongs to the next request.
        await socket.send(json.dumps({"type": "response.processed", "response_id": "resp_1"}))
        frames = await answer(socket, {"model": "m", "input": "still there?"})
        assert frames[0]["type"] == "response.created"
        assert completed(frames)["output"][0]["content"][0]["text"] == "fake answer"
    assert len(responses_requests(fake_upstream)) == 1  # nothing half-sent upstream


async def test_a_stream_cut_off_upstream_ends_in_one_error_frame_and_the_socket_goes_on(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """The upstream drops its connection mid-answer: the client gets the events relayed so far,
    then one final error frame with a status (what Codex needs to stop waiting), and nothing
    after it; the next request on the socket is answered normally."""
    fake_upstream.script([{"kind": "drop_mid_stream", "after_chunks": 5}, {"kind": "ok"}])
    async with open_socket(gateway) as socket:
        cut = await answer(socket, {"model": "m", "input": "tell me"})
        assert [f["type"] for f in cut[:2]] == ["response.created", "response.in_progress"]
        assert cut[-1]["type"] == "error" and cut[-1]["status"] == 502, cut[-1]
        assert cut[-1]["error"]["code"] in ("bad_gateway", "upstream_unreachable")
        frames = await answer(socket, {"model": "m", "input": "again"})
        assert frames[0]["type"] == "response.created"  # no leftover of the cut answer
        assert completed(frames)["output"][0]["content"][0]["text"] == "fake answer"


async def test_a_client_leaving_mid_answer_stops_the_upstream_call(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """The socket closes while the upstream is still streaming (for seconds more): the request
    ends at once as a client disconnect (499), its upstream call dropped, as on HTTP."""
    fake_upstream.script([{"kind": "slow_stream", "interval": 1.0}])
    left = gateway.output().count("api=responses model=m status=499")
    async with open_socket(gateway) as socket:
        await socket.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        first = json.loads(await asyncio.wait_for(socket.recv(), 30))
        assert first["type"] == "response.created"
    for _ in range(60):
        if gateway.output().count("api=responses model=m status=499") > left:
            break
        await asyncio.sleep(0.05)
    assert gateway.output().count("api=responses model=m status=499") == left + 1
    assert metric(gateway, 'compactgate_websocket_requests_total{status="499"}') >= 1
    assert "internal error" not in gateway.output()


async def test_the_socket_is_authenticated_at_the_upgrade_and_the_key_stays_here(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    for key in (None, "sk-wrong"):
        with pytest.raises(InvalidStatus) as refused:
            async with open_socket(gateway, key=key):
                pass
        assert refused.value.response.status_code == 401
        assert b"authentication_error" in refused.value.response.body
    async with open_socket(gateway, openai_beta="responses_websockets=2026-02-06") as socket:
        completed(await answer(socket, {"model": "m", "input": "hi"}))
    [sent] = fake_upstream.requests()
    assert KEY not in json.dumps(sent["headers"])  # a gateway key is never forwarded
    # Nor are the upgrade's own headers: the upstream gets a plain HTTP request.
    names = {name.lower() for name, _ in sent["headers"]}
    assert not any(name.startswith("sec-websocket-") for name in names)
    assert "upgrade" not in names and "openai-beta" not in names


async def test_a_warm_up_is_answered_without_the_upstream_and_can_be_continued(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """Codex opens a session with `generate: false`: nothing to generate, so nothing goes
    upstream; its next request continues the warm-up's input."""
    opening = [{"type": "message", "role": "developer", "content": "You are a coding agent."}]
    async with open_socket(gateway) as socket:
        warm = await answer(socket, {"model": "m", "input": opening, "generate": False})
        assert completed(warm)["output"] == []
        assert fake_upstream.requests() == []
        user = [{"type": "message", "role": "user", "content": "Hello."}]
        previous = completed(warm)["id"]
        completed(
            await answer(socket, {"model": "m", "previous_response_id": previous, "input": user})
        )
    [sent] = responses_requests(fake_upstream)
    assert sent["input"] == [*opening, *user] and "generate" not in sent
    assert metric(gateway, 'compactgate_websocket_requests_total{status="prewarm"}') >= 1


# -- the socket's memory ---------------------------------------------------------------------------

ITEMS = st.lists(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["message", "function_call"]), "n": st.integers()}
    ),
    max_size=5,
)


@given(ITEMS, ITEMS, ITEMS, st.text(min_size=1, max_size=8))
def test_a_continuation_is_the_last_input_then_its_output_then_the_new_items(
    before: list[Any], output: list[Any], new: list[Any], other: str
) -> None:
    history = SocketHistory()
    history.remember({"input": before}, "resp_last", output)
    expanded = history.expand({"model": "m", "previous_response_id": "resp_last", "input": new})
    assert expanded == {"model": "m", "input": [*before, *output, *new]}
    # A response the socket did not answer is the upstream's business: forwarded as it came.
    foreign = {"model": "m", "previous_response_id": "resp_" + other + "x", "input": new}
    assert history.expand(foreign) is foreign


# -- the real Codex CLI ----------------------------------------------------------------------------


def codex_over_the_socket(gateway: GatewayProcess, tmp_path: Path, settings: str) -> None:
    """`codex exec` through the gateway over its WebSocket: the run must finish without
    reconnecting or falling back to HTTP."""
    output = run_codex(gateway, tmp_path, settings, websockets=True)
    assert FINAL in output, output[-3000:]
    assert "Reconnecting" not in output and "Falling back" not in output, output


@pytest.mark.slow
def test_codex_over_its_websocket_finishes_a_tool_session_that_outgrows_the_window(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Codex with `supports_websockets = true` runs its whole session over the socket (no
    retries, no fallback to HTTP), and what reached the upstream was compacted to fit."""
    window = 24_000
    gateway = start_gateway(agent_config(fake_upstream.base_url, window))
    codex_over_the_socket(gateway, tmp_path, outgrowing_codex_session(fake_upstream, window))
    sent = responses_requests(fake_upstream)
    assert len(sent) >= STEPS + 1
    # Every request the upstream got came over the socket, as the whole conversation.
    assert_all_over_the_socket(gateway)
    over_socket = metric(gateway, 'compactgate_websocket_requests_total{status="200"}')
    assert over_socket == len(sent), gateway.output()[-3000:]
    assert not any("previous_response_id" in body for body in sent)
    assert gateway.output().count("status=400") == 0, gateway.output()[-3000:]
    sizes = [prompt_tokens(body, 4.0) for body in sent]
    assert max(sizes) <= window * 1.1
    assert re.search(r"steps=(?!none\b)\w", gateway.output())  # some request was compacted


@pytest.mark.slow
def test_codexs_own_compaction_over_its_websocket_is_answered_from_a_summary(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    """Past `model_auto_compact_token_limit` Codex asks for its own compaction on the socket:
    the first request is forwarded and teaches the gateway; a later one is answered at once from
    a summary made ahead of need, as a stream of frames Codex accepts."""
    gateway = start_gateway(agent_config(fake_upstream.base_url, 200_000))
    calls = shell_steps(9, "sleep 1; seq {step}0000 {step}1500", reasoning=False)
    fake_upstream.script([*calls, {"kind": "ok", "content": FINAL}])
    settings = "model_context_window = 200000\nmodel_auto_compact_token_limit = 14000\n"
    codex_over_the_socket(gateway, tmp_path, settings)
    compactions = "compactgate_agent_compactions_total"
    forwarded = metric(gateway, compactions + '{agent="codex",outcome="forwarded"}')
    answered = metric(gateway, compactions + '{agent="codex",outcome="answered"}')
    assert forwarded >= 1 and answered >= 1, (forwarded, answered, gateway.output()[-3000:])
    assert_all_over_the_socket(gateway)


def assert_all_over_the_socket(gateway: GatewayProcess) -> None:
    """Every Responses request the gateway served came over a WebSocket (none over HTTP)."""
    served = gateway.output().count(" api=responses ")
    over_socket = metric(gateway, 'compactgate_websocket_requests_total{status="200"}')
    assert served == over_socket > 0, (served, over_socket)
