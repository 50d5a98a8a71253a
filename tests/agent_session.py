"""A long agent session, deterministic, as each wire API sends it; the core it is sent to.

The session (`session(turns)`) is a task, then tool calls whose outputs are about 3 000
characters of log or code, a new user message every eighth step, as neutral steps; `body(api,
steps)` is the request an agent sends after them (the whole history so far, as agents do), in
Chat Completions, Responses or Anthropic Messages. `pieces` cuts a forwarded conversation into
what a provider's prefix cache compares, and `parts_at` builds the gateway's core without HTTP
for one model at a given window and chain.

Shared by the tests of prefix stability (tests/test_prefix_stability.py) and the benchmarks
that measure it or time the wire APIs on it (`benchmarks.bench_cache`,
`benchmarks.bench_wire_apis`): the benchmarks import it from here, so no test depends on a
benchmark.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import orjson

from gateway.config import parse_config
from gateway.devtools.parts import Parts, parts
from gateway.wire import CHAT, MESSAGES, RESPONSES

WIRES = {"chat": CHAT, "responses": RESPONSES, "messages": MESSAGES}
SYSTEM = "You are a coding agent. Use the shell tool to inspect and change the repository."
TOOL = {
    "name": "shell",
    "description": "Run a shell command in the repository.",
    "parameters": {
        "type": "object",
        "properties": {"cmd": {"type": "string"}},
        "required": ["cmd"],
    },
}
WORDS = "build test error module import value config handler request cache token window".split()


def session(turns: int, seed: int = 7) -> list[dict[str, Any]]:
    """The session as neutral steps: user text, or (call id, command, output)."""
    rng = random.Random(seed)
    steps: list[dict[str, Any]] = [{"user": "Fix the failing tests in the gateway package."}]
    for n in range(1, turns):
        if n % 8 == 0:
            steps.append(
                {"user": f"Now look at part {n // 8}: " + " ".join(rng.choices(WORDS, k=20))}
            )
            continue
        lines = []
        while sum(len(line) + 1 for line in lines) < 3000:
            lines.append(
                f"{rng.choice(WORDS)}/{rng.choice(WORDS)}.py:{rng.randint(1, 900)}: "
                + " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))
            )
        steps.append(
            {
                "call": f"call_{n}",
                "cmd": f"grep -rn {rng.choice(WORDS)} .",
                "output": "\n".join(lines),
            }
        )
    return steps


def body(api: str, steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The request an agent sends after `steps`, in `api`'s format."""
    if api == "chat":
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        for step in steps:
            if "user" in step:
                messages.append({"role": "user", "content": step["user"]})
                continue
            call = {
                "id": step["call"],
                "type": "function",
                "function": {
                    "name": "shell",
                    "arguments": orjson.dumps({"cmd": step["cmd"]}).decode(),
                },
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append(
                {"role": "tool", "tool_call_id": step["call"], "content": step["output"]}
            )
        return {
            "model": "m",
            "messages": messages,
            "tools": [{"type": "function", "function": TOOL}],
            "max_completion_tokens": 1024,
        }
    if api == "responses":
        items: list[dict[str, Any]] = []
        for step in steps:
            if "user" in step:
                items.append(
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": step["user"]}],
                    }
                )
                continue
            arguments = orjson.dumps({"cmd": step["cmd"]}).decode()
            items.append(
                {
                    "type": "function_call",
                    "call_id": step["call"],
                    "name": "shell",
                    "arguments": arguments,
                }
            )
            items.append(
                {"type": "function_call_output", "call_id": step["call"], "output": step["output"]}
            )
        return {
            "model": "m",
            "instructions": SYSTEM,
            "input": items,
            "tools": [{"type": "function", **TOOL}],
            "max_output_tokens": 1024,
            "store": False,
        }
    turns: list[dict[str, Any]] = []
    for step in steps:
        if "user" in step:
            block: dict[str, Any] = {"type": "text", "text": step["user"]}
        else:
            call = {
                "type": "tool_use",
                "id": step["call"],
                "name": "shell",
                "input": {"cmd": step["cmd"]},
            }
            turns.append({"role": "assistant", "content": [call]})
            block = {"type": "tool_result", "tool_use_id": step["call"], "content": step["output"]}
        if turns and turns[-1]["role"] == "user":
            turns[-1]["content"].append(block)
        else:
            turns.append({"role": "user", "content": [block]})
    tool = {
        "name": TOOL["name"],
        "description": TOOL["description"],
        "input_schema": TOOL["parameters"],
    }
    return {"model": "m", "system": SYSTEM, "messages": turns, "tools": [tool], "max_tokens": 1024}


CONVERSATION = {"chat": "messages", "responses": "input", "messages": "messages"}


def parts_at(
    window: int, steps: list[dict[str, Any]] | None, target: float = 0.6, hold: float = 0.95
) -> Parts:
    """The core (no HTTP) for model `m` at `window` tokens (`chars:4`), its policy triggering at
    0.8, compacting to `target` with `steps` (None: the default chain) and holding an event's
    result up to `hold`."""
    policy: dict[str, Any] = {"trigger_ratio": 0.8, "target_ratio": target, "hold_ratio": hold}
    if steps is not None:
        policy["steps"] = steps
    config = {
        "models": [
            {
                "name": "m",
                "upstream": {"base_url": "http://127.0.0.1:9/v1"},
                "tokenizer": "chars:4",
                "context_window": window,
                "policy": "p",
            }
        ],
        "policies": {"p": policy},
    }
    return parts(parse_config(config))


def pieces(api: str, conversation: list[dict[str, Any]]) -> list[bytes]:
    """The forwarded conversation as the pieces a prefix cache sees in order: items, or for
    Messages each content block with its turn's role (a block appended to the last turn, as a
    user's text after a tool result, extends the prefix)."""
    if api != "messages":
        return [orjson.dumps(item) for item in conversation]
    out = []
    for turn in conversation:
        content = turn["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        out.extend(orjson.dumps([turn["role"], block]) for block in blocks)
    return out
