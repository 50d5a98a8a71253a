"""Envoy in front of three gateway replicas: deploy/envoy/envoy.yaml run by the real Envoy
binary (tests/envoy_front.py), the replicas from the CLI sharing a real Redis, the fake upstream
playing the model (`slow`).

- a conversation stays on one replica (ring hash on the agent's session header, else the key the
  gateway returns), conversations spread over the replicas, and the admin surfaces are not
  served through the front;
- a slow SSE stream and the Responses WebSocket pass through;
- a real Codex CLI session (its `session-id` pins it to one replica) finishes although that
  replica is killed (SIGKILL) half-way: Envoy sends the next request to another replica, which
  serves it from the same store.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from tests.agent_runs import FINAL, agent, agent_config, run_codex, shell_steps
from tests.conftest import GatewayProcess, GatewayStarter, Starter
from tests.envoy_front import EnvoyFront, start_envoy
from tests.fake_upstream import FakeUpstream
from tests.redis_server import start_redis

pytestmark = pytest.mark.slow


def requests_served(gateway: GatewayProcess) -> float:
    """Requests this replica answered, from its own /metrics (read on its loopback port)."""
    text = httpx.get(f"{gateway.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("compactgate_requests_total{")
    )


def model_calls(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [r for r in fake.requests() if r["path"] == "/v1/responses"]


def replicas_behind_envoy(
    start_gateway: GatewayStarter,
    start_process: Starter,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
    config: dict[str, Any],
) -> tuple[list[GatewayProcess], EnvoyFront]:
    redis = start_redis(start_process)
    replicas = [start_gateway({**config, "store": redis.url}) for _ in range(3)]
    return replicas, start_envoy(start_process, tmp_path, [g.port for g in replicas])


def test_conversations_stick_to_a_replica_and_streams_pass_through(
    start_gateway: GatewayStarter,
    start_process: Starter,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    config = agent_config(fake_upstream.base_url, 100_000)
    replicas, front = replicas_behind_envoy(
        start_gateway, start_process, fake_upstream, tmp_path, config
    )
    client = openai.OpenAI(base_url=front.base_url, api_key="sk-envoy", max_retries=0)

    def served() -> list[float]:
        return [requests_served(r) for r in replicas]

    # One agent session: every turn on the same replica.
    before = served()
    for turn in range(6):
        client.responses.create(
            model="m", input=f"turn {turn}", extra_headers={"session-id": "codex-session-1"}
        )
    after = served()
    assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 0, 6]

    # Without a session header: the key the gateway returned, echoed back, keeps it together.
    first = client.chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "plain client"}]
    )
    conversation = first.headers["x-compactgate-conversation"]
    before = served()
    for _ in range(4):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "plain client"}],
            extra_headers={"x-compactgate-conversation": conversation},
        )
    assert sorted(a - b for a, b in zip(served(), before, strict=True)) == [0, 0, 4]

    # Many sessions spread over the replicas.
    before = served()
    for session in range(24):
        client.responses.create(
            model="m", input="hi", extra_headers={"session-id": f"session-{session}"}
        )
    assert sum(a > b for a, b in zip(served(), before, strict=True)) >= 2

    # Admin surfaces are reached on each replica, never through the front.
    plan = httpx.post(f"{front.base_url}/compactgate/plan", json={}, timeout=10)
    assert plan.status_code == 404
    assert httpx.get(f"{front.url}/metrics", timeout=10).status_code == 404

    # A stream that takes seconds passes through whole.
    fake_upstream.script(
        [{"kind": "slow_stream", "content": "a b c d e f", "chunks": 6, "interval": 0.5}]
    )
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "stream"}], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "a b c d e f"

    # The Responses WebSocket upgrades through the front.
    import asyncio

    async def over_the_socket() -> dict[str, Any]:
        async with connect(
            f"ws://127.0.0.1:{front.port}/v1/responses",
            additional_headers={"authorization": "Bearer sk-envoy", "session-id": "ws-1"},
        ) as socket:
            request = {"type": "response.create", "model": "m", "input": "over ws", "stream": True}
            await socket.send(json.dumps(request))
            while True:
                frame = json.loads(await asyncio.wait_for(socket.recv(), 30))
                if frame["type"] in ("response.completed", "response.failed", "error"):
                    return frame

    assert asyncio.run(over_the_socket())["type"] == "response.completed"


def test_a_codex_session_finishes_although_its_replica_is_killed(
    start_gateway: GatewayStarter,
    start_process: Starter,
    fake_upstream: FakeUpstream,
    tmp_path: Path,
) -> None:
    agent("codex")
    window = 24_000
    config = agent_config(fake_upstream.base_url, window)
    replicas, front = replicas_behind_envoy(
        start_gateway, start_process, fake_upstream, tmp_path, config
    )
    steps = 8
    fake_upstream.configure({"context_limit": window})
    fake_upstream.script(
        [
            # Each command takes a second: the replica is killed while Codex runs one, when
            # no request is in flight (one in flight would fail whatever the front does).
            *shell_steps(steps, "sleep 1; seq {step}000 {step}999 | head -1600", True),
            {"kind": "ok", "content": FINAL},
        ]
    )
    through_envoy = GatewayProcess(front.process, front.port, tmp_path / "none")
    outcome: dict[str, Any] = {}

    def session() -> None:
        try:
            outcome["output"] = run_codex(through_envoy, tmp_path, "", timeout=240)
        except BaseException as error:  # reported by the test below
            outcome["error"] = error

    runner = threading.Thread(target=session)
    runner.start()
    deadline = time.monotonic() + 120
    while True:  # half-way, once the replica has relayed every answer so far
        calls = len(model_calls(fake_upstream))
        serving = [r for r in replicas if requests_served(r) > 0]  # the session's one replica
        if calls >= steps // 2 and len(serving) == 1 and requests_served(serving[0]) == calls:
            break
        assert time.monotonic() < deadline and runner.is_alive(), outcome
        time.sleep(0.05)
    [serving_replica] = serving
    serving_replica.process.popen.kill()
    killed_at = len(model_calls(fake_upstream))
    runner.join(240)

    assert "error" not in outcome, outcome.get("error")
    events = [json.loads(line) for line in outcome["output"].splitlines() if line.startswith("{")]
    assert any(FINAL in json.dumps(e) for e in events), outcome["output"][-3000:]
    survivors = [r for r in replicas if r is not serving_replica]
    later = len(model_calls(fake_upstream)) - killed_at
    assert later >= 2  # the rest of the session ...
    assert sum(requests_served(r) for r in survivors) >= later  # ... went to the other replicas
    for replica in survivors:
        assert replica.output().count("status=400") == 0, replica.output()[-3000:]
    # Codex never saw the replica go: the front retried the refused connection elsewhere.
    stats = front.stats()
    print(f"envoy retried {stats['cluster.compactgate.upstream_rq_retry']} request(s)")
    assert stats["http.gateway.downstream_rq_5xx"] == 0
