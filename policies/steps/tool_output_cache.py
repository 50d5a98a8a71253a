"""`tool_output_cache` (design D5.1): shrink tool results, keep them reachable.

Three rules, applied to `tool` messages only, in this order:

1. In-context view: every line is cut at `max_line_length` characters and the message at
   `max_message_bytes` UTF-8 bytes (never inside a character; whole lines when one fits), and a
   note is appended saying the full output can be expanded with the tool `tool_output_cache` and
   its ref. The view is a function of the output alone.
2. Tool budget: when the tool outputs together pass `context_budget_tokens` (unset: 25 % of
   the context window, clamped to 20 000..60 000), the oldest are replaced by
   `[tool output trimmed; ref=<id>]`. The set is a stable cut (`budget.stable_cut`) over the
   outputs: it only grows at events, and then down to `mask_to` (0.5) of that budget, so that
   several more outputs fit before the next event (each event is one prompt-cache miss, and a
   masked output is not lost: the model can expand it by ref).
3. Fit (`fit_budget`, on by default): while the whole request is still over the policy's
   trigger, more of the oldest outputs are replaced, scanning the history as it grew (the same
   event rule over all messages, down to the policy's target or `mask_to` of the limit, whichever
   is lower), never one from the tool group being scanned. This is "observation masking": in
   agent sessions it frees most of the room before a Turn is dropped.

Every output cut or replaced is returned as a `StoredOutput(ref=env.ref_for(full text), ...)` for
the gateway to store; the ref in the note and the placeholder is that one.

Never touched: messages that are not `tool` results; pinned results; outputs under 200
characters (never masked: the placeholder would cost about as much); results that already are
a placeholder or a view (they are recognised and never stored again: a view's ref is read back
from its note); and the gateway's own expansion results, recognised by the tool's name
(`"name": "tool_output_cache"` / `"tool_output_cache_grep"` on the result or on the call it
answers) or by a `tool_call_id` starting with `cg_`, the prefix the gateway gives the ids of its
expansion rounds. Masking those would make the model ask for the same text again in a loop.
Content arrays: the text parts are joined and replaced by one text part; other parts stay.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from typing import ClassVar, Literal

from pydantic import Field

from ..budget import Budget, stable_cut
from ..content import with_text
from ..conversation import Conversation, Message, is_mapping
from ..excerpts import is_excerpt
from ..step import Env, StepConfig, StepResult, StoredOutput

EXPANSION_TOOLS = frozenset({"tool_output_cache", "tool_output_cache_grep"})
EXPANSION_ID_PREFIX = "cg_"
PLACEHOLDER = "[tool output trimmed; ref={ref}]"
PLACEHOLDER_RE = re.compile(r"^\[tool output trimmed; ref=[^\]\s]+\]$")
_PADDED_PLACEHOLDER_RE = re.compile(r"\s*\[tool output trimmed; ref=[^\]\s]+\]\s*\Z")
NOTE = (
    "\n[tool output cut; ref={ref}: showing {shown} of {lines} lines{long}. The full output "
    "({size} bytes) can be expanded with the tool tool_output_cache "
    '{{"ref_id": "{ref}", "offset": <line>, "limit": <lines>}}]'
)
NOTE_RE = re.compile(r"\n\[tool output cut; ref=([^:\s\]]+):")
NOTE_START = "\n[tool output cut; ref="  # what every NOTE_RE match starts with
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
    mask_to: float = Field(
        0.5,
        gt=0,
        le=1,
        description="At an event, mask down to this share of the tool budget (and of the limit)",
    )

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
        roles = conversation.roles()
        expansion_ids = expansion_call_ids(messages)
        refs: dict[int, str] = {}  # maskable output -> its ref, when known
        full: dict[int, str] = {}  # maskable output -> its full text
        order: list[int] = []  # maskable outputs long enough to mask, in order
        stored: dict[str, StoredOutput] = {}
        viewed: set[int] = set()
        for i, message in enumerate(messages):
            if roles[i] != "tool":
                continue
            text = _maskable_text(message, expansion_ids)
            if text is None:
                continue
            noted = find_note(text)
            if noted is not None:
                refs[i] = noted.group(1)
                if len(text) >= MIN_MASK_CHARS:
                    order.append(i)
                continue
            full[i] = text
            view = self._view(text, env, refs, i)
            if view is None:
                if len(text) >= MIN_MASK_CHARS:
                    order.append(i)
                continue
            data = with_text(message.data, view)
            messages[i] = message.with_data(data, env.count(data))
            if refs[i] not in stored:
                stored[refs[i]] = _stored(refs[i], text)
            viewed.add(i)
            if len(messages[i].text) >= MIN_MASK_CHARS:
                order.append(i)
        masks = _Masks(messages, refs, full, stored, env)
        masked = {i for i in self._over_tool_budget(messages, order, budget) if masks.get(i)}
        # the running total only grows, so it passes the trigger iff the whole does
        if self.config.fit_budget and order and _total(messages, masked, masks) > budget.trigger:
            masked |= self._over_trigger(messages, roles, order, masked, budget, masks)
        for i in masked:
            replacement = masks.get(i)
            assert replacement is not None
            messages[i] = replacement
        if not viewed and not masked:
            return StepResult.unchanged(conversation, reason="within limits")
        return StepResult(
            conversation.with_contents(messages),
            replaced=len(viewed | masked),
            stored=tuple(stored.values()),
            detail={"outputs_cut": len(viewed), "outputs_trimmed": len(masked)},
        )

    def _view(self, text: str, env: Env, refs: dict[int, str], index: int) -> str | None:
        """The in-context view of `text`, or None when it already fits."""
        config = self.config
        if len(text) <= config.max_line_length and len(text) * 4 <= config.max_message_bytes:
            return None  # no line can be too long, and even 4-byte characters would fit
        long = _has_long_line(text, config.max_line_length)
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if not long and size <= config.max_message_bytes:
            return None
        lines = text.split("\n")
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
        """The oldest outputs past `context_budget_tokens`, by a stable cut."""
        tool_budget = self.config.tool_budget(budget.context_window)
        sizes = [messages[i].tokens for i in order]
        cut = stable_cut(sizes, 0, tool_budget, int(tool_budget * self.config.mask_to))
        return set(order[:cut])

    def _over_trigger(
        self,
        messages: list[Message],
        roles: Sequence[str],
        order: list[int],
        masked: set[int],
        budget: Budget,
        masks: _Masks,
    ) -> set[int]:
        """Mask the oldest outputs wherever the history, as it grew, passed the trigger."""
        candidates = [i for i in order if i not in masked]
        more: set[int] = set()
        running = 0
        pointer = 0
        trigger = budget.trigger
        target = min(budget.target, int(budget.limit * self.config.mask_to))
        for i, message in enumerate(messages):
            running += message.tokens
            if i in masked:
                running -= masks.saving(i)
            if running <= trigger:
                continue
            if pointer == len(candidates) or running <= target:
                continue
            bound = group_start(messages, roles, i)
            while pointer < len(candidates) and candidates[pointer] < bound and running > target:
                index = candidates[pointer]
                pointer += 1
                if masks.get(index) is not None:
                    running -= masks.saving(index)
                    more.add(index)
        return more


class _Masks:
    """Placeholder messages, built once per output on first use (ref, store, count)."""

    def __init__(
        self,
        messages: list[Message],
        refs: dict[int, str],
        full: dict[int, str],
        stored: dict[str, StoredOutput],
        env: Env,
    ) -> None:
        self.messages = messages
        self.refs = refs
        self.full = full
        self.stored = stored
        self.env = env
        self.built: dict[int, Message | None] = {}

    def get(self, index: int) -> Message | None:
        """The placeholder for output `index`; None when no ref can be made for it."""
        try:
            return self.built[index]
        except KeyError:
            built = self.built[index] = self._build(index)
            return built

    def saving(self, index: int) -> int:
        replacement = self.get(index)
        if replacement is None:
            return 0
        return max(0, self.messages[index].tokens - replacement.tokens)

    def _build(self, index: int) -> Message | None:
        ref = self.refs.get(index)
        if ref is None:
            try:
                ref = self.env.ref_for(self.full[index])
            except LookupError:
                return None
            self.refs[index] = ref
            if ref not in self.stored:
                self.stored[ref] = _stored(ref, self.full[index])
        message = self.messages[index]
        data = with_text(message.data, PLACEHOLDER.format(ref=ref))
        return message.with_data(data, self.env.count(data))


def _total(messages: list[Message], masked: AbstractSet[int], masks: _Masks) -> int:
    """Tokens of `messages` once the `masked` outputs are replaced by their placeholders."""
    return sum(m.tokens for m in messages) - sum(masks.saving(i) for i in masked)


def _maskable_text(message: Message, expansion_ids: AbstractSet[str]) -> str | None:
    """The text of a tool output (the caller checked the role) this step may cut or mask; None
    for everything else."""
    if message.pin:
        return None
    call_id = str(message.data.get("tool_call_id", ""))
    if call_id.startswith(EXPANSION_ID_PREFIX):
        return None
    if message.data.get("name") in EXPANSION_TOOLS or call_id in expansion_ids:
        return None
    text = message.text
    if len(text) < 200 and PLACEHOLDER_RE.match(text.strip()):
        return None
    if is_excerpt(text):  # the `excerpt` step's: its rest is stored already, its head must stay
        return None
    return text


def group_start(messages: Sequence[Message], roles: Sequence[str], index: int) -> int:
    """For a tool result, the index of the assistant message whose calls it answers; else `index`.

    Results directly follow their call (OpenAI's rule, checked by `invariants`), so the opening
    assistant message is the one before the run of results, if it has tool_calls.
    """
    if roles[index] != "tool":
        return index
    opener = index - 1
    while opener >= 0 and roles[opener] == "tool":
        opener -= 1
    if opener >= 0 and roles[opener] == "assistant" and messages[opener].data.get("tool_calls"):
        return opener
    return index


def expansion_call_ids(messages: Sequence[Message]) -> set[str]:
    """Ids of the tool calls to the gateway's expansion tools (by `pinning.call_names`'s rule:
    the last call with an id names it)."""
    ids: set[str] = set()
    for message in [m for m in messages if m.data.get("tool_calls")]:  # (most have none)
        for call in message.data["tool_calls"]:
            if is_mapping(call) and is_mapping(function := call.get("function")):
                if str(function.get("name", "")) in EXPANSION_TOOLS:
                    ids.add(str(call.get("id", "")))
                elif ids:
                    ids.discard(str(call.get("id", "")))
    return ids


def _has_long_line(text: str, limit: int) -> bool:
    """`max(map(len, text.split("\\n"))) > limit`, looking only at the lines through every
    (limit + 1)th character: any run of limit + 1 characters covers one of them."""
    step = limit + 1
    for at in range(limit, len(text), step):
        start = text.rfind("\n", 0, at) + 1
        end = text.find("\n", at)
        if (len(text) if end < 0 else end) - start > limit:
            return True
    return False


def find_note(text: str) -> re.Match[str] | None:
    """`NOTE_RE.search(text)`, without running the regex over texts that have no note."""
    return NOTE_RE.search(text) if NOTE_START in text else None


def is_placeholder(text: str) -> bool:
    """Whether `text`, stripped, is a placeholder (`PLACEHOLDER_RE`), without copying it."""
    return _PADDED_PLACEHOLDER_RE.match(text) is not None


def _stored(ref: str, text: str) -> StoredOutput:
    return StoredOutput(ref=ref, text=text)
