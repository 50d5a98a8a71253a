"""POST /v1/compactgate/plan: what the gateway would do with a request, without sending it.

The whole pipeline runs as on the compacting path (count, budget, chain, invariants, the bytes
to forward) but nothing goes upstream and nothing is remembered, so an operator can see a
policy's effect on a real request. `plan_report` is also the `plan` subcommand's output.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..config import ServerConfig
from ..engine.engine import Engine
from ..engine.prepared import Prepared
from ..errors import ModelNotFoundError
from ..path.windows import Windows
from ..routing import Router
from ..wire import wire_of
from .auth import Authenticator
from .passthrough import read_limited


class Plan:
    """POST /v1/compactgate/plan: the whole pipeline, no upstream chat call (design D17.2)."""

    def __init__(
        self,
        auth: Authenticator,
        router: Router,
        engine: Engine,
        windows: Windows,
        server: ServerConfig,
    ) -> None:
        self._auth = auth
        self._router = router
        self._engine = engine
        self._windows = windows
        self._server = server

    async def handle(self, request: Request) -> Response:
        identity = self._auth.authenticate(request.scope)
        body = await read_limited(self._server, request)
        if body is None:
            return Response(status_code=499)
        wire = wire_of(body, request.query_params.get("api"))
        parsed = wire.parse(body, self._server.max_messages)
        self._auth.authorize(identity, parsed.model)
        route = self._router.resolve(parsed.model)
        if route is None:
            raise ModelNotFoundError(
                f"The model `{parsed.model}` is not served by this gateway.", param="model"
            )
        window = self._windows.effective(route)
        prepared = await self._engine.prepare(
            parsed, route, identity.tenant, window=window, remember=False
        )
        return JSONResponse(plan_report(prepared, window))


def plan_report(prepared: Prepared, window: int | None) -> dict[str, Any]:
    budget = prepared.budget
    return {
        "api": prepared.api,
        "model": prepared.route.name,
        "upstream_model": prepared.route.upstream_model,
        "tokenizer": prepared.route.tokenizer,
        "policy": prepared.route.policy_name,
        "context_window": window,
        "window_source": prepared.route.window_source,
        "reserved_output": budget.reserved_output if budget else None,
        "budget": budget.limit if budget else None,
        "trigger": budget.trigger if budget else None,
        "target": budget.target if budget else None,
        "hold": budget.hold if budget else None,
        "tokens_before": prepared.tokens_before,
        "tokens_after": prepared.tokens_after,
        "fits": budget is None
        or prepared.tokens_after <= (budget.context_window - budget.reserved_output),
        "counts_by_role": dict(prepared.counts_by_role),
        "tokens_by_region": dict(prepared.tokens_by_region),
        "steps": [s.as_dict() for s in prepared.steps],
        "messages": prepared.messages,
        "forwarded": orjson.loads(prepared.body) if prepared.body[:1] == b"{" else None,
    }
