"""Answering a coding agent's own compaction request from a summary made ahead of need.

An agent compacts when its history passes its own limit: a full model call over the whole
history, made while the user waits (`agent_compaction` recognises the request). The first one
of a tenant's agent is forwarded, and teaches the gateway the agent's request (the compaction
prompt, tools and settings: a `Template`); every one teaches where the agent compacts
(`timing.CompactionTiming`: after which ordinary request). When an ordinary request of that
API is foreseen to be the last before the agent's compaction, the gateway makes the same
compaction call itself over its history, in the background while that request is at the
upstream, with the client's credential, through its own compaction (so it fits the window),
and keeps the answer per conversation.

When the agent's compaction request comes, a summary still being made for its history is
waited for (at most `wait_s`: it started earlier than the agent's own call would). A summary
that covers the history but for a tail is the answer, with that tail written short after it
(`tail.with_tail`), at once, in the client's wire format, streamed or not, unless it is
`stale` (`coverage`: it covers too little). Measured with the real Codex CLI
(benchmarks/bench_codex_compaction.py: ~6k-token tool outputs, compacting at 20k tokens), the
summary leaves one step uncovered, about a third of the history; written short it is ~150
tokens, and the upstream reads 13 % less than without the gateway. Kept verbatim instead, it
made Codex compact twice as often and the upstream read 24 % more than without the gateway.

A conversation whose summaries do not pay sits out its next compactions (`payback.Payback`);
its figures go on the event log's agent line, and into the metrics. With a shared store, the
timing and payback of every replica follow the store's (`shared`).

A summary made ahead of need is kept in this process and in the shared store (Redis when
configured), under a fingerprint of the conversation (tenant, API, its opening messages) with a
digest of the history it covers: the agent's compaction request may reach another replica than
the one that made it, and is answered there the same way.

The summary's cost is counted as the gateway's own spend when it is made; an answer from it
bills nothing, and its usage says so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..config import SummariesConfig
from ..counting.tokens import PRIMING_TOKENS
from ..ops.metrics import Metrics
from ..path.own_calls import OwnAnswer
from ..routing import Route
from ..store import SafeStore
from ..wire import WireRequest
from .coverage import BACKOFF, NOT_READY, Found, judged
from .payback import Payback
from .records import (
    Shared,
    Template,
    compaction_body,
    conversation_key,
    digest_of,
    store_key,
)
from .shared import SharedMemory, fetch_template, share_template
from .timing import CompactionTiming

if TYPE_CHECKING:
    from ..engine.prepared import Prepared

log = logging.getLogger("compactgate.agent_compaction")

MAX_KEPT = 1024
LOOKUP_EVERY_S = 10.0  # how often a replica asks the store for a tenant's template it lacks


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


@dataclass(slots=True)
class Making:
    """A summary being made: the history it covers, and when it is done."""

    uids: tuple[int | None, ...]
    done: asyncio.Event = field(default_factory=asyncio.Event)


Conversation = tuple[str, str, int]  # tenant, API, the uid of its first message


def history_tokens(prepared: Prepared) -> int:
    """The tokens of a prepared request's messages (its tool definitions left out)."""
    tools = prepared.tokens_by_region.get("tools", 0)
    return max(0, prepared.tokens_before - tools - PRIMING_TOKENS)


