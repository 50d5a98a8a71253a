"""Counts from the upstream's own tokenizer, for routes with `tokenizer: upstream`.

The texts a request holds that the route's `UpstreamTokenizer` has not counted yet are sent to
the upstream once: llama.cpp's `/tokenize` (at the server's root) where it answers, else an
Anthropic-style `/v1/messages/count_tokens` (one user message per text, less the count of a
one-token message, which is the request's own overhead). Which of the two a route's upstream
speaks is found on its first request and remembered. When neither answers, the route's texts
are estimated (`chars:4`) and a warning says so once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import orjson

from ..errors import GatewayError
from ..routing import Route
from ..wire import Wire
from . import CLIENT_CREDENTIALS, UpstreamClient, http_transport
from .destinations import upstream_headers

log = logging.getLogger("compactgate.tokens")

CREDENTIALS = frozenset(name.encode() for name in CLIENT_CREDENTIALS)
CONCURRENCY = 8  # counting calls in flight per request
PROBE = "."  # a one-token text: what a count_tokens request adds around any text


class UpstreamCounts:
    def __init__(self, client: UpstreamClient) -> None:
        self._client = client
        self._how: dict[str, str] = {}  # route name -> "tokenize" | "count_tokens" | "none"
        self._overhead: dict[str, int] = {}

    async def count_for(
        self,
        route: Route,
        wire: Wire,
        texts: Sequence[str],
        client: Sequence[tuple[bytes, bytes]] | None,
    ) -> list[int] | None:
        """Texts counted by the route's upstream, with the credential the client's requests
        use (the engine's `RemoteCounter`)."""
        credentials = [(k, v) for k, v in client or () if k.lower() in CREDENTIALS]
        headers = upstream_headers(credentials, route, wire)
        return await self.count(route, texts, headers)

    async def count(
        self, route: Route, texts: Sequence[str], headers: Mapping[str, str]
    ) -> list[int] | None:
        """Each text's tokens as the upstream counts them; None when it cannot say."""
        base = route.upstream.base_url
        how = self._how.get(route.name)
        if base is None or how == "none":
            return None
        if how in (None, "tokenize"):
            counts = await self._all(texts, lambda t: self._tokenize(route, base, t, headers))
            if counts is not None:
                self._how[route.name] = "tokenize"
                return counts
        if how in (None, "count_tokens"):
            counts = await self._all(texts, lambda t: self._count_tokens(route, t, headers))
            if counts is not None:
                self._how[route.name] = "count_tokens"
                return counts
        if how is None:
            log.warning(
                "model %s: tokenizer: upstream, but its upstream counts neither with /tokenize "
                "nor with /v1/messages/count_tokens; its tokens are estimated (chars:4)",
                route.name,
            )
            self._how[route.name] = "none"
        return None

    async def _all(
        self, texts: Sequence[str], one: Callable[[str], Awaitable[int | None]]
    ) -> list[int] | None:
        slots = asyncio.Semaphore(CONCURRENCY)

        async def bounded(text: str) -> int | None:
            async with slots:
                return await one(text)

        counts = await asyncio.gather(*(bounded(t) for t in texts))
        known = [c for c in counts if c is not None]
        return known if len(known) == len(counts) else None

    async def _post(
        self, route: Route, url: str, headers: Mapping[str, str], body: object
    ) -> object:
        sent = {**headers, "content-type": "application/json"}
        provider = http_transport(route.upstream.provider)
        with contextlib.suppress(GatewayError):
            response = await self._client.open("POST", url, sent, orjson.dumps(body), provider)
            try:
                if response.status != 200:
                    return None
                return orjson.loads(await response.read())
            except orjson.JSONDecodeError:
                return None
            finally:
                response.release()
        return None

    async def _tokenize(
        self, route: Route, base: str, text: str, headers: Mapping[str, str]
    ) -> int | None:
        root = base.removesuffix("/v1")
        found = await self._post(route, root + "/tokenize", headers, {"content": text})
        tokens = found.get("tokens") if isinstance(found, dict) else None
        return len(tokens) if isinstance(tokens, list) else None

    async def _count_tokens(
        self, route: Route, text: str, headers: Mapping[str, str]
    ) -> int | None:
        overhead = self._overhead.get(route.name)
        if overhead is None:
            probe = await self._messages_count(route, PROBE, headers)
            if probe is None:
                return None
            overhead = self._overhead[route.name] = max(0, probe - 1)
        counted = await self._messages_count(route, text, headers)
        return None if counted is None else max(0, counted - overhead)

    async def _messages_count(
        self, route: Route, text: str, headers: Mapping[str, str]
    ) -> int | None:
        body = {"model": route.upstream_model, "messages": [{"role": "user", "content": text}]}
        url = f"{route.upstream.base_url}/messages/count_tokens"
        found = await self._post(route, url, headers, body)
        value = found.get("input_tokens") if isinstance(found, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None
