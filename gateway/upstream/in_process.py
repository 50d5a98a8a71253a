"""Upstreams served inside the gateway's own process (`upstream.provider: in_process`).

Code that embeds the gateway, such as `compactgate demo` with its echo model and the test suite
with its fake upstream, hands `build_app` an HTTP server for each name (`base_url`'s host, or
host:port): anything that makes an asyncio protocol per connection, as aiohttp's
`AppRunner.server` does. Each connection is a socket pair inside the process, no port and no
listening socket, and the bytes on it are real HTTP/1.1, so framing, streams, hang-ups and
errors behave as they do over TCP, and the responses are the HTTP transport's own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from yarl import URL

from ..config import Config
from .http import HttpTransport
from .transport import Timeouts

# Makes the protocol that serves one connection (aiohttp: `web.AppRunner(app).server`).
ServerFactory = Callable[[], asyncio.BaseProtocol]


class InProcessTransport(HttpTransport):
    """The HTTP transport, its connections made to servers in this process, by URL authority."""

    def __init__(self, timeouts: Timeouts, servers: Mapping[str, ServerFactory]) -> None:
        super().__init__(timeouts)
        self.servers = servers  # the embedder's own: a server it takes out is gone from here

    def _connector(self) -> aiohttp.BaseConnector:
        return _Connector(self.servers)


class _Connector(aiohttp.BaseConnector):
    """Connects to a named in-process server through a socket pair instead of the network.

    It overrides `_create_connection`, the hook aiohttp's own Unix-socket and named-pipe
    connectors override; not public API, so an aiohttp upgrade is checked by this module's
    tests (tests/test_in_process_upstream.py) before the lock moves.
    """

    def __init__(self, servers: Mapping[str, ServerFactory]) -> None:
        super().__init__(limit=0)
        self._servers = servers

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> ResponseHandler:
        authority = req.url.raw_authority
        server = self._servers.get(authority)
        if server is None:  # reported as an unreachable upstream, like a refused connection
            raise ConnectionRefusedError(f"no in-process upstream is named {authority!r}")
        ours, theirs = socket.socketpair()
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(server, theirs)
            _, protocol = await loop.create_connection(self._factory, sock=ours)
        except BaseException:
            ours.close()
            theirs.close()
            raise
        return protocol


def authority(base_url: str) -> str:
    """The name an in-process upstream is registered under: `base_url`'s host[:port]."""
    return URL(base_url).raw_authority


def unserved(config: Config, servers: Mapping[str, ServerFactory]) -> list[str]:
    """Config problems: in_process upstreams whose name no embedded server answers to."""
    problems = []
    for i, model in enumerate(config.models):
        several = model.upstreams is not None
        for j, upstream in enumerate(model.targets):
            if upstream.provider != "in_process" or upstream.base_url is None:
                continue
            name = authority(upstream.base_url)
            if name not in servers:
                where = f"models[{i}].upstreams[{j}]" if several else f"models[{i}].upstream"
                problems.append(
                    f"{where}.provider: in_process, but no server embedded with the gateway is "
                    f"named {name!r} (in_process is for code that runs the gateway in its own "
                    "process with a server of its own, such as the demo; a server elsewhere is "
                    "provider openai)"
                )
    return problems
