"""An upstream 2xx that is not the API's answer (design D15.5): a 502 in the client API's shape
while nothing has been sent, else the events before the fault and one error event (numbered on
after the last one on Responses); counted in `compactgate_upstream_malformed_total` and named
`upstream_malformed` in the request's log line.

The fake upstream sends what broken servers and proxies do (`tests.fake_agent_apis.malformed`):
an HTML page with the API's content type, half a body, events that lost their field names, a
stream without its last event. In-process, on every API, streamed and not.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.devtools.echo_upstream import completion_body, stream_frames
from gateway.errors import UpstreamMalformedError
from gateway.wire import WIRES
from gateway.wire.framing import StreamCheck
from gateway.wire.usage import sse_events
from tests.fake_agent_apis import (
    _frame,
    messages_body,
    messages_events,
    responses_body,
    responses_events,
)
from tests.fuzz_oracle import error_problems
from tests.in_process import AppGateway, AppStarter, LocalUpstream

REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "responses": ("/v1/responses", {"input": "hi"}),
    "messages": (
        "/v1/messages",
        {"max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]},
    ),
}
FINAL = {"chat": b"[DONE]", "responses": b"response.completed", "messages": b"message_stop"}


async def ask(gw: AppGateway, api: str, stream: bool) -> Any:
    path, body = REQUESTS[api]
    return await gw.http.post(path, json={"model": "m", **body, "stream": stream})


def malformed_count(gw_text: str, api: str) -> float:
    for line in gw_text.splitlines():
        if line.startswith("compactgate_upstream_malformed_total{") and f'api="{api}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def metrics(gw: AppGateway) -> str:
    return (await gw.http.get("/metrics")).text


@pytest.mark.parametrize("api", list(REQUESTS))
@pytest.mark.parametrize("kind", ["not_json", "truncated", "bad_framing"])
async def test_a_whole_answer_that_is_not_the_apis_is_a_502(
    start_app: AppStarter, local_upstream: LocalUpstream, api: str, kind: str
) -> None:
    gw = await start_app(
        {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    local_upstream.script([{"kind": kind}])
    response = await ask(gw, api, stream=False)
    assert response.status_code == 502, response.text
    assert not error_problems(api, response.content)
    error = response.json()["error"]
    if api != "messages":  # Anthropic's errors carry a type, no code
        assert error["code"] == "upstream_malformed"
    assert "not a" in error["message"]
    assert malformed_count(await metrics(gw), api) == 1
    assert "reason=upstream_malformed" in gw.logs()


@pytest.mark.parametrize("api", list(REQUESTS))
async def test_a_stream_that_is_not_an_event_stream_is_a_502_before_anything_is_sent(
    start_app: AppStarter, local_upstream: LocalUpstream, api: str
) -> None:
    gw = await start_app(
        {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    local_upstream.script([{"kind": "not_json"}])
    response = await ask(gw, api, stream=True)
    assert response.status_code == 502, response.text
    assert response.headers["content-type"] == "application/json"
    assert not error_problems(api, response.content)
    assert malformed_count(await metrics(gw), api) == 1


@pytest.mark.parametrize("api", list(REQUESTS))
@pytest.mark.parametrize("kind", ["truncated", "bad_framing", "no_final"])
async def test_a_stream_broken_midway_ends_with_one_error_event_after_the_good_ones(
    start_app: AppStarter, local_upstream: LocalUpstream, api: str, kind: str
) -> None:
    gw = await start_app(
        {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    local_upstream.script([{"kind": kind}])
    response = await ask(gw, api, stream=True)
    assert response.status_code == 200
    events = list(sse_events(response.content))
    assert FINAL[api] not in response.content
    *before, (_, last) = events
    assert before, response.content  # the events before the fault were relayed
    for _, data in before:  # whole, as the upstream wrote them
        assert data == b"[DONE]" or isinstance(orjson.loads(data), dict)
    error = orjson.loads(last)
    assert "event stream" in (error.get("message") or error["error"]["message"]), last
    if api != "messages":  # flat on Responses, in an envelope on chat
        assert (error.get("code") or error["error"]["code"]) == "upstream_malformed"
    if api == "responses":
        numbers = [orjson.loads(d)["sequence_number"] for _, d in before]
        assert numbers == list(range(len(numbers)))
        assert error["sequence_number"] == len(numbers)  # the next one, not 0
    assert malformed_count(await metrics(gw), api) == 1
    assert "reason=upstream_malformed" in gw.logs()


@pytest.mark.parametrize(
    "fault", [{"kind": "drop_mid_stream", "after_chunks": 4}, {"kind": "no_final"}]
)
async def test_the_error_event_that_ends_a_responses_stream_carries_the_next_number(
    start_app: AppStarter, local_upstream: LocalUpstream, fault: dict[str, Any]
) -> None:
    """Regression: the gateway's own error event said `sequence_number: 0` after 0, 1, 2, ...
    (a client that checks the order drops it, and the stream's end with it)."""
    gw = await start_app(
        {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    local_upstream.script([fault])
    response = await ask(gw, "responses", stream=True)
    numbers = [orjson.loads(data)["sequence_number"] for _, data in sse_events(response.content)]
    assert len(numbers) >= 3
    assert numbers == list(range(len(numbers))), numbers
    assert orjson.loads(list(sse_events(response.content))[-1][1])["type"] == "error"


async def test_a_good_answer_is_untouched(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The check lets every well-formed answer through byte for byte, streamed and not."""
    gw = await start_app(
        {"models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}]}
    )
    for api in REQUESTS:
        for stream in (False, True):
            response = await ask(gw, api, stream)
            assert response.status_code == 200
            if stream:
                assert FINAL[api] in response.content
    assert malformed_count(await metrics(gw), "chat") == 0


# -- the check on its own ----------------------------------------------------------------------


def streams() -> dict[str, bytes]:
    """A well-formed stream of each API, as the fake upstream writes them."""
    payload: dict[str, Any] = {"model": "m"}
    chat = b"".join(
        stream_frames(completion_body(content="hi there", prompt_tokens=3), include_usage=True)
    )
    body = responses_body(payload, {"kind": "ok"}, 3)
    responses = b"".join(
        _frame(e["type"], {**e, "sequence_number": n}) for n, e in enumerate(responses_events(body))
    )
    answer = messages_body(payload, {"kind": "ok"}, 3)
    messages = b"".join(_frame(name, data) for name, data in messages_events(answer))
    return {"chat": chat, "responses": responses, "messages": messages}


@given(api=st.sampled_from(["chat", "responses", "messages"]), cuts=st.lists(st.integers(0, 4000)))
def test_a_good_stream_cut_anywhere_goes_on_byte_for_byte(api: str, cuts: list[int]) -> None:
    raw = streams()[api]
    check = StreamCheck(WIRES[api])
    points = sorted({min(c, len(raw)) for c in cuts} | {0, len(raw)})
    out = b"".join(check.feed(raw[a:b]) for a, b in itertools.pairwise(points))
    check.end()
    assert out == raw


@given(api=st.sampled_from(["chat", "responses", "messages"]), at=st.integers(1, 50))
def test_a_line_that_is_no_field_is_found_wherever_the_stream_is_cut(api: str, at: int) -> None:
    raw = streams()[api]
    events = raw.split(b"\n\n")
    broken = b"\n\n".join([*events[:1], b"<html>", *events[1:]])
    check = StreamCheck(WIRES[api])
    with pytest.raises(UpstreamMalformedError):
        for start in range(0, len(broken), at):
            check.feed(broken[start : start + at])
        check.end()
