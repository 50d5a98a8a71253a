"""Masked tool output, kept and readable again (design D13.4).

When the `tool_output_cache` step cuts or replaces a tool output, its full text is stored here
under the step's ref (an HMAC of the tenant and the text: unguessable, and the same ref for the
same text, so the compacted prefix stays cache-stable). The model gets two function tools:

    tool_output_cache({ref_id, offset?, limit?})        line-numbered lines, like a file read
    tool_output_cache_grep({ref_id, pattern, context?}) matching lines with their numbers

which the gateway executes itself. Keys are scoped to the tenant, so a ref from tenant A is
unknown to tenant B. Entries expire `ttl_s` after the last request that referenced them. Bad
refs, offsets and patterns produce a tool result saying so; nothing here raises.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import orjson

from policies import StoredOutput

from .config import ToolOutputsConfig
from .store import SafeStore

MAX_LIMIT = 2000  # lines per read
MAX_RESULT_CHARS = 32_000  # one tool result
MAX_LINE_CHARS = 2000  # a line in a result is cut here
MAX_MATCHES = 200
MAX_CONTEXT = 10
_RECENT_MAX = 20_000  # refs remembered as stored lately (checked, not sent again)


class ToolOutputCache:
    def __init__(self, store: SafeStore, config: ToolOutputsConfig) -> None:
        self._store = store
        self.config = config
        self.names = frozenset({config.read_tool, config.grep_tool})
        self._recent: OrderedDict[str, None] = OrderedDict()  # keys stored lately: a hint
        self._epoch = store.epoch

    # -- storing -----------------------------------------------------------------------------

    async def save(self, tenant: str, outputs: Sequence[StoredOutput]) -> None:
        """Store every output the step masked, so that its ref can be read back.

        An output stored lately is only checked, not sent again: in one round trip its expiry
        is renewed and the store says whether it still holds it. One the store no longer holds
        (emptied, restarted, evicted, or failed over without it) is stored again from the
        conversation that brings it. The memory of what was stored lately is dropped whenever
        the store comes back after an outage or is found emptied (`SafeStore.epoch`).
        """
        if self._epoch != self._store.epoch:
            self._epoch = self._store.epoch
            self._recent.clear()
        texts = {self._key(tenant, o.ref): o.text for o in outputs}
        hinted = [key for key in texts if key in self._recent]
        ttl = self.config.ttl_s
        if hinted:
            held = await self._store.touch_many(hinted, ttl)
            if held is None:
                return  # the store is away: nothing can be stored either
            for key, found in zip(hinted, held, strict=True):
                if found:
                    del texts[key]
                    self._recent.move_to_end(key)
        if not texts:
            return
        items = [(key, text.encode("utf-8", "surrogatepass")) for key, text in texts.items()]
        if await self._store.put_many(items, ttl):
            for key in texts:
                self._recent[key] = None
                self._recent.move_to_end(key)
            while len(self._recent) > _RECENT_MAX:
                self._recent.popitem(last=False)

    async def _text(self, tenant: str, ref: str) -> str | None:
        value = await self._store.get(self._key(tenant, ref))
        return value.decode("utf-8", "replace") if value is not None else None

    def _key(self, tenant: str, ref: str) -> str:
        return f"tool:{tenant}:{ref}"

    # -- the model's tools -------------------------------------------------------------------

    def tool_definitions(self) -> list[dict[str, Any]]:
        ref = {
            "type": "string",
            "description": "The ref id from a '[tool output trimmed; ref=...]' note.",
        }
        return [
            {
                "type": "function",
                "function": {
                    "name": self.config.read_tool,
                    "description": "Read lines of an earlier tool output that was trimmed from the "
                    "conversation. Returns numbered lines.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "ref_id": ref,
                            "offset": {
                                "type": "integer",
                                "description": "First line to read (1-based); default 1.",
                            },
                            "limit": {
                                "type": "integer",
                                "description": (
                                    f"Lines to read; default {self.config.default_limit}."
                                ),
                            },
                        },
                        "required": ["ref_id"],
                    },
                },
            },
            {
                "type": "function",
                "function": {
                    "name": self.config.grep_tool,
                    "description": "Search an earlier, trimmed tool output with a regular "
                    "expression. "
                    "Returns the matching lines with their numbers.",
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "ref_id": ref,
                            "pattern": {
                                "type": "string",
                                "description": "A Python regular expression.",
                            },
                            "context": {
                                "type": "integer",
                                "description": "Lines of context around each match; default 0.",
                            },
                        },
                        "required": ["ref_id", "pattern"],
                    },
                },
            },
        ]

    def system_note(self) -> str:
        return (
            "Some earlier tool outputs were trimmed to fit the context window; "
            "each note shows a ref. "
            f"Use {self.config.read_tool} to read one and {self.config.grep_tool} to search one."
        )

    async def execute(self, tenant: str, name: str, arguments: str) -> str:
        """Run one internal tool call; the result text always explains itself."""
        try:
            args = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError:
            return f"error: the arguments are not valid JSON: {arguments[:200]!r}"
        if not isinstance(args, dict):
            return "error: the arguments must be a JSON object"
        ref = args.get("ref_id")
        if not isinstance(ref, str) or not ref:
            return (
                "error: ref_id is required (the ref from a '[tool output trimmed; ref=...]' note)"
            )
        text = await self._text(tenant, ref)
        if text is None:
            return f"error: unknown ref_id {ref!r} (it may have expired); ask for the output again"
        if name == self.config.read_tool:
            return read(text, ref, args.get("offset"), args.get("limit"), self.config.default_limit)
        if name == self.config.grep_tool:
            return grep(text, ref, args.get("pattern"), args.get("context"))
        return f"error: unknown tool {name!r}"


def read(text: str, ref: str, offset: Any, limit: Any, default_limit: int) -> str:
    lines = text.splitlines()
    start = offset if isinstance(offset, int) and not isinstance(offset, bool) else 1
    count = limit if isinstance(limit, int) and not isinstance(limit, bool) else default_limit
    if start < 1:
        return (
            "error: offset must be >= 1 (lines are numbered from 1); "
            f"the output has {len(lines)} lines"
        )
    if count < 1:
        return "error: limit must be >= 1"
    if start > max(1, len(lines)):
        return f"error: offset {start} is past the end: the output has {len(lines)} lines"
    count = min(count, MAX_LIMIT)
    chunk = lines[start - 1 : start - 1 + count]
    body = _numbered((start + i, line) for i, line in enumerate(chunk))
    end = start + len(chunk) - 1
    header = f"[ref={ref}: lines {start}-{end} of {len(lines)}]"
    return _bounded(header + "\n" + body, end < len(lines))


def grep(text: str, ref: str, pattern: Any, context: Any) -> str:
    if not isinstance(pattern, str) or not pattern:
        return "error: pattern is required"
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        return f"error: invalid pattern {pattern!r}: {exc}"
    around = context if isinstance(context, int) and not isinstance(context, bool) else 0
    around = max(0, min(MAX_CONTEXT, around))
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if regex.search(line[:MAX_LINE_CHARS])]
    if not hits:
        return f"[ref={ref}: no line matches {pattern!r} in {len(lines)} lines]"
    shown: list[int] = []
    for i in hits[:MAX_MATCHES]:
        for j in range(max(0, i - around), min(len(lines), i + around + 1)):
            if not shown or j > shown[-1]:
                shown.append(j)
    header = f"[ref={ref}: {len(hits)} matching lines of {len(lines)}]"
    body = _numbered((j + 1, lines[j]) for j in shown)
    return _bounded(header + "\n" + body, len(hits) > MAX_MATCHES)


def _numbered(lines: Any) -> str:
    return "\n".join(f"{n:>6}\t{line[:MAX_LINE_CHARS]}" for n, line in lines)


def _bounded(result: str, more: bool) -> str:
    if len(result) > MAX_RESULT_CHARS:
        result = result[:MAX_RESULT_CHARS] + "\n[... result cut; read a smaller range]"
    elif more:
        result += "\n[... more lines follow; read on with a larger offset]"
    return result
