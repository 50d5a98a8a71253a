"""/readyz says whether this replica can serve (design D17.5): 503 with the reason while it
drains or its Redis store does not answer, and never for an upstream; each model's upstream
reachability is detail in /healthz, the overview and a gauge. Checked at most once per cache
period."""

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


async def test_one_models_dead_upstream_leaves_the_replica_ready_and_healthz_says_which(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """Regression: with one of two models' upstream down, /readyz was 503, so behind a load
    balancer every replica left the pool and the healthy model went down with it."""
    dead = dead_url()
    config = {
        "server": {"readiness_cache_s": 0},
        "models": [
            {"name": "alive", "upstream": {"base_url": local_upstream.base_url}},
            {
                "name": "half",
                "upstreams": [{"base_url": dead}, {"base_url": local_upstream.base_url}],
            },
            {"name": "gone", "upstream": {"base_url": dead}},
        ],
    }
    app = await start_app(config)
    ready = await app.http.get(f"{app.url}/readyz")
    assert ready.status_code == 200 and ready.json() == {"status": "ready"}
    health = await app.http.get(f"{app.url}/healthz")
    assert health.status_code == 200
    models = health.json()["upstreams"]["models"]
    assert models["gone"] == {"reachable": False, "upstreams": 1, "down": ["connection refused"]}
    assert models["half"] == {"reachable": True, "upstreams": 2, "down": ["connection refused"]}
    assert models["alive"] == {"reachable": True, "upstreams": 1}
    assert "127.0.0.1" not in health.text  # hosts go to the log, not to an open endpoint
    assert "model gone: no upstream accepts connections (127.0.0.1:" in app.logs()
    overview = (await app.http.get(f"{app.url}/v1/compactgate/overview")).json()
    assert overview["upstreams"]["models"]["gone"]["reachable"] is False
    gauges = (await app.http.get(f"{app.url}/metrics")).text
    assert 'compactgate_upstream_reachable{model="gone"} 0.0' in gauges
    assert 'compactgate_upstream_reachable{model="alive"} 1.0' in gauges
    # The healthy model is served meanwhile, the dead one answers its own 502.
    reply = await app.openai().chat.completions.create(model="alive", messages=SMALL)
    assert reply.choices[0].message.content

    config["server"] = {"readiness_upstreams": False}
    unchecked = await start_app(config)
    assert "upstreams" not in (await unchecked.http.get(f"{unchecked.url}/healthz")).json()


async def test_a_draining_replica_is_not_ready(start_app: AppStarter) -> None:
    app = await start_app({"server": {"readiness_cache_s": 60}})
    assert (await app.http.get(f"{app.url}/readyz")).status_code == 200
    app.app.core.readiness.drain()  # what SIGTERM does under `serve`
    down = await app.http.get(f"{app.url}/readyz")
    assert down.status_code == 503  # at once, whatever the cache says
    assert down.json() == {
        "status": "not ready",
        "reasons": ["draining: the server is shutting down"],
    }
    assert (await app.http.get(f"{app.url}/healthz")).status_code == 200  # alive all the same


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
        answers = await asyncio.gather(*(app.http.get(f"{app.url}/healthz") for _ in range(10)))
        answers += [await app.http.get(f"{app.url}/healthz") for _ in range(5)]
        assert {a.status_code for a in answers} == {200}
        await asyncio.sleep(0.05)
        assert connections == 1
