"""What one answer comes to, once the request path has sent it: the `x-compactgate-*` headers,
its price, the tokenizer calibration, the metrics, the event log and the operator page's sample.

The request path calls these at fixed points (note what was prepared, price the answer when its
usage is known, record the request when it ends); keeping the bookkeeping here lets `app.py`
read as the path itself. One `Accounting` per endpoint: it knows the API's name as logs and
metrics give it, and whether the endpoint's answers save tokens (a count does not).
"""

from __future__ import annotations

import time
from typing import Any

from ..engine.prepared import Prepared, when_settled
from ..errors import UpstreamMalformedError, reason_of
from ..ops.costs import Accountant, Priced
from ..ops.events import EventLog, RequestSample, reward
from ..ops.logs import access_logged, log_request, tenant_label
from ..ops.metrics import Metrics
from ..routing import Route
from ..wire import Usage
from .calibration import Calibration
from .exchange import Exchange

REMOTE_COMPACTION = "responses"  # the agent label of compactions the gateway made itself
MALFORMED = reason_of(UpstreamMalformedError(""))  # the log reason the malformed metric counts


class Accounting:
    """The bookkeeping of one endpoint's answers (see the module's docstring)."""

    def __init__(
        self,
        metrics: Metrics,
        events: EventLog,
        costs: Accountant,
        calibration: Calibration,
        api: str,
        saves: bool,
    ) -> None:
        self._metrics = metrics
        self._events = events
        self._costs = costs
        self._calibration = calibration
        self.api = api
        self.saves = saves
        by = metrics.children  # each by (model, api): held here, looked up once per request
        self._request_seconds = by(metrics.request_seconds)
        self._upstream_seconds = by(metrics.upstream_seconds)
        self._overhead_seconds = by(metrics.overhead_seconds)
        self._tokens_before = by(metrics.tokens_before)
        self._tokens_after = by(metrics.tokens_after)
        self._tokens_saved = by(metrics.tokens_saved)

    def calibrate(
        self, route: Route, prepared: Prepared, exchange: Exchange, usage: Usage | None
    ) -> None:
        """Compare what the upstream says the prompt was with our estimate (not when internal
        rounds were added: their usage is summed into the answer's)."""
        exchange.usage = usage
        if usage is not None and usage.input > 0 and not exchange.internal_rounds:
            calibration = self._calibration

            def observe(settled: Prepared | None) -> None:
                if settled is not None and not settled.bounded:  # an upper bound is no estimate
                    calibration.observe(route, settled.sent_tokens, usage.input, settled.correction)

            when_settled(prepared, observe)

    def account(self, prepared: Prepared, exchange: Exchange, usage: Usage | None) -> None:
        """Price an answered request (`costs`): both arms, into the metrics and the exchange."""
        if usage is None or not 200 <= exchange.status < 300:
            return  # a failed request saves nothing
        exchange.priced = self._costs.request(
            prepared.route,
            exchange.tenant,
            usage,
            prepared.tokens_before,
            prepared.tokens_after,
            prepared.uids,
            compacted=not prepared.observe and prepared.tokens_after < prepared.tokens_before,
        )

    def note(self, exchange: Exchange, prepared: Prepared) -> None:
        prepared = prepared.settled()
        exchange.prepared = prepared
        exchange.priority_preserved = prepared.priority_preserved
        exchange.tokens_before = prepared.tokens_before
        exchange.tokens_after = prepared.tokens_after
        exchange.tokens_bound = prepared.bounded
        exchange.observe = prepared.observe
        steps = prepared.changed_steps
        exchange.steps = ",".join(steps) if steps else "none"

    def headers(self, exchange: Exchange) -> list[tuple[bytes, bytes]]:
        prefix = b"x-compactgate-would-" if exchange.observe else b"x-compactgate-"
        headers = [
            (b"x-compactgate-request-id", exchange.request_id.encode("latin-1", "replace")),
            (prefix + b"tokens-before", str(exchange.tokens_before).encode()),
            (prefix + b"tokens-after", str(exchange.tokens_after).encode()),
            (prefix + b"steps", exchange.steps.encode()),
            (prefix + b"retries", str(exchange.retries).encode()),
            (b"x-compactgate-internal-rounds", str(exchange.internal_rounds).encode()),
        ]
        # The rest, in this order, only when they apply (most answers carry none of them).
        if exchange.stateful:
            headers.append((b"x-compactgate-history", b"upstream"))
        if exchange.tokens_bound:
            headers.append((b"x-compactgate-tokens-counted", b"upper-bound"))
        if exchange.priced is not None:
            headers += _cost_headers(exchange.priced)
        if exchange.agent_compaction is not None:
            headers += _agent_headers(exchange.agent_compaction, exchange.agent_outcome)
        if exchange.compacted is not None:
            headers.append((b"x-compactgate-compaction", exchange.compacted.encode()))
        if exchange.conversation:
            headers.append((b"x-compactgate-conversation", exchange.conversation.encode()))
        return headers

    def record(self, exchange: Exchange) -> None:
        """Metrics, the log line and `/ui`'s sample of a finished request; for a request
        forwarded on its upper bound, once its exact count is made (`when_settled`)."""
        total = time.perf_counter() - exchange.started
        if exchange.prepared is None or not exchange.tokens_bound:
            self.recorded(exchange, total)
            return

        def settled(prepared: Prepared | None) -> None:
            if prepared is not None:
                self.note(exchange, prepared)
            self.recorded(exchange, total)

        when_settled(exchange.prepared, settled)

    def recorded(self, exchange: Exchange, total: float) -> None:
        metrics = self._metrics
        key = (exchange.model, self.api)
        upstream = exchange.upstream_seconds
        self._request_seconds[key].observe(total)
        if upstream:
            self._upstream_seconds[key].observe(upstream)
        self._overhead_seconds[key].observe(max(0.0, total - upstream))
        if exchange.tokens_before and not exchange.tokens_bound:  # a bound is not a count
            self._tokens_before[key].inc(exchange.tokens_before)
            self._tokens_after[key].inc(exchange.tokens_after)
            if saved := self.tokens_saved(exchange):
                self._tokens_saved[key].inc(saved)
            if not exchange.observe and exchange.steps != "none":
                for step in exchange.steps.split(","):  # step types: a fixed few
                    metrics.child(metrics.compactions, step).inc()
        if exchange.recovered:
            metrics.child(metrics.context_errors_avoided, exchange.model).inc()
        if self.over_window(exchange):
            metrics.child(metrics.over_window_answered, exchange.model).inc()
        seq = None
        if exchange.prepared is not None and (exchange.steps != "none" or exchange.retries):
            seq = self.log_event(exchange, total)
        elif exchange.agent_compaction is not None or exchange.compacted is not None:
            seq = self.log_agent_compaction(exchange, total)
        self._events.count_request(self.sample(exchange, total, seq))
        finish(metrics, exchange, total)

    def tokens_saved(self, exchange: Exchange) -> int:
        """Prompt tokens compaction saved on this request: an answered generation only (not a
        failed request, a count, or shadow mode, which forwards the original)."""
        if not (self.saves and exchange.answered) or exchange.observe:
            return 0
        return max(0, exchange.tokens_before - exchange.tokens_after)

    def over_window(self, exchange: Exchange) -> bool:
        """Whether an answered request was, as the client sent it, larger than the model's
        window by our estimate, and compaction made it fit before the upstream saw it (no
        context error on the way; never in shadow mode, which forwards the original)."""
        prepared = exchange.prepared
        budget = prepared.budget if prepared is not None else None
        return (
            budget is not None
            and self.saves
            and exchange.answered
            and not exchange.observe
            and not exchange.context_errors
            and exchange.tokens_before > budget.context_window - budget.reserved_output
        )

    def sample(self, exchange: Exchange, total: float, event: int | None) -> RequestSample:
        """The request as the operator page aggregates it (`overview`)."""
        costs = _cost_fields(exchange.priced)
        return RequestSample(
            ts=time.time(),
            request_id=exchange.request_id,
            api=self.api,
            model=exchange.model,
            tenant=tenant_label(exchange.tenant),  # as the request log names it
            status=exchange.status,
            reason="" if 0 < exchange.status < 400 else exchange.reason,
            total_ms=round(total * 1000, 3),
            upstream_ms=round(exchange.upstream_seconds * 1000, 3),
            tokens_before=exchange.tokens_before,
            tokens_after=exchange.tokens_after,
            observe=exchange.observe,
            steps=exchange.steps,
            retries=exchange.retries,
            context_errors=len(exchange.context_errors),
            internal_rounds=exchange.internal_rounds,
            stream=exchange.stream,
            cost_usd=costs["cost_usd"],
            counterfactual_usd=costs["counterfactual_usd"],
            saved_usd=costs["saved_usd"],
            agent_compaction=exchange.agent_compaction,
            agent_outcome=exchange.agent_outcome if exchange.agent_compaction else None,
            event=event,
            failed_in_stream=exchange.failed_in_stream,
            saves=self.saves,
        )

    def log_event(self, exchange: Exchange, total: float) -> int:
        """One event-log line for a compacted or retried request (design D17.3); its
        seq."""
        prepared = exchange.prepared
        assert prepared is not None
        chain = prepared.chain
        budget = prepared.budget
        changed = [s for s in prepared.steps if s.changed]
        recovery = chain.recovery if chain is not None else None
        success = exchange.answered
        phases = ["detection", *dict.fromkeys(s.type for s in changed)]  # each step once
        phases += ["recovery"] if recovery else []
        phases += ["success"] if success else ["failure"]
        would_fail = bool(exchange.retries) or (
            budget is not None
            and prepared.tokens_before > budget.context_window - budget.reserved_output
        )
        return self._events.record(
            {
                **_who(exchange),
                "mode": "observe" if exchange.observe else "enforce",
                "status": exchange.status,
                "tokens_before": exchange.tokens_before,
                "tokens_after": exchange.tokens_after,
                "context_window": budget.context_window if budget else None,
                "budget": budget.limit if budget else None,
                "steps": [s.as_dict() for s in changed],
                "messages_removed": sum(s.messages_removed for s in changed),
                "summary_used": any(s.summary_used for s in changed),
                "recovery": recovery,
                "retries": exchange.retries,
                "context_errors": exchange.context_errors,
                "would_have_failed": would_fail,
                "answered": success,
                "tokens_saved": self.tokens_saved(exchange),
                "context_error_recovered": exchange.recovered,
                "over_window": self.over_window(exchange),
                "phases": phases,
                "agent_compaction": exchange.agent_compaction,
                "agent_outcome": exchange.agent_outcome if exchange.agent_compaction else None,
                "agent_reason": exchange.agent_reason or None,
                **_agent_figures(exchange),
                "internal_rounds": exchange.internal_rounds,
                "total_ms": round(total * 1000, 2),
                "upstream_ms": round(exchange.upstream_seconds * 1000, 2),
                **_cost_fields(exchange.priced),
                "reward": round(
                    reward(
                        success,
                        bool(recovery),
                        exchange.tokens_before,
                        exchange.tokens_after,
                        exchange.priority_preserved,
                        total * 1000,
                    ),
                    4,
                ),
            },
            content=prepared.messages,
        )

    def log_agent_compaction(self, exchange: Exchange, total: float) -> int:
        """One event-log line for an agent's own compaction (or a Responses compaction) that
        was not compacted here: answered by the gateway or forwarded, and why. No content."""
        agent: str | None
        if exchange.compacted is not None:  # made by the gateway: from a ready summary or now
            agent, outcome, why = REMOTE_COMPACTION, "answered", exchange.compacted
        else:
            agent, outcome, why = (
                exchange.agent_compaction,
                exchange.agent_outcome,
                exchange.agent_reason,
            )
        return self._events.record(
            {
                **_who(exchange),
                "status": exchange.status,
                "answered": exchange.answered,
                "mode": "observe" if exchange.observe else "enforce",
                "tokens_before": exchange.tokens_before,
                "tokens_after": exchange.tokens_after,
                "steps": [],
                "retries": exchange.retries,
                "context_errors": exchange.context_errors,
                "agent_compaction": agent,
                "agent_outcome": outcome,
                "agent_reason": why or None,
                **_agent_figures(exchange),
                "phases": ["agent_compaction", outcome],
                "total_ms": round(total * 1000, 2),
                "upstream_ms": round(exchange.upstream_seconds * 1000, 2),
            }
        )


