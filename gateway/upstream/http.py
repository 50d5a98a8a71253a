"""The transport to OpenAI-compatible upstreams: one pooled aiohttp client, bytes in, bytes out.

This is the only module that imports aiohttp's client, and `MAPPED` is the only place its
exceptions become ours (`UpstreamUnreachableError`, `UpstreamTimeoutError`, `UpstreamError`).
Bodies are forwarded as bytes and responses relayed as the chunks arrive, never re-encoded:
`auto_decompress=False` keeps a gzip body gzip, so the client gets exactly what the upstream sent.

Timeouts: connect, time to first byte (headers), and the idle gap between chunks of a stream,
each configurable; the whole of a non-streaming call is bounded by `upstream_timeout_s`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Literal

import aiohttp

from ..deadlines import within
from ..errors import GatewayError, UpstreamError, UpstreamTimeoutError, UpstreamUnreachableError
from .headers import HOP_BY_HOP, connection_listed
from .transport import Timeouts

# The upstream's own `date` and `server` are not relayed: the server in front of the client
# (uvicorn) sends its own, and two of each confuse clients and caches.
_NOT_RELAYED = frozenset({"date", "server"})


class HttpResponse:
    """An upstream answer whose headers have arrived; the body is read or streamed on demand."""

    def __init__(self, response: aiohttp.ClientResponse, timeouts: Timeouts) -> None:
        self._response = response
        self._timeouts = timeouts
        self.status = response.status
        self.headers = response.headers

    def relay_headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers safe to pass to the client (hop-by-hop ones, `date` and `server`
        removed)."""
        drop = HOP_BY_HOP | _NOT_RELAYED | connection_listed(self._response.raw_headers)
        return [
            (k.lower(), v)
            for k, v in self._response.raw_headers
            if k.decode("latin-1").lower() not in drop
        ]

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")

    async def read(self) -> bytes:
        """The whole body (non-streaming), bounded by the total timeout."""
        with MAPPED:
            with within(self._timeouts.total):
                return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive; a gap longer than the idle timeout is an error."""
        content = self._response.content
        idle = self._timeouts.idle
        while True:
            with MAPPED:
                with within(idle):
                    chunk = await content.readany()
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        """Release the connection; closes it if the body was not fully read (cancels upstream)."""
        self._response.close()

    def release(self) -> None:
        self._response.release()


class HttpTransport:
    """One pooled client for all OpenAI-compatible upstreams."""

    def __init__(self, timeouts: Timeouts) -> None:
        self.timeouts = timeouts
        self._session: aiohttp.ClientSession | None = None

    def _connector(self) -> aiohttp.BaseConnector:
        return aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=self._connector(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept", "Content-Type"),
                timeout=aiohttp.ClientTimeout(total=None, connect=self.timeouts.connect),
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def open(
        self, method: str, url: str, headers: Mapping[str, str], body: bytes | None
    ) -> HttpResponse:
        """Send a request and return once the response headers arrived."""
        if self._session is None:
            await self.start()
        assert self._session is not None
        with MAPPED:
            with within(self.timeouts.first_byte):
                response = await self._session.request(
                    method, url, headers=headers, data=body, allow_redirects=False
                )
        return HttpResponse(response, self.timeouts)


class _Mapped:
    """Translate aiohttp/asyncio failures into the gateway's error types, as `with MAPPED:`.
    A class, not a generator-based context manager: it wraps every chunk of every stream."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: object
    ) -> Literal[False]:
        if error is None or isinstance(error, GatewayError):
            return False
        if isinstance(error, TimeoutError):
            raise UpstreamTimeoutError("The upstream did not answer in time.") from None
        if isinstance(error, aiohttp.ClientConnectorError | aiohttp.ServerDisconnectedError):
            raise UpstreamUnreachableError(f"The upstream could not be reached: {error}") from None
        if isinstance(error, aiohttp.ClientPayloadError):
            raise UpstreamError(f"The upstream broke off its response: {error}") from None
        if isinstance(error, aiohttp.ClientError | OSError):
            raise UpstreamUnreachableError(f"The upstream connection failed: {error}") from None
        return False


MAPPED = _Mapped()
