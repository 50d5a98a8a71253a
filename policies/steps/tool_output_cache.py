"""`tool_output_cache` (R4.5, 001 sections 1.6-1.7): shrink tool results, keep them reachable.

Three rules, applied to `tool` messages only, in this order:

1. In-context view (1.6): every line is cut at `max_line_length` characters and the message at
   `max_message_bytes` UTF-8 bytes (never inside a character; whole lines when one fits), and a
   note is appended saying the full output can be expanded with the tool `tool_output_cache` and
   its ref. The view is a function of the output alone.
2. Tool budget (1.7): when the tool outputs together pass `context_budget_tokens` (unset: 25 % of
   the context window, clamped to 20 000..60 000), the oldest are replaced by
   `[tool output trimmed; ref=<id>]`. The set is a stable cut (`budget.stable_cut`) over the
   outputs, toward the policy's target/trigger share of that budget, so it only grows at events.
3. Fit (`fit_budget`, on by default): while the whole request is still over the policy's
   trigger, more of the oldest outputs are replaced, scanning the history as it grew (the same
   event rule over all messages), never one from the tool group being scanned. This is
   "observation masking": in agent sessions it frees most of the room before a Turn is dropped.

Every output cut or replaced is returned as a `StoredOutput(ref=env.ref_for(full text), ...)` for
the gateway to store; the ref in the note and the placeholder is that one.

Never touched: messages that are not `tool` results; pinned results; results that already are
a placeholder or a view (they are recognised and never stored again: a view's ref is read back
from its note); and the gateway's own expansion results, recognised by the tool's name
(`"name": "tool_output_cache"` / `"tool_output_cache_grep"` on the result or on the call it
answers) or by a `tool_call_id` starting with `cg_`, the prefix the gateway gives the ids of its
expansion rounds. Masking those would make the model ask for the same text again in a loop.
Content arrays: the text parts are joined and replaced by one text part; other parts stay.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget, stable_cut
from ..content import with_text
from ..conversation import Conversation, Message, tool_groups
from ..pinning import call_names
from ..step import Env, StepConfig, StepResult, StoredOutput

EXPANSION_TOOLS = frozenset({"tool_output_cache", "tool_output_cache_grep"})
EXPANSION_ID_PREFIX = "cg_"
PLACEHOLDER = "[tool output trimmed; ref={ref}]"
PLACEHOLDER_RE = re.compile(r"^\[tool output trimmed; ref=[^\]\s]+\]$")
NOTE = (
    "\n[tool output cut; ref={ref}: showing {shown} of {lines} lines{long}. The full output "
    "({size} bytes) can be expanded with the tool tool_output_cache "
    '{{"ref_id": "{ref}", "offset": <line>, "limit": <lines>}}]'
)
NOTE_RE = re.compile(r"\n\[tool output cut; ref=([^:\s\]]+):")
LONG_LINE_MARK = " [...]"
MIN_MASK_CHARS = 200  # shorter outputs cost about what their placeholder would: never masked


class ToolOutputCacheConfig(StepConfig):
    TYPE: ClassVar[str] = "tool_output_cache"
    type: Literal["tool_output_cache"] = "tool_output_cache"
    max_line_length: int = Field(2000, ge=16, description="Characters kept per line")
    max_message_bytes: int = Field(51200, ge=1024, description="UTF-8 bytes kept per output")
    context_budget_tokens: int | None = Field(
        None, ge=1, description="Tokens all outputs may take; unset: clamp(window*0.25, 20k, 60k)"
    )
    fit_budget: bool = Field(True, description="Also mask oldest outputs while over the trigger")

    def tool_budget(self, context_window: int) -> int:
        if self.context_budget_tokens is not None:
            return self.context_budget_tokens
        return min(60_000, max(20_000, int(context_window * 0.25)))


class ToolOutputCache:
    type: ClassVar[str] = "tool_output_cache"

    def __init__(self, config: ToolOutputCacheConfig) -> None:
        self.config = config

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        messages = list(conversation.messages)
        names = call_names(messages)
        refs: dict[int, str] = {}  # maskable output -> its ref, when known
        full: dict[int, str] = {}  # maskable output -> its full text
        stored: dict[str, StoredOutput] = {}
        changed: set[int] = set()
        viewed = 0
        for i, message in enumerate(messages):
            if not _maskable(message, names):
                continue
            text = message.text
            noted = NOTE_RE.search(text)
            if noted is not None:
                refs[i] = noted.group(1)
                continue
            full[i] = text
            view = self._view(text, env, refs, i)
            if view is None:
                continue
            data = with_text(message.data, view)
            messages[i] = message.with_data(data, env.count(data))
            stored.setdefault(refs[i], _stored(refs[i], text))
            changed.add(i)
            viewed += 1
        order = sorted(i for i in set(refs) | set(full) if len(messages[i].text) >= MIN_MASK_CHARS)
        masked = self._over_tool_budget(messages, order, budget)
        if self.config.fit_budget and order:
            masked |= self._over_trigger(messages, order, masked, budget, env)
        trimmed = 0
        for i in sorted(masked):
            if i not in refs:
                try:
                    refs[i] = env.ref_for(full[i])
                except LookupError:
                    continue
                stored.setdefault(refs[i], _stored(refs[i], full[i]))
            data = with_text(messages[i].data, PLACEHOLDER.format(ref=refs[i]))
            messages[i] = messages[i].with_data(data, env.count(data))
            trimmed += 1
            changed.add(i)
        if not changed:
            return StepResult.unchanged(conversation, reason="within limits")
        return StepResult(
            Conversation(tuple(messages)),
            replaced=len(changed),
            stored=tuple(stored.values()),
            detail={"outputs_cut": viewed, "outputs_trimmed": trimmed},
        )

    def _view(self, text: str, env: Env, refs: dict[int, str], index: int) -> str | None:
        """001 1.6: the in-context view of `text`, or None when it already fits."""
        config = self.config
        lines = text.split("\n")
        long = any(len(line) > config.max_line_length for line in lines)
        size = len(text.encode("utf-8", "surrogatepass"))
        if not long and size <= config.max_message_bytes:
            return None
        try:
            ref = env.ref_for(text)
        except LookupError:
            return None
        refs[index] = ref
        shown = [
            line[: config.max_line_length] + LONG_LINE_MARK
            if len(line) > config.max_line_length
            else line
            for line in lines
        ]
        long_note = f", lines cut at {config.max_line_length} characters" if long else ""

        def note(count: int) -> str:
            return NOTE.format(ref=ref, shown=count, lines=len(lines), long=long_note, size=size)

        room = config.max_message_bytes - len(note(len(lines)).encode("utf-8"))
        kept: list[str] = []
        used = 0
        for line in shown:
            cost = len(line.encode("utf-8", "surrogatepass")) + (1 if kept else 0)
            if used + cost > room:
                break
            kept.append(line)
            used += cost
        if not kept:
            head = shown[0].encode("utf-8", "surrogatepass")[: max(0, room)]
            kept = [head.decode("utf-8", "ignore")]
        return "\n".join(kept) + note(len(kept))

    def _over_tool_budget(
        self, messages: list[Message], order: list[int], budget: Budget
    ) -> set[int]:
        """001 1.7: the oldest outputs past `context_budget_tokens`, by a stable cut."""
        tool_budget = self.config.tool_budget(budget.context_window)
        share = budget.target_ratio / budget.trigger_ratio if budget.trigger_ratio else 1.0
        sizes = [messages[i].tokens for i in order]
        cut = stable_cut(sizes, 0, tool_budget, int(tool_budget * min(1.0, share)))
        return set(order[:cut])

    def _over_trigger(
        self,
        messages: list[Message],
        order: list[int],
        masked: set[int],
        budget: Budget,
        env: Env,
    ) -> set[int]:
        """Mask the oldest outputs wherever the history, as it grew, passed the trigger."""
        group_start = _group_starts(messages)
        candidates = [i for i in order if i not in masked]
        more: set[int] = set()
        running = 0
        pointer = 0
        for i, message in enumerate(messages):
            running += message.tokens
            if i in masked:
                running -= _saving(messages[i], env)
            if running <= budget.trigger:
                continue
            bound = group_start.get(i, i)
            while (
                pointer < len(candidates)
                and candidates[pointer] < bound
                and running > budget.target
            ):
                running -= _saving(messages[candidates[pointer]], env)
                more.add(candidates[pointer])
                pointer += 1
        return more


def _saving(message: Message, env: Env) -> int:
    data = with_text(message.data, PLACEHOLDER.format(ref="ref_" + "0" * 24))
    return max(0, message.tokens - env.count(data))


def _maskable(message: Message, names: Mapping[str, str]) -> bool:
    if message.role != "tool" or message.pin:
        return False
    call_id = str(message.data.get("tool_call_id", ""))
    if call_id.startswith(EXPANSION_ID_PREFIX):
        return False
    if message.data.get("name") in EXPANSION_TOOLS or names.get(call_id) in EXPANSION_TOOLS:
        return False
    return PLACEHOLDER_RE.match(message.text.strip()) is None


def _group_starts(messages: list[Message]) -> dict[int, int]:
    """Message index -> index of the assistant message opening its tool group."""
    starts: dict[int, int] = {}
    for group in tool_groups(messages):
        for i in group:
            starts[i] = group[0]
    return starts


def _stored(ref: str, text: str) -> StoredOutput:
    return StoredOutput(
        ref=ref,
        text=text,
        byte_size=len(text.encode("utf-8", "surrogatepass")),
        line_count=text.count("\n") + 1 if text else 0,
    )
