"""Which `Host` a browser may reach the gateway by: the rule against DNS rebinding.

A web page can make its own domain name resolve to 127.0.0.1 (DNS rebinding); the browser then
sends the page's requests to a gateway listening on this machine, and, the page's origin and
the request's Host being the same name, treats them as same-origin: no CORS check stops it
from reading the answers or spending the key the gateway holds. What the rebinding cannot
change is the Host header: it carries the attacker's name.

The rule this module owns (design D16.7): a request whose Host names no allowed host is refused
(403 `host_not_allowed`) on the admin surfaces (when no admin token vouches for the caller), on
the Responses WebSocket opened by a browser, and, on the API paths, a page whose origin is its
own Host is same-origin only under an allowed Host. Allowed: a loopback name (`localhost`,
`*.localhost`), any IP literal (a rebinding needs a DNS name: a page opened by its IP is that
server's own), and the names in `server.allowed_hosts` (exact, or `*.example.com` for the
subdomains; `*` allows any Host). The port is never part of the decision; a request without a
Host header (not a browser) passes.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from ..asgi import Scope, header
from ..errors import HostNotAllowedError


class Hosts:
    """The allowed Host names: loopback names, IP literals, and `server.allowed_hosts`."""

    def __init__(self, allowed: Sequence[str]) -> None:
        names = [name.lower() for name in allowed]
        self.any = "*" in names
        self.exact = frozenset(n for n in names if not n.startswith("*."))
        self.suffixes = tuple(n[1:] for n in names if n.startswith("*."))  # ".example.com"

    def allows(self, host: bytes | None) -> bool:
        """Whether a request with this Host header may be served as a browser's."""
        if host is None or self.any:
            return True
        name = _hostname(host.decode("latin-1").strip().lower()).rstrip(".")
        if name == "localhost" or name.endswith(".localhost") or _is_ip(name):
            return True
        if name in self.exact:
            return True
        return bool(self.suffixes) and name.endswith(self.suffixes)

    def refusal(self, scope: Scope) -> HostNotAllowedError | None:
        """The 403 of a request whose Host is not allowed (None: it is)."""
        host = header(scope, b"host")
        if self.allows(host):
            return None
        shown = (host or b"").decode("latin-1")[:100]
        return HostNotAllowedError(
            f"This gateway is not served as {shown!r} to browsers: a page reaching it by that "
            "name may be a DNS-rebinding attack. Use localhost or an IP address, or add the "
            "name to server.allowed_hosts."
        )


def _hostname(host: str) -> str:
    """The name of a Host header's value, without its port (IPv6 literals in brackets)."""
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
