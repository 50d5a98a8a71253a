"""The steps a summary made ahead of need does not cover, written short for the agent's answer.

A summary made ahead of need covers the history up to the request it was made after; by the time
the agent asks for its compaction a step or two more has happened (the model's last answer and
the tool output it asked for). The answer is that summary followed by these steps, written out
as a short transcript (`render_tail`), without a model:

- every message keeps its role, its text and its tool calls (name and arguments);
- a tool result longer than `RESULT_LINES` lines or `RESULT_CHARS` characters keeps its first
  and last lines, and says how much was left out and that running the call again shows it all
  (the agent has the tool; the gateway's own read tool is not offered to the turns after a
  compaction, so no reference is given);
- any other text longer than `TEXT_CHARS` keeps its head and its tail.

Nothing a message says about itself (role, call name, call id) is dropped, and the order is the
history's. `tail_share` measures what the written tail costs against the history it stands in
for, so that the caller can tell an answer that is still a compaction from one that is not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from policies.conversation import content_text

from ..summaries.transcript import render_message

NOTE = "\n\nSteps after this summary was written (oldest first; long tool output shortened):\n"
RESULT_LINES = 16  # a tool result's lines kept: the first 12 and the last 4
RESULT_HEAD = 12
RESULT_CHARS = 1_600  # ... and at most this many characters of them
TEXT_CHARS = 4_000  # any other text (a user's or the model's words, call arguments)
ARGUMENT_CHARS = 600


def render_tail(messages: Sequence[Mapping[str, Any]]) -> str:
    """`messages` as a short transcript, oldest first (empty for none)."""
    return "\n\n".join(_render(message) for message in messages)


def with_tail(summary: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """The answer: `summary`, then the steps it does not cover."""
    return summary + NOTE + render_tail(messages) if messages else summary


def tail_share(messages: Sequence[Mapping[str, Any]]) -> float:
    """The written tail's size against the messages written out whole, in characters (the
    share of their tokens it comes to: one tokenizer reads both)."""
    full = len("\n\n".join(render_message(m) for m in messages))
    return len(render_tail(messages)) / full if full else 0.0


def _render(message: Mapping[str, Any]) -> str:
    if message.get("role") == "tool":
        label = f"[tool result for {message.get('tool_call_id', '?')}]"
        text = content_text(message.get("content"))
        return f"{label}\n{_result(text)}" if text else label
    shortened = dict(message)
    text = content_text(message.get("content"))
    if len(text) > TEXT_CHARS:
        shortened["content"] = _cut(text, TEXT_CHARS)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        shortened["tool_calls"] = [_short_call(call) for call in calls]
    return render_message(shortened)


def _short_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return call
    arguments = function.get("arguments")
    if not isinstance(arguments, str) or len(arguments) <= ARGUMENT_CHARS:
        return call
    return {**call, "function": {**function, "arguments": _cut(arguments, ARGUMENT_CHARS)}}


def _result(text: str) -> str:
    """A tool result's first and last lines, or all of it when it is short."""
    lines = text.splitlines()
    if len(lines) <= RESULT_LINES and len(text) <= RESULT_CHARS:
        return text
    if len(lines) <= RESULT_LINES:  # a few long lines
        return _cut(text, RESULT_CHARS)
    head, tail = lines[:RESULT_HEAD], lines[RESULT_HEAD - RESULT_LINES :]
    kept = "\n".join(head) + "\n" + "\n".join(tail)
    if len(kept) > RESULT_CHARS:
        return _cut(text, RESULT_CHARS)
    left = len(lines) - len(head) - len(tail)
    omitted = len(text) - len(kept)
    note = f"[... {left} lines ({omitted} characters) not shown; run the call again for all ...]"
    short = "\n".join([*head, note, *tail])
    return short if len(short) < len(text) else text


def _cut(text: str, chars: int) -> str:
    """`text`'s head and tail, about `chars` characters (never longer than `text`)."""
    head = chars * 3 // 4
    tail = chars - head
    omitted = len(text) - head - tail
    short = f"{text[:head]}\n[... {omitted} characters not shown ...]\n{text[-tail:]}"
    return short if len(short) < len(text) else text
