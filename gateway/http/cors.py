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

Two exceptions keep browsers away from what they must not reach (design D16.7): the admin
surfaces (`admin.ADMIN_PATHS`) never answer a page on another origin, whatever origins are
allowed (a page on `http://localhost:3000` must not read `/metrics` or the event feed; the
gateway's own `/ui` is same-origin); and a page whose origin is the request's own Host is
same-origin only under a Host `hosts` allows (a DNS-rebinding page's origin is its Host too).
The Responses WebSocket applies the same rule before its upgrade (`refusal`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from starlette.middleware.cors import CORSMiddleware

from ..asgi import Receive, Scope, Send, header, send_error
from ..errors import GatewayError, OriginNotAllowedError
from ..ops.logs import clip, log_request, new_request_id, request_fields
from .admin import ADMIN_PATHS
from .hosts import Hosts

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


class Origins:
    """Which web pages may call the gateway: the configured origins, and its own under a Host
    `hosts` allows."""

    def __init__(self, origins: Sequence[str], hosts: Hosts) -> None:
        self.pattern = origin_pattern(origins)
        self.allow_all = self.pattern == ".*"
        self._allowed = re.compile(self.pattern) if self.pattern else None
        self.hosts = hosts

    def allows(self, origin: str) -> bool:
        return self.allow_all or (
            self._allowed is not None and bool(self._allowed.fullmatch(origin))
        )

    def cross_origin(self, scope: Scope) -> bool:
        """Whether this HTTP request comes from a web page on another origin (it has to go
        through `BrowserAccess`); most requests (SDKs, agents) carry no `Origin` at all. On an
        admin path the Host is the admin gate's to judge (`admin.refusal`)."""
        origin = header(scope, b"origin")
        if origin is None:
            return False
        if not _same_origin(scope, origin):
            return True
        return scope["path"] not in ADMIN_PATHS and not self.hosts.allows(header(scope, b"host"))

    def refusal(self, scope: Scope) -> GatewayError | None:
        """Why a browser may not open a socket here (None: it may, or it is no browser): its
        origin is neither allowed nor this gateway's own, or it came by a Host no browser may
        use. Browsers send `Origin` with every WebSocket upgrade."""
        origin = header(scope, b"origin")
        if origin is None:
            return None
        text = origin.decode("latin-1")
        if not (self.allows(text) or _same_origin(scope, origin)):
            return _refused(text)
        return self.hosts.refusal(scope)


class BrowserAccess:
    """CORS for the allowed origins, 403 for the others (see the module doc), in front of `app`
    for the requests `Origins.cross_origin` picks."""

    def __init__(self, app: object, origins: Origins) -> None:
        self.app = app
        self.origins = origins
        self.cors = CORSMiddleware(
            app,  # type: ignore[arg-type]
            allow_origins=("*",) if origins.allow_all else (),
            allow_origin_regex=None if origins.allow_all else origins.pattern,
            allow_methods=METHODS,
            allow_headers=("*",),
            expose_headers=("*",),
            max_age=600,
        )

    def cross_origin(self, scope: Scope) -> bool:
        return self.origins.cross_origin(scope)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A cross-origin request: its preflight answered, else served with CORS headers if the
        origin is allowed, else refused; never served on an admin path."""
        origin = (header(scope, b"origin") or b"").decode("latin-1")
        preflight = scope["method"] == "OPTIONS" and header(scope, b"access-control-request-method")
        if scope["path"] in ADMIN_PATHS:
            await self.refuse(scope, send, origin)
            return
        if preflight or self.origins.allows(origin):
            await self.cors(scope, receive, send)
            return
        await self.refuse(scope, send, origin)

    async def refuse(self, scope: Scope, send: Send, origin: str) -> None:
        started = time.perf_counter()
        incoming = header(scope, b"x-request-id")
        request_id = incoming.decode("latin-1") if incoming else new_request_id()
        error = _refused(origin)
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


def _refused(origin: str) -> OriginNotAllowedError:
    return OriginNotAllowedError(
        f"Pages from {origin[:200]} may not call this gateway; add the origin to "
        "server.cors_origins to allow it (admin surfaces answer no other origin's page)."
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
