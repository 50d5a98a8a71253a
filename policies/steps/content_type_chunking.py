"""`content_type_chunking` (design D5.2): compress each message as what it is.

Each message's type is the client's mark (`"compactgate": {"type": ...}`; `message` means
"detect") or what `chunking.detect` finds: JSON, log, code or prose. Then, per `ratios`:
JSON loses insignificant whitespace, code its comment-only lines and blank-line runs (indentation
never changes, Python keeps the same AST), logs collapse repeated lines and keep head and tail
at the ratio, "other" keeps head and tail at the ratio; prose is only elided with
`compress_prose: true`, plan references (`plan_ref`, ratio 1.0) are never touched. A type whose
ratio is 1.0 is left alone. Priority-1 messages get only the lossless transforms.

Which messages and when: oldest first, only messages outside the last Turn, and only at the
events where the history, scanned as it grew, passes the trigger (then until it is back under the
target). A message's compressed form is a function of the message alone, and which messages are
compressed is a function of the prefix: appending messages never changes an earlier decision
(cache-stable).

Never touched: system/developer prompts, pinned messages, the latest user message, summaries
and placeholders that steps inserted, the tool output cache's views and placeholders (their ref
note must survive) and the gateway's expansion results. Nothing is ever dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..budget import Budget
from ..chunking import Kind, compress, detect
from ..content import with_text
from ..conversation import PROTECTED_ROLES, Conversation, Message
from ..excerpts import NOTE_START, is_excerpt
from ..memo import Memo
from ..step import Env, StepConfig, StepResult
from .tool_output_cache import EXPANSION_ID_PREFIX, EXPANSION_TOOLS, find_note, is_placeholder

MARK_KINDS: dict[str, Kind] = {
    "code": "code",
    "plan_ref": "plan_ref",
    "log": "log",
    "other": "other",
}


# What one pass found for each (text, mark, lossy): a text repeated in a request, once.
_Known = dict[tuple[str, Kind | None, bool], tuple[str, str] | None]
_UNKNOWN = object()
# A candidate of the scan: (index, memo key, (is a candidate, compressed form) when known).
_Candidate = tuple[int, tuple[object, ...] | None, tuple[bool, tuple[str, str] | None] | None]


class Ratios(BaseModel):
    """Target size per type, as a share of the original (1.0: keep verbatim)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    code: float = Field(0.7, gt=0, le=1)
    text: float = Field(0.5, gt=0, le=1)
    plan_ref: float = Field(1.0, gt=0, le=1)
    log: float = Field(0.4, gt=0, le=1)
    json_: float = Field(0.6, gt=0, le=1, alias="json")
    other: float = Field(0.6, gt=0, le=1)

    def of(self, kind: Kind) -> float:
        return self.json_ if kind == "json" else float(getattr(self, kind))


class ContentTypeChunkingConfig(StepConfig):
    TYPE: ClassVar[str] = "content_type_chunking"
    type: Literal["content_type_chunking"] = "content_type_chunking"
    ratios: Ratios = Field(default_factory=Ratios)
    compress_prose: bool = Field(False, description="Also elide the middle of prose messages")


