"""The HTTP seam to OpenAI-compatible upstreams: one pooled aiohttp client, bytes in, bytes out.

This is the only module that imports aiohttp's client, and `_mapped` is the only place its
exceptions become ours (`UpstreamUnreachableError`, `UpstreamTimeoutError`, `UpstreamError`).
Bodies are forwarded as bytes and responses relayed as the chunks arrive, never re-encoded:
`auto_decompress=False` keeps a gzip body gzip, so the client gets exactly what the upstream sent.

Timeouts (design D11.2): connect, time to first byte (headers), and the idle gap between chunks of a
stream, each configurable; the whole of a non-streaming call is bounded by `upstream_timeout_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote_to_bytes

import aiohttp

from . import litellm_upstream
from .config import ServerConfig
from .errors import (
    GatewayError,
    InvalidRequestError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnreachableError,
)

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus those aiohttp recomputes.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "proxy-connection",
        "expect",
    }
)
_UNSAFE_PATH = re.compile(rb"[\x00-\x1f\x7f\\]")
# The upstream's own `date` and `server` are not relayed: the server in front of the client
# (uvicorn) sends its own, and two of each confuse clients and caches.
_NOT_RELAYED = frozenset({"date", "server"})
# A browser's cookies for the gateway's origin: never the upstream's business.
_NOT_FORWARDED = frozenset({"cookie"})


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


class UpstreamResponse:
    """An upstream answer whose headers have arrived; the body is read or streamed on demand."""

    def __init__(self, response: aiohttp.ClientResponse, timeouts: Timeouts) -> None:
        self._response = response
        self._timeouts = timeouts
        self.status = response.status
        self.headers = response.headers

    def relay_headers(self) -> list[tuple[bytes, bytes]]:
        """Response headers safe to pass to the client (hop-by-hop ones, `date` and `server`
        removed)."""
        drop = HOP_BY_HOP | _NOT_RELAYED | _connection_listed(self._response.raw_headers)
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
        with _mapped():
            async with asyncio.timeout(self._timeouts.total):
                return await self._response.read()

    async def chunks(self) -> AsyncIterator[bytes]:
        """Body chunks as they arrive; a gap longer than the idle timeout is an error."""
        content = self._response.content
        idle = self._timeouts.idle
        while True:
            with _mapped():
                async with asyncio.timeout(idle):
                    chunk = await content.readany()
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        """Release the connection; closes it if the body was not fully read (cancels upstream)."""
        self._response.close()

    def release(self) -> None:
        self._response.release()


class UpstreamClient:
    """One pooled client for all OpenAI-compatible upstreams."""

    def __init__(self, server: ServerConfig) -> None:
        self.timeouts = Timeouts.from_config(server)
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector,
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
    ) -> UpstreamResponse:
        """Send a request and return once the response headers arrived."""
        if url.startswith(litellm_upstream.SCHEME):
            return await litellm_upstream.open_litellm(url, headers, body, self.timeouts.total)  # type: ignore[return-value]
        if self._session is None:
            await self.start()
        assert self._session is not None
        with _mapped():
            async with asyncio.timeout(self.timeouts.first_byte):
                response = await self._session.request(
                    method, url, headers=headers, data=body, allow_redirects=False
                )
        return UpstreamResponse(response, self.timeouts)


# The client's credentials: replaced, never forwarded, when the gateway holds the route's key.
CLIENT_CREDENTIALS = frozenset({"authorization", "api-key", "x-api-key"})


def forward_headers(
    client_headers: list[tuple[bytes, bytes]],
    credentials: Mapping[str, str] | None,
    extra: Mapping[str, str],
) -> dict[str, str]:
    """Client headers to send upstream: hop-by-hop removed (the fixed set and any the client's
    `Connection` header names), and cookies; when the gateway supplies the upstream credential
    (`credentials`, the gateway's key as the upstream's API wants it, or one in the configured
    `extra` headers) none of the client's own credentials goes with it."""
    out: dict[str, str] = {}
    drop = HOP_BY_HOP | _NOT_FORWARDED | _connection_listed(client_headers)
    if credentials or any(name.lower() in CLIENT_CREDENTIALS for name in extra):
        drop = drop | CLIENT_CREDENTIALS
    for raw_name, raw_value in client_headers:
        name = raw_name.decode("latin-1").lower()
        if name in drop or name.startswith("x-compactgate-admin"):
            continue
        out[name] = raw_value.decode("latin-1")
    if credentials:
        out.update(credentials)
    out.update({k.lower(): v for k, v in extra.items()})
    return out


def _connection_listed(headers: list[tuple[bytes, bytes]]) -> frozenset[str]:
    """Header names a `Connection` header declares hop-by-hop (RFC 9110 §7.6.1)."""
    names: set[str] = set()
    for raw_name, raw_value in headers:
        if raw_name.lower() == b"connection":
            names.update(n.strip().lower() for n in raw_value.decode("latin-1").split(","))
    names.discard("")
    return frozenset(names)


def passthrough_path(raw_path: bytes, prefix: str = "/v1") -> str:
    """The client's path after `prefix`, to append to a configured base_url (no SSRF).

    Kept percent-encoded as the client sent it, so `%2F` stays inside its segment. Refused (400)
    when any segment is `.` or `..` once decoded (`%2e%2e` too: the URL library decodes and
    resolves them, which would climb out of the base_url's path), or when it holds a backslash or
    a control character. The result always starts with `/`, so it can only extend the base path
    on the configured host, never replace the host.
    """
    if not raw_path.startswith(prefix.encode() + b"/"):
        raise InvalidRequestError(f"Only paths under {prefix}/ are forwarded.")
    rest = raw_path[len(prefix) :]
    decoded = unquote_to_bytes(rest)
    if _UNSAFE_PATH.search(decoded) or any(s in (b".", b"..") for s in decoded.split(b"/")):
        raise InvalidRequestError(
            "The request path may not contain `.` or `..` segments, backslashes or control "
            "characters."
        )
    return quote(rest, safe="/%:@!$&'()*+,;=-._~")


@contextlib.contextmanager
def _mapped() -> Iterator[None]:
    """Translate aiohttp/asyncio failures into the gateway's error types."""
    try:
        yield
    except GatewayError:
        raise
    except TimeoutError:
        raise UpstreamTimeoutError("The upstream did not answer in time.") from None
    except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as exc:
        raise UpstreamUnreachableError(f"The upstream could not be reached: {exc}") from None
    except aiohttp.ClientPayloadError as exc:
        raise UpstreamError(f"The upstream broke off its response: {exc}") from None
    except (aiohttp.ClientError, OSError) as exc:
        raise UpstreamUnreachableError(f"The upstream connection failed: {exc}") from None
