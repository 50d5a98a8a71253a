"""Responses remote compaction on any upstream: `POST /v1/responses/compact`, `compaction_trigger`.

OpenAI's Responses API can compact a conversation itself: the answer is one `compaction` item
whose `encrypted_content` only OpenAI can read, and the client sends that item in place of the
history from then on. Other upstreams (llama.cpp, vLLM, any OpenAI-compatible server) know
nothing of it. For a model whose `responses_compact` is `emulate`, the gateway plays OpenAI's
part:

- **Compacting**: the input (the gateway's own earlier compaction items read back first) is
  summarised. A summary made ahead of need that covers it is used at once (an agent's compaction
  prepared by `compaction_answers`, or the same summary already in the store, made by any
  replica); otherwise the configured summariser makes it now. The text goes into the store under
  a random id, kept `summaries.remote_compaction_ttl_s` after the last request using it, and
  the client gets exactly one `compaction` item whose `encrypted_content` is a signed,
  tenant-bound reference to it (`compaction_refs`). `/v1/responses/compact` answers in
  OpenAI's shape: the input's user messages, then that item.
- **Ahead of need**: each compaction teaches `compaction_answers` where this tenant compacts
  (`timing`). Once a later conversation reaches that point, the summary for its next
  compaction is made in the background (with the gateway's compaction prompt, unless an agent's
  own is known for the tenant), so that compaction is answered at once.
- **Reading back**: before a `/v1/responses` (or compact) request whose body may hold one of
  our references (`refs.MARK`) is parsed, every `compaction` item carrying one becomes a user
  message with the summary (pinned: the gateway's own compaction never drops it); the request
  is then parsed once, and the upstream reads plain text. A reference that
  does not validate for this tenant is a 400 (`invalid_encrypted_content`), one whose summary
  has left the store a 410 (`compaction_expired`: the client must compact again from its own
  transcript), one that cannot be looked up because the store is down a 503; in each case
  nothing is sent upstream. A compaction item that is not ours (an OpenAI upstream's) is
  forwarded untouched.

`native` forwards both to the upstream; our own items are still read back first, since no
upstream can read them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from policies.steps.compaction import COMPACTION_PROMPT
from policies.summaries import SummaryRequest, prepare_for_summary

from ..config import SummariesConfig
from ..counting.prefix import Counted
from ..errors import (
    CompactionExpiredError,
    InvalidCompactionError,
    InvalidRequestError,
    StoreUnavailableError,
    UpstreamError,
)
from ..routing import Route
from ..store import SafeStore
from ..store.records import record
from ..summaries import SummaryService
from ..wire.base import WireRequest
from ..wire.fields import EXTENSION, serialise
from . import refs as compaction_refs
from .answers import CompactionAnswers

KEY_PREFIX = "compaction:"
SUMMARY_INTRO = (
    "The conversation before this point was compacted. This summary of it replaces the earlier "
    "messages:\n\n"
)
TRIGGER = "compaction_trigger"
READY = "ready"  # answered from a summary made before it was asked for
SUMMARISED = "summarised"  # the summariser made it for this request
AGENT = "responses"  # the label of these compactions (metrics, compaction_answers, the books)
TEMPLATE_FIELDS = ("model", "instructions", "prompt_cache_key", "service_tier")


@dataclass(frozen=True, slots=True)
class Compacted:
    """A compaction the gateway made: its one output item and where its summary came from."""

    item: dict[str, Any]
    outcome: str  # READY or SUMMARISED
    tokens_before: int = 0  # the history it replaces, by the gateway's count
    tokens_after: int = 0  # the summary that stands for it in later requests


class RemoteCompaction:
    def __init__(
        self,
        store: SafeStore,
        summaries: SummaryService,
        secret: bytes,
        counts: Callable[[WireRequest, Route, str], Counted],
        answers: CompactionAnswers,
        config: SummariesConfig,
    ) -> None:
        self._store = store
        self._summaries = summaries  # the summariser, its cache, and background work
        self._secret = secret  # signs the compaction items (the tool-output refs' key)
        self._counts = counts  # a request's per-message counts (the engine's)
        self._answers = answers  # summaries made ahead of need, and where tenants compact
        self._config = config

    # -- reading our items back ---------------------------------------------------------------

    async def expand(self, payload: Mapping[str, Any], tenant: str) -> bytes | None:
        """The body with each of our compaction items replaced by its summary as a user
        message; None when it has none."""
        items = payload.get("input")
        if not isinstance(items, list) or not has_type(items, "compaction"):
            return None
        ours = {
            index: item["encrypted_content"]
            for index, item in enumerate(items)
            if isinstance(item, dict)
            and item.get("type") == "compaction"
            and compaction_refs.is_ours(item.get("encrypted_content"))
        }
        if not ours:
            return None
        secret = self._secret
        ids = {}
        for index, content in ours.items():
            ref_id = compaction_refs.verify(secret, tenant, content)
            if ref_id is None:
                raise InvalidCompactionError(
                    f"input[{index}] is a compaction item this gateway did not issue to this "
                    "caller (its encrypted_content does not verify).",
                    param=f"input[{index}].encrypted_content",
                )
            ids[index] = ref_id
        texts = await asyncio.gather(*(self._summary(tenant, ref_id) for ref_id in ids.values()))
        replaced = list(items)
        for (index, ref_id), text in zip(ids.items(), texts, strict=True):
            if text is None:
                raise self._missing(index)
            replaced[index] = summary_item(text)
            self._keep_alive(tenant, ref_id, text)
        return serialise({**payload, "input": replaced})

    async def _summary(self, tenant: str, ref_id: str) -> str | None:
        held = record(await self._store.get(KEY_PREFIX + ref_id))
        if held is None or held.get("tenant") != _tenant_digest(tenant):
            return None
        text = held.get("text")
        return text if isinstance(text, str) else None

    def _keep_alive(self, tenant: str, ref_id: str, text: str) -> None:
        """A summary in use is kept `remote_compaction_ttl_s` after its last use; rewritten in
        the background, never delaying the request."""
        if self._summaries.closed:
            return
        held = _held(tenant, text)
        ttl = self._config.remote_compaction_ttl_s
        put = self._store.put(KEY_PREFIX + ref_id, held, ttl)
        self._summaries.spawn(put, name="compaction-ttl")

    def _missing(self, index: int) -> Exception:
        where = f"input[{index}].encrypted_content"
        if self._store.down:
            return StoreUnavailableError(
                f"The summary behind input[{index}] is held in the gateway's store, which cannot "
                "be reached; retry later.",
                param=where,
            )
        return CompactionExpiredError(
            f"The summary behind the compaction item input[{index}] has expired from the "
            "gateway's store; compact the conversation again from its full history.",
            param=where,
        )

    # -- making a compaction ------------------------------------------------------------------

    async def compact(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> Compacted:
        """Summarise `request`'s conversation and issue the compaction item referring to it."""
        if request.stateful:
            raise InvalidRequestError(
                "This model's compaction is made by the gateway, which cannot see a history "
                "held upstream (previous_response_id, conversation): send the input items.",
                param="previous_response_id",
            )
        text, outcome, tokens = await self.summarise(request, route, tenant, headers)
        self._learn(tenant, request, tokens)
        counted = self._counts(request, route, tenant)  # the memo's: counted by `summarise`
        await self._answers.compacted(tenant, request, counted.uids, tokens)
        after = route.counter.message(summary_item(text))
        return Compacted(await self.issue(tenant, text), outcome, tokens, after)

    def _learn(self, tenant: str, request: WireRequest, tokens: int) -> None:
        """Teach `compaction_answers` where this tenant compacts, so that its next compaction
        is prepared ahead of need (unless an agent's own compaction prompt is known: that one
        gives the summary the agent expects)."""
        answers = self._answers
        if answers.agent_of(tenant, request.api) not in (None, AGENT):
            return
        items = request.payload.get("input")
        if isinstance(items, str):
            items = [{"type": "message", "role": "user", "content": items}]
        prompt = {"type": "message", "role": "user", "content": COMPACTION_PROMPT}
        payload = {k: request.payload[k] for k in TEMPLATE_FIELDS if k in request.payload}
        payload["input"] = [*(items or ()), prompt]
        answers.learn(tenant, AGENT, dataclasses.replace(request, payload=payload), tokens)

    async def issue(self, tenant: str, text: str) -> dict[str, Any]:
        """Keep `text` in the store and return the compaction item that refers to it."""
        ref_id = compaction_refs.new_id()
        ttl = self._config.remote_compaction_ttl_s
        if not await self._store.put(KEY_PREFIX + ref_id, _held(tenant, text), ttl):
            raise StoreUnavailableError(
                "The gateway's store cannot be reached, so the compaction cannot be kept; retry."
            )
        return {
            "type": "compaction",
            "id": "cmp_" + uuid.uuid4().hex,
            "encrypted_content": compaction_refs.sign(self._secret, tenant, ref_id),
            "created_by": "compactgate",
        }

    async def summarise(
        self,
        request: WireRequest,
        route: Route,
        tenant: str,
        headers: Sequence[tuple[bytes, bytes]],
        instructions: str | None = None,
    ) -> tuple[str, str, int]:
        """The summary's text, where it came from, and the history's size in tokens
        (`instructions`: the client's own summary prompt, instead of the gateway's)."""
        history = _history(request)
        if not history:
            raise InvalidRequestError(
                "There is nothing to compact: `input` is empty.", param="input"
            )
        counted = self._counts(request, route, tenant)
        tokens = sum(counted.counts)
        prepared = await self._answers.covering(
            tenant, request, counted.uids, counted.counts, len(request.messages)
        )
        if prepared.text is not None:
            return prepared.text, READY, tokens
        summary = SummaryRequest(
            purpose="compaction",
            messages=prepare_for_summary(tuple(history)),
            instructions=instructions or COMPACTION_PROMPT,
            max_tokens=self._config.remote_compaction_tokens,
        )
        service = self._summaries
        key = service.key(summary, route, tenant)
        found = await service.cached(key)
        if found is not None:
            return found.text, READY, tokens
        answer = await service.compute(key, summary, route, headers, request.api)
        if answer.status != "ready" or not answer.text:
            raise UpstreamError(
                "The gateway could not summarise this conversation for compaction (the "
                "summariser failed); retry, or compact with the full history."
            )
        return answer.text, SUMMARISED, tokens


