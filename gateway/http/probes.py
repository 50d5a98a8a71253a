"""GET /healthz, /readyz and /metrics: what an orchestrator and a metrics scraper ask.

Liveness (`/healthz`) is 200 while the process answers, with each model's upstream
reachability as detail (`ops.upstream_health`; never waited on for long: a liveness probe that
times out restarts a healthy process). Readiness (`/readyz`) is `ops.readiness`'s report: 503
with the reasons while this replica drains or a store it needs does not answer, never for an
upstream (design D17.5). Metrics is the Prometheus text of the gateway's registry.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..ops.metrics import Metrics
from ..ops.readiness import Readiness
from ..ops.upstream_health import UpstreamHealth

HEALTHZ_WAIT_S = 0.5  # at most this long for a round of upstream checks under way


class Probes:
    def __init__(self, readiness: Readiness, upstreams: UpstreamHealth, metrics: Metrics) -> None:
        self._readiness = readiness
        self._upstreams = upstreams
        self._metrics = metrics

    async def healthz(self, request: Request) -> Response:
        """200 `{"status": "ok", "upstreams": {"checked_at", "models": {name: {"reachable",
        ...}}}}`; `upstreams` is absent while no round has finished (or checks are off)."""
        body: dict[str, Any] = {"status": "ok"}
        checked = await self._upstreams.report(HEALTHZ_WAIT_S)
        if checked is not None:
            body["upstreams"] = checked.view()
        return JSONResponse(body)

    async def readyz(self, request: Request) -> Response:
        """503 with the reasons while draining or a store the config needs does not answer
        (see ops/readiness.py: cached a few seconds, hosts only in the log)."""
        report = await self._readiness.report()
        return JSONResponse(report.body(), status_code=200 if report.ready else 503)

    async def metrics(self, request: Request) -> Response:
        return Response(self._metrics.render(), media_type=self._metrics.content_type)
