"""Summary answers kept: the store's encoding and key, and the tier in this process in front of it.

The rules this module keeps: **the cache key is everything the text depends on** (tenant, summary
model, the summariser's fingerprint and the request's canonical bytes, hashed), so one tenant
never receives a summary made from another tenant's request, even for identical messages; and
**only ready answers are kept** (a failure is never cached). The local tier is an LRU bounded by
bytes, read synchronously by the chain, so a rolling summary of many links costs one chain run,
not one store round trip per link.
"""

from __future__ import annotations

import hashlib
import sys
import threading

import orjson

from policies.summaries import SummaryAnswer

from ..counting.sized_lru import SizedLru

ANSWER_OVERHEAD = 200  # bytes of bookkeeping per locally kept answer


def store_key(parts: tuple[str, str, str], canonical: bytes) -> str:
    """The store key of a summary: (tenant, model, fingerprint) and the request's bytes, hashed."""
    digest = hashlib.blake2b(digest_size=24)
    for part in (*(p.encode() for p in parts), canonical):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "summary:" + digest.hexdigest()


def encode(answer: SummaryAnswer) -> bytes:
    return orjson.dumps({"v": 1, "text": answer.text, "retain": answer.retain})


def decode(value: bytes) -> SummaryAnswer | None:
    try:
        data = orjson.loads(value)
        if data.get("v") != 1 or not isinstance(data.get("text"), str) or not data["text"]:
            return None
        return SummaryAnswer.ready(data["text"], str(data.get("retain") or ""))
    except (orjson.JSONDecodeError, AttributeError, TypeError):
        return None


class LocalAnswers:
    """Ready answers by cache key, in this process: an LRU bounded by bytes; thread-safe (the
    precomputation runs the chain in a worker thread)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        # Bounded by bytes alone; a read keeps an answer longer.
        self._answers: SizedLru[str, SummaryAnswer] = SizedLru(sys.maxsize, max_bytes, by_use=True)
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        return self._answers.bytes

    def get(self, key: str) -> SummaryAnswer | None:
        with self._lock:
            return self._answers.get(key)

    def put(self, key: str, answer: SummaryAnswer) -> None:
        size = _answer_bytes(key, answer)
        if answer.status != "ready" or size > self.max_bytes:
            return  # what is kept under the key stays
        with self._lock:
            self._answers.put(key, answer, size)


def _answer_bytes(key: str, answer: SummaryAnswer) -> int:
    return len(key) + 2 * (len(answer.text) + len(answer.retain)) + ANSWER_OVERHEAD
