"""GET /healthz, /readyz and /metrics: what an orchestrator and a metrics scraper ask.

Liveness says only that the process answers; readiness is `ops.readiness`'s report (503 with
the reasons); metrics is the Prometheus text of the gateway's registry.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..ops.metrics import Metrics
from ..ops.readiness import Readiness


class Probes:
    def __init__(self, readiness: Readiness, metrics: Metrics) -> None:
        self._readiness = readiness
        self._metrics = metrics

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """503 with the reasons while the store does not answer or a model has no reachable
        upstream (see ops/readiness.py: cached a few seconds, hosts only in the log)."""
        report = await self._readiness.report()
        return JSONResponse(report.body(), status_code=200 if report.ready else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(self._metrics.render(), media_type=self._metrics.content_type)
