"""The summary service: answers from the store, each computed once, failures remembered.

Policies ask for summaries as data (`policies/summaries.py`); the pipeline runs the chain with a
`RequestSummaries` for the request and hands it what the chain lacked, which it fetches here:
from this process's tier or the store (`cache`), or computed by the `Summarizer`.

Rules this module keeps:

- **Failures are never cached**: a failed call leaves the store untouched, answers `failed`
  (the chain goes on to its next step), is counted, and is not retried by this process for
  `retry_failed_after_s`.
- **One computation per key** (single-flight): in a process, racing requests share one task;
  across replicas, the computing one holds a store lock (`SET NX PX`, expiring after the
  summary's timeout) and the others poll the store for its result. A store outage degrades to
  local-only single-flight.
- **A summary is only waited for when the request cannot be sent without it**: when the steps
  up to the summarising ones do not fit it under its limit without the missing summary (or on a
  reactive retry), and then at most `wait_s`. The computation goes on in the background either
  way and its result is cached for the next request; a request that fits is sent meanwhile
  with what is ready (the pipeline decides; `SummaryAsk.wait`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.memo import Memo
from policies.summaries import FAILED, MISSING, SummaryAnswer, SummaryRequest, UnwritableError

from ..config import SummariesConfig
from ..errors import InvalidRequestError
from ..ops.metrics import Metrics
from ..routing import Route
from ..store import SafeStore
from .cache import LocalAnswers, decode, encode, store_key
from .summarizer import Summarizer, SummarizerError

log = logging.getLogger("compactgate.summaries")

LOCK_MARGIN_S = 10.0
POLL_FIRST_S = 0.05
POLL_MAX_S = 0.5
MAX_FAILURES_KEPT = 4096
AVERAGE_WEIGHT = 0.3
KEYS_KEPT = 4096
KEYS_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class SummaryAsk:
    """How the summary fetcher may get what the store lacks."""

    headers: tuple[tuple[bytes, bytes], ...] | None  # the client's (credential); None: cache only
    wait: bool  # the request cannot be sent without them: wait (bounded); else compute meanwhile
    api: str = "chat"  # the client's wire API: its upstream speaks it, so summaries use it


def unsummarisable(error: UnwritableError) -> InvalidRequestError:
    """The 400 of a conversation whose messages cannot be written again to be summarised."""
    return InvalidRequestError(
        f"The conversation cannot be summarised: a message is nested too deeply ({error})."
    )


class RequestSummaries:
    """The summary source of one request's chain runs: the answers it was given, then this
    process's tier. It keeps its own answers; the caller hands it what it fetched (`learn`)."""

    def __init__(self, service: SummaryService, route: Route, tenant: str) -> None:
        self._service = service
        self._route = route
        self._tenant = tenant
        self._answers: dict[bytes, SummaryAnswer] = {}

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        canonical = request.canonical()
        answer = self._answers.get(canonical)
        if answer is not None:
            return answer
        answer = self._service.local.get(
            self._service.key_of(request, canonical, self._route, self._tenant)
        )
        if answer is None:
            return MISSING
        self._service.hits.inc()
        self._answers[canonical] = answer
        return answer

    async def fetch(
        self, requests: Sequence[SummaryRequest], ask: SummaryAsk
    ) -> Mapping[bytes, SummaryAnswer]:
        """Answers by canonical bytes (`SummaryService.fetch`); nothing is learnt yet."""
        return await self._service.fetch(requests, self._route, self._tenant, ask)

    def learn(
        self, requests: Sequence[SummaryRequest], answers: Mapping[bytes, SummaryAnswer]
    ) -> None:
        """Answer `requests` from `answers` from now on; one without an answer has failed (this
        request does not ask for it again)."""
        for request in requests:
            key = request.canonical()
            self._answers[key] = answers.get(key) or FAILED

    def add(self, request: SummaryRequest, answer: SummaryAnswer) -> None:
        self._answers[request.canonical()] = answer

    def complete(self) -> bool:
        """Whether every summary asked for so far was ready."""
        return all(answer.status == "ready" for answer in self._answers.values())


