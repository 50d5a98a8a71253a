"""/readyz: ready while the store answers and each model has an upstream that accepts
connections; 503 with the reason otherwise; checked at most once per cache period."""

from __future__ import annotations

import asyncio
import socket

from tests.conftest import Starter
from tests.in_process import AppStarter, LocalUpstream
from tests.redis_server import start_redis

SMALL = [{"role": "user", "content": "hello"}]


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


async def test_readyz_follows_redis_killed_and_restarted_mid_run(
    start_process: Starter, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    redis = start_redis(start_process)
    app = await start_app(
        {
            "store": redis.url,
            "server": {"readiness_cache_s": 0},
            "models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}],
        }
    )
    ready = await app.http.get(f"{app.url}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}

    redis.stop()
    down = await app.http.get(f"{app.url}/readyz")
    assert down.status_code == 503
    assert down.json()["status"] == "not ready"
    [reason] = down.json()["reasons"]
    assert reason.startswith("store: not answering")
    assert "127.0.0.1" not in reason  # hosts go to the log, not to an open endpoint
    assert "not ready: store:" in app.logs()
    # Requests are still served without the store (no cache): only readiness says it.
    reply = await app.openai().chat.completions.create(model="m", messages=SMALL)
    assert reply.choices[0].message.content

    start_redis(start_process, port=redis.port)
    assert (await app.http.get(f"{app.url}/readyz")).status_code == 200


async def test_a_model_without_a_reachable_upstream_is_not_ready(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    dead = dead_url()
    config = {
        "models": [
            {"name": "alive", "upstream": {"base_url": local_upstream.base_url}},
            {
                "name": "half",
                "upstreams": [{"base_url": dead}, {"base_url": local_upstream.base_url}],
            },
            {"name": "gone", "upstream": {"base_url": dead}},
        ]
    }
    app = await start_app(config)
    response = await app.http.get(f"{app.url}/readyz")
    assert response.status_code == 503
    assert response.json()["reasons"] == [
        "model gone: none of its 1 upstream(s) accepts connections (connection refused)"
    ]

    config["server"] = {"readiness_upstreams": False}
    relaxed = await start_app(config)
    assert (await relaxed.http.get(f"{relaxed.url}/readyz")).status_code == 200


async def test_probes_within_the_cache_period_make_one_check(start_app: AppStarter) -> None:
    connections = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        app = await start_app(
            {
                "server": {"readiness_cache_s": 60},
                "models": [{"name": "m", "upstream": {"base_url": f"http://127.0.0.1:{port}/v1"}}],
            }
        )
        answers = await asyncio.gather(*(app.http.get(f"{app.url}/readyz") for _ in range(10)))
        answers += [await app.http.get(f"{app.url}/readyz") for _ in range(5)]
        assert {a.status_code for a in answers} == {200}
        await asyncio.sleep(0.05)
        assert connections == 1
