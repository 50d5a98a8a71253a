"""What one upstream attempt came to, and how much tighter a retry after a context error aims.

The request path (`forward.Forwarder`) sends a prepared body and gets one of three outcomes:
`Relayed` (the answer, or an upstream error that is not about the context, reached the
client), `Failed` (an upstream error not about the context window, read whole), or `Overflow`
(the upstream says the prompt does not fit). `retry_window` is the pure decision of the
reactive path (design D6.2): the window to compact against after an overflow, always tighter
than what was just sent.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from ..counting.tokens import PRIMING_TOKENS
from ..engine.prepared import Prepared
from ..upstream import UpstreamResponse
from ..wire.context_errors import ContextError


@dataclass(frozen=True, slots=True)
class Relayed:
    """The answer (or the upstream's own error, not a context one) reached the client."""


@dataclass(frozen=True, slots=True)
class Failed:
    """The upstream answered with an error that is not about the context window."""

    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]]


@dataclass(frozen=True, slots=True)
class Overflow:
    """The upstream says the prompt does not fit: a 4xx body, or a stream whose first events
    are an error (`stream` is then still open, `head` what was read of it)."""

    error: ContextError
    failed: Failed | None = None
    stream: UpstreamResponse | None = None
    head: bytes = b""


Outcome = Relayed | Failed | Overflow
RELAYED = Relayed()


@dataclass(frozen=True, slots=True)
class Retries:
    """How many emergency retries (context errors) a request has left: a value, never state."""

    left: int

    def spend(self) -> Retries:
        return Retries(self.left - 1)


class Decoration(Protocol):
    """What an API adds to a successful answer on its way to the client (Anthropic's emulated
    `context_management` report: `agents.context_management.Applied`)."""

    @property
    def active(self) -> bool: ...

    def whole(self, body: bytes) -> bytes: ...

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]: ...


class Plain:
    """No decoration: the answer goes as the upstream wrote it."""

    active = False

    def whole(self, body: bytes) -> bytes:
        return body

    def stream(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        return chunks


PLAIN = Plain()


def retry_window(
    current: int | None, previous: Prepared, error: ContextError, limit_at: Callable[[int], int]
) -> int:
    """The window to compact against after a context error: tighter, in our own token units.

    If the upstream said how many tokens the prompt had, scale its limit into our estimate's units
    (our tokenizer may count differently); otherwise aim well below what we just sent.
    Either way the messages then get a budget below what was just sent (90 %, or 60 % when the
    error states no numbers), so every retry makes progress. `limit_at(window)` is the messages
    budget the pipeline derives from a window; the output reserve in it may be a share of the
    window (20 % by default), so the bound is found by search, never by subtracting the previous
    attempt's reserve (that one was a share of the configured, wrong, window).
    """
    sent = previous.sent_tokens
    messages = max(1, sent - previous.tokens_by_region.get("tools", 0) - PRIMING_TOKENS)
    allowance = int(messages * 0.9)
    if error.limit is not None and error.requested is not None and error.requested > 0:
        scaled = int(error.limit * sent / error.requested)
        window = scaled if error.requested > sent else min(scaled, error.limit)
    elif error.limit is not None:
        window = error.limit
    else:
        allowance = int(messages * 0.6)
        window = current if current is not None else max(1, sent)
        for _ in range(64):  # grow until the bound below binds (no window was ever known)
            if limit_at(window) > allowance:
                break
            window *= 2
    if current is not None:
        window = min(window, current)
    if limit_at(window) > allowance:
        low, high = 1, window  # the largest window whose messages budget is within allowance
        while low < high:
            middle = (low + high + 1) // 2
            if limit_at(middle) <= allowance:
                low = middle
            else:
                high = middle - 1
        window = low
    return max(1, window)
