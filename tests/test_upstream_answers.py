"""An upstream 2xx that is not the API's answer (design D15.5): a 502 in the client API's shape
while nothing has been sent, else the events before the fault and one error event (numbered on
after the last one on Responses); counted in `compactgate_upstream_malformed_total` and named
`upstream_malformed` in the request's log line.

The fake upstream sends what broken servers and proxies do (`tests.fake_agent_apis.malformed`):
an HTML page with the API's content type, half a body, events that lost their field names, a
stream without its last event. In-process, on every API, streamed and not.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.wire.base import sse_events
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
