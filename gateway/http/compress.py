"""POST /v1/compress: the engine as another gateway's compressor (agentgateway's contract).

    {"messages": [...provider-native...], "model": "..."}
      -> {"messages": [...], "tokens_saved": N}

The door takes a conversation, not a request to forward: it authenticates, reads and parses
like the other compacting endpoints (`Endpoint`: 401, 413, 408, 400, 403, 429), tells the
messages' API from their own fields (`wire.native`), and runs the one engine entry point,
`Engine.prepare`, against the model's window, tokenizer and policy, exactly as that API's
endpoint would (design D9.10). It sends nothing upstream; what it answers is the list the
engine would have forwarded, in the shape it came in, and `tokens_saved`, the engine's count
before less its count after, in the model's tokenizer (0 when nothing changed, in shadow mode
too, where the list comes back as it was sent).

- `model` is a configured model (its glob entries included); an unknown one is 404. A config
  that lists no models compacts any name with the defaults (the registry's window and
  tokenizer, the default policy).
- The work is bounded by `server.compress_timeout_s`: past it the answer is 503
  `compress_timeout` and the caller keeps its own messages (agentgateway fails open on it);
  a summary being made carries on for the next call.
- Masked tool outputs are stored as on every path (design D13.4), under the caller's tenant.
  The expansion tools cannot be offered: the caller forwards only the messages, and runs the
  model's tool calls itself (docs/integrations/agentgateway.md).
- Headers, metrics (`api="compress"`), the log line and the event log are the other
  endpoints' (`path.accounting`); errors are OpenAI's shape.
"""

from __future__ import annotations

import orjson

from ..asgi import Scope, Send, send_bytes
from ..deadlines import within
from ..errors import CompressTimeoutError, ModelNotFoundError
from ..path.accounting import Accounting
from ..path.exchange import Exchange
from ..path.outcome import Decoration
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..wire import CHAT, WireRequest
from ..wire.native import answer, parse_native
from .auth import Identity
from .endpoints import Doorway, Endpoint, Serving


class CompressEndpoint(Endpoint):
    """POST /v1/compress (module docstring)."""

    def __init__(
        self,
        door: Doorway,
        serving: Serving,
        books: Accounting,
        tool_outputs: ToolOutputCache,
        defaults: bool,
    ) -> None:
        super().__init__(door, serving, CHAT, books)  # CHAT: OpenAI's error shape
        self.tool_outputs = tool_outputs
        self.defaults = defaults  # no models configured: any name gets the default route

    async def parse(self, body: bytes, tenant: str) -> WireRequest:
        return parse_native(body, self.door.server.max_messages)

    def route(self, identity: Identity, request: WireRequest) -> Route:
        self.door.auth.authorize(identity, request.model)
        router = self.door.router
        route = router.resolve(request.model)
        if route is None and self.defaults:
            route = router.default_route(request.model)
        if route is None:
            raise ModelNotFoundError(
                f"The model `{request.model}` is not configured on this gateway.", param="model"
            )
        return route

    async def serve(
        self,
        scope: Scope,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        decoration: Decoration,
    ) -> None:
        serving = self.serving
        observe = route.mode == "observe"
        seconds = self.door.server.compress_timeout_s
        try:
            with within(seconds):
                prepared = await serving.engine.prepare(
                    request,
                    route,
                    exchange.tenant,
                    window=serving.windows.effective(route),
                    observe=observe,
                    headers=None if observe else scope["headers"],
                    count_late=True,  # a list that plainly fits comes back before it is counted
                    offer_expansion=False,  # the caller forwards the messages alone
                )
        except TimeoutError:
            raise CompressTimeoutError(
                f"Compacting took longer than server.compress_timeout_s ({seconds:g} s); "
                "the messages are unchanged."
            ) from None
        if prepared.stored:
            await self.tool_outputs.save(exchange.tenant, prepared.stored)
        self.books.note(exchange, prepared)
        messages, _ = answer(request, prepared.body)
        saved = 0 if observe else max(0, prepared.tokens_before - prepared.tokens_after)
        exchange.status = 200
        body = orjson.dumps({"messages": messages, "tokens_saved": saved})
        await send_bytes(send, 200, body, self.books.headers(exchange), b"application/json")
