"""The canonical conversation rendered back as Anthropic Messages: wire messages whose parts all
survived go as they were sent, the others are rebuilt from their kept blocks, and prompt-cache
breakpoints move to the nearest kept block (at most four). The rules are described in
`messages.py`."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from policies.conversation import content_text

from .base import WireRequest, unchanged
from .messages_parse import SYSTEM, Layout

if TYPE_CHECKING:
    from policies import Message

MAX_BREAKPOINTS = 4


def _wire_block(part: Any) -> dict[str, Any]:
    """A canonical part back as a content block: its original when it has one."""
    if not isinstance(part, dict):
        return {"type": "text", "text": str(part)}
    source = part.get("source")
    if part.get("type") == "text":
        if isinstance(source, dict):
            if source.get("text") == part.get("text"):
                return source
            return {**source, "text": part.get("text", "")}
        return {"type": "text", "text": str(part.get("text", ""))}
    return source if isinstance(source, dict) else {"type": "text", "text": content_text([part])}


def _wire_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, list):
        return [_wire_block(p) for p in content]
    text = content_text(content)
    return [{"type": "text", "text": text}] if text else []


class Renderer:
    """Puts a compacted canonical conversation back into messages and blocks.

    The canonical messages made from one client message come one after the other; they are
    regrouped into it. A client message whose canonical messages all came back unchanged is
    forwarded as the client's own object; the usual one (a single canonical message) is
    recognised without regrouping.
    """

    def __init__(self, request: WireRequest, layout: Layout, payload: dict[str, Any]) -> None:
        self.layout = layout
        self.originals = request.messages
        self.payload = payload
        self.out: list[Any] = []
        # (message, block) -> the block sent there; only needed to move cache markers
        self.kept: dict[tuple[int, int], Any] | None = {} if layout.marked else None
        self._index = -1  # the client message being regrouped (-1: none)
        self._group: list[Any] = []  # its blocks so far
        self._unchanged = 0  # its canonical messages that came back unchanged

    def render(self, messages: Sequence[Message], uids: Sequence[int | None]) -> None:
        layout, originals, out, kept = self.layout, self.originals, self.out, self.kept
        spans, parts, wires = layout.spans, layout.parts, layout.messages
        appended_system: list[dict[str, Any]] = []
        for message, same in zip(messages, unchanged(messages, originals, uids), strict=True):
            origin = message.origin
            if origin < 0:
                if message.role == "system":
                    appended_system.extend(_wire_blocks(message.data.get("content")))
                else:
                    self._flush()
                    role = "assistant" if message.role == "assistant" else "user"
                    out.append({"role": role, "content": _wire_blocks(message.data.get("content"))})
                continue
            index, positions = spans[origin]
            data = message.data
            if index == SYSTEM:
                if not same:
                    self.payload["system"] = _system_of(data.get("content"))
            elif parts[index] == 1:  # the only canonical message of its client message
                if self._index >= 0:
                    self._flush()
                wire = wires[index]
                if same:
                    out.append(wire)
                    if kept is not None and positions is not None:
                        content = wire["content"]
                        kept.update(((index, p), content[p]) for p in positions)
                elif positions is None:  # string content
                    out.append({**wire, "content": content_text(data.get("content"))})
                else:
                    out.append(self._rebuilt(index, positions, data, wire))
            elif index == self._index:  # (a message of several parts has blocks, no string)
                self._group.extend(self._blocks(index, positions or (), data, same))
                self._unchanged += same
            else:
                self._flush()
                self._index, self._unchanged = index, int(same)
                self._group = self._blocks(index, positions or (), data, same)
        self._flush()
        if appended_system:
            self.payload["system"] = _system_with(self.payload.get("system"), appended_system)
        self.payload["messages"] = out
        if kept is not None:
            _move_breakpoints(self.payload, layout, kept)
        _limit_breakpoints(self.payload, layout.markers)

    def _rebuilt(
        self, index: int, positions: tuple[int, ...], data: Mapping[str, Any], wire: Any
    ) -> Any:
        """Client message `index`, made of one canonical message a step changed (`data`), with
        its blocks rewritten. A pure function of the two objects: the render of an earlier
        request of the conversation is reused when it had these very objects."""
        kept, renders = self.kept, self.layout.renders
        hit = renders.get(index)
        if hit is not None and hit[0] is wire and hit[1] is data:
            if kept is None:
                return hit[2]
            if hit[3] is not None:
                kept.update(hit[3])
                return hit[2]
        made: dict[tuple[int, int], Any] | None = None if kept is None else {}
        self.kept = made
        rebuilt = {**wire, "content": self._blocks(index, positions, data, False)}
        self.kept = kept
        if kept is not None and made is not None:
            kept.update(made)
        renders[index] = (wire, data, rebuilt, None if made is None else tuple(made.items()))
        return rebuilt

    def _blocks(
        self, index: int, positions: tuple[int, ...], data: Mapping[str, Any], same: bool
    ) -> list[dict[str, Any]]:
        """The blocks one canonical message puts back into client message `index`."""
        source, kept = self.layout.messages[index]["content"], self.kept
        if same:
            blocks = [source[p] for p in positions]
            if kept is not None:
                kept.update(((index, p), source[p]) for p in positions)
            return blocks
        if data.get("role") == "tool":  # one tool result, its content changed (masked, cut)
            position = positions[0]
            block = _result(source[position], data.get("content"))
            if kept is not None:
                kept[(index, position)] = block
            return [block]
        pairs = _changed(data, [(p, source[p]) for p in positions])
        if kept is not None:
            kept.update(((index, p), block) for p, block in pairs if p is not None)
        return [block for _, block in pairs]

    def _flush(self) -> None:
        """Close the client message being regrouped."""
        index = self._index
        if index < 0:
            return
        self._index = -1
        wire = self.layout.messages[index]
        if self._unchanged == self.layout.parts[index]:
            self.out.append(wire)  # every part of it, unchanged: exactly as sent
        else:
            self.out.append({**wire, "content": self._group})


def _result(block: Mapping[str, Any], content: Any) -> dict[str, Any]:
    """A `tool_result` block with the content a step gave its tool message."""
    if isinstance(content, list):
        return {**block, "content": [_wire_block(p) for p in content]}
    return {**block, "content": content_text(content)}


def _changed(
    data: Mapping[str, Any], blocks: list[tuple[int, dict[str, Any]]]
) -> list[tuple[int | None, dict[str, Any]]]:
    """The blocks of one canonical message a step changed, with the change written onto them,
    each with the position of the block it replaces (None for a block that replaces none)."""
    role = data.get("role")
    content = data.get("content")
    if role == "assistant":
        text = content_text(content)
        calls = data.get("tool_calls")
        keep = None if calls is None else {c.get("id") for c in calls if isinstance(c, dict)}
        out: list[tuple[int | None, dict[str, Any]]] = []
        written = False
        for position, block in blocks:
            kind = block.get("type")
            if kind == "text":
                if written or not text:
                    continue
                block = {**block, "text": text}
                written = True
            elif kind == "tool_use" and keep is not None and block.get("id") not in keep:
                continue
            out.append((position, block))
        if text and not written:
            out.append((None, {"type": "text", "text": text}))
        return out
    return [(None, block) for block in _wire_blocks(content)]


def _system_of(content: Any) -> Any:
    if isinstance(content, list):
        return [_wire_block(p) for p in content]
    return content_text(content)


def _system_with(system: Any, blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(system, list):
        return [*system, *blocks]
    if isinstance(system, str) and system:
        return [{"type": "text", "text": system}, *blocks]
    return blocks


def _move_breakpoints(
    payload: dict[str, Any], layout: Layout, kept: Mapping[tuple[int, int], Any]
) -> None:
    """Keep the prompt-cache breakpoints of removed blocks usable.

    A removed block's marker moves to the nearest kept block before it (in the messages), so the
    prefix up to there is still cached. The client's own lists are never modified: what changes
    is copied.
    """
    moved: dict[int, dict[str, Any]] = {}  # id of a sent block -> its copy with a marker
    order: list[tuple[int, int]] | None = None
    for index, position in layout.marked:
        if (index, position) in kept:
            continue
        marker = layout.messages[index]["content"][position].get("cache_control")
        if marker is None:
            continue
        if order is None:
            order = sorted(kept)
        before = bisect_left(order, (index, position))
        if before == 0:
            continue
        target = kept[order[before - 1]]
        if isinstance(target, dict) and target.get("cache_control") is None:
            moved[id(target)] = {**target, "cache_control": marker}
    if moved:
        _replace_blocks(payload, lambda block: moved.get(id(block), block))


def _limit_breakpoints(payload: dict[str, Any], in_messages: bool) -> None:
    """At most four markers, and `1h` never after `5m`: later offenders lose their marker.

    `in_messages`: the messages may carry markers (else only tools and system are read).
    """
    marked: list[Any] = []
    for key in ("tools", "system"):
        value = payload.get(key)
        if isinstance(value, list):
            marked.extend(b for b in value if _marked(b))
    for message in payload["messages"] if in_messages else ():
        content = message["content"]
        if type(content) is list:
            # every sent block is a dict: checked on the way in, or made by us
            marked.extend([b for b in content if b.get("cache_control") is not None])
    if len(marked) <= 1:
        return
    seen_short = False
    count = 0
    unmark: set[int] = set()
    for block in marked:
        marker = block["cache_control"]
        ttl = marker.get("ttl", "5m") if isinstance(marker, dict) else "5m"
        if (ttl == "1h" and seen_short) or count >= MAX_BREAKPOINTS:
            unmark.add(id(block))
            continue
        seen_short = seen_short or ttl != "1h"
        count += 1
    if unmark:
        _replace_blocks(
            payload,
            lambda b: (
                {k: v for k, v in b.items() if k != "cache_control"} if id(b) in unmark else b
            ),
        )


def _replace_blocks(payload: dict[str, Any], change: Any) -> None:
    """Apply `change` to every block of tools, system and messages, copying the containers
    whose blocks changed (never the client's own lists)."""
    for key in ("tools", "system"):
        value = payload.get(key)
        if isinstance(value, list):
            new = [change(b) for b in value]
            if any(a is not b for a, b in zip(new, value, strict=True)):
                payload[key] = new
    messages = payload["messages"]
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        new = [change(b) for b in content]
        if any(a is not b for a, b in zip(new, content, strict=True)):
            messages[i] = {**message, "content": new}


def _marked(block: Any) -> bool:
    return isinstance(block, dict) and block.get("cache_control") is not None
