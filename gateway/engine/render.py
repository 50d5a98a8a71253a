"""Rendering (design D3, D9): the exact bytes to forward for what was decided, and the figures
reported about them, as one `Prepared`.

An unchanged request is forwarded as the client's own bytes (or with only a rename, our marks
stripped, stream usage asked for). A compacted one is written once, from the chain's
conversation, in the client's API (`WireRequest.forward_payload`), with the expansion tools
offered when masked outputs can be read back. `render` is the only builder of a `Prepared`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from policies import Budget, ChainResult, Conversation

from ..counting.prefix import Counted
from ..counting.tokens import PRIMING_TOKENS
from ..expansion import offer
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..wire import WireRequest
from ..wire.fields import serialise
from .prepared import ExactCount, Prepared, correction_of


class Render:
    def __init__(
        self,
        tool_outputs: ToolOutputCache | None,
        expansion_tokens: Callable[[Route, int | None], int],
        inject_stream_usage: bool,
    ) -> None:
        self._tool_outputs = tool_outputs
        self._expansion_tokens = expansion_tokens  # what the expansion tools cost (0: no room)
        self._inject_usage = inject_stream_usage

    def render(
        self,
        request: WireRequest,
        route: Route,
        counted: Counted,
        counts: Sequence[int],
        tools_tokens: int,
        budget: Budget | None,
        observe: bool,
        conversation: Conversation | None = None,
        chain: ChainResult | None = None,
        late: asyncio.Future[ExactCount] | None = None,
        offer_expansion: bool = True,
    ) -> Prepared:
        """What to forward and its figures. Without a `conversation` (no chain was needed) the
        client's request goes as it is, its figures summed from `counts` (with `late`, those
        and `tools_tokens` are upper bounds and `late` makes the exact ones); with one, the
        chain's result when it changed anything (not in shadow mode), else the request.
        `offer_expansion`: False when the caller cannot run the expansion tools (it forwards
        the messages alone): they are not added."""
        if conversation is None:
            return self._unchanged(
                request, route, counted, counts, tools_tokens, budget, observe, late
            )
        offered = self._expansion_offered(chain, budget, route) if offer_expansion else None
        return self._compacted(
            request, route, counted, conversation, chain, budget, tools_tokens, observe, offered
        )

    def _unchanged(
        self,
        request: WireRequest,
        route: Route,
        counted: Counted,
        counts: Sequence[int],
        tools_tokens: int,
        budget: Budget | None,
        observe: bool,
        late: asyncio.Future[ExactCount] | None,
    ) -> Prepared:
        """The fast path: the client's own bytes (or a rename of them), no conversation model
        built. `counted` gives the uids and roles (`counts` may differ from its counts:
        bounds)."""
        rename = route.upstream_model if route.renamed else None
        inject = self._injects(request, observe)
        truncate = request.stateful and route.stateful_truncation and not observe
        if rename is None and not request.has_extension and not inject and not truncate:
            body = request.body
        else:
            payload = request.forward_payload(None, rename, inject)
            if truncate:
                payload.setdefault("truncation", "auto")
            body = serialise(payload)
        system = sum(map(counts.__getitem__, counted.roles.system))
        in_messages = sum(counts)
        total = in_messages + tools_tokens + PRIMING_TOKENS
        return Prepared(
            route=route,
            body=body,
            tokens_before=total,
            tokens_after=total,
            budget=budget,
            chain=None,
            counts_by_role=counted.roles.tally,
            tokens_by_region={
                "system": system,
                "tools": tools_tokens,
                "history": in_messages - system,
            },
            messages=request.messages,
            observe=observe,
            api=request.api,
            correction=correction_of(route),
            injected_usage=inject,
            uids=tuple(counted.uids),
            bounded=late is not None,
            late=late,
        )

    def _compacted(
        self,
        request: WireRequest,
        route: Route,
        counted: Counted,
        conversation: Conversation,
        chain: ChainResult | None,
        budget: Budget | None,
        tools_tokens: int,
        observe: bool,
        offered: ToolOutputCache | None,
    ) -> Prepared:
        """The body to forward (the chain's result, or the request as sent when nothing
        changed or the gateway only observes), the tools of `offered` added, and its figures."""
        result = chain.conversation if chain is not None and chain.changed else conversation
        changed = result is not conversation
        rename = route.upstream_model if route.renamed else None
        inject = self._injects(request, observe)
        expandable = False
        if observe or not changed:
            if rename is None and not request.has_extension and not inject:
                body = request.body
            else:
                body = serialise(request.forward_payload(None, rename, inject))
            sent: list[Any] = request.messages
        else:
            payload = request.forward_payload(result.messages, rename, inject, counted.uids)
            if offered is not None:
                with_tools = offer(request.api, payload, offered)
                if with_tools is not None:
                    payload, expandable = with_tools, True
            body = serialise(payload)
            sent = result.data()
        counts = Counter(m.role for m in (conversation if observe else result).messages)
        system = sum(m.tokens for m in result.messages if m.role in ("system", "developer"))
        important = {i for i, marks in enumerate(request.marks) if marks.pin or marks.priority == 1}
        kept = {m.origin for m in result.messages} if important else set()
        return Prepared(
            route=route,
            body=body,
            tokens_before=conversation.tokens + tools_tokens + PRIMING_TOKENS,
            tokens_after=result.tokens + tools_tokens + PRIMING_TOKENS,
            budget=budget,
            chain=chain,
            counts_by_role=dict(counts),
            tokens_by_region={
                "system": system,
                "tools": tools_tokens,
                "history": result.tokens - system,
            },
            messages=sent,
            observe=observe,
            api=request.api,
            correction=correction_of(route),
            injected_usage=inject,
            expandable=expandable,
            conversation=conversation,
            uids=tuple(counted.uids),
            priority_preserved=len(important & kept) / len(important) if important else 1.0,
        )

    def _expansion_offered(
        self, chain: ChainResult | None, budget: Budget | None, route: Route
    ) -> ToolOutputCache | None:
        """The cache whose masked outputs are offered back to the model (the expansion tool):
        when the chain stored some, expansion is on, and the window leaves room for the tool."""
        cache = self._tool_outputs
        if chain is None or not chain.stored or cache is None or not cache.config.expand:
            return None
        if budget is None or not self._expansion_tokens(route, budget.context_window):
            return None
        return cache

    def _injects(self, request: WireRequest, observe: bool) -> bool:
        """Whether to ask a stream for the usage the client did not ask for (the wire says
        whether its API needs asking: only chat does)."""
        return (
            self._inject_usage
            and request.wire.asks_stream_usage
            and request.stream
            and not request.include_usage
            and not observe
        )
