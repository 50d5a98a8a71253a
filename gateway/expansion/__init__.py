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

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from ..metrics import Metrics
from ..retry import send_with_retries
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..upstream import UpstreamClient, UpstreamResponse
from . import chat, messages, responses
from .chat import ChatExpansion, Resolved
from .rounds import Call, add_usage, splice

__all__ = ["Expansion", "Resolved", "Rounds", "offer"]

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
        if api == "chat":
            return await self.chat.resolve(body, sent, route, url, headers, tenant)
        dialect = responses if api == "responses" else messages
        field_name = "output" if api == "responses" else "content"
        names = self.cache.names
        payload = orjson.loads(sent)
        answer = orjson.loads(body)
        usage: dict[str, int] = {}
        keys = dialect.USAGE_KEYS
        add_usage(usage, answer.get("usage"), keys)
        rounds = 0
        while rounds < self.cache.config.max_rounds:
            produced = answer.get(field_name) or []
            calls = dialect.internal_calls(produced, names)
            if not calls:
                break
            results = [await self._execute(tenant, call) for call in calls]
            payload = dialect.next_payload(payload, produced, calls, results, names)
            response = await send_with_retries(
                self.upstream, route, url, headers, orjson.dumps(payload), self.metrics
            )
            data = await response.read()
            response.release()
            rounds += 1
            self._count(route)
            if response.status >= 400:
                return Resolved(response.status, data, rounds, response.relay_headers())
            answer = orjson.loads(data)
            add_usage(usage, answer.get("usage"), keys)
        return Resolved(200, dialect.finish(answer, names, usage if rounds else {}), rounds)

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
