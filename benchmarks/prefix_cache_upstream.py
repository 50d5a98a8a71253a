"""A fake upstream with a prompt cache: how much of each prompt it has seen before, by prefix.

    python -m benchmarks.prefix_cache_upstream --port 0     # prints "READY <port>"

`POST /<scope>/v1/chat/completions` (or `/v1/chat/completions`, scope "-") answers a small
`chat.completion`, `POST /<scope>/v1/messages` a small Anthropic message, neither streamed.
The prompt is what a chat template would put first to last: the tool definitions, the system
prompt (Messages), then each message, serialised (orjson). It is cut into blocks of
`BLOCK` bytes, each named by a hash chained over every block before it, as vLLM's automatic
prefix caching names its KV blocks: a block is "cached" when a request seen before had the same
prompt up to and including it. A request reads from the cache its leading blocks that are known
and then writes all of its blocks. The usage block reports the cached part as
`prompt_tokens_details.cached_tokens` (chat) or `cache_read_input_tokens` (Messages), bytes / 4.

Two caches are kept side by side, never evicted (a benchmark's traffic fits):

    scope    one per path prefix: a gateway replica given `/<scope>/v1` as its base_url stands
             for a replica with a model server of its own (or a provider that routes each
             replica's traffic to its own cache)
    shared   one for all: a single upstream behind every replica

`GET /stats` gives, per scope and in total, the requests, the prompt bytes, and the bytes each
cache held; `POST /reset` forgets the caches and the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import socket
import sys
from collections import defaultdict
from typing import Any

import orjson
from aiohttp import web

BLOCK = 1024


def blocks(prompt: bytes) -> list[bytes]:
    """The chained names of the prompt's whole blocks."""
    names, previous = [], b""
    for start in range(0, len(prompt) - BLOCK + 1, BLOCK):
        previous = hashlib.blake2b(
            previous + prompt[start : start + BLOCK], digest_size=16
        ).digest()
        names.append(previous)
    return names


def prompt_of(body: dict[str, Any]) -> bytes:
    """Tools, then the system prompt (Messages), then each message."""
    parts = [orjson.dumps(body.get("tools") or []), orjson.dumps(body.get("system") or "")]
    parts += [orjson.dumps(m) for m in body.get("messages") or []]
    return b"".join(parts)


class Caches:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.scoped: dict[str, set[bytes]] = defaultdict(set)
        self.shared: set[bytes] = set()
        self.figures: dict[str, dict[str, int]] = defaultdict(
            lambda: {"requests": 0, "prompt_bytes": 0, "scope_cached": 0, "shared_cached": 0}
        )

    def read(self, scope: str, prompt: bytes) -> int:
        """The bytes of `prompt` the scope's cache held; both caches then hold all of it."""
        names = blocks(prompt)
        own, shared = self.scoped[scope], self.shared
        scope_hits = next((i for i, n in enumerate(names) if n not in own), len(names))
        shared_hits = next((i for i, n in enumerate(names) if n not in shared), len(names))
        own.update(names)
        shared.update(names)
        figures = self.figures[scope]
        figures["requests"] += 1
        figures["prompt_bytes"] += len(prompt)
        figures["scope_cached"] += scope_hits * BLOCK
        figures["shared_cached"] += shared_hits * BLOCK
        return scope_hits * BLOCK

    def stats(self) -> dict[str, Any]:
        total = {"requests": 0, "prompt_bytes": 0, "scope_cached": 0, "shared_cached": 0}
        for figures in self.figures.values():
            for key, value in figures.items():
                total[key] += value
        return {"scopes": dict(self.figures), "total": total}


def build_app() -> web.Application:
    caches = Caches()

    async def complete(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        cached = caches.read(request.match_info.get("scope", "-"), prompt_of(body))
        prompt_tokens = max(1, len(prompt_of(body)) // 4)
        answer = {
            "id": "chatcmpl-prefix-cache",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": body.get("model", "bench"),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "Done."},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": 2,
                "total_tokens": prompt_tokens + 2,
                "prompt_tokens_details": {"cached_tokens": cached // 4},
            },
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def message(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        prompt = prompt_of(body)
        cached = caches.read(request.match_info.get("scope", "-"), prompt)
        answer = {
            "id": "msg_prefix_cache",
            "type": "message",
            "role": "assistant",
            "model": body.get("model", "bench"),
            "content": [{"type": "text", "text": "Done."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": max(1, (len(prompt) - cached) // 4),
                "output_tokens": 2,
                "cache_read_input_tokens": cached // 4,
                "cache_creation_input_tokens": 0,
            },
        }
        return web.Response(body=orjson.dumps(answer), content_type="application/json")

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bench", "object": "model"}]})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(caches.stats())

    async def reset(request: web.Request) -> web.Response:
        caches.reset()
        return web.json_response({"reset": True})

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/{scope}/v1/chat/completions", complete)
    app.router.add_post("/v1/chat/completions", complete)
    app.router.add_post("/{scope}/v1/messages", message)
    app.router.add_post("/v1/messages", message)
    app.router.add_get("/{scope}/v1/models", models)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/stats", stats)
    app.router.add_post("/reset", reset)
    return app


async def serve(port: int) -> None:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    runner = web.AppRunner(build_app(), access_log=None)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    print(f"READY {sock.getsockname()[1]}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
