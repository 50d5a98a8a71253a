"""Where a request for a model goes: each of its upstreams as a `Destination` (URL and headers).

The compacting endpoints, passthrough, count_tokens, the Responses compact endpoint and the
compaction answers all reach upstreams the same way, so the URL rule (the upstream speaks the
client's API; litellm serves chat completions only) and the header rule (a gateway-held key goes
the way the API wants it) are kept here once.
"""

from __future__ import annotations

from ..config import UpstreamConfig
from ..errors import InvalidRequestError, NotFoundError
from ..routing import Route
from ..wire import Wire
from . import forward_headers, http_transport
from .failover import Destination


def upstream_url(route: Route, wire: Wire, upstream: UpstreamConfig | None = None) -> str:
    """Where this API's requests for `route` go (to `upstream`, default: the route's first):
    the upstream speaks the client's API."""
    upstream = upstream or route.upstream
    if upstream.provider == "litellm":
        if wire.name != "chat":
            raise InvalidRequestError(
                f"The model `{route.name}` is served through litellm, which this gateway "
                f"uses for chat completions only; use /v1/chat/completions.",
                param="model",
            )
        return upstream.base_url or ""  # litellm's api_base; empty: the provider's default
    if upstream.base_url is None:
        raise NotFoundError(f"The model `{route.name}` has no upstream for {wire.name}.")
    return upstream.base_url + wire.upstream_path


def upstream_headers(
    client: list[tuple[bytes, bytes]],
    route: Route,
    wire: Wire,
    upstream: UpstreamConfig | None = None,
) -> dict[str, str]:
    """The client's headers for the upstream; a gateway-held key goes the way the API wants."""
    upstream = upstream or route.upstream
    key = upstream.api_key
    return forward_headers(client, wire.credential_headers(key) if key else None, upstream.headers)


def destinations(
    route: Route,
    wire: Wire,
    client: list[tuple[bytes, bytes]],
    suffix: str = "",
    path: str | None = None,
) -> list[Destination]:
    """Each of the route's upstreams as this request would reach it: the API's URL plus
    `suffix`, or `path` appended to the base_url (passthrough), and its headers."""
    return [
        Destination(
            upstream,
            upstream_url(route, wire, upstream) + suffix
            if path is None
            else f"{upstream.base_url}{path}",
            upstream_headers(client, route, wire, upstream),
            None if path is None else http_transport(upstream.provider),
        )
        for upstream in route.targets
        if path is None or upstream.base_url is not None
    ]
