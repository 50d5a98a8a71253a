"""The one way to an upstream: each request goes out on the transport of its declared provider.

`upstream.provider` in the config names the transport: `openai`, the pooled HTTP client to
OpenAI-compatible servers; `litellm`, chat completions translated by litellm; `in_process`, HTTP to
servers embedded in this process. A litellm upstream's other paths (passthrough to its base_url)
are plain HTTP, so the caller names the transport per request (`failover.Destination.provider`);
nothing looks at the URL to decide.
"""

from __future__ import annotations

from collections.abc import Awaitable, Collection, Mapping

from ..config import ServerConfig
from .http import HttpTransport
from .in_process import InProcessTransport, ServerFactory
from .litellm import LitellmTransport
from .transport import Provider, Timeouts, Transport, UpstreamResponse

_OPENAI_ONLY: tuple[Provider, ...] = ("openai",)


class UpstreamClient:
    """The transports of every provider, started for those the config declares. `in_process`:
    the servers embedded with the gateway, by the host[:port] their upstreams' base_url names."""

    def __init__(
        self,
        server: ServerConfig,
        providers: Collection[Provider] = _OPENAI_ONLY,
        in_process: Mapping[str, ServerFactory] | None = None,
    ) -> None:
        self.timeouts = Timeouts.from_config(server)
        self._transports: dict[str, Transport] = {
            "openai": HttpTransport(self.timeouts),
            "litellm": LitellmTransport(self.timeouts),
            "in_process": InProcessTransport(self.timeouts, in_process or {}),
        }
        self._declared = tuple(providers)

    async def start(self) -> None:
        """The HTTP pool, which every config uses (passthrough, counts), and the transport of
        every declared provider, so that no first request waits for an import."""
        for name in dict.fromkeys(("openai", *self._declared)):
            await self._transports[name].start()

    async def close(self) -> None:
        for transport in self._transports.values():
            await transport.close()

    def open(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        body: bytes | None,
        provider: Provider = "openai",
    ) -> Awaitable[UpstreamResponse]:
        """Send a request on `provider`'s transport; the awaitable gives the response once its
        headers arrived."""
        return self._transports[provider].open(method, url, headers, body)
