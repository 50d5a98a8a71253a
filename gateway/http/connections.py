"""Client connections before the app sees a request: the request head has a deadline.

uvicorn closes a keep-alive connection that stays idle between requests, and the gateway cuts
off a body trickled too slowly (`body_read_timeout_s`, gateway/asgi.py), but nothing limits
how long a request's *head* (request line and headers) may take: a client sending one header
byte every few seconds keeps its connection, and a slot in every per-connection table, for as
long as it likes, and no request ever reaches the app to time it out.

The rule this module owns: from the moment a connection is opened, and again from the first byte
of each later request on it, the whole request head must arrive within
`server.header_read_timeout_s`. If it does not, a client that had started sending a head gets a
408 OpenAI error and the connection is closed; a connection that sent nothing at all is just
closed, as an idle keep-alive connection is (so a client racing the deadline with a new request
never reads a 408 meant for nobody). If a response is still being written on that connection (a
pipelined head trickling behind it), that response finishes and the connection is then closed.

The deadline is one event-loop timer per connection, armed and cancelled from uvicorn's parser
callbacks: no task waits on a slow client, so a crowd of them costs timers, not workers. The
timers are subclasses of uvicorn's two HTTP/1.1 protocols (httptools, which `serve` uses, and
h11), hooking only the callbacks that say where a request head starts and ends; `protocol()`
returns the one uvicorn's `http=` setting names, as a picklable factory (several workers).

The first connection a worker accepts also starts that worker's `memory.IdleTrim` (when given):
the protocol is where uvicorn shows the set of requests in flight, which says when it is idle.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import weakref
from collections.abc import Callable
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..errors import RequestTimeoutError
from ..ops.memory import IdleTrim

log = logging.getLogger("compactgate.connections")


class HeadDeadline:
    """The deadline of one connection: started when a request head begins (or the connection
    opens), stopped when the head is complete; `expire` runs if it was not stopped in time.

    Starting and stopping only note the time: the loop timer is created at most once per
    `seconds` on a busy keep-alive connection, not once per request (creating and cancelling a
    uvloop timer costs ~3 us, noting the time ~0.1 us). When the timer fires with no head in
    progress it lapses; with one in progress that started later, it is set again for that
    head's own deadline.
    """

    __slots__ = ("_close", "_expire", "_loop", "_seconds", "_since", "_timer")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, seconds: float, expire: Callable[[], None]
    ) -> None:
        self._loop = loop
        self._seconds = seconds
        self._expire = expire
        self._since: float | None = None  # when the head in progress began
        self._timer: asyncio.TimerHandle | None = None
        self._close = False

    @property
    def running(self) -> bool:
        """A head is in progress (its deadline counts)."""
        return self._since is not None

    def start(self) -> None:
        """Start the deadline unless it is already running (a later byte never extends it)."""
        if self._since is None and not self._close:
            self._since = self._loop.time()
            if self._timer is None:
                self._timer = self._loop.call_at(self._since + self._seconds, self._fire)

    def stop(self) -> None:
        self._since = None

    def close(self) -> None:
        """The connection is gone: no more timers."""
        self._since = None
        self._close = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._since is None:
            return
        deadline = self._since + self._seconds
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._fire)
            return
        self._since = None
        self._expire()


def timeout_response(seconds: float) -> bytes:
    """The raw 408 (OpenAI error body) for a client whose request head took too long."""
    body = RequestTimeoutError(
        f"The request headers were not received within {seconds:g} s."
    ).body()
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class _Expiry:
    """What both protocols do when the deadline passes (they share no base class of their own).

    It holds its protocol weakly: the protocol holds it, and a reference cycle would keep every
    closed connection's objects alive until the cyclic garbage collector ran.
    """

    def __init__(self, protocol: _Deadlined, seconds: float) -> None:
        self._protocol = weakref.ref(protocol)
        self._seconds = seconds
        self.head_started = False  # a byte of the current request head has arrived

    def __call__(self) -> None:
        protocol = self._protocol()
        if protocol is None:
            return
        transport = protocol.transport
        if transport is None or transport.is_closing():
            return
        cycle = protocol.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False  # let that response finish, then close
            return
        if self.head_started:
            log.info(
                "closed a connection: its request head took over %g s "
                "(server.header_read_timeout_s)",
                self._seconds,
            )
            transport.write(timeout_response(self._seconds))
        transport.close()


class _Deadlined(asyncio.Protocol):
    """What both protocols add to uvicorn's: the head deadline started with the connection
    and closed with it, and the idle-memory trim. Listed before the uvicorn protocol in the
    bases, so its methods run first and hand on through `super()`."""

    # uvicorn's protocols set these (declared here for the methods that use them)
    loop: asyncio.AbstractEventLoop
    tasks: Any
    transport: Any
    cycle: Any

    def __init__(
        self, *args: Any, head_timeout: float, idle_trim: IdleTrim | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._expiry = _Expiry(self, head_timeout)
        self.head_deadline = HeadDeadline(self.loop, head_timeout, self._expiry)
        self._idle_trim = idle_trim

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.head_deadline.start()
        if self._idle_trim is not None:
            self._idle_trim.start(self.loop, self.tasks)

    def connection_lost(self, exc: Exception | None) -> None:
        self.head_deadline.close()
        super().connection_lost(exc)


class HttpToolsHeadDeadline(_Deadlined, HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline on each request head."""

    def on_message_begin(self) -> None:
        self._expiry.head_started = True
        self.head_deadline.start()
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self.head_deadline.stop()
        self._expiry.head_started = False
        super().on_headers_complete()


class H11HeadDeadline(_Deadlined, H11Protocol):
    """uvicorn's h11 protocol with a deadline on each request head.

    h11 has no "message begins" callback: after each chunk of input, a request head is in
    progress while the client's side is IDLE with bytes buffered, and complete once it is not.
    """

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request
        self._follow_head()

    def _follow_head(self) -> None:
        if self.conn.their_state is h11.IDLE:
            if self.conn.trailing_data[0]:
                self._expiry.head_started = True
                self.head_deadline.start()
        else:
            self.head_deadline.stop()
            self._expiry.head_started = False


_PROTOCOLS: dict[str, type[_Deadlined]] = {
    "httptools": HttpToolsHeadDeadline,
    "h11": H11HeadDeadline,
}


def protocol(
    http: str, head_timeout: float, idle_trim: IdleTrim | None = None
) -> Callable[..., asyncio.Protocol]:
    """What to pass as uvicorn's `http=`: the protocol `http` names ("httptools", "h11" or
    "auto", which is httptools when installed, as in uvicorn), with the head deadline (and the
    worker's idle trim). A partial of a module-level class, so it pickles into worker processes."""
    if http == "auto":
        try:
            import httptools  # noqa: F401
        except ImportError:  # pragma: no cover - uvicorn[standard] installs it
            http = "h11"
        else:
            http = "httptools"
    if http not in _PROTOCOLS:
        raise ValueError(f"no head deadline for uvicorn's http={http!r}; use httptools or h11")
    return functools.partial(_PROTOCOLS[http], head_timeout=head_timeout, idle_trim=idle_trim)
