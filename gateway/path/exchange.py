"""One request's record on the request path: what it is and what came of it.

An `Exchange` is made when a request arrives and read, once it has ended, by the bookkeeping
(`accounting.py`: headers, metrics, the log line, the event log, the operator page). Who writes
what: the endpoint (`http.endpoints`) sets the facts as they become known (tenant, model,
stream, whether an agent's compaction was answered); the forwarder (`forward.py`) and the
bookkeeping set the outcome (status, upstream time, retries, usage, price). Nothing else
writes to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..engine.prepared import Prepared
from ..errors import GatewayError, reason_of
from ..ops.costs import Priced
from ..ops.logs import clip, request_fields
from ..wire import Usage
from ..wire.framing import StreamCheck


@dataclass(slots=True)
class Exchange:
    """Per-request facts that end up in headers, metrics and the access log line."""

    request_id: str
    started: float
    api: str = "chat"
    model: str = "-"
    status: int = 0
    reason: str = ""  # the failure kind, when the request failed (errors.ERROR_TABLE, upstream_*)
    stream: bool = False
    upstream_seconds: float = 0.0
    retries: int = 0
    tokens_before: int = 0
    tokens_after: int = 0
    tokens_bound: bool = False  # the token figures are an upper bound, not counts (`Prepared`)
    steps: str = "none"
    observe: bool = False
    stateful: bool = False  # the history is held upstream: forwarded as it came
    prepared: Prepared | None = None
    context_errors: list[str] = field(default_factory=list)
    internal_rounds: int = 0  # expansion-tool rounds the gateway answered itself
    priority_preserved: float = 1.0
    usage: Usage | None = None  # what the upstream reported for the answer
    tenant: str = ""
    priced: Priced | None = None  # what the answer cost, and would have without compaction
    agent_compaction: str | None = None  # the agent whose own compaction request this is
    agent_outcome: str = "forwarded"  # or answered (from a summary made ahead of need)
    agent_reason: str = ""  # why: ready, not_ready, stale, backoff, unanswerable, shadow
    agent_figures: dict[str, int] | None = None  # its conversation's (`agents.payback.Figures`)
    failed_in_stream: bool = False  # a 200 stream that carried an error instead of the answer
    requested: str = ""  # the model name the client sent (the log line's `model`)
    compacted: str | None = None  # a Responses compaction the gateway made: ready | summarised
    conversation: str = ""  # the conversation key a load balancer hashes on (path.affinity)
    framing: StreamCheck | None = None  # the stream being relayed, as checked (`wire.framing`)

    @property
    def answered(self) -> bool:
        """The client got its answer: a 2xx that did not end in an error event."""
        return 200 <= self.status < 300 and not self.failed_in_stream

    @property
    def recovered(self) -> bool:
        """Answered although the upstream refused it with a context-window error first: the
        gateway compacted and retried (a refusal that ran out of retries is not answered)."""
        return self.answered and bool(self.context_errors)

    def failed(self, error: GatewayError) -> None:
        """Note one of our errors as this request's answer."""
        self.status = error.status
        self.reason = reason_of(error)

    def line(self, total: float) -> dict[str, Any]:
        """The request's log line (`logs.request_fields`)."""
        return request_fields(
            request_id=clip(self.request_id),
            tenant=self.tenant,
            api=self.api,
            model=clip(self.requested) if self.requested else self.model,
            status=self.status,
            reason=self.reason,
            stream=self.stream,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens_after,
            tokens_bound=self.tokens_bound,
            steps=self.steps,
            retries=self.retries,
            internal_rounds=self.internal_rounds,
            total_s=total,
            upstream_s=self.upstream_seconds,
        )
