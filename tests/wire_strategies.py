"""Hypothesis strategies for agent sessions in the Responses and Messages wire formats, and the
providers' rules a forwarded body must keep (checked on what the gateway renders).

The sessions look like what Codex CLI and Claude Code send: instructions or a system prompt,
user messages, reasoning / thinking, parallel tool calls with their outputs, hosted-tool items,
and items of types no adapter knows. Every id is unique, so a rule can say which item is which.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

from policies import Conversation, Message
from tests.policy_strategies import count

WORDS = ("alpha", "beta", "gamma", "delta", "file", "test", "error", "fixed", "line", "value")


@st.composite
def text(draw: st.DrawFn, low: int = 1, high: int = 60) -> str:
    n = draw(st.integers(low, high))
    return " ".join(draw(st.sampled_from(WORDS)) for _ in range(n))


# -- Responses ---------------------------------------------------------------------------------


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    ids = itertools.count(1)
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(1, 6))):
        items.append({"type": "message", "role": "user", "content": draw(text())})
        for _ in range(draw(st.integers(0, 4))):  # agent steps
            if draw(st.booleans()):
                n = next(ids)
                items.append(
                    {
                        "type": "reasoning",
                        "id": f"rs_{n}",
                        "summary": [{"type": "summary_text", "text": draw(text(1, 8))}],
                        "encrypted_content": f"gAAA{n:06d}opaque==",
                    }
                )
            calls = []
            for _ in range(draw(st.integers(1, 2))):
                n = next(ids)
                kind = draw(st.sampled_from(["function_call", "custom_tool_call"]))
                call: dict[str, Any] = {"type": kind, "id": f"fc_{n}", "call_id": f"call_{n}"}
                if kind == "function_call":
                    call.update(name="shell", arguments='{"cmd": "ls"}')
                else:
                    call.update(name="apply_patch", input="*** Begin Patch")
                items.append(call)
                calls.append(call)
            if draw(st.booleans()):
                items.append({"type": "web_search_call", "id": f"ws_{next(ids)}", "status": "done"})
            for call in calls:
                kind = f"{call['type']}_output"
                output: Any = draw(text(1, 200))
                if draw(st.booleans()):
                    output = [{"type": "input_text", "text": output}]
                items.append({"type": kind, "call_id": call["call_id"], "output": output})
                if draw(st.integers(0, 9)) == 0:
                    items.append({"type": "future_item_kind", "id": f"x_{next(ids)}"})
        if draw(st.booleans()):
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "id": f"msg_{next(ids)}",
                    "content": [{"type": "output_text", "text": draw(text()), "annotations": []}],
                }
            )
    body: dict[str, Any] = {"model": "m", "input": items, "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["instructions"] = "You are a coding agent. " + draw(text(1, 20))
    return body


def responses_violations(original: Sequence[Any], sent: Sequence[Any]) -> list[str]:
    """What OpenAI would refuse (or a client would notice) in `sent`, derived from `original`."""
    problems: list[str] = []
    where = {id(item): i for i, item in enumerate(original)}
    calls_seen: set[str] = set()
    outputs = {i.get("call_id") for i in sent if str(i.get("type", "")).endswith("_output")}
    positions = []
    for k, item in enumerate(sent):
        kind = item.get("type", "message")
        if kind.endswith("_output"):
            if item["call_id"] not in calls_seen:
                problems.append(f"output {item['call_id']} without its call")
        elif "call_id" in item:
            calls_seen.add(item["call_id"])
            if item["call_id"] not in outputs:
                problems.append(f"call {item['call_id']} without its output")
        at = where.get(id(item))
        if at is None:
            same = [i for i, o in enumerate(original) if _same_item_but_output(o, item)]
            if not same:
                if item.get("type") in ("reasoning", "function_call", "custom_tool_call"):
                    problems.append(f"item {item.get('id')} changed")
                continue
            at = same[0]
        positions.append(at)
        if kind == "reasoning":
            nxt = sent[k + 1] if k + 1 < len(sent) else None
            if at + 1 < len(original) and (nxt is None or where.get(id(nxt)) != at + 1):
                problems.append(f"reasoning {item['id']} separated from the item after it")
        if kind == "future_item_kind" and at > 0:
            previous = sent[k - 1] if k > 0 else None
            if previous is None or positions[-2:-1] != [at - 1]:
                problems.append(f"unknown item {item['id']} separated from its neighbour")
    if positions != sorted(positions):
        problems.append("order changed")
    kept = set(positions)
    for i, item in enumerate(original[:-1]):
        if item.get("type") == "reasoning" and (i in kept) != (i + 1 in kept):
            problems.append(f"reasoning {item['id']} kept or dropped without the item after it")
    return problems


def _same_item_but_output(original: Any, item: Mapping[str, Any]) -> bool:
    """`item` is `original` with a new `output` (a masked tool output) and nothing else."""
    if not isinstance(original, dict) or "output" not in original:
        return False
    return {k: v for k, v in original.items() if k != "output"} == {
        k: v for k, v in item.items() if k != "output"
    }


# -- Messages ----------------------------------------------------------------------------------


@st.composite
def messages_bodies(draw: st.DrawFn) -> dict[str, Any]:
    ids = itertools.count(1)
    messages: list[dict[str, Any]] = []
    breakpoints = 0

    def marked(block: dict[str, Any], ttl: str = "5m") -> dict[str, Any]:
        """Now and then, a prompt-cache breakpoint on `block` (never more than four)."""
        nonlocal breakpoints
        if breakpoints < 4 and draw(st.integers(0, 5)) == 0:
            breakpoints += 1
            marker = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
            return {**block, "cache_control": marker}
        return block

    system = marked({"type": "text", "text": "You are Claude Code. " + draw(text(1, 20))}, "1h")
    for _ in range(draw(st.integers(1, 6))):
        user: list[dict[str, Any]] = [marked({"type": "text", "text": draw(text())})]
        if messages and messages[-1]["role"] == "user":
            messages[-1]["content"].extend(user)
        else:
            messages.append({"role": "user", "content": user})
        for _ in range(draw(st.integers(0, 4))):
            blocks: list[dict[str, Any]] = []
            if draw(st.booleans()):
                n = next(ids)
                blocks.append(
                    {"type": "thinking", "thinking": draw(text(1, 10)), "signature": f"sig{n}=="}
                )
            if draw(st.booleans()):
                blocks.append(marked({"type": "text", "text": draw(text())}))
            uses = []
            for _ in range(draw(st.integers(1, 2))):
                n = next(ids)
                use = {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"n": n}}
                blocks.append(marked(use))
                uses.append(use)
            messages.append({"role": "assistant", "content": blocks})
            results = []
            for use in uses:
                content: Any = draw(text(1, 200))
                if draw(st.integers(0, 4)) == 0:  # blocks, one perhaps with its own marker
                    content = [marked({"type": "text", "text": content})]
                result = {"type": "tool_result", "tool_use_id": use["id"], "content": content}
                results.append(marked(result))
            messages.append({"role": "user", "content": results})
        if draw(st.booleans()):
            final = [{"type": "text", "text": draw(text())}]
            messages.append({"role": "assistant", "content": final})
    body: dict[str, Any] = {"model": "m", "max_tokens": 1024, "messages": messages}
    if messages[-1]["role"] == "assistant":
        messages.append({"role": "user", "content": draw(text())})
    if draw(st.booleans()):
        body["system"] = [system]
    return body


def messages_violations(
    original: Mapping[str, Any], sent: Mapping[str, Any], recovered: bool = False
) -> list[str]:
    """What Anthropic would refuse in `sent` (pairing, signatures, breakpoints), and the latest
    assistant message changed (allowed only to the last-resort recovery, `recovered`)."""
    problems: list[str] = []
    blocks_sent = [
        b for m in sent["messages"] if isinstance(m["content"], list) for b in m["content"]
    ]
    originals = {
        id(b): b
        for m in original["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
    }
    for block in blocks_sent:
        if block.get("type") in ("thinking", "redacted_thinking") and id(block) not in originals:
            problems.append(f"thinking block rewritten: {block.get('signature')}")
    messages = sent["messages"]
    for k, message in enumerate(messages):
        content = message["content"] if isinstance(message["content"], list) else []
        if message["role"] == "assistant":
            uses = [b["id"] for b in content if b.get("type") == "tool_use"]
            nxt = messages[k + 1] if k + 1 < len(messages) else None
            answered = set()
            if nxt is not None and nxt["role"] == "user" and isinstance(nxt["content"], list):
                answered = {b.get("tool_use_id") for b in nxt["content"]}
            for use in uses:
                if use not in answered:
                    problems.append(f"tool_use {use} without its result in the next message")
        else:
            previous = messages[k - 1] if k > 0 else None
            made = set()
            if previous is not None and previous["role"] == "assistant":
                if isinstance(previous["content"], list):
                    made = {b.get("id") for b in previous["content"]}
            for block in content:
                if block.get("type") == "tool_result" and block["tool_use_id"] not in made:
                    problems.append(f"tool_result {block['tool_use_id']} without its tool_use")
    marked = sum(1 for b in blocks_sent if b.get("cache_control"))
    for key in ("system", "tools"):
        value = sent.get(key)
        if isinstance(value, list):
            marked += sum(1 for b in value if isinstance(b, dict) and b.get("cache_control"))
    if marked > 4:
        problems.append(f"{marked} cache_control markers")
    ttls = [
        b["cache_control"].get("ttl", "5m")
        for b in [*(sent.get("system") or []), *blocks_sent]
        if isinstance(b, dict) and b.get("cache_control")
    ]
    if "5m" in ttls and "1h" in ttls[ttls.index("5m") :]:
        problems.append("a 1h cache marker after a 5m one")
    last = (
        max(i for i, m in enumerate(original["messages"]) if m["role"] == "assistant")
        if any(m["role"] == "assistant" for m in original["messages"])
        else None
    )
    if (
        last is not None
        and not recovered
        and all(m is not original["messages"][last] for m in messages)
    ):
        if not any(m == original["messages"][last] for m in messages):
            problems.append("the latest assistant message was changed or dropped")
    return problems


def conversation_of(request: Any) -> Conversation:
    """The canonical conversation as the pipeline builds it (test counter, client marks)."""
    return Conversation(
        tuple(
            Message(data, count(data), marks.pin, marks.priority, marks.kind, i)
            for i, (data, marks) in enumerate(zip(request.messages, request.marks, strict=True))
        )
    )
