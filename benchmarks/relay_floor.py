"""The Python floor: a Starlette + aiohttp relay that forwards bytes and does nothing else.

    python -m benchmarks.relay_floor --upstream http://127.0.0.1:9000 --port 0   # "READY <port>"

Served like the gateway (uvicorn, uvloop, httptools, one worker, no access log). A POST's body
is sent to the same path on the upstream through one pooled aiohttp session (chat completions,
Responses and Messages alike, with the client's credential and Anthropic's version and beta
headers); the answer comes back with the upstream's status and content type, streamed chunk by
chunk when it is an event stream. No parsing, no counting, no headers of its own: whatever the
gateway adds on top of this is the gateway's own cost.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
from collections.abc import AsyncIterator

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

FORWARDED = ("authorization", "x-api-key", "anthropic-version", "anthropic-beta")


def build_app(upstream: str) -> Starlette:
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)
        state["session"] = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        try:
            yield
        finally:
            await state["session"].close()

    async def relay(request: Request) -> Response:
        body = await request.body()
        headers = {"content-type": "application/json"}
        for name in FORWARDED:
            value = request.headers.get(name)
            if value is not None:
                headers[name] = value
        session = state["session"]
        response = await session.post(upstream + request.url.path, data=body, headers=headers)
        content_type = response.headers.get("content-type", "application/json")
        if content_type.startswith("text/event-stream"):

            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in response.content.iter_any():
                        yield chunk
                finally:
                    response.release()

            return StreamingResponse(chunks(), status_code=response.status, media_type=content_type)
        data = await response.read()
        response.release()
        return Response(data, status_code=response.status, media_type=content_type)

    return Starlette(routes=[Route("/v1/{path:path}", relay, methods=["POST"])], lifespan=lifespan)


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--upstream", required=True, help="upstream origin, e.g. http://127.0.0.1:9000"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    args = parser.parse_args(argv)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    sock.listen(2048)  # listening before READY: a client may connect the moment it reads the line
    print(f"READY {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(
        build_app(args.upstream.rstrip("/")),
        loop="uvloop",
        http="httptools",
        access_log=False,
        log_level="warning",
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
