"""Forwarding: send a prepared request upstream, relay the answer, and recover from a context
error by compacting harder (design D6), for every wire API.

    forward(prepared)
      attempt: send to one of the model's upstreams (failing over, retried with backoff on
               429/5xx/connection failures: upstream/retry.py), then look at the answer
        a 4xx/5xx read whole        -> Failed, or Overflow when it is a context-window error
        a stream                    -> Overflow if its first events say so, else relayed as it
                                       arrives (internal expansion rounds spliced in)
        a whole answer              -> relayed (internal rounds resolved first)
      Overflow with retries left: learn the window it states, prepare the client's original
      request again against a tighter window (`outcome.retry_window`), and attempt again;
      out of retries: the upstream's own refusal goes to the client.

What differs between the APIs comes from the wire adapter (`wire`: how a stream shows an
error, how usage is read) and from the decoration the endpoint passes (Anthropic's emulated
`context_management` report); this module never asks which API it serves.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from ..asgi import Send, send_bytes
from ..engine.engine import Engine
from ..engine.prepared import Prepared
from ..errors import (
    ContextLengthExceededError,
    GatewayError,
    UpstreamError,
    upstream_reason,
)
from ..expansion import Expansion, Streamed
from ..ops.metrics import Metrics
from ..routing import Route
from ..tool_outputs import ToolOutputCache
from ..upstream import UpstreamResponse
from ..upstream.failover import Destination
from ..upstream.retry import Sender
from ..wire import Wire, WireRequest
from ..wire.context_errors import ContextError, beyond_window, classify
from ..wire.framing import StreamCheck, answer_problem
from .accounting import Accounting
from .exchange import Exchange
from .outcome import (
    PLAIN,
    RELAYED,
    Decoration,
    Failed,
    Outcome,
    Overflow,
    Relayed,
    Retries,
    retry_window,
)
from .relay import relay
from .sse import UsageStripper
from .windows import Windows

log = logging.getLogger("compactgate")

EMPTY_STREAM = "The upstream answered 200 with an empty stream."


@dataclass(frozen=True, slots=True)
class Call:
    """One request on its way upstream: what the forwarder needs besides the prepared body."""

    wire: Wire
    request: WireRequest
    route: Route
    tenant: str
    targets: list[Destination]
    books: Accounting  # the endpoint's bookkeeping (headers, price, calibration)
    decoration: Decoration = PLAIN
    headers: Sequence[tuple[bytes, bytes]] | None = None  # the client's, for summaries


class Forwarder:
    """Sends prepared requests and relays their answers (see the module's docstring)."""

    def __init__(
        self,
        sender: Sender,
        engine: Engine,
        expansion: Expansion,
        tool_outputs: ToolOutputCache,
        windows: Windows,
        metrics: Metrics,
    ) -> None:
        self._sender = sender
        self._engine = engine
        self._expansion = expansion
        self._tool_outputs = tool_outputs
        self._windows = windows
        self._metrics = metrics

    async def forward(self, send: Send, call: Call, prepared: Prepared, exchange: Exchange) -> None:
        """Attempt until the client has its answer (or the upstream's refusal, out of retries)."""
        retries = Retries(call.route.max_retries)
        first: ContextError | None = None  # the upstream's figures for the client's own request
        while True:
            outcome = await self.attempt(send, call, prepared, exchange)
            match outcome:
                case Relayed():
                    return
                case Failed():
                    await self.relay_failure(send, call, exchange, prepared, outcome)
                    return
                case Overflow():
                    self.overflowed(call.route, exchange, outcome, prepared)
                    first = first or outcome.error
                    if not retries.left:
                        await self.answer_overflow(send, call, exchange, prepared, outcome)
                        return
                    retries = retries.spend()
                    exchange.retries += 1
                    self._metrics.emergency_retries.labels(exchange.model).inc()
                    if outcome.stream is not None:
                        outcome.stream.close()
                    prepared = await self.recompact(call, prepared, outcome, first)

    async def attempt(
        self, send: Send, call: Call, prepared: Prepared, exchange: Exchange
    ) -> Outcome:
        """Send `prepared` upstream once (to one of the model's upstreams, failing over) and say
        what came of it; answers are relayed here."""
        started = time.perf_counter()
        if prepared.stored:
            await self._tool_outputs.save(call.tenant, prepared.stored)
        targets = call.targets
        if prepared.expandable:  # we read the answer to find internal calls: no gzip
            targets = [
                Destination(
                    d.upstream,
                    d.url,
                    {k: v for k, v in d.headers.items() if k != "accept-encoding"},
                )
                for d in targets
            ]
        try:
            response, chosen = await self._sender.send(call.route, targets, prepared.body)
        except GatewayError:  # the time spent trying is the upstream's too
            exchange.upstream_seconds += time.perf_counter() - started
            raise
        try:
            if response.status >= 400:
                return await self.error_answer(response)
            if call.request.stream:
                return await self.relay_stream(send, call, prepared, exchange, response, chosen)
            return await self.relay_whole(send, call, prepared, exchange, response, chosen)
        finally:
            exchange.upstream_seconds += time.perf_counter() - started

    async def error_answer(self, response: UpstreamResponse) -> Failed | Overflow:
        """An upstream's error, read whole: the context window exceeded, or any other failure."""
        body = await response.read()
        response.release()
        failed = Failed(response.status, body, response.relay_headers())
        error = classify(response.status, body)
        return failed if error is None else Overflow(error, failed=failed)

    async def relay_stream(
        self,
        send: Send,
        call: Call,
        prepared: Prepared,
        exchange: Exchange,
        response: UpstreamResponse,
        chosen: Destination,
    ) -> Outcome:
        """A 2xx stream: an overflow if its first events say so, else relayed as it arrives
        (with the internal expansion rounds spliced in when the gateway answers its own tools)."""
        wire = call.wire
        head = await self.read_head(wire, response)
        error = wire.stream_context_error(head)
        if error is not None:
            return Overflow(error, stream=response, head=head)
        if not head:
            response.close()
            raise UpstreamError(EMPTY_STREAM)
        if not prepared.expandable:
            chunks = call.decoration.stream(_then(head, response.chunks()))
            stripper = UsageStripper() if prepared.injected_usage else None
            await self._relay(send, call, exchange, prepared, response, chunks, stripper)
            return RELAYED
        check = exchange.framing = StreamCheck(wire)  # its error events number on from it
        streamed = await self._expansion.stream(
            call.request.api,
            response,
            head,
            prepared.body,
            call.route,
            chosen.url,  # later internal rounds go there too
            dict(chosen.headers),
            call.tenant,
            lambda message: wire.stream_error_event(UpstreamError(message), check.next_sequence),
        )
        response = streamed.response
        if response.status >= 400:
            body = await response.read()
            response.release()
            return Failed(response.status, body, response.relay_headers())
        exchange.internal_rounds = streamed.rounds.count  # a held chat stream knows them now
        stripper = UsageStripper() if prepared.injected_usage else None
        chunks = call.decoration.stream(streamed.chunks)
        await self._relay(send, call, exchange, prepared, response, chunks, stripper, streamed)
        return RELAYED

    async def relay_whole(
        self,
        send: Send,
        call: Call,
        prepared: Prepared,
        exchange: Exchange,
        response: UpstreamResponse,
        chosen: Destination,
    ) -> Relayed:
        """A whole (not streamed) answer: internal rounds resolved, priced before its headers
        go out (they say the cost), then sent."""
        data = await response.read()
        response.release()
        if 200 <= response.status < 300 and not data:
            raise UpstreamError("The upstream answered with an empty body.")
        if 200 <= response.status < 300 and "content-encoding" not in response.headers:
            if (malformed := answer_problem(call.wire, data)) is not None:
                raise malformed  # not this API's answer: a 502, not a 200 the client misreads
        status, relay_headers = response.status, response.relay_headers()
        if status == 200 and prepared.expandable and self._expansion.calls_internal(data):
            resolved = await self._expansion.resolve(
                call.request.api,
                data,
                prepared.body,
                call.route,
                chosen.url,  # later internal rounds go there too
                dict(chosen.headers),
                call.tenant,
            )
            exchange.internal_rounds = resolved.rounds
            status, data = resolved.status, resolved.body
            relay_headers = resolved.headers or relay_headers
        books = call.books
        books.note(exchange, prepared)
        exchange.status = status
        if 200 <= status < 300:
            self._windows.served(call.route, prepared.sent_tokens)
        usage = None if "content-encoding" in response.headers else call.wire.usage(data)
        books.account(prepared, exchange, usage)  # known before the headers: they say it
        if status == 200:
            data = call.decoration.whole(data)
        await send_bytes(send, status, data, [*relay_headers, *books.headers(exchange)], None)
        books.calibrate(call.route, prepared, exchange, usage)
        return RELAYED

    async def read_head(self, wire: Wire, response: UpstreamResponse) -> bytes:
        """The start of a stream, read until it shows what it is (b'' if the stream is empty)."""
        head = b""
        async for chunk in response.chunks():
            head += chunk
            if wire.head_decided(head):
                break
        return head

    def overflowed(
        self, route: Route, exchange: Exchange, overflow: Overflow, prepared: Prepared
    ) -> None:
        """Count a context error and learn the window from it (design D2.4): the limit it
        states, or, when it states none (the Responses API's errors), the refused request's own
        size with the output it reserved, an upper bound of the window in the gateway's units
        whether or not the upstream counts the output (unless a request as large was answered
        before: `Windows.refused`). An empty stream is only a guess at an overflow and teaches
        nothing."""
        error = overflow.error
        self._metrics.context_errors.labels(error.signature).inc()
        exchange.context_errors.append(error.signature)
        if error.limit is not None:
            self._windows.learn(route, error.limit, error.signature)
        elif overflow.failed is not None or overflow.head:
            budget = prepared.budget
            reserved = budget.reserved_output if budget is not None else 0
            self._windows.refused(route, prepared.sent_tokens, reserved, error.signature)

    async def answer_overflow(
        self, send: Send, call: Call, exchange: Exchange, prepared: Prepared, overflow: Overflow
    ) -> None:
        """Out of retries: the upstream's own answer goes to the client (never a silent 200)."""
        if overflow.failed is not None:
            await self.relay_failure(send, call, exchange, prepared, overflow.failed)
            exchange.reason = "context_overflow"
        elif overflow.stream is not None and overflow.head:
            stream = overflow.stream
            exchange.failed_in_stream = True  # the stream relayed is the upstream's refusal
            chunks = _then(overflow.head, stream.chunks())
            await self._relay(send, call, exchange, prepared, stream, chunks)
        else:
            if overflow.stream is not None:
                overflow.stream.close()
            raise UpstreamError(EMPTY_STREAM)

    async def relay_failure(
        self, send: Send, call: Call, exchange: Exchange, prepared: Prepared, failed: Failed
    ) -> None:
        """The upstream's error, relayed with its own status and body."""
        books = call.books
        books.note(exchange, prepared)
        exchange.status, exchange.reason = failed.status, upstream_reason(failed.status)
        headers = [*failed.headers, *books.headers(exchange)]
        await send_bytes(send, failed.status, failed.body, headers, None)

    async def _relay(
        self,
        send: Send,
        call: Call,
        exchange: Exchange,
        prepared: Prepared,
        response: UpstreamResponse,
        chunks: AsyncIterator[bytes],
        stripper: UsageStripper | None = None,
        streamed: Streamed | None = None,
    ) -> None:
        """The stream relayed to the client (`relay.relay`) under this call's bookkeeping."""
        await relay(
            send, call.books, call.wire, exchange, prepared, response, chunks, self._windows,
            stripper, streamed,
        )  # fmt: skip

    async def recompact(
        self, call: Call, previous: Prepared, overflow: Overflow, first: ContextError
    ) -> Prepared:
        """Prepare the client's original request again against a tighter window. When nothing
        fits it, the 400 quotes the real figures (the upstream's window, the request's size),
        never those of the tighter window the retry was compacted against (design D15.6)."""
        engine, request, route = self._engine, call.request, call.route
        if previous.late is not None:  # the window is learnt in counted tokens, not a bound
            await asyncio.wait([previous.late])
            previous = previous.settled()
        tools = engine.tools_tokens(request, route)

        def limit_at(window: int) -> int:
            budget = engine.budget(request, route, tools, window)
            return budget.limit if budget is not None else window

        current = self._windows.effective(route)
        window = retry_window(current, previous, overflow.error, limit_at)
        try:
            return await engine.prepare(
                request,
                route,
                call.tenant,
                window=window,
                force=True,
                observe=False,
                headers=call.headers,
            )
        except ContextLengthExceededError:
            if overflow.stream is not None and not overflow.head:
                # An empty stream was only a guess at an overflow: report what happened.
                raise UpstreamError(EMPTY_STREAM) from None
            figures = beyond_window(
                first, overflow.error.limit, current, previous.tokens_before, request.max_output
            )
            raise ContextLengthExceededError(figures, param=call.wire.conversation_field) from None


async def _then(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A stream's bytes: what was read of it already, then the rest as it arrives."""
    if first:
        yield first
    async for chunk in rest:
        yield chunk
