"""Operator surfaces: the event feed, the overview behind `/ui`, the page, and who may reach them.

`/metrics`, `/ui`, `/v1/compactgate/events`, `/v1/compactgate/overview` and
`/v1/compactgate/plan` are admin surfaces. With `server.admin_port` they are served only on that
port (and the proxy only on the main one); with `server.admin_token` they require the token,
presented as `x-compactgate-admin-token: <token>`, or `Authorization: Bearer <token>`, or
`?token=<token>` (so a browser can open `/ui`), looked for in that order: the first one present
is the one compared. A browser (a request that accepts HTML) refused for want of the token gets
a page saying how to pass it; API clients get the JSON error. The plan endpoint also runs `auth`
(it acts for a tenant), so with gateway keys configured its `Authorization` carries the caller's
key and the admin token travels in `x-compactgate-admin-token`, a header the gateway never
forwards upstream. Health checks stay open on both ports for probes.

Without a token nothing is opened silently: on the main port the admin surfaces answer only
clients on this machine (loopback, or a Unix socket), so a laptop or the demo works as before
and anyone else gets a 403 that says how to open them. A separate `admin_port` without a token
is a deliberate choice (its network decides who reaches it) and `serve` warns about it when it
listens beyond loopback. An empty token (`admin_token: ""`, often an unset variable) is no
token: it never matches a request that presents none. Without a token, an admin surface also
needs a Host no DNS-rebinding page can use (`hosts`); no page on another origin reads one (`cors`).
"""

from __future__ import annotations

import asyncio
import hmac
import html
import re
import time
from dataclasses import fields
from functools import cache
from importlib import resources
from string import Template
from typing import Any
from urllib.parse import parse_qs

import orjson
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response

from ..asgi import Scope, Send, header, send_bytes, send_error
from ..config import ServerConfig
from ..errors import (
    AuthenticationError,
    GatewayError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from ..ops.events import EventLog, RequestSample
from ..ops.metrics import Metrics
from ..ops.overview import overview as aggregate
from ..ops.upstream_health import Round, UpstreamHealth
from ..path.windows import Windows
from ..routing import Router
from .auth import is_loopback
from .hosts import Hosts

ADMIN_PATHS = frozenset(
    {
        "/metrics",
        "/ui",
        "/v1/compactgate/events",
        "/v1/compactgate/overview",
        "/v1/compactgate/plan",
    }
)
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
DURATION = re.compile(r"(\d+(?:\.\d+)?)\s*(s|m|h|d)?")
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
LATEST_REQUESTS = 100  # the request list under the tables
UPSTREAMS_WAIT_S = 0.5  # the overview waits at most this long for a round of upstream checks

ADMIN_TOKEN_HEADER = b"x-compactgate-admin-token"


def refusal(scope: Scope, server: ServerConfig, hosts: Hosts) -> GatewayError | None:
    """Why this request may not reach its path here (404, 401 or 403); None when it may.
    Without an admin token, an admin surface also needs a Host no rebinding page can use
    (`hosts`, design D16.7): the token is what a rebinding page cannot present."""
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
            "`x-compactgate-admin-token: <token>` (or `Authorization: Bearer <token>`), or, "
            "from a browser, add `?token=<token>` to the address.",
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
    return hosts.refusal(scope)


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
            "them. Keep the port inside a trusted network, or set server.admin_token; reached "
            "by a host name (not an address), list it in server.allowed_hosts."
        )
    if is_loopback(host) and not empty:
        return None
    return (
        f"{empty}no admin token: admin surfaces (/metrics, /ui, events, plan) answer only "
        "clients on this machine; others get 403. Set server.admin_token (or "
        "server.admin_port) to reach them from elsewhere, e.g. for a Prometheus scrape."
    )


