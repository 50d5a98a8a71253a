"""The log a real `compactgate serve` writes with `server.log_format: json`, and what only a real
server shows in a response's headers.

What an operator would notice: every line of the process's output is one JSON object; each
request, whatever its API and however it ended, leaves exactly one line on `compactgate.access`
with the request id, tenant, API, model, status, failure reason, stream flag, tokens, steps,
retries, internal rounds and times; and no line holds an API key, its hash or a word of any
message. A client gets one `date` and one `server` header, not the upstream's as well.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import GatewayProcess, GatewayStarter, free_port
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process

KEY = "sk-gateway-client-key-9c41e7"
UPSTREAM_KEY = "sk-upstream-held-key-3b8d20"
TENANT = "team-a"
MARKER = "purple-elephant-manuscript"  # message content: must never be logged
LONG = [{"role": "user", "content": f"{MARKER} {i} " + "filler " * 40} for i in range(30)]
ACCESS = "compactgate.access"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    upstream = {"base_url": fake_upstream_server.base_url, "api_key": UPSTREAM_KEY}
    config = {
        "server": {"log_format": "json"},
        "auth": {"keys": [{"key_sha256": sha256(KEY), "tenant": TENANT}]},
        "models": [
            {"name": "m", "upstream": upstream, "context_window": 100_000},
            {
                "name": "tiny",
                "upstream": upstream,
                "context_window": 600,
                "max_output_tokens": 50,
                "tokenizer": "chars:4",
                "policy": "fifo",
            },
            {"name": "alias", "upstream": {**upstream, "model": "real-embedder"}},
            {
                "name": "down",
                "upstream": {"base_url": f"http://127.0.0.1:{free_port()}/v1"},
                "retry": {"max_attempts": 1},
            },
        ],
        "policies": {"fifo": {"steps": [{"type": "fifo"}]}},
    }
    with gateway_process(config, tmp_path_factory.mktemp("json-log")) as process:
        yield process


def request_lines(gw: GatewayProcess, ids: set[str], timeout: float = 20) -> dict[str, Any]:
    """The access lines of these request ids, once all have been written."""
    deadline = time.monotonic() + timeout
    while True:
        found: dict[str, list[dict[str, Any]]] = {}
        for line in gw.process.lines:
            record = json.loads(line)
            if record.get("logger") == ACCESS and record.get("request_id") in ids:
                found.setdefault(record["request_id"], []).append(record)
        if set(found) == ids or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert set(found) == ids, f"no request line for {sorted(ids - set(found))}"
    for request_id, records in found.items():
        assert len(records) == 1, f"{request_id} logged {len(records)} times"
    return {request_id: records[0] for request_id, records in found.items()}


def test_every_api_and_every_failure_leaves_one_json_line(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    gw = gateway
    oa = openai.OpenAI(base_url=gw.base_url, api_key=KEY, max_retries=0, timeout=20)
    claude = anthropic.Anthropic(base_url=gw.url, api_key=KEY, max_retries=0, timeout=20)
    small = [{"role": "user", "content": f"{MARKER}: say hi"}]

    def rid(name: str) -> dict[str, str]:
        return {"x-request-id": name}

    oa.chat.completions.create(model="m", messages=small, extra_headers=rid("chat"))
    stream = oa.chat.completions.create(
        model="m", messages=small, stream=True, extra_headers=rid("chat-stream")
    )
    assert list(stream)
    compacted = oa.chat.completions.with_raw_response.create(
        model="tiny", messages=LONG, extra_headers=rid("compacted")
    )
    assert compacted.headers["x-compactgate-steps"] != "none"
    oa.responses.create(model="m", input=f"{MARKER}: hello", extra_headers=rid("responses"))
    claude.messages.create(model="m", max_tokens=50, messages=small, extra_headers=rid("messages"))
    claude.messages.count_tokens(model="m", messages=small, extra_headers=rid("count"))
    oa.embeddings.create(model="alias", input=MARKER, extra_headers=rid("passthrough"))
    oa.models.retrieve("m", extra_headers=rid("model"))
    fake_upstream.script(
        [{"kind": "error", "status": 400, "body": {"error": {"message": "refused by upstream"}}}]
    )
    failures = {
        "down": lambda: oa.chat.completions.create(
            model="down", messages=small, extra_headers=rid("down")
        ),
        "unknown": lambda: oa.chat.completions.create(
            model="nope", messages=small, extra_headers=rid("unknown")
        ),
        "bad": lambda: oa.chat.completions.create(
            model="m",
            messages=[{"role": "bogus", "content": MARKER}],
            extra_headers=rid("bad"),
        ),
        "upstream-400": lambda: oa.chat.completions.create(
            model="m", messages=small, extra_headers=rid("upstream-400")
        ),
        "auth": lambda: openai.OpenAI(
            base_url=gw.base_url, api_key="sk-wrong-key-0000", max_retries=0, timeout=20
        ).embeddings.create(model="m", input=MARKER, extra_headers=rid("auth")),
    }
    for call in failures.values():
        with pytest.raises(openai.APIStatusError):
            call()

    lines = request_lines(gw, {"chat", "chat-stream", "compacted", "responses", "messages",
                               "count", "passthrough", "model", *failures})  # fmt: skip
    expected = {  # request id: (api, model, status, reason, tenant)
        "chat": ("chat", "m", 200, "-", TENANT),
        "chat-stream": ("chat", "m", 200, "-", TENANT),
        "compacted": ("chat", "tiny", 200, "-", TENANT),
        "responses": ("responses", "m", 200, "-", TENANT),
        "messages": ("messages", "m", 200, "-", TENANT),
        "count": ("count_tokens", "m", 200, "-", TENANT),
        "passthrough": ("passthrough", "alias", 200, "-", TENANT),
        "model": ("models", "m", 200, "-", TENANT),
        "down": ("chat", "down", 502, "upstream_unreachable", TENANT),
        "unknown": ("chat", "nope", 404, "unknown_model", TENANT),
        "bad": ("chat", "-", 400, "bad_request", TENANT),  # the body did not parse
        "upstream-400": ("chat", "m", 400, "upstream_bad_request", TENANT),
        "auth": ("passthrough", "-", 401, "auth", "-"),
    }
    for request_id, (api, model, status, reason, tenant) in expected.items():
        line = lines[request_id]
        got = (line["api"], line["model"], line["status"], line["reason"], line["tenant"])
        assert got == (api, model, status, reason, tenant), request_id
        assert line["level"] == "info" and line["ts"].endswith("Z")
        assert line["total_ms"] >= line["upstream_ms"] >= 0
        assert line["overhead_ms"] == pytest.approx(
            line["total_ms"] - line["upstream_ms"], abs=0.02
        )
        for field in ("steps", "retries", "internal_rounds", "tokens_before", "tokens_after"):
            assert field in line, (request_id, field)

    assert lines["chat-stream"]["stream"] is True and lines["chat"]["stream"] is False
    assert lines["chat"]["tokens_before"] == lines["chat"]["tokens_after"] > 0
    assert lines["chat"]["upstream_ms"] > 0 and lines["down"]["upstream_ms"] > 0
    compacted_line = lines["compacted"]
    assert compacted_line["tokens_after"] < compacted_line["tokens_before"]
    assert compacted_line["steps"] == compacted.headers["x-compactgate-steps"]


def test_every_line_is_json_and_none_holds_a_key_or_content(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    oa = openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=20)
    oa.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": MARKER}],
        extra_headers={"x-request-id": "secrets"},
    )
    request_lines(gateway, {"secrets"})
    output = gateway.output()
    records = [json.loads(line) for line in output.splitlines()]
    assert all({"ts", "level", "logger"} <= set(r) for r in records)
    assert any(r["logger"].startswith("uvicorn") for r in records)  # the server's own lines too
    for secret in (KEY, UPSTREAM_KEY, sha256(KEY), sha256(f"Bearer {KEY}"), MARKER, "Bearer"):
        assert secret not in output, secret
    assert "authorization" not in output.lower()


def test_a_client_gets_one_date_and_one_server_header(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=gateway.base_url, headers=auth, timeout=20) as http:
        direct = httpx.post(
            f"{fake_upstream.base_url}/embeddings", json={"model": "x", "input": "x"}, timeout=20
        )
        assert direct.headers.get_list("date") and direct.headers.get_list("server")
        answers = [
            http.post("/embeddings", json={"model": "alias", "input": "x"}),
            http.post("/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
            http.get("/models/m"),
        ]  # fmt: skip
    for response in answers:
        assert response.status_code == 200
        assert len(response.headers.get_list("date")) == 1, response.url
        assert response.headers.get_list("server") == ["uvicorn"], response.url


def test_a_request_without_an_id_gets_a_new_one_in_its_header_and_its_line(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """The gateway names a request that brought no `x-request-id`: 32 hex digits, new for each
    request, in the response header and on the request's log line."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    headers = {"authorization": f"Bearer {KEY}"}
    answers = [
        httpx.post(f"{gateway.base_url}/chat/completions", json=body, headers=headers, timeout=20)
        for _ in range(3)
    ]
    ids = {answer.headers["x-compactgate-request-id"] for answer in answers}
    assert len(ids) == 3
    assert all(len(i) == 32 and all(c in "0123456789abcdef" for c in i) for i in ids), ids
    lines = request_lines(gateway, ids)
    assert {line["status"] for line in lines.values()} == {200}


@pytest.mark.slow
def test_every_worker_writes_request_lines(start_gateway: GatewayStarter) -> None:
    """Workers are separate processes that set up their own logging: each must use the
    configured format, or their request lines are lost (they were, before)."""
    model = {"name": "m", "upstream": {"base_url": "http://127.0.0.1:9/v1"}}
    # nothing that workers on a memory store would need to share (design D13.7)
    config = {
        "models": [{**model, "policy": "p", "responses_compact": "native"}],
        "policies": {"p": {"steps": [{"type": "fifo"}]}},
    }
    gw = start_gateway(config, args=("--workers", "2"))
    deadline = time.monotonic() + 60
    while True:  # the parent listens first; the workers then start one after the other
        try:
            answer = httpx.get(f"{gw.base_url}/models", headers={"x-request-id": "worker"})
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert answer.status_code == 200
    deadline = time.monotonic() + 20
    while "request_id=worker " not in gw.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    [line] = [x for x in gw.output().splitlines() if "request_id=worker " in x]
    assert " compactgate.access " in line and " api=models " in line and " status=200 " in line
