"""Issue 39 checked from outside: two `compactgate serve` replicas on one real Redis, the fake
upstream misbehaving on command, and clients that send what they should not.

What an operator would notice, on both replicas:
- hostile bodies on every API and on the WebSocket get 4xx answers in each API's own shape,
  never a 5xx, and nothing of them reaches the upstream;
- a 3 MB body over a 1 MB limit: 20 tries out of 20 read the 413 (a plain client that writes
  its whole body first, and httpx), none sees a broken pipe;
- with one model's upstream down, both replicas stay ready and `/healthz` says which model;
- a non-JSON 200 from the upstream is a 502, streamed or not (an error event once a stream has
  begun), counted;
- a page on a foreign origin, or one that rebound its name to this machine, opens no socket and
  reads no admin surface;
- a flood of frames behind a hung request: the socket is closed at its queue's bound, the
  replica's memory stays flat (compared, in the same run, with a replica whose bound is too
  large to matter: how the socket behaved before), and nothing queued reaches the upstream
  after the client has gone.
The only 5xx the replicas count are the 502s of the upstream's malformed answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import GatewayProcess, Starter
from tests.fake_upstream import FakeUpstream
from tests.fuzz_oracle import MARK, PATHS, answer_problems, upstream_problems
from tests.fuzz_strategies import encode
from tests.gateway_process import gateway_process
from tests.redis_server import start_redis
from tests.test_fuzz import ISSUE_39, ROLE

pytestmark = pytest.mark.slow

LIMIT = 1024 * 1024
BIG = b'{"model":"m","messages":[{"role":"user","content":"' + b"y" * (3 * 1024 * 1024) + b'"}]}'
QUEUE = 8 * 1024 * 1024


def dead_base_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def replica_config(fake: FakeUpstream, redis_url: str, queue: int = QUEUE) -> dict[str, Any]:
    model = {"upstream": {"base_url": fake.base_url}, "tokenizer": "chars:4"}
    return {
        "store": redis_url,
        "server": {
            "max_body_bytes": LIMIT,
            "readiness_cache_s": 0,
            "websocket_queue_bytes": queue,
        },
        "tool_outputs": {"ref_secret": "shared-by-the-replicas"},
        "models": [
            {"name": "m", **model},
            {"name": "big", **model},
            {"name": "emulate", **model, "responses_compact": "emulate"},
            {"name": "down", "upstream": {"base_url": dead_base_url()}},
        ],
    }


@pytest.fixture(scope="module")
def replicas(
    fake_upstream_server: FakeUpstream,
    start_module_process: Starter,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[list[GatewayProcess]]:
    redis = start_redis(start_module_process)
    config = replica_config(fake_upstream_server, redis.url)
    with (
        gateway_process(config, tmp_path_factory.mktemp("one")) as one,
        gateway_process(config, tmp_path_factory.mktemp("two")) as two,
    ):
        yield [one, two]


def rss_kib(gateway: GatewayProcess) -> int:
    status = Path(f"/proc/{gateway.process.popen.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))


def five_hundreds(gateway: GatewayProcess) -> dict[str, float]:
    """The replica's own count of 5xx answers, by API."""
    found: dict[str, float] = {}
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith("compactgate_requests_total{") and 'status="5' in line:
            api = line.split('api="')[1].split('"')[0]
            found[api] = found.get(api, 0) + float(line.rsplit(" ", 1)[1])
    return found


def malformed(gateway: GatewayProcess) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("compactgate_upstream_malformed_total{")
    )


# -- hostile bodies -------------------------------------------------------------------------


def test_hostile_bodies_on_every_api_and_the_socket_get_4xx_on_both_replicas(
    replicas: list[GatewayProcess], fake_upstream: FakeUpstream
) -> None:
    for gateway in replicas:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            for name, api, body in ISSUE_39:
                fake_upstream.reset()
                response = client.post(PATHS[api], content=encode(body), headers={MARK: name})
                assert response.status_code == 400, (name, response.text)
                assert not answer_problems(api, 400, response.headers, response.content, False)
                assert not upstream_problems(fake_upstream.requests(), name, refused=True)
        asyncio.run(_hostile_frames(gateway))
        assert five_hundreds(gateway) == {}, gateway.output()[-3000:]