class SummaryService:
    """The pipeline's summary fetcher: store lookups, single-flight computation, background work."""

    def __init__(
        self, config: SummariesConfig, store: SafeStore, summarizer: Summarizer, metrics: Metrics
    ) -> None:
        self.config = config
        self.store = store
        self.summarizer = summarizer
        self.metrics = metrics
        self._inflight: dict[str, asyncio.Task[SummaryAnswer]] = {}
        self._tasks: set[asyncio.Task[object]] = set()
        self._failed: dict[str, float] = {}
        self.local = LocalAnswers(config.local_cache_bytes)
        self.hits = metrics.summary_cache.labels("hit")  # per link asked (one when resumed)
        self._keys = Memo(KEYS_KEPT, KEYS_BYTES)  # cache keys of recent requests, by their bytes
        self.closed = False
        self.summary_seconds: float | None = None  # running average of one summary's duration

    def source(self, route: Route, tenant: str) -> RequestSummaries:
        """The summary source of one request of `tenant` on `route`."""
        return RequestSummaries(self, route, tenant)

    # -- keys and the store -------------------------------------------------------------------

    def key(self, request: SummaryRequest, route: Route, tenant: str) -> str:
        """The cache key of `request` (400 for one whose messages cannot be written again)."""
        try:
            canonical = request.canonical()
        except UnwritableError as error:
            raise unsummarisable(error) from None
        return self.key_of(request, canonical, route, tenant)

    def key_of(self, request: SummaryRequest, canonical: bytes, route: Route, tenant: str) -> str:
        """Hash of tenant, summary model, summariser fingerprint and the request's bytes.

        Memoised: a rolling summary's links are looked up on every request of a conversation,
        and a memoised link brings the same `canonical` object, whose `hash()` Python keeps.
        """
        parts = (tenant, self.summarizer.model_of(request, route), self.summarizer.fingerprint())
        return self._keys.get(
            (*parts, canonical), lambda: store_key(parts, canonical), len(canonical)
        )

    async def cached(self, key: str) -> SummaryAnswer | None:
        """The answer from this process's tier, else from the store (then kept locally)."""
        answer = self.local.get(key)
        if answer is not None:
            return answer
        value = await self.store.get(key)
        answer = decode(value) if value is not None else None
        if answer is not None:
            self.local.put(key, answer)
        return answer

    # -- the fetcher ----------------------------------------------------------------------------

    async def fetch(
        self, requests: Sequence[SummaryRequest], route: Route, tenant: str, ask: SummaryAsk
    ) -> Mapping[bytes, SummaryAnswer]:
        """Answers by canonical bytes: ready, failed, or missing (computing; the request fits)."""
        answers: dict[bytes, SummaryAnswer] = {}
        waiting: dict[bytes, asyncio.Task[SummaryAnswer]] = {}
        for request in requests:
            canonical = request.canonical()
            if canonical in answers or canonical in waiting:
                continue
            key = self.key_of(request, canonical, route, tenant)
            found = await self.cached(key)
            self.metrics.summary_cache.labels("hit" if found else "miss").inc()
            if found is not None:
                answers[canonical] = found
            elif ask.headers is None or self.closed or self.recently_failed(key):
                answers[canonical] = FAILED
            else:
                task = self.compute(key, request, route, ask.headers, ask.api)
                if ask.wait:
                    waiting[canonical] = task
                else:
                    answers[canonical] = MISSING
        if waiting:
            done, _ = await asyncio.wait(waiting.values(), timeout=self.config.wait_s)
            for canonical, task in waiting.items():
                answers[canonical] = task.result() if task in done else FAILED
        return answers

    def compute(
        self,
        key: str,
        request: SummaryRequest,
        route: Route,
        headers: Sequence[tuple[bytes, bytes]],
        api: str = "chat",
    ) -> asyncio.Task[SummaryAnswer]:
        """The one task computing `key` in this process (started if there is none), through
        `api`, the wire API of the request it is for (one its upstream speaks)."""
        task = self._inflight.get(key)
        if task is None:
            task = asyncio.get_running_loop().create_task(
                self._compute(key, request, route, tuple(headers), api),
                name=f"summary {key[8:20]}",
            )
            self._inflight[key] = task
            self._track(task)
            task.add_done_callback(lambda _: self._inflight.pop(key, None))
        return task

    async def _compute(
        self,
        key: str,
        request: SummaryRequest,
        route: Route,
        headers: tuple[tuple[bytes, bytes], ...],
        api: str,
    ) -> SummaryAnswer:
        lock_ttl = self.config.timeout_s + LOCK_MARGIN_S
        deadline = time.monotonic() + lock_ttl + 1
        delay = POLL_FIRST_S
        while True:
            lock = await self.store.lock("lock:" + key, lock_ttl)
            if lock is not None:
                break
            # Another replica is computing it: its result arrives in the store.
            found = await self.cached(key)
            if found is not None:
                return found
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(POLL_MAX_S, delay * 2)
        try:
            found = await self.cached(key)
            if found is not None:
                return found
            started = time.monotonic()
            answer = await self.summarizer.summarize(request, route, headers, api)
            self.summary_seconds = average(self.summary_seconds, time.monotonic() - started)
        except SummarizerError as error:
            self._note_failure(key)
            log.warning("summary for %s failed (%s): %s", request.purpose, error.outcome, error)
            return FAILED
        finally:
            if lock is not None:
                await self.store.release(lock)
        self.local.put(key, answer)
        await self.store.put(key, encode(answer), self.config.ttl_s)
        return answer

    def computing(self, key: str) -> bool:
        """Whether this process is computing `key` now (for a request or a precomputation)."""
        return key in self._inflight

    def recently_failed(self, key: str) -> bool:
        when = self._failed.get(key)
        if when is None:
            return False
        if time.monotonic() - when < self.config.retry_failed_after_s:
            return True
        del self._failed[key]
        return False

    def _note_failure(self, key: str) -> None:
        if self.config.retry_failed_after_s <= 0:
            return
        if len(self._failed) >= MAX_FAILURES_KEPT:
            self._failed.pop(next(iter(self._failed)))
        self._failed[key] = time.monotonic()

    # -- background work ------------------------------------------------------------------------

    def _track(self, task: asyncio.Task[object]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_crash)

    def spawn(self, coroutine: Coroutine[Any, Any, object], name: str) -> asyncio.Task[object]:
        task: asyncio.Task[object] = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._track(task)
        return task

    async def close(self) -> None:
        """Cancel everything still running (shutdown). The store belongs to the gateway."""
        self.closed = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


def _log_crash(task: asyncio.Task[object]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("background summary task %s crashed", task.get_name(), exc_info=task.exception())


def average(current: float | None, value: float) -> float:
    """A running average that follows recent values (`AVERAGE_WEIGHT` of each new one)."""
    return value if current is None else current + AVERAGE_WEIGHT * (value - current)