async def send_refusal(send: Send, scope: Scope, error: GatewayError) -> None:
    """The refusal as a page for a browser missing the admin token, else as the JSON error."""
    if isinstance(error, AuthenticationError) and _wants_html(scope):
        presented = presented_token(scope) is not None
        body = _token_page(scope["path"], presented).encode()
        headers = [(b"cache-control", b"no-store")]
        await send_bytes(send, error.status, body, headers, b"text/html; charset=utf-8")
        return
    await send_error(send, error)


def _wants_html(scope: Scope) -> bool:
    """A browser's navigation: GET with an Accept that names text/html (API clients do not)."""
    accept = header(scope, b"accept") or b""
    return scope.get("method") == "GET" and b"text/html" in accept.lower()


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


# -- the JSON feeds -----------------------------------------------------------------------------


def _bad_request(message: str, param: str) -> Response:
    error = InvalidRequestError(message, param=param)
    return Response(error.body(), status_code=error.status, media_type="application/json")


class AdminViews:
    """The admin surfaces' feeds and page (behind the gate above): what they read is passed in."""

    def __init__(
        self,
        events: EventLog,
        metrics: Metrics,
        router: Router,
        windows: Windows,
        upstreams: UpstreamHealth,
    ) -> None:
        self._events = events
        self._metrics = metrics
        self._router = router
        self._windows = windows
        self._upstreams = upstreams

    async def events(self, request: Request) -> Response:
        return await events(self._events, request)

    async def overview(self, request: Request) -> Response:
        upstreams = await self._upstreams.report(UPSTREAMS_WAIT_S)
        return await overview(self._events, self._metrics, self.windows(), upstreams, request)

    async def ui(self, request: Request) -> Response:
        return await ui(request)

    def windows(self) -> list[dict[str, Any]]:
        return windows(self._router, self._windows)


async def events(log: EventLog, request: Request) -> Response:
    """GET /v1/compactgate/events?limit=50&after=<seq>: latest events and running totals."""
    try:
        limit = min(500, max(1, int(request.query_params.get("limit", "50"))))
        after = int(request.query_params.get("after", "0"))
    except ValueError:
        return _bad_request("limit and after must be integers.", "limit")
    return JSONResponse(log.snapshot(limit=limit, after=after))


def parse_range(text: str) -> float | None:
    """`all` (None: everything kept), or a duration: `90` or `90s`, `5m`, `1h`, `2d`."""
    if text == "all":
        return None
    match = DURATION.fullmatch(text.strip().lower())
    seconds = float(match[1]) * UNITS[match[2] or "s"] if match else 0.0
    if not 0 < seconds < float("inf"):
        raise InvalidRequestError(
            f"range must be `all` or a duration such as 90s, 5m, 1h or 24h; got {text!r}.",
            param="range",
        )
    return seconds


async def overview(
    log: EventLog,
    metrics: Metrics,
    model_windows: list[dict[str, Any]],
    upstreams: Round | None,
    request: Request,
) -> Response:
    """GET /v1/compactgate/overview?range=1h: what `/ui` shows, for the last `range`.

    Per model, per wire API and per tenant: requests, rate, errors by reason, p50/p99 latency
    and the gateway's own overhead, compaction, retries, internal rounds and cost; the cost
    totals; then, since start, the summary cache and the summariser; the learned windows; the
    latest requests and compaction events of the range; each model's upstream reachability.
    """
    text = request.query_params.get("range", "1h")
    try:
        range_s = parse_range(text)
    except InvalidRequestError as error:
        return _bad_request(error.message, "range")
    now = time.time()
    kept = list(log.requests)  # copies: requests finishing meanwhile append to the log
    # Tens of milliseconds for a full log: off the event loop, so requests are not held up.
    view = await asyncio.to_thread(
        aggregate, kept, list(log.spend), now=now, range_s=range_s, covered_from=log.covered_from()
    )
    since = view.since or 0.0
    recent = [s for s in kept[-LATEST_REQUESTS:] if s.ts >= since]
    feed = log.snapshot(limit=50, since=since)
    body = {
        "range": text,
        "now": round(now, 3),
        "overview": view,
        "since_start": feed["totals"],
        "summaries": summaries(metrics),
        "windows": model_windows,
        "upstreams": upstreams.view() if upstreams is not None else None,
        "requests": [sample_view(s) for s in reversed(recent)],
        "events": feed["events"],
        "kept": {"requests": len(log.requests), "limit": log.requests.maxlen},
    }
    return Response(
        orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS), media_type="application/json"
    )


