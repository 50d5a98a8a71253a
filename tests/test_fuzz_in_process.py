"""Hostile input on every endpoint and frame, in-process (design D15.3): generated bodies of
every wire API, structurally broken and byte-damaged (`tests/fuzz_strategies.py`), sent to the
gateway's ASGI app with the fake upstream behind it; every answer judged by
`tests/fuzz_oracle.py`: never a 5xx, errors in the API's own shape, nothing unparseable or
half-parsed upstream, and the app still serving afterwards.

The gateway's models (`fuzz_strategies.fuzz_config`) cover every path a body can take. The
same suite runs against a `compactgate serve` process, with fewer examples, in
tests/test_fuzz.py.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.asgi_socket import AppSocket
from tests.fuzz_oracle import (
    MARK,
    PATHS,
    answer_problems,
    socket_problems,
    upstream_problems,
)
from tests.fuzz_strategies import (
    FUZZ,
    chat_bodies,
    compact_bodies,
    count_tokens_bodies,
    encode,
    fuzz_config,
    mangled,
    messages_bodies,
    mutated,
    responses_bodies,
    socket_frames,
)
from tests.in_process import AppGateway, AppStarter, LocalUpstream

# aiohttp warns (a ResourceWarning, which a served process ignores) when the gateway forwards a
# body over 1 MiB as bytes; here, in the test process, warnings are errors. Large bodies are
# part of the fuzzing, so this one warning is let through.
pytestmark = pytest.mark.filterwarnings("ignore:Sending a large body directly:ResourceWarning")
EXAMPLES = itertools.count()
SCHEMAS: dict[str, Any] = {
    "chat": chat_bodies(),
    "responses": responses_bodies(),
    "messages": messages_bodies(),
    "count_tokens": count_tokens_bodies(),
    "compact": compact_bodies(),
}
GOOD = {
    "chat": {"model": "big", "messages": [{"role": "user", "content": "still there?"}]},
    "responses": {"model": "big", "input": "still there?"},
    "messages": {
        "model": "big",
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "still there?"}],
    },
    "count_tokens": {"model": "big", "messages": [{"role": "user", "content": "still there?"}]},
    "compact": {"model": "emulate", "input": "remember the number 7"},
}


@pytest.fixture
async def fuzzed(start_app: AppStarter, local_upstream: LocalUpstream) -> Any:
    gw = await start_app(fuzz_config(local_upstream.base_url))
    yield gw, local_upstream
    for api, body in GOOD.items():  # still serving, every endpoint
        await send(gw, local_upstream, api, encode(body), expect=200)
    assert "Traceback" not in gw.logs(), gw.logs()[-5000:]


async def send(
    gw: AppGateway, upstream: LocalUpstream, api: str, raw: bytes, expect: int | None = None
) -> None:
    """One hostile body on `api`'s endpoint, judged (see tests/fuzz_oracle.py)."""
    example = str(next(EXAMPLES))
    upstream.state.records.clear()
    response = await gw.http.post(
        PATHS[api],
        content=raw,
        headers={
            "content-type": "application/json",
            "authorization": "Bearer sk-fuzz",
            MARK: example,
        },
    )
    relayed = "x-compactgate-steps" in response.headers
    problems = answer_problems(
        api, response.status_code, response.headers, response.content, relayed
    )
    assert not problems, (api, raw[:2000], problems)
    code = response.json()["error"].get("code") if response.status_code >= 400 else None
    refused = response.status_code >= 400 and not relayed and code != "context_length_exceeded"
    problems += upstream_problems(upstream.requests(), example, refused)
    assert not problems, (api, raw[:2000], problems)
    if expect is not None:
        assert response.status_code == expect, response.text[:500]


def schema_or_broken(api: str) -> st.SearchStrategy[Any]:
    schema = SCHEMAS[api]
    return st.one_of(schema, mutated(schema))


@pytest.mark.parametrize("api", list(SCHEMAS))
@FUZZ
@given(data=st.data())
async def test_generated_and_broken_bodies(fuzzed: Any, api: str, data: st.DataObject) -> None:
    gw, upstream = fuzzed
    await send(gw, upstream, api, encode(data.draw(schema_or_broken(api))))


@pytest.mark.parametrize("api", list(SCHEMAS))
@FUZZ
@given(data=st.data())
async def test_damaged_bytes(fuzzed: Any, api: str, data: st.DataObject) -> None:
    gw, upstream = fuzzed
    await send(gw, upstream, api, data.draw(mangled(SCHEMAS[api])))


@FUZZ
@given(frames=socket_frames())
async def test_websocket_frames(fuzzed: Any, frames: list[Any]) -> None:
    """Each frame asking for an answer gets one whose last frame is final and no 5xx; the socket
    then still answers a good request."""
    gw, upstream = fuzzed
    example = str(next(EXAMPLES))
    upstream.state.records.clear()
    headers = {"authorization": "Bearer sk-fuzz", MARK: example}
    last_id = "resp_unknown"
    async with AppSocket.open(gw.app, headers=headers) as socket:
        assert socket.accepted, socket.denial
        for frame in [*frames, {"type": "response.create", "model": "big", "input": "hi"}]:
            if isinstance(frame, bytes):
                await socket.send_bytes(frame)
            elif isinstance(frame, str):
                await socket.send_text(frame)
            else:
                if frame.get("previous_response_id") == "last":
                    frame = {**frame, "previous_response_id": last_id}
                await socket.send_text(encode(frame).decode())
                if frame.get("type") == "response.processed":
                    continue  # asks for no answer
            answer = await socket.until_final()
            assert not socket_problems(answer), (frame, answer[-3:])
            completed = (
                answer[-1].get("response")
                if answer[-1].get("type") == "response.completed"
                else None
            )
            if isinstance(completed, dict) and isinstance(completed.get("id"), str):
                last_id = completed["id"]
        assert answer[-1]["type"] == "response.completed"
    assert not upstream_problems(upstream.requests(), example, refused=False)
