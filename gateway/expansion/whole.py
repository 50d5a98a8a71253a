"""Internal rounds of an answer that is not streamed, one loop for every wire API.

While the upstream's answer calls the gateway's own tools, the calls are run, the model is
asked again with the results, at most `max_rounds` times; the client gets the last answer as
its dialect finishes it (internal calls removed, usage of every round), or the first refusal of
an internal round as the upstream gave it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from .rounds import Call, Execute, add_usage


@dataclass(slots=True)
class Resolved:
    """The final upstream answer after internal rounds."""

    status: int
    body: bytes
    rounds: int
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Whole:
    """A dialect as the loop sees it (chat.py, responses.py and messages.py each make one)."""

    produced: Callable[[Mapping[str, Any]], Any]  # what the model produced in an answer
    internal_calls: Callable[[Any, frozenset[str]], list[Call]]  # its calls to our tools
    # The request for the next round: the history, what was produced and the calls' results.
    next_payload: Callable[
        [dict[str, Any], Any, Sequence[Call], Sequence[str], frozenset[str]], dict[str, Any]
    ]
    # The last answer as the client gets it, given each round's `usage` field.
    finish: Callable[[dict[str, Any], frozenset[str], Sequence[Any]], bytes]


# The next round's request sent and its answer read whole: (status, body, headers to relay).
Ask = Callable[[dict[str, Any]], Awaitable[tuple[int, bytes, list[tuple[bytes, bytes]]]]]


async def resolve(
    dialect: Whole,
    payload: dict[str, Any],
    answer: dict[str, Any],
    names: frozenset[str],
    execute: Execute,
    ask: Ask,
    max_rounds: int,
) -> Resolved:
    """`answer` (to the request `payload`) with its internal calls resolved until there are none
    or the rounds run out."""
    usages = [answer.get("usage")]
    rounds = 0
    while rounds < max_rounds:
        produced = dialect.produced(answer)
        calls = dialect.internal_calls(produced, names)
        if not calls:
            break
        results = [await execute(call) for call in calls]
        payload = dialect.next_payload(payload, produced, calls, results, names)
        status, data, headers = await ask(payload)
        rounds += 1
        if status >= 400:
            return Resolved(status, data, rounds, headers)
        answer = orjson.loads(data)
        usages.append(answer.get("usage"))
    return Resolved(200, dialect.finish(answer, names, usages), rounds)


def with_usage(answer: dict[str, Any], usages: Sequence[Any], keys: Sequence[str]) -> bytes:
    """The answer's JSON, its usage fields `keys` replaced by their sums over the rounds."""
    total: dict[str, int] = {}
    for usage in usages:
        add_usage(total, usage, keys)
    if total and isinstance(answer.get("usage"), dict):
        answer["usage"] = {**answer["usage"], **total}
    return orjson.dumps(answer)