def finish(metrics: Metrics, exchange: Exchange, total: float) -> None:
    """Count a served request and write its log line (every API, passthrough included)."""
    metrics.child(metrics.requests, exchange.model, str(exchange.status), exchange.api).inc()
    if exchange.reason == MALFORMED:
        metrics.child(metrics.upstream_malformed, exchange.model, exchange.api).inc()
    if access_logged():  # the line is not built for nobody
        log_request(exchange.line(total))


def _who(exchange: Exchange) -> dict[str, Any]:
    """The fields every event-log line opens with: which request, API, tenant and model."""
    return {
        "request_id": exchange.request_id,
        "api": exchange.api,
        "tenant": tenant_label(exchange.tenant),
        "stream": exchange.stream,
        "model": exchange.model,
    }


def _agent_figures(exchange: Exchange) -> dict[str, Any]:
    """An agent's compaction request's conversation so far: its compaction requests answered
    and forwarded (by reason), the tokens the gateway's own summary calls sent upstream and
    the tokens its answers kept from going upstream (`agents.payback.Figures`)."""
    figures = exchange.agent_figures
    return {"agent_conversation": figures} if figures is not None else {}


def _agent_headers(agent: str | None, outcome: str) -> list[tuple[bytes, bytes]]:
    """Which agent's own compaction request this was, and what the gateway did with it."""
    if agent is None:
        return []
    return [(b"x-compactgate-agent-compaction", f"{agent}; {outcome}".encode())]


def _cost_fields(priced: Priced | None) -> dict[str, Any]:
    """The event log's view of `costs`: None where the price is not known."""
    if priced is None:
        return {"cost_usd": None, "counterfactual_usd": None, "saved_usd": None}
    actual = None if priced.actual.partial else round(priced.actual.total, 8)
    counterfactual = priced.counterfactual
    known = None
    if counterfactual is not None and not counterfactual.partial:
        known = round(counterfactual.total, 8)
    return {
        "cost_usd": actual,
        "counterfactual_usd": known,
        "saved_usd": None if priced.saved is None else round(priced.saved, 8),
    }


def _cost_headers(priced: Priced | None) -> list[tuple[bytes, bytes]]:
    """What the answer cost and what the client's own request would have, in USD (only where
    the usage was known before the headers went out: answers that are not streamed)."""
    if priced is None or priced.actual.partial:
        return []
    headers = [(b"x-compactgate-cost-usd", f"{priced.actual.total:.6f}".encode())]
    if priced.counterfactual is not None and not priced.counterfactual.partial:
        value = f"{priced.counterfactual.total:.6f}".encode()
        headers.append((b"x-compactgate-counterfactual-cost-usd", value))
    return headers
