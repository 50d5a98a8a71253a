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
import threading
from collections import OrderedDict

import orjson

from policies.summaries import SummaryAnswer

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
        self.bytes = 0
        self._answers: OrderedDict[str, SummaryAnswer] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> SummaryAnswer | None:
        with self._lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._answers.move_to_end(key)
            return answer

    def put(self, key: str, answer: SummaryAnswer) -> None:
        size = _answer_bytes(key, answer)
        if answer.status != "ready" or size > self.max_bytes:
            return
        with self._lock:
            old = self._answers.pop(key, None)
            if old is not None:
                self.bytes -= _answer_bytes(key, old)
            self._answers[key] = answer
            self.bytes += size
            while self.bytes > self.max_bytes:
                evicted, gone = self._answers.popitem(last=False)
                self.bytes -= _answer_bytes(evicted, gone)


def _answer_bytes(key: str, answer: SummaryAnswer) -> int:
    return len(key) + 2 * (len(answer.text) + len(answer.retain)) + ANSWER_OVERHEAD
