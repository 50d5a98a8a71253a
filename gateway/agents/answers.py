"""Answering a coding agent's own compaction request from a summary made ahead of need.

An agent compacts when its history passes its own limit: a full model call over the whole
history, made while the user waits (`agent_compaction` recognises the request). The first one
of a tenant's agent is forwarded, and teaches the gateway two things: the history size at which
that agent compacts, and its request (the compaction prompt, tools and settings). From then on,
when an ordinary request of that API passes `PREPARE_AT` of that size, the gateway makes the
same compaction call itself, in the background, over that request's history, with the client's
credential, through its own compaction (so it fits the window), and keeps the answer per
conversation. When the agent's compaction request comes, if the kept summary covers its history
but for a short tail (at most `STALE_SHARE` of it: typically the model's last answer and a tool
output), the gateway answers at once with that summary, the tail appended as a short transcript,
in the client's wire format, streamed or not; otherwise it forwards the request as before.

A summary made ahead of need is kept in this process and in the shared store (Redis when
configured), under a fingerprint of the conversation (tenant, API, its opening messages) with a
digest of the history it covers: the agent's compaction request may reach another replica than
the one that made it, and is answered there the same way. Each lookup says why it answered or
not (`Found.reason`: ready, not_ready or stale), for the response's event-log line.

The summary's cost is counted as the gateway's own spend when it is made; an answer from it
bills nothing, and its usage says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..ops.metrics import Metrics
from ..path.own_calls import OwnAnswer
from ..routing import Route
from ..store import SafeStore
from ..summaries.transcript import render_message
from ..wire import WireRequest
from .records import (
    TEMPLATE_TTL_S,
    Shared,
    Template,
    digest_of,
    store_key,
    template_key,
)

if TYPE_CHECKING:
    from ..engine.prepared import Prepared

log = logging.getLogger("compactgate.agent_compaction")

PREPARE_AT = 0.7  # of the history size at the agent's last compaction
REFRESH_SHARE = 0.15  # prepare again when the history grew this much since the last summary
STALE_SHARE = 0.25  # the most of a compaction request's history a summary may not cover
MAX_KEPT = 1024
TAIL_NOTE = "\n\nSteps after this summary was written (verbatim, oldest first):\n"
LOOKUP_EVERY_S = 10.0  # how often a replica asks the store for a tenant's template it lacks
READY = "ready"  # a summary made ahead of need covers the history: answered from it
NOT_READY = "not_ready"  # none was made for this history (or it is being made)
STALE = "stale"  # one was, but too much happened since: the agent's own call makes a better one


class Spawn(Protocol):
    """Start background work that shutdown cancels (`SummaryService.spawn`)."""

    def __call__(self, coroutine: Coroutine[Any, Any, object], name: str) -> object: ...


class Complete(Protocol):
    """The gateway's own call answered whole (`path.own_calls.OwnCalls.complete`)."""

    def __call__(
        self,
        route: Route,
        tenant: str,
        api: str,
        body: Mapping[str, Any],
        headers: Sequence[tuple[bytes, bytes]],
    ) -> Awaitable[OwnAnswer]: ...


@dataclass(frozen=True, slots=True)
class Ready:
    uids: tuple[int | None, ...]  # the canonical messages of the history it summarises
    tokens: int
    text: str


@dataclass(frozen=True, slots=True)
class Found:
    """A compaction request looked up: the answer's text (None: forward it), and why."""

    text: str | None
    reason: str  # READY, NOT_READY or STALE


