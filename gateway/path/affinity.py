"""The conversation key: what a load balancer hashes on to keep a conversation on one replica
(design D13.6).

Every answer carries it as `x-compactgate-conversation`. The rule this module keeps: the same
conversation gets the same key on every turn and on every replica, and the key reveals nothing
of what it was made from (a digest, scoped to the tenant). Taken from, in order:

1. the agent's own session: the header `session-id` or `session_id` (Codex CLI) or
   `x-claude-code-session-id` (Claude Code), else the `session_id` inside Claude Code's
   `metadata.user_id`; one session gives one key whichever of these carried it;
2. a key the client sends back in `x-compactgate-conversation` (a client that echoes the header
   keeps its conversation together even after its history was rewritten);
3. the conversation's opening: its leading system and developer messages and its first user
   message, which stay the same from turn to turn (until an agent compacts its history).

Prompt caches and the in-process memos (`gateway.prefix`, held results) stay warm when one
replica serves the whole conversation; correctness never depends on it (D13.3).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson

HEADER = b"x-compactgate-conversation"
SESSION_HEADERS = (b"session-id", b"session_id", b"x-claude-code-session-id")
_SESSION_VALUE = re.compile(rb"[\x21-\x7e]{1,200}")  # longer or unprintable: ignored
_KEY = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
_USER_ID_SESSION = re.compile(r'"session_id"\s*:\s*"([^"]{1,200})"|_session_([0-9a-fA-F-]{8,64})')

Source = Literal["session", "client", "opening"]


@dataclass(frozen=True, slots=True)
class ConversationKey:
    value: str
    source: Source


def conversation_key(
    headers: Sequence[tuple[bytes, bytes]],
    payload: Mapping[str, Any],
    messages: Sequence[Mapping[str, Any]],
    tenant: str,
) -> ConversationKey:
    """The key of the conversation a request belongs to (see the module's rules)."""
    session = _session(headers, payload)
    if session is not None:
        return ConversationKey(_digest("s", tenant, session), "session")
    for name, value in headers:
        if name == HEADER and _KEY.fullmatch(value):
            return ConversationKey(value.decode("ascii"), "client")
    return ConversationKey(_digest("o", tenant, _opening(messages)), "opening")


def _session(headers: Sequence[tuple[bytes, bytes]], payload: Mapping[str, Any]) -> bytes | None:
    for name, value in headers:
        if name in SESSION_HEADERS and _SESSION_VALUE.fullmatch(value):
            return value
    metadata = payload.get("metadata")
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if isinstance(user_id, str) and (found := _USER_ID_SESSION.search(user_id[:2000])):
        return (found.group(1) or found.group(2)).encode("utf-8", "surrogatepass")
    return None


def _opening(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """The leading system/developer messages and the first user message, as bytes."""
    opening = []
    for message in messages:
        role = message.get("role")
        opening.append([role, message.get("content")])
        if role not in ("system", "developer"):
            if role == "user":
                break
            opening.pop()  # an assistant turn before any user message says nothing stable
    try:
        return orjson.dumps(opening)
    except orjson.JSONEncodeError:  # a lone surrogate in a string: still a stable key
        return repr(opening).encode("utf-8", "surrogatepass")


def _digest(kind: str, tenant: str, value: bytes) -> str:
    digest = hashlib.blake2b(digest_size=12)
    digest.update(tenant.encode("utf-8", "surrogatepass"))
    digest.update(b"\0")
    digest.update(value)
    return kind + digest.hexdigest()
