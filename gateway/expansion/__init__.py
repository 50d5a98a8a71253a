"""The expansion tools: the model reads masked tool output again, and the client never knows.

When the `tool_output_cache` step masked outputs in a forwarded request, the request also
offers the gateway's read and grep tools (in the client API's tool shape). When the model calls
them, the gateway runs the calls, asks the model again with the results (at most
`tool_outputs.max_rounds` times) and answers the client with the final answer: usage summed
over the rounds, calls to its own tools removed. One dialect per wire API:

    chat       chat.py       (a stream is held until it shows what it is)
    responses  responses.py  (a stream is spliced: see rounds.py)
    messages   messages.py   (likewise)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..ops.metrics import Metrics
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..upstream import UpstreamClient, UpstreamResponse
from ..upstream.retry import send_with_retries
from . import chat, messages, responses, whole
from .chat import ChatExpansion
from .rounds import Call, splice
from .whole import Resolved

__all__ = ["Expansion", "Resolved", "Rounds", "Streamed", "offer"]

DIALECTS = {"chat": chat, "responses": responses, "messages": messages}


def offer(api: str, payload: dict[str, Any], cache: ToolOutputCache) -> dict[str, Any] | None:
    """`payload` with the expansion tools added, or None where they cannot be offered (the
    client has a tool of the same name, or asked for no tools)."""
    dialect = DIALECTS[api]
    if not dialect.applicable(payload, cache.names):
        return None
    return dialect.with_tools(payload, cache)


@dataclass(slots=True)
class Rounds:
    """How many internal rounds a request took (filled in while its stream is relayed)."""

    done: list[int] = field(default_factory=lambda: [0])

    @property
    def count(self) -> int:
        return self.done[0]


@dataclass(frozen=True, slots=True)
class Streamed:
    """A streamed answer with the internal rounds resolved: the response it ends with (its
    status may be an upstream's error, for a chat round that failed before anything was
    relayed), what to relay of it, and the rounds (counted as the stream is relayed)."""

    response: UpstreamResponse
    chunks: AsyncIterator[bytes]
    rounds: Rounds


class Expansion:
    def __init__(self, cache: ToolOutputCache, upstream: UpstreamClient, metrics: Metrics) -> None:
        self.cache = cache
        self.upstream = upstream
        self.metrics = metrics
        self.chat = ChatExpansion(cache, upstream, metrics)

    # -- answering the model's calls ---------------------------------------------------------

    def calls_internal(self, body: bytes) -> bool:
        """Cheap test before parsing: does this answer mention one of our tools?"""
        return any(name.encode() in body for name in self.cache.names)

    async def resolve(
        self,
        api: str,
        body: bytes,
        sent: bytes,
        route: Route,
        url: str,
        headers: Mapping[str, str],
        tenant: str,
    ) -> Resolved:
        """A non-streaming answer: internal calls resolved until there are none (or rounds run
        out)."""

        async def execute(call: Call) -> str:
            return await self._execute(tenant, call)

        async def ask(payload: dict[str, Any]) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
            response = await send_with_retries(
                self.upstream, route, url, headers, orjson.dumps(payload), self.metrics
            )
            data = await response.read()
            response.release()
            self._count(route)
            failed = response.status >= 400
            return response.status, data, response.relay_headers() if failed else []

        return await whole.resolve(
            DIALECTS[api].WHOLE,
            orjson.loads(sent),
            orjson.loads(body),
            self.cache.names,
            execute,
            ask,
            self.cache.config.max_rounds,
        )

    async def stream(
        self,
        api: str,
        response: UpstreamResponse,
        head: bytes,
        sent: bytes,
        route: Route,
        url: str,
        headers: Mapping[str, str],
        tenant: str,
        error_event: Callable[[str], bytes],
    ) -> Streamed:
        """A streamed answer whose internal calls the gateway answers: a chat stream is held
        until it shows what it is (`chat.py`); a Responses or Messages stream is relayed with
        the rounds spliced in as they come (`rounds.py`)."""
        if api == "chat":
            response, head, count = await self.chat.resolve_stream(
                response, head, sent, route, url, headers, tenant
            )
            return Streamed(response, _chunks(head, response), Rounds([count]))
        rounds = Rounds()
        chunks = self.splice(
            api, response, head, sent, route, url, headers, tenant, rounds, error_event
        )
        return Streamed(response, chunks, rounds)

    def splice(
        self,
        api: str,
        response: UpstreamResponse,
        head: bytes,
        sent: bytes,
        route: Route,
        url: str,
        headers: Mapping[str, str],
        tenant: str,
        rounds: Rounds,
        error_event: Any,
    ) -> AsyncIterator[bytes]:
        """A streamed Responses or Messages answer with its internal rounds spliced in."""
        names = self.cache.names
        round_class = responses.ResponsesRound if api == "responses" else messages.MessagesRound

        async def execute(call: Call) -> str:
            return await self._execute(tenant, call)

        async def resend(body: bytes) -> UpstreamResponse:
            self._count(route)
            return await send_with_retries(self.upstream, route, url, headers, body, self.metrics)

        return splice(
            lambda number, carry, final: round_class(number, carry, final, names),
            response,
            head,
            orjson.loads(sent),
            execute,
            resend,
            self.cache.config.max_rounds,
            error_event,
            rounds.done,
        )

    async def _execute(self, tenant: str, call: Call) -> str:
        return await self.cache.execute(tenant, call.name, call.arguments)

    def _count(self, route: Route) -> None:
        self.metrics.internal_tool_rounds.labels(self.metrics.model_label(route.name)).inc()


async def _chunks(head: bytes, response: UpstreamResponse) -> AsyncIterator[bytes]:
    """A stream's bytes: what was read of it already, then the rest as it arrives."""
    if head:
        yield head
    async for chunk in response.chunks():
        yield chunk
