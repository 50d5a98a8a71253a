"""What a `store:` URL says, read once and checked at start-up (design D13.1).

    memory://[?max_bytes=N]                                       this process only
    redis://[:password@]host:port[/db]                            one Redis (rediss:// for TLS)
    redis-sentinel://[:password@]host:port[,host:port...]/<service>[/<db>]
    redis-cluster://[:password@]host:port[,host:port...]
    rediss-sentinel://..., rediss-cluster://...                   the same over TLS

The rule this module keeps: a URL either parses into a `StoreUrl` whose every part is known, or
fails with a ValueError naming the part that is wrong (the config turns it into a start-up error
at `store`). The password (percent-encoded when it holds `@`, `/`, `,` or `?`) is read here and
nowhere else; `masked` gives the URL fit for logs, `check-config` and `/ui`.

A Sentinel set's own password, when the sentinels require one, is the query option
`sentinel_password`; the password before `@` is the one of the Redis servers it watches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, unquote

Kind = Literal["memory", "redis", "sentinel", "cluster"]

DEFAULT_MEMORY_BYTES = 64 * 1024 * 1024
DEFAULT_PORT = {"redis": 6379, "sentinel": 26379, "cluster": 6379}
SCHEMES: dict[str, tuple[Kind, bool]] = {
    "memory": ("memory", False),
    "redis": ("redis", False),
    "rediss": ("redis", True),
    "redis-sentinel": ("sentinel", False),
    "rediss-sentinel": ("sentinel", True),
    "redis-cluster": ("cluster", False),
    "rediss-cluster": ("cluster", True),
}
# Query options each kind accepts (plain redis:// keeps redis-py's own options, as before).
OPTIONS: dict[Kind, frozenset[str]] = {
    "memory": frozenset({"max_bytes"}),
    "sentinel": frozenset(
        {"socket_timeout", "socket_connect_timeout", "sentinel_password", "ssl_ca_certs"}
    ),
    "cluster": frozenset({"socket_timeout", "socket_connect_timeout", "ssl_ca_certs"}),
}
SECRET_OPTIONS = frozenset({"sentinel_password"})


@dataclass(frozen=True, slots=True)
class StoreUrl:
    """A parsed `store:` URL. `hosts` are the Redis servers, the sentinels or the cluster's
    seed nodes; `service` names the Sentinel master set."""

    url: str = field(repr=False)
    kind: Kind
    tls: bool = False
    hosts: tuple[tuple[str, int], ...] = ()
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    db: int = 0
    service: str | None = None
    options: dict[str, str] = field(default_factory=dict, repr=False)
    max_bytes: int = DEFAULT_MEMORY_BYTES

    @property
    def shared(self) -> bool:
        """Whether other processes see what this store holds (every kind but memory)."""
        return self.kind != "memory"

    def option_float(self, name: str) -> float | None:
        value = self.options.get(name)
        return None if value is None else float(value)

    @property
    def masked(self) -> str:
        return mask_store_url(self.url)


def parse_store_url(url: str) -> StoreUrl:
    """`url` as a StoreUrl; ValueError naming what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in SCHEMES:
        raise ValueError(
            "must be memory://, redis://host:port/db, "
            "redis-sentinel://host:port[,host:port...]/<service>[/<db>] or "
            "redis-cluster://host:port[,host:port...] (rediss-... for TLS)"
        )
    kind, tls = SCHEMES[scheme]
    # The last `@` ends the user info, so a password may hold `/` or `?` unencoded.
    userinfo, at, rest = rest.rpartition("@")
    rest, _, query = rest.partition("?")
    hostlist, _, path = rest.partition("/")
    options = _options(query, kind)
    if kind == "memory":
        return StoreUrl(url, kind, options=options, max_bytes=_max_bytes(options))
    username, password = _userinfo(userinfo) if at else (None, None)
    hosts = _hosts(hostlist, DEFAULT_PORT[kind])
    service, db = _path(path, kind)
    if kind == "redis" and len(hosts) > 1:
        raise ValueError(
            "redis:// names one server; several hosts need redis-sentinel:// or redis-cluster://"
        )
    for name in ("socket_timeout", "socket_connect_timeout"):
        if name in options and kind != "redis":
            _positive(options[name], name)
    return StoreUrl(url, kind, tls, hosts, username, password, db, service, options)


