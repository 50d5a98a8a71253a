"""What a web page can reach, and a WebSocket as safe as HTTP (design D16.7, D9.8).

In-process: the app with the fake upstream behind it, requests shaped as a browser sends them
(its `Origin`, the `Host` it thinks it is talking to) and WebSocket upgrades through the ASGI
protocol (`tests/asgi_socket.py`). What a user would notice: a page on another site, or one
that rebound its own name to this machine, can neither read the admin surfaces nor drive the
gateway (and spend its key) over HTTP or the WebSocket; a page on an allowed origin, the
gateway's own `/ui`, and every client that is no browser work as before; a socket's queue is
bounded and dies with its client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests.asgi_socket import AppSocket, SocketClosed
from tests.in_process import AppGateway, AppStarter, LocalUpstream

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ADMIN = ("/metrics", "/ui", "/v1/compactgate/events", "/v1/compactgate/overview")


def config(upstream: LocalUpstream, **server: Any) -> dict[str, Any]:
    return {
        "server": server,
        "models": [{"name": "m", "upstream": {"base_url": upstream.base_url}}],
    }


def browser(gw: AppGateway, host: str) -> httpx.AsyncClient:
    """A client on the app from this machine whose requests carry `Host: host`."""
    transport = httpx.ASGITransport(app=gw.app, client=("127.0.0.1", 50000))
    return httpx.AsyncClient(transport=transport, base_url=f"http://{host}", timeout=30)


# -- DNS rebinding: the Host a page reaches the gateway by -------------------------------------


async def test_a_rebinding_page_reads_no_admin_surface_and_drives_no_request(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """A page on evil.example:8080 whose name now resolves to 127.0.0.1: its requests are
    same-origin to the browser (Origin and Host are both its name)."""
    gw = await start_app(config(local_upstream))
    page = "http://evil.example:8080"
    async with browser(gw, "evil.example:8080") as rebound:
        for path in ADMIN:  # a same-origin GET carries no Origin at all
            answer = await rebound.get(path)
            assert answer.status_code == 403, path
            assert answer.json()["error"]["code"] == "host_not_allowed"
        chat = await rebound.post("/v1/chat/completions", json=CHAT, headers={"origin": page})
        assert chat.status_code == 403
        assert chat.json()["error"]["code"] == "origin_not_allowed"
    assert local_upstream.requests() == []  # nothing was spent
    for host in ("localhost:8080", "127.0.0.1:8080", "[::1]:8080", "gw.localhost"):
        async with browser(gw, host) as local:
            assert (await local.get("/metrics")).status_code == 200, host
            own_page = await local.post(
                "/v1/chat/completions", json=CHAT, headers={"origin": f"http://{host}"}
            )
            assert own_page.status_code == 200, host


async def test_a_name_in_allowed_hosts_is_served_and_a_token_vouches_for_any_host(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    named = await start_app(config(local_upstream, allowed_hosts=["*.corp.example"]))
    async with browser(named, "gateway.corp.example") as client:
        assert (await client.get("/metrics")).status_code == 200
    async with browser(named, "gateway.corp.example.evil") as client:
        assert (await client.get("/metrics")).status_code == 403
    tokened = await start_app(config(local_upstream, admin_token="s3cret"))
    async with browser(tokened, "evil.example") as client:
        assert (await client.get("/metrics")).status_code == 401  # no token: refused anyway
        with_token = await client.get("/metrics", headers={"x-compactgate-admin-token": "s3cret"})
        assert with_token.status_code == 200  # a rebinding page cannot know the token


async def test_no_cross_origin_page_reads_an_admin_surface(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Regression: `/metrics` answered a page on http://localhost:3000 (an allowed origin, by
    default) with `access-control-allow-origin`, so any local dev server's page could read it."""
    gw = await start_app(config(local_upstream))
    async with browser(gw, "127.0.0.1:8080") as client:
        for path in ADMIN:
            answer = await client.get(path, headers={"origin": "http://localhost:3000"})
            assert answer.status_code == 403, path
            assert "access-control-allow-origin" not in answer.headers
        preflight = await client.options(
            "/metrics",
            headers={"origin": "http://localhost:3000", "access-control-request-method": "GET"},
        )
        assert "access-control-allow-origin" not in preflight.headers
        api = await client.post(
            "/v1/chat/completions", json=CHAT, headers={"origin": "http://localhost:3000"}
        )
        assert api.status_code == 200  # the API itself still serves allowed pages
        assert api.headers["access-control-allow-origin"] == "http://localhost:3000"


