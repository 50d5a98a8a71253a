"""What every upstream transport offers: open a request, get a response whose headers arrived.

The rest of the gateway sees only these two protocols, so the request path, the retries, the
reactive path, the expansion rounds and the summariser treat every provider alike. A transport
answers an upstream's refusal (a 4xx or 5xx) as a response, never as an exception; it raises the
gateway's own errors (`UpstreamUnreachableError`, `UpstreamTimeoutError`, `UpstreamError`) only
when there is no answer to relay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..config import Provider, ServerConfig

__all__ = ["Provider", "Timeouts", "Transport", "UpstreamResponse", "http_transport"]


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float
    first_byte: float
    idle: float
    total: float

    @classmethod
    def from_config(cls, server: ServerConfig) -> Timeouts:
        return cls(
            connect=server.connect_timeout_s,
            first_byte=server.first_byte_timeout_s or server.upstream_timeout_s,
            idle=server.stream_idle_timeout_s,
            total=server.upstream_timeout_s,
        )


class UpstreamResponse(Protocol):
    """An upstream answer whose headers have arrived; the body is read or streamed on demand."""

    @property
    def status(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    def relay_headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers safe to pass on to the client."""
        ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes:
        """The whole body."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; each call continues where the last one stopped."""
        ...

    def close(self) -> None:
        """Drop the response; an unfinished body is abandoned (the upstream stops)."""
        ...

    def release(self) -> None:
        """Done with a fully read response: its connection may serve another request."""
        ...


class Transport(Protocol):
    """One way of reaching upstreams; `UpstreamClient` picks one per request by provider."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> UpstreamResponse:
        """Send a request and return once the response headers arrived."""
        ...


def http_transport(provider: Provider) -> Provider:
    """The transport of an upstream's plain HTTP paths (passthrough, token counting): litellm
    translates chat completions only, so its upstream's other paths go over HTTP."""
    return "openai" if provider == "litellm" else provider
