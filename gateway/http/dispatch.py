"""The HTTP doors put together: which handler answers which path, and what every request meets
on its way there (browser access, the admin gate), in that order.

The compacting endpoints (`endpoints.py`) are plain ASGI apps reached straight from here, by
path; every other path goes through Starlette's router (models, plan, probes, admin feeds and
page, the Responses WebSocket, passthrough of other /v1/* paths). Errors the router itself
makes (no such path, wrong method) and our own errors raised in its handlers are answered from
the one error table, in the client API's shape.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from ..asgi import Receive, Scope, Send
from ..config import ServerConfig
from ..errors import GatewayError, MethodNotAllowedError, RouteNotFoundError
from ..ops.logs import new_request_id
from ..ops.metrics import Metrics
from ..path.accounting import finish
from ..path.exchange import Exchange
from ..wire import CHAT, MESSAGES
from . import admin
from .cors import BrowserAccess, Origins

Handler = Callable[[Request, Exchange], Awaitable[Response]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def logged(
    metrics: Metrics, api: str, handler: Handler
) -> Callable[[Request], Awaitable[Response]]:
    """A Starlette endpoint around `handler` that counts the request and leaves its log line,
    whatever it answers (an error raised is noted, then answered by the error handler)."""

    async def endpoint(request: Request) -> Response:
        exchange = Exchange(request_id=_request_id(request), started=time.perf_counter(), api=api)
        try:
            response = await handler(request, exchange)
            exchange.status = response.status_code
            response.headers["x-compactgate-request-id"] = exchange.request_id
            return response
        except GatewayError as error:
            exchange.failed(error)
            error.headers.setdefault("x-compactgate-request-id", exchange.request_id)
            raise
        except Exception:
            exchange.status, exchange.reason = 500, "internal"
            raise
        finally:
            finish(metrics, exchange, time.perf_counter() - exchange.started)

    return endpoint


def _request_id(request: Request) -> str:
    incoming = request.headers.get("x-request-id")
    return incoming if incoming else new_request_id()


async def _on_gateway_error(request: Request, error: Exception) -> Response:
    """Our error in the client's API's shape: Anthropic's when it sent `anthropic-version`."""
    assert isinstance(error, GatewayError)
    wire = MESSAGES if "anthropic-version" in request.headers else CHAT
    return Response(
        wire.error_body(error),
        status_code=error.status,
        media_type="application/json",
        headers=error.headers,
    )


async def _on_http_error(request: Request, error: Exception) -> Response:
    """The router's own answers (no such path, or not with this method), from the table."""
    problem: GatewayError = RouteNotFoundError("Not found.")
    if getattr(error, "status_code", 404) == 405:
        problem = MethodNotAllowedError(str(getattr(error, "detail", "Method Not Allowed")))
    return Response(problem.body(), status_code=problem.status, media_type="application/json")


class Dispatch:
    """Browser access first (CORS, see cors.py), then the admin gate; the compacting endpoints
    skip Starlette's router; everything else goes through it."""

    def __init__(
        self,
        endpoints: Mapping[str, ASGIApp],
        routes: list[BaseRoute],
        server: ServerConfig,
        origins: Origins,
    ) -> None:
        self.endpoints = endpoints
        self.app = Starlette(
            routes=routes,
            exception_handlers={
                GatewayError: _on_gateway_error,
                404: _on_http_error,
                405: _on_http_error,
            },
        )
        self.server = server
        self.hosts = origins.hosts
        self.browser = BrowserAccess(self.dispatch, origins)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.browser.cross_origin(scope):
            await self.browser(scope, receive, send)  # then dispatch, if it may go on
            return
        await self.dispatch(scope, receive, send)

    async def dispatch(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if (refused := admin.refusal(scope, self.server, self.hosts)) is not None:
                await admin.send_refusal(send, scope, refused)
                return
            if scope["method"] == "POST":
                endpoint = self.endpoints.get(scope["path"])
                if endpoint is not None:
                    await endpoint(scope, receive, send)
                    return
        await self.app(scope, receive, send)