def sample_view(sample: RequestSample) -> dict[str, Any]:
    """A request sample with what the page derives from it."""
    return {
        **{field.name: getattr(sample, field.name) for field in fields(sample)},
        "overhead_ms": round(sample.overhead_ms, 3),
        "tokens_saved": sample.tokens_saved,
        "context_error_avoided": sample.recovered,
    }


def summaries(metrics: Metrics) -> dict[str, Any]:
    """The summary cache and the summariser since start, read from the process's own counters
    (the numbers `/metrics` exports)."""
    cache_hits = cache_misses = 0.0
    for metric in metrics.summary_cache.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                if sample.labels.get("result") == "hit":
                    cache_hits += sample.value
                else:
                    cache_misses += sample.value
    calls: dict[str, int] = {}
    for metric in metrics.summarizer_calls.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                outcome = sample.labels.get("outcome", "")
                calls[outcome] = calls.get(outcome, 0) + int(sample.value)
    seconds = count = 0.0
    for metric in metrics.summarizer_seconds.collect():
        for sample in metric.samples:
            if sample.name.endswith("_sum"):
                seconds = sample.value
            elif sample.name.endswith("_count"):
                count = sample.value
    lookups = cache_hits + cache_misses
    ok = calls.get("ok", 0)
    failed = sum(calls.values()) - ok - calls.get("cancelled", 0)
    if not calls:
        health = "idle"
    elif failed == 0:
        health = "healthy"
    elif ok == 0:
        health = "failing"
    else:
        health = "degraded"
    return {
        "cache_hits": int(cache_hits),
        "cache_misses": int(cache_misses),
        "cache_hit_rate": cache_hits / lookups if lookups else None,
        "calls": calls,
        "failed_calls": failed,
        "mean_ms": round(seconds / count * 1000, 1) if count else None,
        "health": health,
    }


def windows(router: Router, known: Windows) -> list[dict[str, Any]]:
    """Each model's context window: configured (or looked up), learnt from upstream errors, and
    the one the gateway uses."""
    rows = []
    routes = {route.name: route for route in router.routes()}
    for name in known.learned:
        if name not in routes and (route := router.resolve(name)) is not None:
            routes[name] = route
    for name, route in routes.items():
        rows.append(
            {
                "model": name,
                "configured": route.context_window,
                "source": route.window_source,
                "learned": known.learned.get(name),
                "effective": known.effective(route),
            }
        )
    return rows


# -- the pages ----------------------------------------------------------------------------------


def _static(name: str) -> str:
    return resources.files("gateway").joinpath(f"static/{name}").read_text(encoding="utf-8")


@cache
def _page() -> str:
    """ui.html with its stylesheet and script inlined: one response, nothing fetched besides
    the JSON feed, and no file served outside the admin paths."""
    style = f"<style>\n{_static('ui.css')}</style>"
    script = f"<script>\n{_static('ui.js')}</script>"
    page = _static("ui.html").replace('<link rel="stylesheet" href="ui.css">', style)
    return page.replace('<script src="ui.js"></script>', script)


def _token_page(path: str, presented: bool) -> str:
    problem = (
        "The token given is not this gateway's admin token."
        if presented
        else "This page needs the gateway's admin token (<code>server.admin_token</code>)."
    )
    return Template(_static("token.html")).substitute(
        problem=problem, path=html.escape(path, quote=True)
    )


async def ui(request: Request) -> Response:
    return HTMLResponse(_page())