class ContentTypeChunking:
    type: ClassVar[str] = "content_type_chunking"

    def __init__(self, config: ContentTypeChunkingConfig) -> None:
        self.config = config
        # what besides a message decides its compressed form (a memo key's part)
        self._settings = (config.ratios.model_dump_json(), config.compress_prose)

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        messages = list(conversation.messages)
        turn_start = [0] * len(messages)
        for turn in conversation.turns():
            turn_start[turn.start : turn.end] = [turn.start] * (turn.end - turn.start)
        memo = env.memo
        pending = self._scan(conversation, memo)  # candidates, as the scan gets to them
        candidate = next(pending, None)
        changed: dict[int, str] = {}
        known: _Known = {}
        running = 0
        trigger, target = budget.trigger, budget.target
        for i, message in enumerate(messages):
            running += message.tokens
            if running <= trigger:
                continue
            while candidate is not None and candidate[0] < turn_start[i]:
                if running <= target:
                    break
                index, key, found = candidate
                candidate = next(pending, None)
                if found is not None:
                    new = found[1]
                else:
                    new = self._compressed_text(messages[index], memo, known)
                    if key is not None:
                        memo.put(key, (True, new), len(new[0]) if new else 0)
                if new is None:
                    continue
                data = with_text(messages[index].data, new[0])
                tokens = env.count(data)
                if tokens >= messages[index].tokens:
                    continue
                running -= messages[index].tokens - tokens
                messages[index] = messages[index].with_data(data, tokens)
                changed[index] = new[1]
        if not changed:
            return StepResult.unchanged(conversation, reason="nothing compressible")
        kinds: dict[str, int] = {}
        for kind in changed.values():
            kinds[kind] = kinds.get(kind, 0) + 1
        return StepResult(
            conversation.with_contents(messages),
            replaced=len(changed),
            detail={"compressed": kinds},
        )

    def _scan(self, conversation: Conversation, memo: Memo) -> Iterator[_Candidate]:
        """The candidates, oldest first, each when the scan gets to it: (index, memo key, what
        is remembered under it, None until its compressed form is worked out).

        Whether a message is a candidate and its compressed form are functions of the message
        alone (its data, marks and the config): for a message the gateway has seen (a uid:
        equal uids, equal data) both are remembered under one key, which costs no hashing or
        comparing of its text, so a resent message, or the next pass's, is one lookup. The
        compressed form is worked out only for a candidate the scan takes (`apply`)."""
        latest = conversation.latest_user_index()
        roles = conversation.roles()
        settings = self._settings
        for i, m in enumerate(conversation.messages):
            if i == latest:
                continue
            if m.uid is None:
                if _eligible(m, roles[i]):
                    yield i, None, None
                continue
            key = ("chunked", settings, m.uid, m.kind, m.priority, m.pin)
            found = memo.peek(key)
            if found is None:
                if _eligible(m, roles[i]):
                    yield i, key, None
                else:
                    memo.put(key, (False, None), 0)
            elif found[0]:  # type: ignore[index]
                yield i, key, found  # type: ignore[misc]

    def _compressed_text(
        self, message: Message, memo: Memo, known: _Known
    ) -> tuple[str, str] | None:
        """`_compressed` of a message's text, with its mark and priority: one memo entry per
        text (type and compressed form together), so a message is one lookup."""
        text = message.text
        if not text or text.isspace():
            return None
        mark = MARK_KINDS.get(message.kind or "")
        lossy = message.priority != 1
        local = (text, mark, lossy)
        found = known.get(local, _UNKNOWN)
        if found is _UNKNOWN:
            found = known[local] = memo.get(
                ("chunked-text", self._settings, text, mark, lossy),
                lambda: self._compressed_as(text, mark, lossy),
                2 * len(text),
            )
        return found  # type: ignore[return-value]

    def _compressed_as(self, text: str, mark: Kind | None, lossy: bool) -> tuple[str, str] | None:
        kind = mark or detect(text)
        ratios = self.config.ratios
        new = compress(
            text,
            kind,
            ratios.of(kind),
            lossy=lossy,
            prose=self.config.compress_prose,
            code_blocks=ratios.code < 1.0,
        )
        return (new, kind) if new != text else None


def _eligible(message: Message, role: str) -> bool:
    if role in PROTECTED_ROLES or message.pin:
        return False
    if message.kind is not None and ":" in message.kind:  # summaries, placeholders
        return False
    if role == "tool":
        call_id = str(message.data.get("tool_call_id", ""))
        if call_id.startswith(EXPANSION_ID_PREFIX) or message.data.get("name") in EXPANSION_TOOLS:
            return False
        text = message.text
        if find_note(text) is not None or is_placeholder(text):
            return False
    text = message.text
    if NOTE_START in text and is_excerpt(text):  # an excerpt's head stays the client's bytes
        return False
    return message.data.get("content") is not None
