"""Who is calling, and may they use this model: gateway keys and tenants (design D16.1).

The rule this module owns: a request is served only for a tenant the gateway can name, and a
tenant is never chosen by something another tenant could forge. Two modes, fixed at start-up:

- Gateway keys (`auth: {keys: [{key_sha256, tenant, models}]}` with at least one key). The
  client presents its key as `Authorization: Bearer <key>` (or Azure's `api-key: <key>`, or
  Anthropic's `x-api-key: <key>`, as Claude Code and the anthropic SDK send it). The
  sha256 of what it presented is compared with `hmac.compare_digest` against *every* configured
  hash, with no early exit, so the time taken does not say which entry (if any) matched. The
  matching entry names the tenant and the model globs it may use (the config refuses two entries
  with one key, so at most one matches). No key, or an unknown one, is
  401; a model outside the entry's globs is 403. The key belongs to the gateway, so it is never
  forwarded: the upstream gets the route's `api_key`, or no credential at all. `tenant_header`
  is ignored in this mode (a client could otherwise claim another tenant's summaries).
- No keys (`auth` absent or empty). Anyone may call; the client's credential is forwarded
  unchanged and the tenant is a hash of it, or the value of the configured `tenant_header` for
  deployments behind a trusted proxy that sets it.

A tenant id is opaque (`t:<name>`, `k:<hash>`, `h:<header value>`): it keys per-tenant state
(summaries, tool output refs, concurrency limits) and never appears in a log line or a metric
label. Neither does a presented key. A request's log line names a keyed tenant by its configured
name, any other by a pseudonym (`logs.tenant_label`).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from ..asgi import Scope, header
from ..config import Config
from ..errors import AuthenticationError, PermissionDeniedError

CREDENTIAL_HEADERS = (b"authorization", b"api-key", b"x-api-key")
MAX_ANONYMOUS = 4096  # identities of credentials remembered (all forgotten when full)
_ANY_MODEL = ("*",)


@dataclass(frozen=True, slots=True)
class Identity:
    """The caller as the gateway knows it: its tenant id and the model globs it may use."""

    tenant: str
    models: tuple[str, ...] = _ANY_MODEL

    def may_use(self, model: str) -> bool:
        if self.models == _ANY_MODEL:  # the usual case: `*` matches every name
            return True
        return any(fnmatch.fnmatchcase(model, pattern) for pattern in self.models)


@dataclass(frozen=True, slots=True)
class _Key:
    digest: bytes  # sha256 of the key, 32 bytes
    identity: Identity


IDENTITY = "compactgate.identity"  # scope key: the caller, once authenticated


class Authenticator:
    """Turns a request's headers into an `Identity`, or refuses it (401/403)."""

    def __init__(self, config: Config) -> None:
        keys = config.auth.keys if config.auth is not None else []
        self._keys = tuple(
            _Key(bytes.fromhex(k.key_sha256), Identity(f"t:{k.tenant}", tuple(k.models)))
            for k in keys
        )
        header_name = config.tenant_header if not self._keys else None
        self._tenant_header = header_name.lower().encode() if header_name else None
        # Without keys: the identity of each credential or tenant header value seen lately (a
        # client sends the same one with every request; hashing it each time is wasted).
        self._anonymous: dict[bytes, Identity] = {}
        named = {self._tenant_header} if self._tenant_header else set()
        self._wanted = frozenset(CREDENTIAL_HEADERS) | named

    @property
    def enabled(self) -> bool:
        """True when gateway keys are configured (and so required)."""
        return bool(self._keys)

    def identify(self, scope: Scope) -> Identity:
        """The caller's identity; AuthenticationError (401) when keys are required and missing."""
        if not self._keys:
            return self._anonymous_identity(scope)
        presented = presented_key(scope)
        if presented is None:
            raise AuthenticationError(
                "This gateway requires an API key: send it as `Authorization: Bearer <key>`."
            )
        digest = _digest(presented)
        found: _Key | None = None
        for key in self._keys:  # every entry, always: no early exit
            if hmac.compare_digest(digest, key.digest) and found is None:
                found = key
        if found is None:
            raise AuthenticationError("Incorrect API key provided.")
        return found.identity

    def authenticate(self, scope: Scope) -> Identity:
        """The caller (401 when gateway keys are required), identified once per request and
        kept in the scope; its gateway key is then removed from the request's headers, so
        nothing downstream can forward it upstream."""
        identity = scope.get(IDENTITY)
        if identity is None:
            identity = self.identify(scope)
            scope[IDENTITY] = identity
            scope["headers"] = self.upstream_headers(scope["headers"])
        return identity

    def authorize(self, identity: Identity, model: str) -> None:
        """PermissionDeniedError (403) unless `identity` may use `model`."""
        if not identity.may_use(model):
            raise PermissionDeniedError(
                f"This API key may not use the model `{model}`.", param="model"
            )

    def upstream_headers(self, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The client's headers minus its gateway key (when keys are on), ready for forwarding."""
        if not self._keys:
            return headers
        return [(k, v) for k, v in headers if k.lower() not in CREDENTIAL_HEADERS]

    def _anonymous_identity(self, scope: Scope) -> Identity:
        """The tenant header's value when configured and sent, else a hash of the first
        credential header sent (the empty credential's when none is); each header as its first
        occurrence says. One pass over the headers, and a credential seen lately is not hashed
        again."""
        wanted, first = self._wanted, {}
        for name, value in scope["headers"]:
            if name in wanted and name not in first:
                first[name] = value
        named = first.get(self._tenant_header) if self._tenant_header else None
        if named:
            key = b"h" + named
        else:
            credential = next((v for n in CREDENTIAL_HEADERS if (v := first.get(n))), b"")
            key = b"k" + credential
        identity = self._anonymous.get(key)
        if identity is None:
            if named:
                tenant = "h:" + named.decode("latin-1")
            else:
                tenant = "k:" + hashlib.sha256(key[1:]).hexdigest()[:32]
            if len(self._anonymous) >= MAX_ANONYMOUS:
                self._anonymous.clear()
            identity = self._anonymous[key] = Identity(tenant)
        return identity


def key_sha256(key: bytes) -> str:
    """The `auth.keys[].key_sha256` value for `key` (as the client will send it): the digest
    `Authenticator.identify` compares, so the config and the check cannot drift apart."""
    return _digest(key).hex()


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def presented_key(scope: Scope) -> bytes | None:
    """The key in `Authorization: Bearer <key>` (any case of `Bearer`), `api-key: <key>` or
    `x-api-key: <key>`."""
    value = header(scope, b"authorization")
    if value:
        scheme, _, token = value.strip().partition(b" ")
        token = token.strip()
        if scheme.lower() == b"bearer" and token:
            return token
        return None
    for name in (b"api-key", b"x-api-key"):
        value = header(scope, name)
        if value and value.strip():
            return value.strip()
    return None


# Variables litellm reads a provider credential from when the request carries none.
_PROVIDER_ENV_EXACT = frozenset({"AWS_ACCESS_KEY_ID", "GOOGLE_APPLICATION_CREDENTIALS"})
_LOOPBACK_NAMES = frozenset({"localhost"})


def open_relay_warning(config: Config, host: str, environ: Mapping[str, str]) -> str | None:
    """The start-up warning for a gateway anyone on the network could spend an upstream key
    through, or None. That is: no gateway keys (`auth.keys`), a listening address other than
    loopback, and a route whose upstream credential the gateway itself supplies (its `api_key`,
    a credential header in `upstream.headers`, or, for litellm routes, a provider key in the
    environment, which litellm uses when the client sends none)."""
    if config.auth is not None and config.auth.keys:
        return None
    if is_loopback(host):
        return None
    provider_env = sorted(
        name
        for name, value in environ.items()
        if value and (name.endswith("_API_KEY") or name in _PROVIDER_ENV_EXACT)
    )
    held: list[str] = []
    sources: set[str] = set()
    for model in config.models:
        found = set()
        for upstream in model.targets:
            if upstream.api_key:
                found.add("upstream.api_key")
            elif any(name.lower().encode() in CREDENTIAL_HEADERS for name in upstream.headers):
                found.add("a credential in upstream.headers")
            elif upstream.provider == "litellm" and provider_env:
                found.add(f"litellm reading {', '.join(provider_env)} from the environment")
        if found:
            sources |= found
            held.append(model.name)
    if not held:
        return None
    shown = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
    return (
        f"open relay: listening on {host} without gateway keys (auth.keys), while the gateway "
        f"supplies the upstream credential of model(s) {shown} ({'; '.join(sorted(sources))}): "
        "anyone who can reach this address can spend that credential. Add auth.keys entries "
        '(`printf %s "$KEY" | compactgate hash-key` prints each key_sha256 line), or listen '
        "on 127.0.0.1 behind a proxy that authenticates."
    )


def is_loopback(host: str) -> bool:
    """Whether an address (or `localhost`) stays on this machine; IPv4-mapped IPv6 included."""
    name = host.strip().strip("[]").lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