# -- the WebSocket's upgrade ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("origin", "host", "code"),
    [
        ("https://evil.example", "127.0.0.1:8080", "origin_not_allowed"),  # another site
        ("http://evil.example:8080", "evil.example:8080", "host_not_allowed"),  # rebound
    ],
)
async def test_a_foreign_page_cannot_open_the_websocket(
    start_app: AppStarter, local_upstream: LocalUpstream, origin: str, host: str, code: str
) -> None:
    """Regression: the socket accepted any Origin, so any page a user visited could drive a
    local gateway over it. Refused before the upgrade, with the HTTP answer and its code."""
    gw = await start_app(config(local_upstream))
    async with AppSocket.open(gw.app, headers={"origin": origin}, host=host) as socket:
        assert not socket.accepted
        assert socket.denial is not None and socket.denial[0] == 403
        assert code.encode() in socket.denial[1]
    assert local_upstream.requests() == []


@pytest.mark.parametrize(
    ("origin", "host"),
    [
        ("http://localhost:3000", "127.0.0.1:8080"),  # an allowed origin
        ("http://127.0.0.1:8080", "127.0.0.1:8080"),  # the gateway's own page
        (None, "evil.example"),  # no Origin: no browser (Codex, an SDK)
    ],
)
async def test_allowed_pages_and_clients_that_are_no_browser_open_the_websocket(
    start_app: AppStarter, local_upstream: LocalUpstream, origin: str | None, host: str
) -> None:
    gw = await start_app(config(local_upstream))
    headers = {"origin": origin} if origin else {}
    async with AppSocket.open(gw.app, headers=headers, host=host) as socket:
        assert socket.accepted, socket.denial
        await socket.send_json({"type": "response.create", "model": "m", "input": "hi"})
        assert (await socket.until_final())[-1]["type"] == "response.completed"


# -- the WebSocket's queue ------------------------------------------------------------------


def create(text: str) -> dict[str, Any]:
    return {"type": "response.create", "model": "m", "input": text}


async def test_a_flood_behind_a_hung_request_gets_an_error_frame_and_the_socket_closes(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Regression: the frame queue had no bound (300 frames of 0.9 MB behind a hung request
    grew a worker by 260 MiB). Past `websocket_queue_bytes` the client is told and the socket
    closed; the hung request is dropped and no queued frame ever goes upstream."""
    gw = await start_app(config(local_upstream, websocket_queue_bytes=1_000_000))
    local_upstream.script([{"kind": "hang"}])
    async with AppSocket.open(gw.app) as socket:
        await socket.send_json(create("hang"))
        while not local_upstream.inflight()["inflight"]:
            await asyncio.sleep(0.01)
        for n in range(20):
            await socket.send_json(create(f"{n} " + "x" * 100_000))
        frame = await socket.receive()
        assert frame["type"] == "error" and frame["status"] == 429, frame
        assert frame["error"]["code"] == "websocket_queue_full"
        with pytest.raises(SocketClosed):
            await socket.receive()
        assert socket.close_code == 1008
    counters = await local_upstream.wait_idle()
    assert counters["cancelled"] == 1  # the hung request was dropped with the socket
    assert len(local_upstream.requests()) == 1  # nothing queued went upstream
    assert "compactgate_websocket_queue_overflows_total 1.0" in (await gw.http.get("/metrics")).text


async def test_frames_queued_when_the_client_leaves_are_dropped(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Regression: 35 requests queued behind a hung one were still sent upstream after the
    client had gone."""
    gw = await start_app(config(local_upstream))
    local_upstream.script([{"kind": "hang"}])
    async with AppSocket.open(gw.app) as socket:
        await socket.send_json(create("hang"))
        while not local_upstream.inflight()["inflight"]:
            await asyncio.sleep(0.01)
        for n in range(35):
            await socket.send_json(create(f"queued {n}"))
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)  # time for anything still queued to be sent, had it been
    assert (await local_upstream.wait_idle())["cancelled"] == 1
    assert [r["json"]["input"] for r in local_upstream.requests()] == ["hang"]


async def test_the_error_frame_ending_a_broken_answer_carries_the_next_sequence_number(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    local_upstream.script([{"kind": "drop_mid_stream", "after_chunks": 4}])
    async with AppSocket.open(gw.app) as socket:
        await socket.send_json(create("hi"))
        frames = await socket.until_final()
    numbers = [f["sequence_number"] for f in frames]
    assert frames[-1]["type"] == "error" and len(frames) >= 3
    assert numbers == list(range(len(numbers))), numbers
