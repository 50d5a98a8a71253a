"""Codex-like Responses bodies and Claude-Code-like Messages bodies for the benchmark.

Both carry what those agents send on every request (shapes from the captures in
`tests/fixtures/agents/`; the text is our own, generated): about 20-50 KB of instructions and
tool definitions, then the history. The history is the chat case's 200-message agent
conversation (`workloads.agent_messages`) without its system prompt, turned into each API's
items, so the three APIs carry the same conversation:

* Responses (Codex CLI): two `developer` messages of instructions and an environment message in
  `input`, nine function tools with JSON schemas, `reasoning`, `include`, `store: false`,
  `prompt_cache_key`; each tool round is a `reasoning` item with `encrypted_content`, the
  `function_call` items and their `function_call_output` items.
* Messages (Claude Code): `system` text blocks with `cache_control`, twelve tools with
  `input_schema`, `metadata`, `thinking`, `max_tokens: 32000`; each tool round is an assistant
  message of `tool_use` blocks and one user message of their `tool_result` blocks.

Both end on a new user message after an assistant text. The markers of `workloads` are in every
item (instructions, texts, call ids, arguments, outputs, the cache key), so `Workload.first_time`
makes every item new and `Workload.appended` changes only the last user message.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import orjson

from .workloads import CONV_MARK, Message, Workload, _prose, agent_messages

JSON = dict[str, Any]
_SECTIONS = (
    "How you work",
    "Editing files",
    "Running commands",
    "Testing",
    "Planning",
    "Reviewing changes",
    "Answering the user",
    "Safety",
    "Formatting",
    "Tools",
)


def instructions(rng: random.Random, size: int, mark: str) -> str:
    """About `size` bytes of agent instructions: headed sections of bullet points."""
    parts = [f"[{mark}] You are a coding agent working in the user's repository."]
    length = len(parts[0])
    section = 0
    while length < size:
        heading = f"\n\n## {_SECTIONS[section % len(_SECTIONS)]}\n"
        bullets = [f"- {_prose(rng, rng.randint(12, 30))}" for _ in range(6)]
        block = heading + "\n".join(bullets)
        parts.append(block)
        length += len(block)
        section += 1
    return "".join(parts)


def _schema(rng: random.Random, fields: tuple[str, ...]) -> JSON:
    return {
        "type": "object",
        "properties": {
            name: {"type": "string", "description": _prose(rng, rng.randint(8, 24))}
            for name in fields
        },
        "required": [fields[0]],
        "additionalProperties": False,
    }


_CODEX_TOOLS = (
    ("exec_command", ("cmd", "workdir", "timeout_ms", "justification")),
    ("write_stdin", ("session_id", "chars", "yield_time_ms")),
    ("apply_patch", ("input",)),
    ("update_plan", ("explanation", "plan")),
    ("view_image", ("path",)),
    ("list_mcp_resources", ("server", "cursor")),
    ("read_mcp_resource", ("server", "uri")),
    ("request_user_input", ("questions",)),
    ("get_goal", ("thread",)),
)
_CLAUDE_TOOLS = (
    ("Agent", ("description", "prompt", "subagent_type")),
    ("Bash", ("command", "description", "timeout", "run_in_background")),
    ("Edit", ("file_path", "old_string", "new_string", "replace_all")),
    ("Glob", ("pattern", "path")),
    ("Grep", ("pattern", "path", "glob", "output_mode")),
    ("Read", ("file_path", "offset", "limit")),
    ("Write", ("file_path", "content")),
    ("TodoWrite", ("todos",)),
    ("WebFetch", ("url", "prompt")),
    ("NotebookEdit", ("notebook_path", "cell_id", "new_source")),
    ("Skill", ("skill", "args")),
    ("ToolSearch", ("query", "max_results")),
)


def _encrypted(rng: random.Random, size: int = 900) -> str:
    return "gAAAAAB" + base64.b64encode(rng.randbytes(size)).decode()


def _command(call: Message, mark: str) -> str:
    arguments = orjson.loads(call["function"]["arguments"])
    path, query = arguments["path"], arguments["query"]
    return {
        "read_file": f"sed -n '1,120p' {path}",
        "grep": f"rg -n '{query}' src/{mark}",
        "run_tests": f"python -m pytest -q {path}",
    }[call["function"]["name"]]


def _history(count: int) -> list[Message]:
    """The chat agent conversation without its system prompt, ending assistant text + user."""
    messages = agent_messages(count)[1:]
    last = messages.pop()
    if messages[-1]["role"] != "assistant" or messages[-1].get("tool_calls"):
        rng = random.Random(27)
        text = f"[{CONV_MARK.decode()}] Done: " + _prose(rng, 25)
        messages.append({"role": "assistant", "content": text})
    return [*messages, last]


# -- Responses (Codex CLI) --------------------------------------------------------------------


def _text_item(role: str, text: str) -> JSON:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def responses_body(model: str, stream: bool = True, count: int = 200) -> bytes:
    rng = random.Random(2701)
    mark = CONV_MARK.decode()
    items: list[JSON] = [
        _text_item("developer", instructions(rng, 17_000, mark)),
        _text_item("developer", instructions(rng, 2_400, mark)),
        _text_item(
            "user",
            f"<environment_context>\n  <cwd>/work/{mark}</cwd>\n  <shell>bash</shell>\n"
            "  <current_date>2026-11-25</current_date>\n</environment_context>",
        ),
    ]
    for message in _history(count):
        if message.get("tool_calls"):
            items.append({"type": "reasoning", "summary": [], "encrypted_content": _encrypted(rng)})
            for call in message["tool_calls"]:
                arguments = {"cmd": _command(call, mark), "workdir": f"/work/{mark}"}
                items.append(
                    {
                        "type": "function_call",
                        "name": "exec_command",
                        "arguments": orjson.dumps(arguments).decode(),
                        "call_id": call["id"],
                    }
                )
        elif message["role"] == "tool":
            output = "Process exited with code 0\nOutput:\n" + message["content"]
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": output,
                }
            )
        else:
            items.append(_text_item(message["role"], message["content"]))
    tools = [
        {
            "type": "function",
            "name": name,
            "description": _prose(rng, rng.randint(40, 160)),
            "strict": False,
            "parameters": _schema(rng, fields),
        }
        for name, fields in _CODEX_TOOLS
    ]
    body = {
        "model": model,
        "input": items,  # Codex sends its instructions as developer messages here
        "tools": tools,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "stream": stream,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": f"019ab000-{mark}-7cc0-9609-d96ec8fecddf",
    }
    return orjson.dumps(body)


# -- Messages (Claude Code) -------------------------------------------------------------------


def _tool_use(call: Message) -> JSON:
    arguments = orjson.loads(call["function"]["arguments"])
    path = arguments["path"]
    name, tool_input = {
        "read_file": ("Read", {"file_path": "/work/" + path}),
        "grep": ("Grep", {"pattern": arguments["query"], "path": path}),
        "run_tests": ("Bash", {"command": f"python -m pytest -q {path}", "description": "Test"}),
    }[call["function"]["name"]]
    return {"type": "tool_use", "id": "toolu_" + call["id"], "name": name, "input": tool_input}


def _append(messages: list[JSON], role: str, block: JSON) -> None:
    """Add `block` to the last message if it has `role`, else start a new message."""
    if messages and messages[-1]["role"] == role:
        messages[-1]["content"].append(block)
    else:
        messages.append({"role": role, "content": [block]})


def messages_body(model: str, stream: bool = True, count: int = 200) -> bytes:
    rng = random.Random(2702)
    mark = CONV_MARK.decode()
    history = _history(count)
    reminder = f"<system-reminder>\n[{mark}] {_prose(rng, 90)}\n</system-reminder>"
    messages: list[JSON] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": reminder},
                {"type": "text", "text": history[0]["content"]},
            ],
        }
    ]
    for message in history[1:-1]:
        if message.get("tool_calls"):
            for call in message["tool_calls"]:
                _append(messages, "assistant", _tool_use(call))
        elif message["role"] == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": "toolu_" + message["tool_call_id"],
                "content": message["content"],
            }
            _append(messages, "user", result)
        else:
            _append(messages, message["role"], {"type": "text", "text": message["content"]})
    messages.append({"role": "user", "content": [{"type": "text", "text": history[-1]["content"]}]})
    cache = {"type": "ephemeral"}
    system = [
        {
            "type": "text",
            "text": "x-anthropic-billing-header: cc_version=2.1.0; cc_entrypoint=cli;",
        },
        {"type": "text", "text": "You are an interactive coding agent.", "cache_control": cache},
        {"type": "text", "text": instructions(rng, 15_000, mark), "cache_control": cache},
    ]
    tools = [
        {
            "name": name,
            "description": _prose(rng, rng.randint(60, 260)),
            "input_schema": _schema(rng, fields),
        }
        for name, fields in _CLAUDE_TOOLS
    ]
    body = {
        "model": model,
        "messages": messages,
        "system": system,
        "tools": tools,
        "metadata": {"user_id": f"user_{mark}_account__session_{mark}"},
        "max_tokens": 32000,
        "thinking": {"type": "enabled", "budget_tokens": 16000},
        "stream": stream,
    }
    return orjson.dumps(body)


def codex(model: str, stream: bool = True, count: int = 200) -> Workload:
    return Workload(f"responses{count}", responses_body(model, stream, count), count)


def claude(model: str, stream: bool = True, count: int = 200) -> Workload:
    return Workload(f"messages{count}", messages_body(model, stream, count), count)


def sizes(body: bytes) -> dict[str, int]:
    """Bytes of a body's instructions + tools and of its history (for the report)."""
    payload = orjson.loads(body)
    if "input" in payload:
        head = [i for i in payload["input"] if i.get("role") == "developer"]
        history = [i for i in payload["input"] if i.get("role") != "developer"]
    else:
        head, history = payload["system"], payload["messages"]
    fixed = len(orjson.dumps(head)) + len(orjson.dumps(payload["tools"]))
    return {"instructions_and_tools": fixed, "history": len(orjson.dumps(history))}
