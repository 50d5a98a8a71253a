"""The `encrypted_content` of a compaction item the gateway issued: a signed reference.

A Responses client keeps a `compaction` item in place of its history and sends it back on later
requests. When the gateway made the compaction, the item's `encrypted_content` is

    cgc1.<id>.<mac>

where `id` names the summary held in the gateway's store (22 base64url characters, random) and
`mac` is HMAC-SHA256 over the tenant and the id, with the key every replica sharing the store
holds (the one tool-output refs use). The rule this module keeps: a reference validates only
with the key and for the tenant it was issued to; any other string, or the same string sent by
another tenant, does not. The summary text itself never travels: the reference is opaque.

Anything not starting with the prefix is not ours (an OpenAI upstream's own compaction item) and
is left alone. No I/O here: the store lookup is `remote_compaction`'s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re

PREFIX = "cgc1."
MARK = b'"' + PREFIX.encode()  # in a body that may hold one (a cheap test before parsing)
DOMAIN = b"compactgate compaction reference v1\0"
ID_BYTES = 16
_SHAPE = re.compile(r"cgc1\.([A-Za-z0-9_-]{22})\.([A-Za-z0-9_-]{43})")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _mac(secret: bytes, tenant: str, ref_id: str) -> str:
    message = DOMAIN + tenant.encode() + b"\0" + ref_id.encode("ascii")
    return _b64(hmac.new(secret, message, hashlib.sha256).digest())


def new_id() -> str:
    """A fresh reference id: 128 random bits, so ids cannot be guessed or collide."""
    return _b64(os.urandom(ID_BYTES))


def sign(secret: bytes, tenant: str, ref_id: str) -> str:
    """The `encrypted_content` naming summary `ref_id` for `tenant`."""
    return f"{PREFIX}{ref_id}.{_mac(secret, tenant, ref_id)}"


def is_ours(content: object) -> bool:
    """Whether `content` claims to be a reference this gateway issued (valid or not)."""
    return isinstance(content, str) and content.startswith(PREFIX)


def verify(secret: bytes, tenant: str, content: str) -> str | None:
    """The summary id `content` names, when it was issued with `secret` to `tenant`; else None."""
    found = _SHAPE.fullmatch(content)
    if found is None:
        return None
    ref_id, mac = found.groups()
    if not hmac.compare_digest(mac, _mac(secret, tenant, ref_id)):
        return None
    return ref_id