async def _hostile_frames(gateway: GatewayProcess) -> None:
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    frames: list[Any] = [
        {"type": "response.create", "model": "m", "input": [ROLE]},
        {"type": "response.create", "model": "m", "input": [{**ROLE, "role": {"a": 1}}]},
        {"type": "response.create", "model": "emulate", "input": [{"type": "compaction_trigger"}]},
        {"type": "response.create", "model": "m", "input": "x", "max_output_tokens": -1},
        {"type": "session.update"},
        "not json",
        b"\x00\x01",
    ]
    async with connect(url) as ws:
        for frame in frames:
            await ws.send(frame if isinstance(frame, str | bytes) else json.dumps(frame))
            answer = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert answer["type"] == "error" and answer["status"] == 400, (frame, answer)
        await ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hi"}))
        while (answer := json.loads(await asyncio.wait_for(ws.recv(), 30)))["type"] not in (
            "response.completed",
            "error",
        ):
            pass
        assert answer["type"] == "response.completed"  # the socket stayed usable


# -- 413 ------------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_a_413_read_20_times_out_of_20(
    replicas: list[GatewayProcess],
) -> None:
    gateway = replicas[0]
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BIG)
    )
    read = 0
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=30) as sock:
            sock.sendall(head + BIG)  # a broken pipe here would fail the test
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        read += answer.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in answer
    assert read == 20
    with httpx.Client(timeout=30) as client:
        statuses = [
            client.post(f"{gateway.base_url}/chat/completions", content=BIG).status_code
            for _ in range(20)
        ]
    assert statuses == [413] * 20


# -- readiness ------------------------------------------------------------------------------


def test_with_one_models_upstream_down_both_replicas_stay_ready_and_healthz_says_which(
    replicas: list[GatewayProcess],
) -> None:
    for gateway in replicas:
        ready = httpx.get(f"{gateway.url}/readyz", timeout=10)
        assert ready.status_code == 200, ready.text
        health = httpx.get(f"{gateway.url}/healthz", timeout=10).json()
        models = health["upstreams"]["models"]
        assert models["down"]["reachable"] is False
        assert models["m"]["reachable"] is True


