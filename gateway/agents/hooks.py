"""Agents' own compaction, as hooks on the request path (design D8).

The endpoint calls these at three fixed points of every compacting request:

    before(request)     an agent's own compaction request (`signatures.recognise`) is answered
                        at once from a summary made ahead of need when one covers its history
                        (`answers`); nothing then goes upstream
    prepared(request)   a forwarded compaction request teaches how that agent compacts (its
                        request as a template); every one, answered or not, where (`timing`);
                        an ordinary one that is the last before the agent's compaction starts
                        that compaction's summary, while it is at the upstream
    after(answer)       ahead of need: the summaries the conversation's own policy will need
                        (`Precompute`)

An answered compaction reports real figures: `tokens-before` the request as it would have been
sent, `tokens-after` the answer the agent keeps in its place.

None of them ever fails a request: what they cannot do, they leave to the ordinary path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..asgi import Send, send_bytes
from ..config import Signature
from ..counting.prefix import Counted
from ..counting.tokens import PRIMING_TOKENS
from ..engine.prepared import Prepared, when_settled
from ..ops.metrics import Metrics
from ..path.accounting import Accounting
from ..path.exchange import Exchange
from ..path.windows import Windows
from ..routing import Route
from ..summaries import Precompute
from ..wire import Usage, WireRequest, answers
from .answers import CompactionAnswers, history_tokens
from .signatures import recognise


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
        answers: CompactionAnswers,
        precompute: Precompute,
        counts: Callable[[WireRequest, Route, str], Counted],
        tools_tokens: Callable[[WireRequest, Route], int],
        windows: Windows,
        metrics: Metrics,
    ) -> None:
        self._signatures = signatures
        self._answers = answers
        self._precompute = precompute
        self._counts = counts
        self._tools_tokens = tools_tokens
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
        tools = self._tools_tokens(request, route)
        tokens = sum(counted.counts) + tools + PRIMING_TOKENS  # as it would be sent
        tenant = exchange.tenant
        found = await self._answers.answer(
            tenant, agent.name, request, counted.uids, counted.counts, tokens
        )
        exchange.agent_reason = found.reason
        uid = counted.uids[0] if counted.uids else None
        exchange.agent_figures = self._answers.figures(tenant, request.api, uid)
        if found.text is None:
            return Before(agent)
        exchange.tokens_before = tokens
        exchange.tokens_after = route.counter.message({"role": "assistant", "content": found.text})
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
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        before: Before,
        prepared: Prepared,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """The request is prepared and about to go upstream. An ordinary one: the agent's next
        compaction summary, if this is the last request before it, is started now, while this
        one is at the upstream (judged on the exact count: once it is made, for a request
        forwarded on its bound)."""
        self._precompute.request_prepared(tenant, route)  # waiting precomputations run meanwhile
        agent = before.agent
        if agent is None:
            answers = self._answers

            def then(settled: Prepared | None) -> None:
                exact = settled if settled is not None and not settled.bounded else None
                answers.ordinary(tenant, route, request, exact, headers)

            when_settled(prepared, then)
            return
        # Forwarded: how this agent compacts is learnt (where: by `before`).
        if agent.answerable:
            self._answers.learn(tenant, agent.name, request, history_tokens(prepared))
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
        delaying this answer: the summaries the conversation's policy will need (not after a
        compaction made here)."""
        if exchange.compacted is None:
            window = self._windows.effective(route)
            self._precompute.after_response(
                request, route, tenant, headers, window, exchange.prepared
            )
