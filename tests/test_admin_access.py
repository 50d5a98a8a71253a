"""Who reaches the admin surfaces (`/metrics`, `/ui`, the event feed, the plan endpoint).

Nothing is opened silently: without an admin token they answer only clients on the gateway's
own machine (so a laptop and `compactgate demo` work as before) and anyone else gets a 403
saying how to open them; an empty token is no token; a token opens them to whoever presents it.
In-process with the client address set as a server would set it, and once through a real
socket from a non-loopback address of this machine.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from gateway.config import ServerConfig
from gateway.http.admin import exposure_warning
from tests.conftest import GatewayStarter
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppGateway, AppStarter, LocalUpstream

ADMIN_GETS = ("/metrics", "/ui", "/v1/compactgate/events")
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def config(upstream: LocalUpstream | FakeUpstream, **server: Any) -> dict[str, Any]:
    return {
        "server": server,
        "models": [{"name": "m", "upstream": {"base_url": upstream.base_url}}],
    }


@asynccontextmanager
async def client_at(
    gw: AppGateway, address: str, origin: str = "http://localhost:8080"
) -> AsyncIterator[httpx.AsyncClient]:
    """A client on the app whose requests come from `address` (the ASGI scope's `client`)."""
    transport = httpx.ASGITransport(app=gw.app, client=(address, 50000))
    async with httpx.AsyncClient(transport=transport, base_url=origin, timeout=30) as client:
        yield client


async def assert_refused(client: httpx.AsyncClient) -> None:
    for path in ADMIN_GETS:
        response = await client.get(path)
        assert response.status_code == 403, path
        error = response.json()["error"]
        assert error["code"] == "admin_token_required"
        assert "server.admin_token" in error["message"]
    plan = await client.post("/v1/compactgate/plan", json=CHAT)
    assert plan.status_code == 403


async def test_without_a_token_admin_surfaces_answer_this_machine_only(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    for address in ("127.0.0.1", "::1", "::ffff:127.0.0.1"):
        async with client_at(gw, address) as local:
            for path in ADMIN_GETS:
                assert (await local.get(path)).status_code == 200, (address, path)
    async with client_at(gw, "192.0.2.7") as remote:
        await assert_refused(remote)
        # the proxy and the probes are not admin surfaces
        assert (await remote.get("/healthz")).status_code == 200
        assert (await remote.get("/readyz")).status_code == 200
        chat = await remote.post("/v1/chat/completions", json=CHAT)
        assert chat.status_code == 200


async def test_an_empty_admin_token_is_no_token(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """`admin_token: ${ADMIN_TOKEN:-}` with the variable unset must not match a request that
    presents no token."""
    gw = await start_app(config(local_upstream, admin_token="${ADMIN_TOKEN:-}"))
    async with client_at(gw, "192.0.2.7") as remote:
        await assert_refused(remote)
        empty = await remote.get("/metrics", headers={"x-compactgate-admin-token": ""})
        assert empty.status_code == 403
    assert (await gw.http.get(f"{gw.url}/metrics")).status_code == 200  # this machine


async def test_a_token_opens_admin_surfaces_to_whoever_presents_it(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream, admin_token="s3cret-admin"))
    async with client_at(gw, "192.0.2.7") as remote:
        for path in ADMIN_GETS:
            assert (await remote.get(path)).status_code == 401
            token = {"x-compactgate-admin-token": "s3cret-admin"}
            assert (await remote.get(path, headers=token)).status_code == 200


async def test_an_admin_port_without_a_token_is_left_to_its_network(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream, admin_port=9091))
    async with client_at(gw, "192.0.2.7", origin="http://192.0.2.1:9091") as remote:
        assert (await remote.get("/metrics")).status_code == 200
    async with client_at(gw, "192.0.2.7", origin="http://gateway:9091") as by_name:
        refused = await by_name.get("/metrics")  # a name: what a rebinding page would send
        assert refused.status_code == 403 and refused.json()["error"]["code"] == "host_not_allowed"
    named = await start_app(config(local_upstream, admin_port=9091, allowed_hosts=["gateway"]))
    async with client_at(named, "192.0.2.7", origin="http://gateway:9091") as by_name:
        assert (await by_name.get("/metrics")).status_code == 200


def test_startup_warning_says_who_reaches_the_admin_surfaces() -> None:
    assert exposure_warning(ServerConfig(), "127.0.0.1") is None
    assert exposure_warning(ServerConfig(admin_token="t"), "0.0.0.0") is None
    beyond = exposure_warning(ServerConfig(), "0.0.0.0")
    assert beyond is not None and "only clients on this machine" in beyond
    assert "server.admin_token" in beyond
    port = exposure_warning(ServerConfig(admin_port=9091), "0.0.0.0")
    assert port is not None and "9091 without a token" in port
    assert exposure_warning(ServerConfig(admin_port=9091), "127.0.0.1") is None
    empty = exposure_warning(ServerConfig(admin_token=""), "127.0.0.1")
    assert empty is not None and "admin_token is empty" in empty


def this_machines_other_address() -> str | None:
    """An address of this machine other than loopback (the route to a documentation-only
    address; no packet is sent), or None without one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_a_real_server_on_every_interface_refuses_other_machines_and_says_so(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    address = this_machines_other_address()
    if address is None:
        pytest.skip("this machine has no address besides loopback")
    gw = start_gateway(config(fake_upstream), args=("--host", "0.0.0.0"))
    outside = f"http://{address}:{gw.port}"
    refused = httpx.get(outside + "/metrics", timeout=20)
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "admin_token_required"
    assert httpx.get(outside + "/healthz", timeout=20).status_code == 200
    assert httpx.get(gw.url + "/metrics", timeout=20).status_code == 200  # loopback
    assert "only clients on this machine" in gw.output()