class CompactionAnswers:
    def __init__(
        self,
        store: SafeStore,
        spawn: Spawn,
        complete: Complete,
        metrics: Metrics,
        config: SummariesConfig,
    ) -> None:
        self._store = store
        self._spawn = spawn  # background work, cancelled at shutdown with the summaries'
        self._complete = complete  # the gateway's own call (path.own_calls.OwnCalls.complete)
        self._metrics = metrics
        self._ttl_s = config.ttl_s  # how long a summary made ahead of need is kept in the store
        self._wait_s = config.wait_s  # the longest a compaction request waits for one being made
        self.timing = CompactionTiming()
        self.payback = Payback()
        # With a shared store, every replica's timing and payback follow the store's.
        self._memory = SharedMemory(store, self.timing, self.payback) if store.shared else None
        self._templates: OrderedDict[tuple[str, str], Template] = OrderedDict()
        self._ready: OrderedDict[Conversation, Ready] = OrderedDict()
        self._making: dict[Conversation, Making] = {}
        self._looked: OrderedDict[tuple[str, str], float] = OrderedDict()  # template lookups

    # -- the agent's own request ----------------------------------------------------------------

    def learn(self, tenant: str, agent: str, request: WireRequest, tokens: int) -> None:
        """Remember an agent's compaction request (its prompt, settings and size)."""
        key = conversation_key(request.api)
        conversation = request.payload.get(key)
        if not isinstance(conversation, list) or not conversation:
            return
        fields = {k: v for k, v in request.payload.items() if k != key}
        template = Template(agent, fields, conversation[-1], tokens)
        self._keep(self._templates, (tenant, request.api), template)
        # Every replica prepares the next one, whichever the agent's turns land on.
        self._spawn(share_template(self._store, tenant, request.api, template), "agent-template")

    def agent_of(self, tenant: str, api: str) -> str | None:
        """The agent whose compaction request was learnt for this tenant and API, if any."""
        template = self._templates.get((tenant, api))
        return template.agent if template is not None else None

    async def answer(
        self,
        tenant: str,
        agent: str,
        request: WireRequest,
        uids: Sequence[int | None],
        counts: Sequence[int],
        tokens: int,
    ) -> Found:
        """The summary answering this compaction request (of `tokens`, as it would be sent),
        when one covers its history; what the agent's compaction teaches is learnt, and the
        conversation's books kept (`figures`)."""
        # The last canonical message is the compaction prompt.
        history = len(uids) - 1
        shared = self._memory
        conversation = (tenant, request.api, uids[0] if uids else None)
        if shared is not None and uids and uids[0] is not None:
            await shared.load(tenant, request.api, request.messages, conversation, agent)
        found = await self.covering(tenant, request, uids, counts, history)
        if not uids or uids[0] is None:
            return found
        self.timing.compacted(tenant, agent, conversation, sum(counts[:history]))
        payback = self.payback
        if found.text is not None:
            unused = payback.answered(conversation, tokens)
            self._metrics.agent_saved_tokens.labels(agent).inc(tokens)
        else:
            if found.reason == NOT_READY and payback.sitting_out(conversation):
                found = Found(None, BACKOFF)
            unused = payback.forwarded(conversation, found.reason, tokens)
            self._metrics.agent_forwarded.labels(agent, found.reason).inc()
        if unused:
            self._metrics.agent_unused_summaries.labels(agent).inc(unused)
        if shared is not None:
            saved = shared.save_compaction(
                tenant, request.api, request.messages, conversation, agent
            )
            self._spawn(saved, name="agent-shared")
        return found

    async def compacted(
        self, tenant: str, request: WireRequest, uids: Sequence[int | None], history: int
    ) -> None:
        """A compaction the gateway made itself (Responses remote compaction) of `history`
        tokens: where this tenant compacts, for the agent its template names."""
        api, shared = request.api, self._memory
        agent = self.agent_of(tenant, api)
        if agent is None or not uids or uids[0] is None:
            return
        key = (tenant, api, uids[0])
        if shared is not None:
            await shared.load(tenant, api, request.messages, key, agent)
        self.timing.compacted(tenant, agent, key, history)
        if shared is not None:
            saved = shared.save_compaction(tenant, api, request.messages, key, agent)
            self._spawn(saved, name="agent-shared")

    def figures(self, tenant: str, api: str, uid: int | None) -> dict[str, int]:
        """The conversation's agent-compaction figures so far (`payback.Figures`)."""
        return self.payback.figures((tenant, api, uid if uid is not None else -1))

    async def covering(
        self,
        tenant: str,
        request: WireRequest,
        uids: Sequence[int | None],
        counts: Sequence[int],
        history: int,
    ) -> Found:
        """A summary made ahead of need of the first `history` canonical messages of `request`
        (with their uncovered tail written after it), made here or by another replica; one
        being made here for this history is waited for."""
        if not uids or uids[0] is None:
            return Found(None, NOT_READY)
        key = (tenant, request.api, uids[0])
        making = self._making.get(key)
        if making is not None and tuple(uids[: len(making.uids)]) == making.uids:
            try:
                await asyncio.wait_for(making.done.wait(), self._wait_s)
            except TimeoutError:
                pass  # forwarded: the agent's own call is made now
        found = Found(None, NOT_READY)
        ready = self._ready.get(key)
        if ready is not None and tuple(uids[: len(ready.uids)]) == ready.uids:
            found = judged(request, counts, history, len(ready.uids), ready.text)
            if found.text is not None:
                return found
        # Made by another replica, or since refreshed there: the store has the latest.
        shared = await self._shared(tenant, request, history)
        if shared is None:
            return found
        if None not in uids[: shared.covers]:  # kept here too: the next lookup needs no digest
            ready = Ready(tuple(uids[: shared.covers]), sum(counts[: shared.covers]), shared.text)
            self._keep(self._ready, key, ready)
        return judged(request, counts, history, shared.covers, shared.text)

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

    def ordinary(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        prepared: Prepared | None,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """An ordinary request, prepared and on its way upstream: start the agent's next
        compaction summary if it is due (in the background, while this one is answered)."""
        if prepared is None or not prepared.uids or prepared.uids[0] is None:
            return
        key = (tenant, request.api, prepared.uids[0])
        tokens = history_tokens(prepared)
        if self._memory is not None:  # what the other replicas saw first
            task = self._ordinary_shared(tenant, route, request, prepared, key, tokens, headers)
            self._spawn(task, name="agent-ordinary")
            return
        self.timing.seen(key, tokens)  # before any compaction: the first one is bracketed too
        self._next(tenant, route, request, prepared, key, tokens, headers)

    async def _ordinary_shared(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        prepared: Prepared,
        key: Conversation,
        tokens: int,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """`ordinary` with a shared store: the conversation's records read, this request seen,
        the summary started if due, and what was seen written back (`shared`)."""
        assert self._memory is not None
        template = self._templates.get((tenant, request.api))
        agent = template.agent if template is not None else None
        await self._memory.load(tenant, request.api, request.messages, key, agent)
        self.timing.seen(key, tokens)
        self._next(tenant, route, request, prepared, key, tokens, headers)
        await self._memory.save_seen(tenant, request.api, request.messages, key)

    def _next(
        self,
        tenant: str,
        route: Route,
        request: WireRequest,
        prepared: Prepared,
        key: Conversation,
        tokens: int,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        """After an ordinary request is seen: its agent's next compaction summary started, when
        it is due."""
        template = self._templates.get((tenant, request.api))
        if template is None:
            self._look_up(tenant, request.api)
            return
        if request.stateful:
            return
        due = self.timing.due(tenant, template.agent, key, template.point)
        if not due or key in self._making or not self.payback.may_prepare(key):
            return
        uids = tuple(prepared.uids)
        ready = self._ready.get(key)
        if ready is not None and ready.uids == uids:
            return  # this very history is summarised already
        self._making[key] = Making(uids)
        task = self._make(key, template, route, request, uids, tokens, headers)
        self._spawn(task, name="agent-compaction")

    def _look_up(self, tenant: str, api: str) -> None:
        """Ask the store, now and then, for a template another replica learnt: the agent's
        compaction may have landed there while its ordinary turns land here."""
        now = time.monotonic()
        if now - self._looked.get((tenant, api), -LOOKUP_EVERY_S) < LOOKUP_EVERY_S:
            return
        self._keep(self._looked, (tenant, api), now)
        self._spawn(self._fetch_template(tenant, api), name="agent-template")

    async def _fetch_template(self, tenant: str, api: str) -> None:
        template = await fetch_template(self._store, tenant, api)
        if template is not None and (tenant, api) not in self._templates:
            self._keep(self._templates, (tenant, api), template)

    async def _make(
        self,
        key: Conversation,
        template: Template,
        route: Route,
        request: WireRequest,
        uids: tuple[int | None, ...],
        tokens: int,
        headers: Sequence[tuple[bytes, bytes]],
    ) -> None:
        try:
            body = compaction_body(request, template)
            answer = await self._complete(route, key[0], request.api, body, headers)
            self.payback.made(key, answer.tokens)
            if self._memory is not None:
                await self._memory.save_books(key[0], request.api, request.messages, key)
            self._metrics.agent_background_tokens.labels(template.agent).inc(answer.tokens)
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
            making = self._making.pop(key, None)
            if making is not None:
                making.done.set()

    def _keep(self, table: OrderedDict[Any, Any], key: Any, value: Any) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > MAX_KEPT:
            table.popitem(last=False)
