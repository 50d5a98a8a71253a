"""Agents' own compaction, as hooks on the request path (design D8).

The endpoint calls these at three fixed points of every compacting request:

    before(request)     an agent's own compaction request (`signatures.recognise`) is answered
                        at once from a summary made ahead of need when one covers its history
                        (`answers`); nothing then goes upstream
    prepared(request)   a forwarded compaction request teaches where and how that agent
                        compacts (`CompactionPoints`, the agent's request as a template)
    after(answer)       ahead of need: the agent's next compaction summary when it is near,
                        and the summaries the conversation's own policy will need (`Precompute`)

None of them ever fails a request: what they cannot do, they leave to the ordinary path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..asgi import Send, send_bytes
from ..config import Signature
from ..counting.prefix import Counted
from ..engine.prepared import Prepared, when_settled
from ..ops.metrics import Metrics
from ..path.accounting import Accounting
from ..path.exchange import Exchange
from ..path.windows import Windows
from ..routing import Route
from ..summaries import Precompute
from ..wire import Usage, WireRequest, answers
from .answers import CompactionAnswers
from .signatures import CompactionPoints, recognise


@dataclass(frozen=True, slots=True)
class Before:
    """What `before` found: the agent whose compaction request this is (None: an ordinary
    request), and whether it has been answered already."""

    agent: Signature | None
    answered: bool = False


ORDINARY = Before(None)


class AgentHooks:
    def __init__(
        self,
        signatures: Sequence[Signature],
        points: CompactionPoints,
        answers: CompactionAnswers,
        precompute: Precompute,
        counts: Callable[[WireRequest, Route, str], Counted],
        windows: Windows,
        metrics: Metrics,
    ) -> None:
        self._signatures = signatures
        self._points = points
        self._answers = answers
        self._precompute = precompute
        self._counts = counts
        self._windows = windows
        self._metrics = metrics

    async def before(
        self,
        send: Send,
        request: WireRequest,
        route: Route,
        exchange: Exchange,
        books: Accounting,
    ) -> Before:
        """An agent's own compaction request answered from a summary made ahead of need, if
        one covers its history; else it is forwarded, and `agent_reason` says why."""
        agent = recognise(request.api, request.messages, self._signatures)
        if agent is None:
            return ORDINARY
        exchange.agent_compaction = agent.name
        observe = route.mode == "observe"
        exchange.agent_reason = "shadow" if observe else "unanswerable"
        if not agent.answerable or observe:
            return Before(agent)
        counted = self._counts(request, route, exchange.tenant)
        found = await self._answers.answer(exchange.tenant, request, counted.uids, counted.counts)
        exchange.agent_reason = found.reason
        if found.text is None:
            return Before(agent)
        exchange.tokens_before = sum(counted.counts)  # the history it replaces
        # No upstream call, nothing billed (the summary was counted as the gateway's own spend).
        content_type, body = answers.answer(
            request.api, found.text, route.name, Usage(0), request.stream
        )
        exchange.status = 200
        exchange.agent_outcome = "answered"
        self._metrics.agent_compactions.labels(agent.name, "answered").inc()
        await send_bytes(send, 200, body, books.headers(exchange), content_type)
        return Before(agent, answered=True)

    def prepared(
        self, tenant: str, route: Route, request: WireRequest, before: Before, prepared: Prepared
    ) -> None:
        """The request is prepared and about to go upstream."""
        self._precompute.request_prepared(tenant, route)  # waiting precomputations run meanwhile
        agent = before.agent
        if agent is None:
            return
        # Forwarded: where and how this agent compacts is learnt.
        self._points.seen(tenant, agent.name, prepared.tokens_before)
        if agent.answerable:
            self._answers.learn(tenant, agent.name, request, prepared.tokens_before)
        self._metrics.agent_compactions.labels(agent.name, "forwarded").inc()

    def after(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        exchange: Exchange,
        headers: list[tuple[bytes, bytes]],
    ) -> None:
        """After an ordinary answer (2xx or the upstream's own error), ahead of need, never
        delaying this answer: the agent's next compaction summary if it is near (judged on the
        exact count: after it is made, for a request forwarded on its bound), and the
        summaries the conversation's policy will need (not after a compaction made here)."""
        if exchange.agent_compaction is None:
            answers = self._answers

            def then(prepared: Prepared | None) -> None:
                exact = prepared if prepared is not None and not prepared.bounded else None
                answers.after_response(tenant, route, request, exact, headers)

            when_settled(exchange.prepared, then)
        if exchange.compacted is None:
            window = self._windows.effective(route)
            self._precompute.after_response(
                request, route, tenant, headers, window, exchange.prepared
            )