class CompactionAnswers:
    def __init__(
        self,
        store: SafeStore,
        spawn: Spawn,
        complete: Complete,
        metrics: Metrics,
        ttl_s: float,
    ) -> None:
        self._store = store
        self._spawn = spawn  # background work, cancelled at shutdown with the summaries'
        self._complete = complete  # the gateway's own call (path.own_calls.OwnCalls.complete)
        self._metrics = metrics
        self._ttl_s = ttl_s  # how long a summary made ahead of need is kept in the store
        self._templates: OrderedDict[tuple[str, str], Template] = OrderedDict()
        self._ready: OrderedDict[tuple[str, str, int], Ready] = OrderedDict()
        self._making: set[tuple[str, str, int]] = set()
        self._looked: OrderedDict[tuple[str, str], float] = (
            OrderedDict()
        )  # store lookups of a missing template

    # -- the agent's own request ----------------------------------------------------------------

    def learn(self, tenant: str, agent: str, request: WireRequest, tokens: int) -> None:
        """Remember an agent's compaction request (its prompt, settings and size)."""
        key = _conversation_key(request.api)
        conversation = request.payload.get(key)
        if not isinstance(conversation, list) or not conversation:
            return
        fields = {k: v for k, v in request.payload.items() if k != key}
        template = Template(agent, fields, conversation[-1], tokens)
        self._keep(self._templates, (tenant, request.api), template)
        # Every replica prepares the next one, whichever the agent's turns land on.
        share = self._share_template(tenant, request.api, template)
        self._spawn(share, name="agent-template")

    def agent_of(self, tenant: str, api: str) -> str | None:
        """The agent whose compaction request was learnt for this tenant and API, if any."""
        template = self._templates.get((tenant, api))
        return template.agent if template is not None else None

    async def answer(
        self, tenant: str, request: WireRequest, uids: Sequence[int | None], counts: Sequence[int]
    ) -> Found:
        """The summary answering this compaction request, when one covers its history."""
        # The last canonical message is the compaction prompt.
        return await self.covering(tenant, request, uids, counts, len(uids) - 1)

    async def covering(
        self,
        tenant: str,
        request: WireRequest,
        uids: Sequence[int | None],
        counts: Sequence[int],
        history: int,
    ) -> Found:
        """A summary made ahead of need of the first `history` canonical messages of `request`
        (with their short uncovered tail appended), made here or by another replica."""
        if not uids or uids[0] is None:
            return Found(None, NOT_READY)
        found = Found(None, NOT_READY)
        ready = self._ready.get((tenant, request.api, uids[0]))
        if ready is not None and tuple(uids[: len(ready.uids)]) == ready.uids:
            found = _judged(request, counts, history, len(ready.uids), ready.text)
            if found.text is not None:
                return found
        # Made by another replica, or since refreshed there: the store has the latest.
        shared = await self._shared(tenant, request, history)
        if shared is None:
            return found
        if None not in uids[: shared.covers]:  # kept here too: the next lookup needs no digest
            ready = Ready(tuple(uids[: shared.covers]), sum(counts[: shared.covers]), shared.text)
            self._keep(self._ready, (tenant, request.api, uids[0]), ready)
        return _judged(request, counts, history, shared.covers, shared.text)

    async def _shared(self, tenant: str, request: WireRequest, history: int) -> Shared | None:
        """The store's summary for this conversation, when the history starts with what it
        covers."""
        value = await self._store.get(store_key(tenant, request.api, request.messages))
        shared = Shared.decode(value) if value is not None else None
        if shared is None or shared.covers > history:
            return None
        if digest_of(request.messages[: shared.covers]) != shared.digest:
            return None
        return shared

    # -- ahead of need ----------------------------------------------------------------------

    def after_response(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        prepared: Prepared | None,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """After an ordinary answer: make the agent's next compaction summary if it is near."""
        template = self._templates.get((tenant, request.api))
        if template is None:
            self._look_up(tenant, request.api)
            return
        if prepared is None or not prepared.uids or request.stateful:
            return
        uid = prepared.uids[0]
        if uid is None:
            return
        tokens = prepared.tokens_before
        if tokens < PREPARE_AT * template.point:
            return
        key = (tenant, request.api, uid)
        ready = self._ready.get(key)
        if key in self._making or (
            ready is not None and tokens - ready.tokens < REFRESH_SHARE * template.point
        ):
            return
        self._making.add(key)
        task = self._make(key, template, route, request, tuple(prepared.uids), tokens, headers)
        self._spawn(task, name="agent-compaction")

    def _look_up(self, tenant: str, api: str) -> None:
        """Ask the store, now and then, for a template another replica learnt: the agent's
        compaction may have landed there while its ordinary turns land here."""
        now = time.monotonic()
        if now - self._looked.get((tenant, api), -LOOKUP_EVERY_S) < LOOKUP_EVERY_S:
            return
        self._keep(self._looked, (tenant, api), now)
        self._spawn(self._fetch_template(tenant, api), name="agent-template")

    async def _share_template(self, tenant: str, api: str, template: Template) -> None:
        try:
            await self._store.put(template_key(tenant, api), template.encode(), TEMPLATE_TTL_S)
        except Exception as error:  # the store being away only means no summary ahead of need
            log.warning("agent compaction template not shared: %s", error)

    async def _fetch_template(self, tenant: str, api: str) -> None:
        try:
            value = await self._store.get(template_key(tenant, api))
        except Exception as error:  # the store being away only means no summary ahead of need
            log.warning("agent compaction template lookup failed: %s", error)
            return
        template = Template.decode(value) if value is not None else None
        if template is not None and (tenant, api) not in self._templates:
            self._keep(self._templates, (tenant, api), template)

    async def _make(
        self,
        key: tuple[str, str, int],
        template: Template,
        route: Route,
        request: WireRequest,
        uids: tuple[int | None, ...],
        tokens: int,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        try:
            body = _compaction_body(request, template)
            answer = await self._complete(route, key[0], request.api, body, headers)
            if answer.status != 200:
                log.info("agent compaction summary: upstream answered %d", answer.status)
                return
            if answer.text:
                text = answer.text
                self._keep(self._ready, key, Ready(uids, tokens, text))
                history = request.messages[: len(uids)]
                shared = Shared(len(uids), digest_of(history), text)
                where = store_key(key[0], request.api, history)
                await self._store.put(where, shared.encode(), self._ttl_s)
                self._metrics.agent_compactions.labels(template.agent, "prepared").inc()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # a summary made ahead of need must never hurt a request
            log.warning("agent compaction summary failed: %s", error)
        finally:
            self._making.discard(key)

    def _keep(self, table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > MAX_KEPT:
            table.popitem(last=False)


def _judged(
    request: WireRequest, counts: Sequence[int], history: int, covers: int, text: str
) -> Found:
    """A summary of the first `covers` canonical messages, as the answer for the first
    `history`: with the uncovered tail appended, unless that tail is too much of it."""
    if covers > history:
        return Found(None, NOT_READY)
    if sum(counts[covers:history]) > STALE_SHARE * max(1, sum(counts[:history])):
        return Found(None, STALE)  # too much happened since: the agent's own call does better
    tail = request.messages[covers:history]
    if not tail:
        return Found(text, READY)
    return Found(text + TAIL_NOTE + "\n\n".join(render_message(m) for m in tail), READY)


def _conversation_key(api: str) -> str:
    return "input" if api == "responses" else "messages"


def _compaction_body(request: WireRequest, template: Template) -> dict[str, Any]:
    """The agent's compaction request, as it would send it over this request's history."""
    key = _conversation_key(request.api)
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
