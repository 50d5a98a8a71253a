"""Which of the client's headers and path reach an upstream, whatever the transport.

Hop-by-hop headers describe one connection, not the message (RFC 9110 §7.6.1): they are never
forwarded nor relayed back. The client's credentials give way to the gateway's when the gateway
holds the upstream's key. A passthrough path can only extend the configured base URL, never
leave it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import quote, unquote_to_bytes

from ..errors import InvalidRequestError

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
# A browser's cookies for the gateway's origin: never the upstream's business.
_NOT_FORWARDED = frozenset({"cookie"})

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
    drop = HOP_BY_HOP | _NOT_FORWARDED | connection_listed(client_headers)
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


def connection_listed(headers: Sequence[tuple[bytes, bytes]]) -> frozenset[str]:
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
