"""`upstream.provider: in_process`: a server embedded with the gateway answers as it would over TCP.

The same scripted upstream behaviours (answers, streams, errors, hang-ups, retries, context
errors) reach the client the same way whether the gateway reaches the fake upstream over its
loopback port (`provider: openai`) or embedded in its process; a server that listens on no port
at all answers; one taken away is an unreachable upstream in the client's own error shape, and
a config that names an embedded server nobody embedded is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from gateway.app import build_app
from gateway.config import ConfigError, parse_config
from tests.fake_upstream import JSON, State, make_app
from tests.in_process import LIVE, AppStarter, LocalUpstream

# Differ between any two answers, whichever transport carried them.
VOLATILE = frozenset({"id", "created", "created_at", "system_fingerprint"})
FAST_RETRY = {"max_attempts": 3, "backoff_base_seconds": 0, "max_delay_seconds": 0}
BEHAVIOURS: list[tuple[str, list[JSON]]] = [
    ("ok", [{"kind": "ok", "content": "hello there"}]),
    ("tool_calls", [{"kind": "tool_calls", "tool_calls": [{"function": {"name": "f"}}]}]),
    ("400", [{"kind": "error", "status": 400, "body": {"error": {"message": "no", "code": "x"}}}]),
    ("500 then ok", [{"kind": "error", "status": 500}, {"kind": "ok", "content": "again"}]),
    ("dropped then ok", [{"kind": "drop"}, {"kind": "ok", "content": "second try"}]),
    ("dropped mid-stream", [{"kind": "drop_mid_stream", "after_chunks": 2}]),
    ("error event", [{"kind": "stream_error_event"}]),
    ("empty 200", [{"kind": "empty_200"}]),
    ("slow stream", [{"kind": "slow_stream", "chunks": 4, "interval": 0.01}]),
]


def _steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def seen(response: httpx.Response) -> tuple[int, str, Any]:
    """What a client sees of an answer, without the parts no two answers share."""
    kind = response.headers.get("content-type", "").split(";")[0]
    if kind == "text/event-stream":
        events = []
        for line in response.text.splitlines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                events.append(data if data == "[DONE]" else _steady(orjson.loads(data)))
        return response.status_code, kind, events
    if kind == "application/json":
        return response.status_code, kind, _steady(response.json())
    return response.status_code, kind, response.text


def model(upstream: LocalUpstream, provider: str) -> JSON:
    return {
        "name": "m",
        "upstream": {"base_url": upstream.base_url, "provider": provider},
        "retry": FAST_RETRY,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize(("name", "script"), BEHAVIOURS, ids=[b[0] for b in BEHAVIOURS])
async def test_the_client_sees_the_same_over_tcp_and_in_process(
    start_app: AppStarter,
    local_upstream: LocalUpstream,
    name: str,
    script: list[JSON],
    stream: bool,
) -> None:
    tcp = await start_app({"models": [model(local_upstream, "openai")]})
    embedded = await start_app({"models": [model(local_upstream, "in_process")]})
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    answers = []
    for gw in (tcp, embedded):
        local_upstream.reset()
        local_upstream.script(script)
        answers.append(seen(await gw.http.post(f"{gw.base_url}/chat/completions", json=body)))
        received = [r["json"] for r in local_upstream.chat_requests()]
        assert received and all(r["messages"] == body["messages"] for r in received)
    assert answers[0] == answers[1]
    assert answers[0][0] in (200, 400, 502)


@contextlib.asynccontextmanager
async def unlistened(name: str) -> AsyncIterator[State]:
    """The fake upstream with no port at all: only an embedding gateway can reach it."""
    state = State()
    runner = web.AppRunner(make_app(state), handler_cancellation=True, access_log=None)
    await runner.setup()
    assert runner.server is not None and not runner.addresses
    LIVE[name] = runner.server
    try:
        yield state
    finally:
        LIVE.pop(name, None)
        state.reset()
        await runner.cleanup()


async def test_a_server_without_a_port_answers_every_api_and_one_taken_away_is_a_502(
    start_app: AppStarter,
) -> None:
    upstream = {"base_url": "http://fake.invalid/v1", "provider": "in_process"}
    hi = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with unlistened("fake.invalid") as state:
        gw = await start_app({"models": [{"name": "m", "upstream": upstream, "retry": FAST_RETRY}]})
        state.queue([{"kind": "ok", "content": "from inside"}] * 3)
        chat = await gw.openai().chat.completions.create(**hi)
        assert chat.choices[0].message.content == "from inside"
        reply = await gw.anthropic().messages.create(max_tokens=16, **hi)
        assert [block.text for block in reply.content if block.type == "text"] == ["from inside"]
        streamed = await gw.openai().responses.create(model="m", input="hi", stream=True)
        texts = [e.delta async for e in streamed if e.type == "response.output_text.delta"]
        assert "".join(texts) == "from inside"
        assert [r["path"] for r in state.records] == [
            "/v1/chat/completions",
            "/v1/messages",
            "/v1/responses",
        ]
    gone = await gw.http.post(f"{gw.base_url}/chat/completions", json=hi)
    assert gone.status_code == 502
    assert gone.json()["error"]["code"] == "upstream_unreachable"
    async with unlistened("fake.invalid") as state:  # a new one under the name: reached again
        state.queue([{"kind": "ok", "content": "back"}])
        again = await gw.openai().chat.completions.create(**hi)
        assert again.choices[0].message.content == "back"


def test_an_in_process_upstream_nobody_embedded_is_a_config_error(tmp_path: Path) -> None:
    raw = {"models": [{"name": "m", "upstream": {"base_url": "http://inside/v1"}}]}
    raw["models"][0]["upstream"]["provider"] = "in_process"
    with pytest.raises(ConfigError) as refused:
        build_app(parse_config(raw))
    [problem] = refused.value.problems
    assert problem.startswith("models[0].upstream.provider: in_process")
    assert "'inside'" in problem
    path = tmp_path / "config.json"
    path.write_text(orjson.dumps(raw).decode())
    checked = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 1
    assert "no server embedded with the gateway is named 'inside'" in checked.stdout