def _history(request: WireRequest) -> list[dict[str, Any]]:
    """The conversation to summarise: everything but `instructions` or the system prompt (sent
    again every turn)."""
    messages = request.messages
    if request.api == "messages":
        while messages and messages[0].get("role") == "system":
            messages = messages[1:]
    elif isinstance(request.payload.get("instructions"), str):
        messages = messages[1:]
    return list(messages)


def _held(tenant: str, text: str) -> bytes:
    """What the store keeps for one compaction: the summary, and whose it is."""
    return orjson.dumps({"v": 1, "tenant": _tenant_digest(tenant), "text": text})


def _tenant_digest(tenant: str) -> str:
    return hashlib.sha256(b"compactgate tenant\0" + tenant.encode()).hexdigest()[:32]


def summary_item(text: str) -> dict[str, Any]:
    """The input item standing for one of our compaction items: the summary, pinned."""
    return {
        "type": "message",
        "role": "user",
        "content": SUMMARY_INTRO + text,
        EXTENSION: {"pin": True},
    }


def has_type(items: list[Any], kind: str) -> bool:
    """Whether an input item has type `kind`: every Responses request asks twice, for its whole
    history, so the common answer (no) comes from one scan in C; items that are not all
    objects take the plain loop."""
    try:
        return kind in map(dict.get, items, itertools.repeat("type"))
    except TypeError:  # an item that is not a dict
        return any(isinstance(item, dict) and item.get("type") == kind for item in items)