def memory_max_bytes(url: str) -> int:
    """`max_bytes` of a `memory://?max_bytes=N` URL; ValueError unless a positive integer."""
    return parse_store_url(url).max_bytes


def mask_store_url(url: str) -> str:
    """`url` with its passwords (before `@`, and `sentinel_password=`) replaced by `***`."""
    return masked_url(url, SECRET_OPTIONS.__contains__)


def masked_url(url: str, secret: Callable[[str], bool]) -> str:
    """`url` with the password of its user info (or a lone user name, often a token) and the
    values of the query parameters `secret` names replaced by `***`. The last `@` ends the user
    info even when an unencoded password holds `/`, `?` or `@`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    userinfo, at, rest = rest.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        userinfo = f"{user}:***@" if colon else "***@"
    base, question, query = rest.partition("?")
    if question:
        query = "&".join(
            f"{name}=***" if eq and secret(name) else f"{name}{eq}{value}"
            for name, eq, value in (part.partition("=") for part in query.split("&"))
        )
    return f"{scheme}://{userinfo}{base}{question}{query}"


def _options(query: str, kind: Kind) -> dict[str, str]:
    parsed = {name: values[-1] for name, values in parse_qs(query, keep_blank_values=True).items()}
    allowed = OPTIONS.get(kind)
    if allowed is not None:
        unknown = sorted(set(parsed) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed))
            raise ValueError(f"unknown option {unknown[0]!r} in the store URL; known: {known}")
    return parsed


def _max_bytes(options: dict[str, str]) -> int:
    value = options.get("max_bytes")
    if value is None:
        return DEFAULT_MEMORY_BYTES
    try:
        size = int(value)
    except ValueError:
        raise ValueError("memory://?max_bytes= must be a positive integer") from None
    if size <= 0:
        raise ValueError("memory://?max_bytes= must be a positive integer")
    return size


def _userinfo(userinfo: str) -> tuple[str | None, str | None]:
    user, colon, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if colon else None)


def _hosts(hostlist: str, default_port: int) -> tuple[tuple[str, int], ...]:
    if not hostlist:
        raise ValueError("the store URL names no host")
    hosts = []
    for part in hostlist.split(","):
        host, port = _host(part.strip(), default_port)
        hosts.append((host, port))
    return tuple(hosts)


def _host(part: str, default_port: int) -> tuple[str, int]:
    if part.startswith("["):  # [::1]:6379
        host, bracket, after = part[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise ValueError(f"bad host {part!r} in the store URL")
        port_text = after[1:]
    else:
        host, _, port_text = part.partition(":")
    if not host:
        raise ValueError(f"bad host {part!r} in the store URL")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad port in {part!r} in the store URL")
    return host, int(port_text)


def _path(path: str, kind: Kind) -> tuple[str | None, int]:
    parts = [unquote(p) for p in path.split("/")] if path else []
    if kind == "sentinel":
        if not parts or not parts[0]:
            raise ValueError("redis-sentinel:// needs the master set's name: .../<service>[/<db>]")
        if len(parts) > 2:
            raise ValueError("redis-sentinel:// takes /<service>[/<db>], nothing more")
        return parts[0], _db(parts[1] if len(parts) == 2 else "")
    if len(parts) > 1:
        raise ValueError("the store URL's path is the database number, nothing more")
    db = _db(parts[0] if parts else "")
    if kind == "cluster" and db != 0:
        raise ValueError("a Redis Cluster has only database 0")
    return None, db


def _db(text: str) -> int:
    if not text:
        return 0
    if not text.isdigit():
        raise ValueError(f"the database must be a number, not {text!r}")
    return int(text)


def _positive(text: str, name: str) -> None:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds") from None
    if value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds")
