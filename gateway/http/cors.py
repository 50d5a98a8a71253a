"""Browser access (CORS): which web pages may call the gateway, and their preflight requests.

The rule this module keeps: a request from a page whose origin `server.cors_origins` does not
allow is refused (403) before anything else reads it, so a site the user happens to visit can
neither read answers through the gateway nor spend its upstream key blindly. A request with no
`Origin` (every SDK, curl, an agent) or from the gateway's own origin (the `/ui` page) is not a
cross-origin request and passes untouched; so does every request when `*` is allowed.

Preflights (`OPTIONS` with `Access-Control-Request-Method`) are answered here on every path,
the compacting endpoints included: 200 with the allowed methods and the requested headers for an
allowed origin, 400 naming what was refused otherwise. Answers to an allowed origin carry
`Access-Control-Allow-Origin` and expose every response header (the `x-compactgate-*` ones,
the upstream's rate-limit headers). No credentials mode: API keys travel in headers, never in
cookies.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware

from ..asgi import Receive, Scope, Send, header, send_error
from ..errors import OriginNotAllowedError
from ..ops.logs import clip, log_request, new_request_id, request_fields

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def origin_pattern(origins: Sequence[str]) -> str | None:
    """One regular expression for the configured origins; `scheme://host:*` allows the host on
    any port (and on its scheme's default one). None when no origin is allowed."""
    parts = []
    for origin in origins:
        if origin == "*":
            return ".*"
        if origin.endswith(":*"):
            parts.append(re.escape(origin[:-2]) + r"(:[0-9]{1,5})?")
        else:
            parts.append(re.escape(origin))
    return "|".join(parts) if parts else None


class BrowserAccess:
    """CORS for the allowed origins, 403 for the others (see the module doc), in front of `app`
    for the requests `cross_origin` picks."""

    def __init__(self, app: object, origins: Sequence[str]) -> None:
        self.app = app
        pattern = origin_pattern(origins)
        self.allow_all = pattern == ".*"
        self.allowed = re.compile(pattern) if pattern else None
        self.cors = CORSMiddleware(
            app,  # type: ignore[arg-type]
            allow_origins=("*",) if self.allow_all else (),
            allow_origin_regex=None if self.allow_all else pattern,
            allow_methods=METHODS,
            allow_headers=("*",),
            expose_headers=("*",),
            max_age=600,
        )

    def cross_origin(self, scope: Scope) -> bool:
        """Whether this HTTP request comes from a web page on another origin (it has to go
        through `__call__`); most requests (SDKs, agents) carry no `Origin` at all."""
        origin = header(scope, b"origin")
        return origin is not None and not _same_origin(scope, origin)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A cross-origin request: its preflight answered, else served with CORS headers if the
        origin is allowed, else refused."""
        origin = (header(scope, b"origin") or b"").decode("latin-1")
        preflight = scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method")
        if preflight or self.allows(origin):
            await self.cors(scope, receive, send)
            return
        await self.refuse(scope, send, origin)

    def allows(self, origin: str) -> bool:
        return self.allow_all or (self.allowed is not None and bool(self.allowed.fullmatch(origin)))

    async def refuse(self, scope: Scope, send: Send, origin: str) -> None:
        started = time.perf_counter()
        incoming = header(scope, b"x-request-id")
        request_id = incoming.decode("latin-1") if incoming else new_request_id()
        error = OriginNotAllowedError(
            f"Pages from {origin} may not call this gateway; add the origin to "
            "server.cors_origins to allow it."
        )
        await send_error(send, error, [(b"x-compactgate-request-id", request_id.encode("latin-1"))])
        log_request(
            request_fields(
                request_id=clip(request_id),
                api=api_of(scope["path"]),
                status=error.status,
                reason="origin_not_allowed",
                total_s=time.perf_counter() - started,
            )
        )


def api_of(path: str) -> str:
    """The API a path belongs to, as request lines name it."""
    return {
        "/v1/chat/completions": "chat",
        "/v1/responses": "responses",
        "/v1/messages": "messages",
        "/v1/messages/count_tokens": "count_tokens",
    }.get(path) or _other_api(path)


def _other_api(path: str) -> str:
    if path == "/v1/models" or path.startswith("/v1/models/"):
        return "models"
    return "passthrough" if path.startswith("/v1/") else "other"


def _same_origin(scope: Scope, origin: bytes) -> bool:
    """The page was served by this gateway (its origin's host is the request's Host)."""
    host = header(scope, b"host")
    if host is None:
        return False
    _, _, rest = origin.partition(b"://")
    return rest.lower() == host.lower()
