"""GET /healthz, /readyz and /metrics: what an orchestrator and a metrics scraper ask.

Liveness says only that the process answers; readiness is `readiness.py`'s report (503 with the
reasons); metrics is the Prometheus text of the gateway's registry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from ..app import Gateway


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """503 with the reasons while the store does not answer or a model has no reachable
    upstream (see readiness.py: cached a few seconds, hosts only in the log)."""
    gw: Gateway = request.app.state.gateway
    report = await gw.readiness.report()
    return JSONResponse(report.body(), status_code=200 if report.ready else 503)


async def metrics(request: Request) -> Response:
    gw: Gateway = request.app.state.gateway
    return Response(gw.metrics.render(), media_type=gw.metrics.content_type)