def ends_with_trigger(request: WireRequest) -> bool:
    """Whether the request's last input item is a `compaction_trigger`; one anywhere else is a
    400, as on OpenAI's API (it must be the final input item)."""
    items = request.payload.get("input")
    if not isinstance(items, list) or not has_type(items, TRIGGER):
        return False
    triggers = [
        i for i, item in enumerate(items) if isinstance(item, dict) and item.get("type") == TRIGGER
    ]
    for index in triggers:
        if index != len(items) - 1:
            raise InvalidRequestError(
                f"input[{index}] is a compaction_trigger; it must be the final input item.",
                param=f"input[{index}]",
            )
    return bool(triggers)


def without_trigger(request: WireRequest, max_messages: int) -> WireRequest:
    """The request with its trailing `compaction_trigger` removed: the history to compact."""
    items = request.payload["input"]
    payload = {**request.payload, "input": items[:-1]}
    return request.wire.parse(serialise(payload), max_messages)


def user_messages(payload: Mapping[str, Any]) -> list[Any]:
    """The input's own user messages (OpenAI's compact output keeps them), as output items:
    their text in `input_text` parts, whatever shorthand the client sent them in."""
    items = payload.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list):
        return []
    return [
        _as_item(item)
        for item in items
        if isinstance(item, dict)
        and item.get("type", "message") == "message"
        and item.get("role") == "user"
        and not _is_summary_item(item)  # an earlier compaction: the new summary covers it
    ]


def _as_item(message: Mapping[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    item = {k: v for k, v in message.items() if k != EXTENSION}
    return {**item, "type": "message", "role": "user", "content": content}


def _is_summary_item(item: Mapping[str, Any]) -> bool:
    content = item.get("content")
    return item.get(EXTENSION) == {"pin": True} and (
        isinstance(content, str) and content.startswith(SUMMARY_INTRO)
    )


def compacted_body(
    payload: Mapping[str, Any], item: Mapping[str, Any], model: str
) -> dict[str, Any]:
    """`POST /v1/responses/compact`'s answer: the client's user messages, then our one item.
    Nothing is billed to the client for a summary made ahead of need; a summary made now is
    counted as the gateway's own spend (cost accounting), so the usage is zero either way."""
    return {
        "id": "resp_" + uuid.uuid4().hex,
        "object": "response.compaction",
        "created_at": int(time.time()),
        "model": model,
        "output": [*user_messages(payload), dict(item)],
        "usage": {
            "input_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 0,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 0,
        },
    }
