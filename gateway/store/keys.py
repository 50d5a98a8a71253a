"""How keys are laid out, so that a Redis Cluster never splits one operation (design D13.5).

The rule this module keeps: every operation the gateway sends touches one key, or several keys
in a pipeline of single-key commands (which a cluster client sends to each key's node); nothing
needs two keys in one slot. Keys that belong to one conversation and may one day be read or
written together carry the same hash tag, `{c:<digest>}`, made here from the tenant and the
conversation key, so a cluster keeps them in one slot and a multi-key command or script over
them stays legal. The tag is a digest: a tenant's name or a client's header never picks the
slot, and braces in them never make a tag of their own.
"""

from __future__ import annotations

import hashlib

PREFIX = "compactgate:"  # every Redis key the gateway writes starts with it


def conversation_tag(tenant: str, conversation: str) -> str:
    """The hash tag shared by one conversation's keys."""
    digest = hashlib.blake2b(
        tenant.encode("utf-8", "surrogatepass")
        + b"\0"
        + conversation.encode("utf-8", "surrogatepass"),
        digest_size=10,
    ).hexdigest()
    return "{c:" + digest + "}"


def conversation_key(tenant: str, conversation: str, name: str) -> str:
    """The key `name` of one tenant's conversation: `conv:{c:<digest>}:<name>`."""
    return f"conv:{conversation_tag(tenant, conversation)}:{name}"
