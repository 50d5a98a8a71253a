"""Relaying a stream to the client as it arrives (design D10, D15.5): checked as the API's
stream, watched for its usage, stripped of the usage the gateway asked for on the client's
behalf, and ended with an error event when the upstream breaks off after the headers went out.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from ..asgi import Send
from ..engine.prepared import Prepared
from ..errors import UpstreamError, UpstreamTimeoutError, reason_of
from ..expansion import Streamed
from ..upstream import UpstreamResponse
from ..wire import Wire
from ..wire.framing import StreamCheck
from .accounting import Accounting
from .exchange import Exchange
from .sse import UsageStripper
from .windows import Windows

log = logging.getLogger("compactgate")


async def relay(
    send: Send,
    books: Accounting,
    wire: Wire,
    exchange: Exchange,
    prepared: Prepared,
    response: UpstreamResponse,
    chunks: AsyncIterator[bytes],
    windows: Windows,
    stripper: UsageStripper | None = None,
    streamed: Streamed | None = None,
) -> None:
    """Relay a stream chunk by chunk as it arrives, watching it for its usage (`streamed`:
    the expansion's stream, whose rounds are counted as it is relayed) and checking it is
    the API's stream (design D15.5): one that is not is a 502 until its first event goes
    out, then ends with an error event numbered after the last one relayed."""
    chunks = await checked(wire, exchange, response, chunks)
    books.note(exchange, prepared)
    exchange.status = response.status
    if 200 <= response.status < 300 and not exchange.failed_in_stream:
        windows.served(prepared.route, prepared.sent_tokens)
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": [*response.relay_headers(), *books.headers(exchange)],
        }
    )
    tap = None if "content-encoding" in response.headers else wire.usage_tap()
    try:
        async for chunk in chunks:
            if tap is not None:
                tap.feed(chunk)
            if stripper is not None:
                chunk = stripper.feed(chunk)
            if chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if stripper is not None and (rest := stripper.flush()):
            await send({"type": "http.response.body", "body": rest, "more_body": True})
    except (UpstreamError, UpstreamTimeoutError) as error:
        # Headers are gone: the only way to tell the client is an error event.
        log.warning("request %s: upstream stream failed: %s", exchange.request_id, error.message)
        exchange.reason = reason_of(error)
        check = exchange.framing
        event = wire.stream_error_event(error, check.next_sequence if check else 0)
        exchange.failed_in_stream = True
        await send({"type": "http.response.body", "body": event, "more_body": True})
    finally:
        response.close()
        if streamed is not None:
            exchange.internal_rounds = streamed.rounds.count
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    if tap is not None:
        books.account(prepared, exchange, tap.usage)
        books.calibrate(prepared.route, prepared, exchange, tap.usage)


async def checked(
    wire: Wire, exchange: Exchange, response: UpstreamResponse, chunks: AsyncIterator[bytes]
) -> AsyncIterator[bytes]:
    """`chunks` checked as `wire`'s stream (design D15.5), its first events read already: one
    that is not the API's raises here, a 502 before anything is sent (a compressed stream
    cannot be read and goes unchecked)."""
    if exchange.framing is None and "content-encoding" not in response.headers:
        exchange.framing = StreamCheck(wire)
    if exchange.framing is None:
        return chunks
    try:
        return await exchange.framing.begin(chunks)
    except BaseException:
        response.close()
        raise
