"""The gateway's own model calls made for a client: an agent's compaction summary made ahead of
need (`agents.answers`), with the client's credential.

Such a call goes the way the client's requests go: compacted by the engine against the model's
effective window (so it fits), sent to the model's upstreams with failover and retries, and its
usage priced as the gateway's own spend (design D14.3). It never raises for the upstream's
answer: the caller gets the status and the text, if any.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from ..engine.engine import Engine
from ..routing import Route
from ..upstream.destinations import destinations
from ..upstream.retry import Sender
from ..wire import WIRES, Usage
from .windows import Windows


@dataclass(frozen=True, slots=True)
class OwnAnswer:
    status: int
    text: str | None  # the answer's text (None when the upstream refused or wrote none)


class OwnCalls:
    def __init__(
        self,
        engine: Engine,
        sender: Sender,
        windows: Windows,
        spend: Callable[[Route, Usage], None],
        max_messages: int,
    ) -> None:
        self._engine = engine
        self._sender = sender
        self._windows = windows
        self._spend = spend
        self._max_messages = max_messages

    async def complete(
        self,
        route: Route,
        tenant: str,
        api: str,
        body: Mapping[str, Any],
        headers: Sequence[tuple[bytes, bytes]],
    ) -> OwnAnswer:
        """`body` (a request of the wire API `api`) answered whole by the model's upstream."""
        wire = WIRES[api]
        call = wire.parse(orjson.dumps(body), self._max_messages)
        window = self._windows.effective(route)
        prepared = await self._engine.prepare(call, route, tenant, window=window, remember=False)
        targets = destinations(route, wire, list(headers))
        response, _ = await self._sender.send(route, targets, prepared.body)
        try:
            data = await response.read()
        finally:
            response.release()
        if response.status != 200:
            return OwnAnswer(response.status, None)
        document = orjson.loads(data)
        if not isinstance(document, dict):
            return OwnAnswer(response.status, None)
        usage = wire.usage_of(document)
        if usage is not None:
            self._spend(route, usage)
        return OwnAnswer(response.status, wire.answer_text(document) or None)
