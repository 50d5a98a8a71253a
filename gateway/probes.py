"""GET /healthz, /readyz and /metrics: what an orchestrator and a metrics scraper ask.

Liveness (`/healthz`) is 200 while the process answers, with each model's upstream
reachability as detail (`upstream_health`; never waited on for long: a liveness probe that
times out restarts a healthy process). Readiness (`/readyz`) is `readiness.py`'s report: 503
with the reasons while this replica drains or a store it needs does not answer, never for an
upstream (design D17.5). Metrics is the Prometheus text of the gateway's registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from .app import Gateway

HEALTHZ_WAIT_S = 0.5  # at most this long for a round of upstream checks under way


async def healthz(request: Request) -> Response:
    """200 `{"status": "ok", "upstreams": {"checked_at", "models": {name: {"reachable", ...}}}}`;
    `upstreams` is absent while no round has finished (or checks are off)."""
    gw: Gateway = request.app.state.gateway
    body: dict[str, Any] = {"status": "ok"}
    checked = await gw.upstream_health.report(HEALTHZ_WAIT_S)
    if checked is not None:
        body["upstreams"] = checked.view()
    return JSONResponse(body)


async def readyz(request: Request) -> Response:
    """503 with the reasons while draining or a store the config needs does not answer (see
    readiness.py: cached a few seconds, hosts only in the log)."""
    gw: Gateway = request.app.state.gateway
    report = await gw.readiness.report()
    return JSONResponse(report.body(), status_code=200 if report.ready else 503)


async def metrics(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    return Response(gw.metrics.render(), media_type=gw.metrics.content_type)
