"""Operator surfaces: the event feed, the `/ui` page, and who may reach them.

`/metrics`, `/ui`, `/v1/compactgate/events` and `/v1/compactgate/plan` are admin surfaces. With
`server.admin_port` they are served only on that port (and the proxy only on the main one);
with `server.admin_token` they require the token, presented as `x-compactgate-admin-token:
<token>`, or `Authorization: Bearer <token>`, or `?token=<token>` (so a browser can open `/ui`),
looked for in that order: the first one present is the one compared. The plan endpoint also
runs `auth` (it acts for a tenant), so with gateway keys configured its `Authorization` carries
the caller's key and the admin token travels in `x-compactgate-admin-token`, a header the
gateway never forwards upstream. Health checks stay open on both ports for probes.

Without a token nothing is opened silently: on the main port the admin surfaces answer only
clients on this machine (loopback, or a Unix socket), so a laptop or the demo works as before
and anyone else gets a 403 that says how to open them. A separate `admin_port` without a token
is a deliberate choice (its network decides who reaches it) and `serve` warns about it when it
listens beyond loopback. An empty token (`admin_token: ""`, often an unset variable) is no
token: it never matches a request that presents none.
"""

from __future__ import annotations

import hmac
from functools import cache
from importlib import resources
from urllib.parse import parse_qs

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from .asgi import Scope, header
from .auth import is_loopback
from .config import ServerConfig
from .errors import AuthenticationError, GatewayError, NotFoundError, PermissionDeniedError

ADMIN_PATHS = frozenset({"/metrics", "/ui", "/v1/compactgate/events", "/v1/compactgate/plan"})
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


ADMIN_TOKEN_HEADER = b"x-compactgate-admin-token"


def refusal(scope: Scope, server: ServerConfig) -> GatewayError | None:
    """Why this request may not reach its path here (404 or 401); None when it may."""
    path = scope["path"]
    if path in OPEN_PATHS:
        return None
    admin = path in ADMIN_PATHS
    if server.admin_port is not None:
        port = (scope.get("server") or (None, None))[1]
        if admin != (port == server.admin_port):
            return NotFoundError("Not found.")
    if not admin:
        return None
    token = admin_token(server)
    if token is not None:
        if _token_ok(scope, token):
            return None
        return AuthenticationError(
            "This admin surface needs the admin token: send it as "
            "`x-compactgate-admin-token: <token>` (or `Authorization: Bearer <token>`).",
            code="invalid_admin_token",
        )
    if server.admin_port is None and not _from_this_machine(scope):
        return PermissionDeniedError(
            "Admin surfaces (/metrics, /ui, events, plan) answer only clients on the gateway's "
            "own machine while no admin token is set. To reach them from elsewhere, set "
            "server.admin_token and send it as `x-compactgate-admin-token: <token>`, or serve "
            "them on a port of their own with server.admin_port.",
            code="admin_token_required",
        )
    return None


def admin_token(server: ServerConfig) -> str | None:
    """The configured admin token; an empty one (often an unset variable) is none."""
    token = server.admin_token
    return token if token and token.strip() else None


def _from_this_machine(scope: Scope) -> bool:
    client = scope.get("client")
    return client is None or is_loopback(str(client[0]))  # None: a Unix socket


def exposure_warning(server: ServerConfig, host: str) -> str | None:
    """The start-up warning about who can reach the admin surfaces, or None."""
    if admin_token(server) is not None:
        return None
    empty = (
        "server.admin_token is empty (an unset variable?), so there is no admin token. "
        if server.admin_token is not None
        else ""
    )
    if server.admin_port is not None:
        if is_loopback(host):
            return empty or None
        return (
            f"{empty}admin surfaces (/metrics, /ui, events, plan) are served on port "
            f"{server.admin_port} without a token: anyone who can reach that port can read "
            "them. Keep the port inside a trusted network, or set server.admin_token."
        )
    if is_loopback(host) and not empty:
        return None
    return (
        f"{empty}no admin token: admin surfaces (/metrics, /ui, events, plan) answer only "
        "clients on this machine; others get 403. Set server.admin_token (or "
        "server.admin_port) to reach them from elsewhere, e.g. for a Prometheus scrape."
    )


def _token_ok(scope: Scope, expected: str) -> bool:
    return hmac.compare_digest(presented_token(scope) or b"", expected.encode())


def presented_token(scope: Scope) -> bytes | None:
    """The admin token the request presents: its own header, else a bearer token, else ?token=."""
    value = header(scope, ADMIN_TOKEN_HEADER)
    if value is not None:
        return value.strip()
    value = header(scope, b"authorization")
    if value and value[:7].lower() == b"bearer ":
        return value[7:].strip()
    if scope.get("query_string"):
        tokens = parse_qs(scope["query_string"].decode("latin-1")).get("token")
        if tokens:
            return tokens[0].encode()
    return None


async def events(request: Request) -> Response:
    """GET /v1/compactgate/events?limit=50&after=<seq>: latest events and running totals."""
    log = request.app.state.gateway.events
    try:
        limit = min(500, max(1, int(request.query_params.get("limit", "50"))))
        after = int(request.query_params.get("after", "0"))
    except ValueError:
        body = {
            "error": {
                "message": "limit and after must be integers.",
                "type": "invalid_request_error",
                "param": "limit",
                "code": None,
            }
        }
        return JSONResponse(body, status_code=400)
    return JSONResponse(log.snapshot(limit=limit, after=after))


@cache
def _page() -> str:
    return resources.files("gateway").joinpath("static/ui.html").read_text(encoding="utf-8")


async def ui(request: Request) -> Response:
    return HTMLResponse(_page())
