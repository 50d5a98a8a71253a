"""What the summariser writes and reads: the messages as a transcript (`render_message`), the
prompts and notes around it, the cuts and chunks that make it fit a window, and the answer's
`<retain>`/`<summary>` sections (`read_answer`). No call is made here (`summarizer.py` makes it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from policies.conversation import content_text
from policies.summaries import SummaryAnswer

SYSTEM_PROMPT = (
    "You condense conversations so that the work can continue from your summary alone. Follow "
    "the instructions at the end of the user's message exactly, and write in the language the "
    "conversation is written in. Quote word for word every instruction, prohibition, constraint, "
    "decision, preference, goal and correction the user stated, and every concrete fact (numbers "
    "with units, names, paths, identifiers, dates): the work must still follow them."
)
EXTEND_NOTE = (
    "A summary of the conversation before these messages is given above. Return that summary "
    "extended with the new messages: keep what it says unless the new messages change it, and "
    "return the complete updated summary, not only the additions."
)
APPEND_NOTE = (
    "A summary of the conversation before these messages is given above, as context only. "
    "Summarise only the new messages: do not restate or repeat what the summary above says. "
    "Your summary will be appended to it, so it may refer to what the summary above says."
)
APPEND_RETAIN_NOTE = (
    "The <retain> section replaces the earlier one: list everything still needed word for word "
    "from the whole conversation, including what the summary above mentions."
)
PART_NOTE = "This is part {part} of {parts} of a longer conversation; summarise this part only."
COMBINE_NOTE = (
    "These are summaries of consecutive parts of one conversation, oldest first. Combine them "
    "into one summary of the whole conversation."
)
PREVIOUS_LABEL = "Summary of the conversation so far:"
LENGTH_NOTE = "Keep the summary under about {tokens} tokens."
CUT_NOTE = "\n[... {chars} characters cut ...]\n"

_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
_SUMMARY = re.compile(r"<summary>(.*?)(?:</summary>|$)", re.S | re.I)
_RETAIN = re.compile(r"<retain>(.*?)(?:</retain>|$)", re.S | re.I)


def render_message(message: Mapping[str, Any]) -> str:
    """One message as transcript text: a role line, then its text, tool calls and results."""
    role = str(message.get("role", "?"))
    name = message.get("name")
    label = f"{role} ({name})" if isinstance(name, str) and name else role
    if role == "tool" and isinstance(message.get("tool_call_id"), str):
        label = f"tool result for {message['tool_call_id']}"
    lines = [f"[{label}]"]
    text = content_text(message.get("content"))
    if text:
        lines.append(text)
    content = message.get("content")
    if isinstance(content, list):
        others = [
            p.get("type") for p in content if isinstance(p, Mapping) and p.get("type") != "text"
        ]
        lines.extend(f"[{kind} attached]" for kind in others)
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            call_id = call.get("id", "")
            lines.append(
                f"-> calls {function.get('name')} ({call_id}): {function.get('arguments', '')}"
            )
    function_call = message.get("function_call")
    if isinstance(function_call, Mapping):
        lines.append(f"-> calls {function_call.get('name')}: {function_call.get('arguments', '')}")
    return "\n".join(lines)


def cut_text(text: str, tokens: int, wanted: int) -> str:
    """`text` (of `tokens` tokens) shortened to about `wanted` tokens: its head and its tail."""
    if tokens <= wanted or not text:
        return text
    keep = max(1, int(len(text) * wanted / tokens * 0.9))
    head = keep * 2 // 3
    tail = keep - head
    return text[:head] + CUT_NOTE.format(chars=len(text) - keep) + text[len(text) - tail :]


def chunk(pieces: Sequence[str], sizes: Sequence[int], budget: int) -> list[list[str]]:
    """Greedy runs of `pieces` of at most `budget` tokens (a lone piece may be over; cut first)."""
    chunks: list[list[str]] = []
    current: list[str] = []
    total = 0
    for piece, size in zip(pieces, sizes, strict=True):
        if current and total + size > budget:
            chunks.append(current)
            current, total = [], 0
        current.append(piece)
        total += size
    if current:
        chunks.append(current)
    return chunks


def read_answer(text: str, want_retain: bool) -> SummaryAnswer:
    """Split a summariser's reply into summary and retain sections."""
    text = _THINK.sub("", text).strip()
    retain = ""
    if want_retain:
        found = _RETAIN.search(text)
        if found:
            retain = found.group(1).strip()
            text = (text[: found.start()] + text[found.end() :]).strip()
    found = _SUMMARY.search(text)
    summary = found.group(1).strip() if found else text.strip()
    return SummaryAnswer.ready(summary, retain)


def as_part(answer: SummaryAnswer) -> str:
    if answer.retain:
        return f"<retain>\n{answer.retain}\n</retain>\n<summary>\n{answer.text}\n</summary>"
    return answer.text
