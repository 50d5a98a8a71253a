"""The Responses WebSocket against HTTP SSE: what a request costs on each transport.

Run: `python -m benchmarks.bench_socket [--rounds 150]`. About a minute; no network.

A gateway process (`compactgate serve`, one worker) in front of the test suite's fake upstream,
both started here. An agent loop like Codex's (instructions, then tool calls with ~3 000-character
outputs, the conversation one step longer each request, back to the start every 16) is sent
three ways, interleaved so that all see the machine in the same state:

    http          POST /v1/responses, streamed, the whole conversation each time (keep-alive)
    socket        one WebSocket, `response.create` with the whole conversation each time
    socket+prev   one WebSocket, `previous_response_id` and only the new items (what Codex
                  sends): the gateway rebuilds the conversation from the socket's memory

Timed by the client from sending the request to reading `response.completed` (so the client
libraries' own costs, httpx's and websockets', are in it). Printed: p50 and p90 per transport,
and each one's p50 over http's (the socket should cost no more than HTTP: <= 1.1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import ClientConnection, connect

STEPS = 16
INSTRUCTIONS = "You are a coding agent. " * 200


def step_items(step: int) -> list[dict[str, Any]]:
    """One tool round: the call and its ~3 000-character output."""
    call_id = f"call_{step}"
    output = "\n".join(f"src/module_{step}.py:{n}: value = compute({n})" for n in range(90))
    return [
        {"type": "function_call", "call_id": call_id, "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": output},
    ]


def conversation(steps: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "Fix it."}]
    for step in range(steps):
        items += step_items(step)
    return items


def start(argv: list[str], ready: str, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 60
    for line in process.stdout:
        found = re.search(ready, line)
        if found:
            return process, found.group(1)
        if time.monotonic() > deadline:
            break
    process.kill()
    raise RuntimeError(f"{argv} did not start")


async def until_completed(socket: ClientConnection) -> dict[str, Any]:
    while True:
        frame = json.loads(await socket.recv())
        if frame["type"] in ("response.completed", "error"):
            assert frame["type"] == "response.completed", frame
            return frame["response"]


async def http_request(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> None:
    async with client.stream("POST", url, json={**body, "stream": True}) as response:
        assert response.status_code == 200
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"response.completed"' in line:
                return
    raise AssertionError("no response.completed")


async def measure(port: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"http": [], "socket": [], "socket+prev": []}
    base = {"model": "m", "instructions": INSTRUCTIONS, "store": False}
    url = f"http://127.0.0.1:{port}/v1/responses"
    socket_url = f"ws://127.0.0.1:{port}/v1/responses"
    headers = {"authorization": "Bearer sk-bench"}
    async with (
        httpx.AsyncClient(headers=headers, timeout=30) as client,
        connect(socket_url, additional_headers=headers, max_size=None) as full,
        connect(socket_url, additional_headers=headers, max_size=None) as incremental,
    ):
        previous: str | None = None
        for round_ in range(rounds):
            steps = round_ % STEPS
            body = {**base, "input": conversation(steps)}
            started = time.perf_counter()
            await http_request(client, url, body)
            times["http"].append(time.perf_counter() - started)

            started = time.perf_counter()
            await full.send(json.dumps({"type": "response.create", **body}))
            await until_completed(full)
            times["socket"].append(time.perf_counter() - started)

            if steps == 0 or previous is None:
                request = body
            else:
                request = {**base, "previous_response_id": previous, "input": step_items(steps - 1)}
            started = time.perf_counter()
            await incremental.send(json.dumps({"type": "response.create", **request}))
            previous = (await until_completed(incremental))["id"]
            times["socket+prev"].append(time.perf_counter() - started)
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def report(times: dict[str, list[float]]) -> Iterator[str]:
    http = statistics.median(times["http"])
    yield f"{'transport':<12} {'p50 ms':>8} {'p90 ms':>8} {'p50 / http':>11}"
    for name, values in times.items():
        p50, p90 = statistics.median(values), percentile(values, 0.9)
        yield f"{name:<12} {p50 * 1000:8.2f} {p90 * 1000:8.2f} {p50 / http:11.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    fake, fake_port = start(
        [sys.executable, "-m", "tests.fake_upstream", "--port", "0"], r"^READY (\d+)", env
    )
    with tempfile.TemporaryDirectory() as directory:
        config = Path(directory) / "gateway.json"
        model = {"name": "m", "upstream": {"base_url": f"http://127.0.0.1:{fake_port}/v1"}}
        config.write_text(json.dumps({"models": [{**model, "context_window": 1_000_000}]}))
        port = free_port()
        gateway = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(config),
             "--port", str(port), "--log-level", "warning"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        wait_healthy(port)
        try:
            asyncio.run(measure(port, 10))  # warm-up: imports, connections, memo
            for line in report(asyncio.run(measure(port, args.rounds))):
                print(line)
        finally:
            gateway.terminate()
            fake.terminate()
            gateway.wait(10)
            fake.wait(10)
    return 0


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(port: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the gateway did not start")


if __name__ == "__main__":
    sys.exit(main())
