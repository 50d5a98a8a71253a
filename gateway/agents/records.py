"""What the store keeps for agents' compactions, so every replica sharing it can use them: the
template an agent's first compaction taught, and summaries made ahead of need; with their keys
(tenants hashed) and the digest that ties a summary to the history it covers; and the agent's
compaction request made again from its template over another history (`compaction_body`)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..store.records import record
from ..wire import WireRequest

STORE_PREFIX = "agent-ready:"
TEMPLATE_PREFIX = "agent-template:"
TEMPLATE_TTL_S = 7 * 24 * 3600  # an agent's compaction settings outlive any one session


@dataclass(frozen=True, slots=True)
class Template:
    """An agent's compaction request without its history: what to send to make the next one."""

    agent: str
    fields: Mapping[str, Any]  # the request's fields other than the conversation
    prompt: Any  # the conversation's last element: the compaction prompt
    point: int  # the history's tokens when the agent compacted

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "v": 1,
                "agent": self.agent,
                "fields": self.fields,
                "prompt": self.prompt,
                "point": self.point,
            }
        )

    @staticmethod
    def decode(value: bytes) -> Template | None:
        data = record(value)
        if data is None:
            return None
        agent, fields, point = data.get("agent"), data.get("fields"), data.get("point")
        if not (isinstance(agent, str) and isinstance(fields, dict) and isinstance(point, int)):
            return None
        return Template(agent, fields, data.get("prompt"), point)


@dataclass(frozen=True, slots=True)
class Shared:
    """A summary made ahead of need, as the store keeps it for every replica."""

    covers: int  # the canonical messages it summarises (the history's first ones)
    digest: str  # of those messages: the history must start with exactly them
    text: str

    def encode(self) -> bytes:
        return orjson.dumps(
            {"v": 1, "covers": self.covers, "digest": self.digest, "text": self.text}
        )

    @staticmethod
    def decode(value: bytes) -> Shared | None:
        data = record(value)
        if data is None:
            return None
        covers, digest, text = data.get("covers"), data.get("digest"), data.get("text")
        if not (isinstance(covers, int) and isinstance(digest, str) and isinstance(text, str)):
            return None
        return Shared(covers, digest, text)


def store_key(tenant: str, api: str, messages: Sequence[Any]) -> str:
    """Where the store keeps a conversation's summary: its tenant, API and opening messages
    (what the prefix memo keys a conversation by too)."""
    digest = hashlib.blake2b(digest_size=20)
    for part in (tenant, api):
        digest.update(part.encode() + b"\0")
    return STORE_PREFIX + digest_of(messages[:2], digest)


def template_key(tenant: str, api: str) -> str:
    """Where the store keeps a tenant's agent compaction template (the tenant hashed)."""
    digest = hashlib.blake2b(f"{tenant}\0{api}".encode(), digest_size=20)
    return TEMPLATE_PREFIX + digest.hexdigest()


def digest_of(messages: Sequence[Any], digest: Any = None) -> str:
    """A digest of canonical messages, the same on every replica (they parse the same bytes
    into the same dicts)."""
    digest = digest or hashlib.blake2b(digest_size=20)
    for message in messages:
        try:
            data = orjson.dumps(message)
        except orjson.JSONEncodeError:
            data = repr(message).encode()
        digest.update(len(data).to_bytes(8, "big"))
        digest.update(data)
    return digest.hexdigest()


def conversation_key(api: str) -> str:
    return "input" if api == "responses" else "messages"


def compaction_body(request: WireRequest, template: Template) -> dict[str, Any]:
    """The agent's compaction request, as it would send it over this request's history."""
    key = conversation_key(request.api)
    raw = request.payload.get(key) or []
    if isinstance(raw, str):  # a Responses `input` that is one user message
        raw = [{"type": "message", "role": "user", "content": raw}]
    history = list(raw)
    prompt = template.prompt
    if request.api == "messages" and history and isinstance(prompt, dict):
        # Claude Code puts the prompt in the turn that answers the last tool call.
        texts = [
            b
            for b in prompt.get("content") or []
            if isinstance(b, dict) and b.get("type") == "text"
        ]
        last = history[-1]
        if (
            isinstance(last, dict)
            and last.get("role") == "user"
            and isinstance(last.get("content"), list)
        ):
            history[-1] = {**last, "content": [*last["content"], *texts]}
        else:
            history.append({"role": "user", "content": texts})
    else:
        history.append(prompt)
    return {**template.fields, key: history, "stream": False}