# -- an upstream 200 that is not the API's --------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses", "messages"])
def test_a_non_json_upstream_200_is_a_502_streamed_or_not(
    replicas: list[GatewayProcess], fake_upstream: FakeUpstream, api: str
) -> None:
    gateway = replicas[1]
    body = {
        "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        "responses": {"model": "m", "input": "hi"},
        "messages": {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": "x"}]},
    }[api]
    before = malformed(gateway)
    fake_upstream.script([{"kind": "not_json"}, {"kind": "not_json"}, {"kind": "no_final"}])
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        whole = client.post(PATHS[api], json=body)
        streamed = client.post(PATHS[api], json={**body, "stream": True})
        cut = client.post(PATHS[api], json={**body, "stream": True})
    for response in (whole, streamed):
        assert response.status_code == 502, response.text
        assert not answer_problems(api, 400, response.headers, response.content, False)
    assert cut.status_code == 200
    assert b"event stream" in cut.content.rsplit(b"\n\n", 2)[-2]  # the last event says why
    assert malformed(gateway) == before + 3


# -- browsers -------------------------------------------------------------------------------


async def test_a_foreign_origin_or_host_opens_no_socket_and_reads_no_admin_surface(
    replicas: list[GatewayProcess],
) -> None:
    gateway = replicas[0]
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    with pytest.raises(InvalidStatus) as foreign:
        async with connect(url, origin="https://evil.example"):  # type: ignore[arg-type]
            pass
    assert foreign.value.response.status_code == 403
    assert b"origin_not_allowed" in foreign.value.response.body
    rebound = "ws://evil.example:8080/v1/responses"  # a name that now resolves to this machine
    with pytest.raises(InvalidStatus) as by_name:
        async with connect(
            rebound,
            origin="http://evil.example:8080",  # type: ignore[arg-type]
            host="127.0.0.1",
            port=gateway.port,
        ):
            pass
    assert by_name.value.response.status_code == 403
    assert b"host_not_allowed" in by_name.value.response.body
    metrics = httpx.get(f"{gateway.url}/metrics", headers={"host": "evil.example:8080"})
    assert metrics.status_code == 403 and metrics.json()["error"]["code"] == "host_not_allowed"
    page = httpx.get(f"{gateway.url}/metrics", headers={"origin": "http://localhost:3000"})
    assert page.status_code == 403 and "access-control-allow-origin" not in page.headers


# -- a flood of frames ----------------------------------------------------------------------


async def flood(gateway: GatewayProcess, fake: FakeUpstream, frames: int) -> tuple[int, bool]:
    """A hung request, then `frames` frames of 0.9 MB behind it, then the client leaves. The
    replica's RSS growth (KiB) at its highest, and whether the replica closed the socket."""
    fake.script([{"kind": "hang"}])
    url = f"ws://127.0.0.1:{gateway.port}/v1/responses"
    before = rss_kib(gateway)
    peak = before
    closed = False
    filler = "x" * 900_000
    async with connect(url, max_size=None, additional_headers={MARK: "flood"}) as ws:
        await ws.send(json.dumps({"type": "response.create", "model": "m", "input": "hang"}))
        deadline = time.monotonic() + 10
        while not fake.inflight()["inflight"]:
            assert time.monotonic() < deadline, "the hung request never reached the upstream"
            await asyncio.sleep(0.02)
        try:
            for n in range(frames):
                frame = {"type": "response.create", "model": "m", "input": f"{n} {filler}"}
                await asyncio.wait_for(ws.send(json.dumps(frame)), 10)
                if n % 10 == 0:
                    peak = max(peak, rss_kib(gateway))
        except (ConnectionClosed, TimeoutError):
            closed = True
        await asyncio.sleep(0.5)
        peak = max(peak, rss_kib(gateway))
    return peak - before, closed


async def test_a_flood_behind_a_hung_request_keeps_memory_flat_and_nothing_reaches_the_upstream(
    replicas: list[GatewayProcess],
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    fake_upstream.reset()
    grown, closed = await flood(replicas[0], fake_upstream, 300)
    await asyncio.sleep(1.0)  # time for anything queued to be sent, had it been
    sent = [r for r in fake_upstream.requests() if r["path"] == "/v1/responses"]
    assert closed  # the replica closed the socket at its bound (an error frame first)
    assert [r["json"]["input"] for r in sent] == ["hang"]  # nothing queued went upstream
    assert fake_upstream.inflight()["cancelled"] == 1  # the hung request went with the client
    # The same flood on a replica whose bound is too large to matter, as the socket was before.
    unbounded = replica_config(fake_upstream, "memory://", queue=2**40)
    with gateway_process(unbounded, tmp_path) as old_like:
        fake_upstream.reset()
        grown_unbounded, _ = await flood(old_like, fake_upstream, 300)
    print(
        f"\nRSS growth under a 300-frame flood of 0.9 MB: bounded ({QUEUE // 2**20} MiB queue) "
        f"{grown / 1024:.0f} MiB, unbounded {grown_unbounded / 1024:.0f} MiB "
        f"(ratio {grown_unbounded / max(grown, 1):.1f})"
    )
    assert grown < 100 * 1024, grown  # the issue measured 260 MiB
    assert grown_unbounded > 2 * grown


def test_no_5xx_but_the_upstreams_malformed_answers(replicas: list[GatewayProcess]) -> None:
    """Every 5xx either replica answered, by its own access log, is a 502 for an upstream's
    malformed 2xx; the counts agree with the metrics."""
    for gateway in replicas:
        lines = [line for line in gateway.output().splitlines() if "compactgate.access" in line]
        failed = [line for line in lines if " status=5" in line]
        assert all("reason=upstream_malformed" in line for line in failed), failed
        assert sum(five_hundreds(gateway).values()) == len(failed)
        assert "Traceback" not in gateway.output(), gateway.output()[-5000:]
