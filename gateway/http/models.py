"""GET /v1/models and /v1/models/{id}: the models the gateway serves, with the window each is
compacted to.

Agents and SDKs size their own requests from these fields, so each entry carries the effective
window (learnt from upstream errors when lower) under the names they read, in OpenAI's shape or
Anthropic's. A model only a glob entry matches is the upstream's to describe.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ModelNotFoundError
from ..ops.metrics import Metrics
from ..path.exchange import Exchange
from ..path.windows import Windows
from ..routing import Route
from ..upstream import passthrough_path
from .passthrough import Forwarded, Passthrough, json_object


class Models:
    """GET /v1/models and /v1/models/{id} (module docstring)."""

    def __init__(self, passthrough: Passthrough, windows: Windows, metrics: Metrics) -> None:
        self._passthrough = passthrough  # the upstream's list, for glob models
        self._auth = passthrough.auth
        self._router = passthrough.router
        self._windows = windows
        self._metrics = metrics

    async def list_models(self, request: Request, exchange: Exchange) -> Response:
        """The configured models, with the context window each is compacted to, in the fields
        agents and SDKs read (`context_window`, OpenRouter's `context_length`, vLLM's
        `max_model_len`, `max_input_tokens`/`max_output_tokens`); in Anthropic's list shape
        when the client sends `anthropic-version`. With only glob models configured, the
        upstream's list."""
        identity = self._auth.authenticate(request.scope)
        exchange.tenant = identity.tenant
        routes = self._router.routes()
        if not routes:
            return await self._passthrough(request, exchange)
        created = int(time.time())
        data = [self.entry(route, created) for route in routes if identity.may_use(route.name)]
        if "anthropic-version" in request.headers:
            anthropic = [_anthropic_entry(e) for e in data]
            first = anthropic[0]["id"] if anthropic else None
            last = anthropic[-1]["id"] if anthropic else None
            return JSONResponse(
                {"data": anthropic, "has_more": False, "first_id": first, "last_id": last}
            )
        return JSONResponse({"object": "list", "data": data})

    async def get_model(self, request: Request, exchange: Exchange) -> Response:
        """GET /v1/models/{id}: a configured model's entry, as the list gives it. A name only a
        glob entry matches is asked of that entry's upstream (under its upstream name), and its
        answer gets the client's name and the gateway's window. A name no route serves is
        404."""
        identity = self._auth.authenticate(request.scope)
        exchange.tenant = identity.tenant
        name = request.path_params["model_id"]
        exchange.requested = name
        self._auth.authorize(identity, name)
        route = self._router.resolve(name)
        if route is None:
            raise ModelNotFoundError(
                f"The model `{name}` does not exist or is not served by this gateway.",
                param="model",
            )
        exchange.model = self._metrics.model_label(route.name)
        entry = self.entry(route, int(time.time()))
        anthropic = "anthropic-version" in request.headers
        configured = any(r.name == route.name for r in self._router.routes())
        if configured or route.upstream.base_url is None:
            return JSONResponse(_anthropic_entry(entry) if anthropic else entry)
        # The name is the client's: quoted into one segment, and refused if it is `.` or `..`.
        path = passthrough_path(b"/v1/models/" + quote(route.upstream_model, safe="").encode())
        answer = await self._passthrough.forward(request, exchange, route, path, None)
        assert isinstance(answer, Forwarded)  # asked without `stream`: read whole
        found = json_object(answer.body) if answer.status == 200 else None
        if found is None:
            return answer.response()
        window = {k: v for k, v in entry.items() if k not in ("object", "created", "owned_by")}
        if anthropic:
            window = {k: v for k, v in _anthropic_entry(entry).items() if k != "created_at"}
        return JSONResponse({**found, **window})

    def entry(self, route: Route, created: int) -> dict[str, Any]:
        """A model as the gateway serves it, in OpenAI's model object with the window
        fields."""
        window = self._windows.effective(route)
        entry: dict[str, Any] = {
            "id": route.name,
            "object": "model",
            "created": created,
            "owned_by": "compactgate",
        }
        if window is not None:
            entry.update(context_window=window, context_length=window, max_model_len=window)
            entry["max_input_tokens"] = window - (route.max_output_tokens or 0)
        if route.max_output_tokens is not None:
            entry["max_output_tokens"] = route.max_output_tokens
        return entry


def _anthropic_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI model entry in Anthropic's model shape."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(entry["created"]))
    return {
        "type": "model",
        "id": entry["id"],
        "display_name": entry["id"],
        "created_at": stamp,
        **{k: entry[k] for k in ("max_input_tokens", "max_output_tokens") if k in entry},
        **({"context_window": entry["context_window"]} if "context_window" in entry else {}),
    }
