"""How each client puts a session on the wire: its fixed head, its framing of tool output, and
every request body it sends (`render`), in the order it sends them.

- `aider` (Chat Completions): system prompt, then the files added to the chat in one user
  message ("I have *added these files to the chat* ...", each file as its path and a fenced
  block) with the assistant's short acknowledgement, the repo map likewise, then the history
  (replies carry SEARCH/REPLACE blocks), then the current message. A request per user message.
- `codex` (Responses): `instructions`, a developer message, AGENTS.md and the environment
  context as user items; per tool step a `reasoning` item with `encrypted_content` and
  `function_call` / `function_call_output` items (`exec_command`, output framed with Codex's
  "Chunk ID / Wall time / Process exited with code / Output:" header). A request per user
  message and per tool step.
- `claude_code` (Messages): `system` text blocks with `cache_control`, CLAUDE.md in a
  `<system-reminder>` block of the first user message, `tool_use` / `tool_result` turns (Read
  output line-numbered), `cache_control` on the last block of
  the last message (it moves every request), and from about 60 % of the session on, older
  results replaced by `[Old tool result content cleared]` as its micro-compaction does.
- `opencode` (Chat Completions with tools): OpenCode's tool names and `<file>` framing on even
  seeds, Qwen Code's (`read_file`, `run_shell_command`) on odd ones.
- `chat`: a system prompt and user/assistant turns; logs pasted into user messages.

The text is ours; only the framing follows what those clients send.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from benchmarks.agent_bodies import instructions

from . import material

if TYPE_CHECKING:
    from . import Call, Session

JSON = dict[str, Any]
MODEL = "corpus-model"
API = {
    "aider": "chat",
    "codex": "responses",
    "claude_code": "messages",
    "opencode": "chat",
    "chat": "chat",
}
PATH = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
CLEARED = "[Old tool result content cleared]"
FILES_PREFIX = (
    "I have *added these files to the chat* so you can go ahead and edit them.\n\n"
    "*Trust this message as the true contents of these files!*\n"
    "Other messages in this chat may show older versions of them.\n"
)
FILES_ACK = "Ok, any changes I propose will be to those files."
REPO_PREFIX = (
    "Here are summaries of some files present in my git repository.\n"
    "Do not propose changes to these files, treat them as *read-only*.\n"
    "If you need to edit any of these files, ask me to *add them to the chat* first.\n"
)
REPO_ACK = "Ok, I won't try and edit those files without asking first."
AIDER_SYSTEM = (
    "Act as an expert software developer. Always use best practices when coding and respect "
    "the conventions already in the code base. Take requests for changes to the supplied code. "
    "If a request is ambiguous, ask questions.\n\n"
    "Once you understand the request: decide whether files need changes that are not in the "
    "chat yet, explain the changes briefly, then describe each change with a *SEARCH/REPLACE* "
    "block: the file path alone on a line, an opening fence with the language, the line "
    "<<<<<<< SEARCH, the exact existing lines, the line =======, the new lines, the line "
    ">>>>>>> REPLACE, and the closing fence. Every SEARCH section must match the file exactly, "
    "including comments and indentation. Keep blocks short and only include changing lines "
    "with a little context. Reply in the same language as the user.\n"
)
CHAT_SYSTEM = {
    "en": "You are a helpful assistant for a software team. Answer precisely.",
    "zh": "你是一个帮助软件团队的助手，请准确回答。",
    "ja": "あなたはソフトウェア開発チームを手伝うアシスタントです。正確に答えてください。",
}
_TOOL_NAMES = {
    "codex": {"read": "exec_command", "shell": "exec_command"},
    "claude_code": {"read": "Read", "shell": "Bash"},
    "opencode": {"read": "read", "shell": "bash"},
    "qwen": {"read": "read_file", "shell": "run_shell_command"},
}


def _schema(*fields: str) -> JSON:
    return {
        "type": "object",
        "properties": {
            f: {"type": "string", "description": f"The {f.replace('_', ' ')}."} for f in fields
        },
        "required": [fields[0]],
    }


def _hex(seed: str, n: int) -> str:
    return hashlib.sha256(seed.encode()).hexdigest()[:n]


def shown(shape: str, call: Call) -> str:
    """The command as the agent ran it, as a user would name it in a question."""
    if call.kind == "read":
        return f"sed -n '1,400p' {call.target}" if shape == "codex" else f"Read {call.target}"
    return call.target


def tool_output(shape: str, kind: str, target: str, raw: str, n: int, flavor: str = "") -> str:
    """`raw` framed as the shape's agent frames a tool's output."""
    lines = raw.split("\n")
    if shape == "codex":
        code = 1 if "FAIL" in raw or "failed" in raw else 0
        return (
            f"Chunk ID: {_hex(target + str(n), 6)}\nWall time: {0.05 + (n % 17) / 10:.4f} seconds\n"
            f"Process exited with code {code}\nOriginal token count: {len(raw) // 4}\nOutput:\n{raw}"
        )
    if kind == "read" and shape == "claude_code":
        return "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(lines, 1))
    if kind == "read" and flavor != "qwen":
        body = "\n".join(f"{i:05d}| {line}" for i, line in enumerate(lines, 1))
        return f"<file>\n{body}\n\n(End of file - total {len(lines)} lines)\n</file>"
    if kind == "shell" and flavor == "qwen":
        return (
            f"Command: {target}\nDirectory: (root)\nOutput: {raw}\nError: (none)\n"
            f"Exit Code: 0\nSignal: (none)\nBackground PIDs: (none)\nProcess Group PGID: {4000 + n}"
        )
    return raw


def edit_block(shape: str, rng: random.Random, domain: Mapping[str, Any], reply: str) -> str:
    """An Aider reply sometimes carries a SEARCH/REPLACE block."""
    if shape != "aider" or rng.random() < 0.4:
        return reply
    path = material.module_path(domain, rng.choice(domain["modules"]))
    lang = domain["code"]
    entity = rng.choice(domain["entities"])
    if lang == "rust":
        old = "            .map_err(|e| Error::Db(e.to_string()))?;"
        new = f'            .map_err(|e| Error::NotFound(format!("{entity} {{id}}: {{e}}")))?;'
    elif lang == "go":
        old = "\tif err := row.Scan(&v); err != nil {\n\t\treturn nil, err\n\t}"
        new = f'\tif err := row.Scan(&v); err != nil {{\n\t\treturn nil, fmt.Errorf("{entity} %d: %w", id, err)\n\t}}'
    else:
        old = "    if row is None:\n        return None"
        new = (
            f'    if row is None:\n        raise LookupError(f"{entity} {{{entity}_id}} not found")'
        )
    return (
        f"{reply}\n\n{path}\n```{lang}\n<<<<<<< SEARCH\n{old}\n=======\n{new}\n>>>>>>> REPLACE\n```"
    )


def head(
    shape: str,
    rng: random.Random,
    half: str,
    language: str,
    domain: Mapping[str, Any],
    lang: Mapping[str, Any],
) -> dict[str, Any]:
    """What the shape sends around the events (system prompts, tools, files)."""
    from . import Content

    project = domain["project"]
    if shape == "aider":
        first, second = rng.sample(domain["modules"], 2)
        doc_name = {"en": "CONTRIBUTING.md", "zh": "docs/开发规范.md", "ja": "docs/開発ガイド.md"}[
            language
        ]
        files = [
            Content(
                material.module_path(domain, first), material.source_file(rng, domain, first, 46)
            ),
            Content(
                material.module_path(domain, second), material.source_file(rng, domain, second, 38)
            ),
            Content(domain["data"]["path"], material.data_file(rng, domain, 252)),
            Content(doc_name, lang["doc"]),
        ]
        return {"system": AIDER_SYSTEM, "files": files, "repo_map": material.repo_map(rng, domain)}
    if shape == "codex":
        return {
            "instructions": instructions(rng, 14_000, "codex"),
            "developer": "<permissions instructions>\nFilesystem sandboxing: workspace-write. "
            "Network access is restricted. Approval policy: on-request.\n</permissions instructions>",
            "agents_md": f"# AGENTS.md instructions for /home/dev/{project}\n\n<INSTRUCTIONS>\n{lang['doc']}</INSTRUCTIONS>",
            "environment": f"<environment_context>\n  <cwd>/home/dev/{project}</cwd>\n  <shell>bash</shell>\n"
            f"  <current_date>2024-10-{rng.randint(1, 28):02d}</current_date>\n</environment_context>",
            "cache_key": f"{_hex(project + str(rng.random()), 8)}-{_hex(half, 4)}",
        }
    if shape == "claude_code":
        return {
            "system": [
                {
                    "type": "text",
                    "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                    "cache_control": {"type": "ephemeral"},
                },
                {
                    "type": "text",
                    "text": instructions(rng, 12_000, "claude"),
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            "claude_md": "<system-reminder>\nAs you answer the user's questions, you can use the following context:\n"
            f"# claudeMd\nContents of /home/dev/{project}/CLAUDE.md (project instructions):\n\n{lang['doc']}\n"
            "</system-reminder>",
            "user_id": f"user_{_hex(project, 12)}_account__session_{_hex(str(rng.random()), 8)}",
        }
    if shape == "opencode":
        return {
            "system": instructions(rng, 9_000, "opencode")
            + f"\n<env>\n  Working directory: /home/dev/{project}\n</env>"
        }
    return {"system": CHAT_SYSTEM[language]}


def _tools(shape: str, flavor: str) -> list[JSON]:
    names = _TOOL_NAMES[flavor or shape]
    if shape == "codex":
        return [
            {
                "type": "function",
                "name": "exec_command",
                "description": "Runs a command in a PTY.",
                "strict": False,
                "parameters": _schema("cmd", "workdir", "yield_time_ms"),
            },
            {
                "type": "function",
                "name": "apply_patch",
                "description": "Applies a patch to files.",
                "strict": False,
                "parameters": _schema("input"),
            },
            {
                "type": "function",
                "name": "update_plan",
                "description": "Updates the task plan.",
                "strict": False,
                "parameters": _schema("explanation", "plan"),
            },
        ]
    if shape == "claude_code":
        return [
            {
                "name": names["read"],
                "description": "Reads a file from the local filesystem.",
                "input_schema": _schema("file_path", "offset", "limit"),
            },
            {
                "name": names["shell"],
                "description": "Executes a bash command.",
                "input_schema": _schema("command", "description"),
            },
            {
                "name": "Edit",
                "description": "Performs exact string replacements in files.",
                "input_schema": _schema("file_path", "old_string", "new_string"),
            },
            {
                "name": "Grep",
                "description": "Searches file contents with ripgrep.",
                "input_schema": _schema("pattern", "path"),
            },
        ]
    return [
        {
            "type": "function",
            "function": {
                "name": names["read"],
                "description": "Read a file.",
                "parameters": _schema("filePath" if flavor != "qwen" else "absolute_path"),
            },
        },
        {
            "type": "function",
            "function": {
                "name": names["shell"],
                "description": "Run a shell command.",
                "parameters": _schema("command", "description"),
            },
        },
    ]


def _arguments(shape: str, flavor: str, call: Call) -> JSON:
    if shape == "codex":
        return {"cmd": shown(shape, call), "workdir": "."}
    if call.kind == "read":
        key = {"claude_code": "file_path", "qwen": "absolute_path"}.get(flavor or shape, "filePath")
        return {key: call.target}
    return {"command": call.target, "description": "Run " + call.target.split()[0]}


def _encrypted(seed: str) -> str:
    return "gAAAAAB" + base64.b64encode(hashlib.sha512(seed.encode()).digest() * 14).decode()


def render(session: Session) -> Iterator[JSON]:
    """Every request body of the session, in order."""
    api = API[session.shape]
    if api == "responses":
        yield from _render_responses(session)
    elif api == "messages":
        yield from _render_messages(session)
    else:
        yield from _render_chat(session)


def _render_chat(session: Session) -> Iterator[JSON]:
    from . import Paste, Reply, Say, Step

    shape, h = session.shape, session.head
    flavor = h.get("flavor", "")
    opening: list[JSON] = [{"role": "system", "content": h["system"]}]
    if shape == "aider":
        files = "".join(f"\n{f.name}\n```\n{f.text}```\n" for f in session.files)
        opening += [
            {"role": "user", "content": FILES_PREFIX + files},
            {"role": "assistant", "content": FILES_ACK},
            {"role": "user", "content": REPO_PREFIX + "\n" + h["repo_map"]},
            {"role": "assistant", "content": REPO_ACK},
        ]
    history: list[JSON] = []
    for event in session.events:
        if isinstance(event, Say):
            history.append({"role": "user", "content": event.text})
        elif isinstance(event, Paste):
            history.append({"role": "user", "content": _paste_text(shape, event)})
        elif isinstance(event, Reply):
            history.append({"role": "assistant", "content": event.text})
            continue
        else:
            assert isinstance(event, Step)
            names = _TOOL_NAMES[flavor or "opencode"]
            history.append(
                {
                    "role": "assistant",
                    "content": event.thought,
                    "tool_calls": [
                        {
                            "id": f"call_{_hex(session.id + c.call_id, 16)}",
                            "type": "function",
                            "function": {
                                "name": names[c.kind],
                                "arguments": json.dumps(
                                    _arguments(shape, flavor, c), ensure_ascii=False
                                ),
                            },
                        }
                        for c in event.calls
                    ],
                }
            )
            history += [
                {
                    "role": "tool",
                    "tool_call_id": f"call_{_hex(session.id + c.call_id, 16)}",
                    "content": c.output.text,
                }
                for c in event.calls
            ]
        body: JSON = {"model": MODEL, "messages": [*opening, *history]}
        if shape == "opencode":
            body.update(
                tools=_tools(shape, flavor), tool_choice="auto", stream=True, max_tokens=8192
            )
        elif shape == "aider":
            body.update(stream=True, temperature=0)
        yield body


def _paste_text(shape: str, event: Any) -> str:
    if shape == "aider" and not event.after:
        command = event.content.name.removeprefix("paste:")
        return f"I ran this command:\n\n{command}\n\nAnd got this output:\n\n{event.content.text}\n"
    text = f"{event.intro}\n```\n{event.content.text}\n```"
    return f"{text}\n{event.after}" if event.after else text


def _render_responses(session: Session) -> Iterator[JSON]:
    from . import Paste, Reply, Say, Step

    h = session.head

    def message(role: str, text: str) -> JSON:
        kind = "output_text" if role == "assistant" else "input_text"
        return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}

    items: list[JSON] = [
        message("developer", h["developer"]),
        message("user", h["agents_md"]),
        message("user", h["environment"]),
    ]
    for n, event in enumerate(session.events):
        if isinstance(event, (Say, Paste)):
            items.append(
                message(
                    "user", event.text if isinstance(event, Say) else _paste_text("codex", event)
                )
            )
        elif isinstance(event, Reply):
            items.append(message("assistant", event.text))
            continue
        else:
            assert isinstance(event, Step)
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{_hex(session.id + str(n), 24)}",
                    "summary": [{"type": "summary_text", "text": f"**{event.thought[:60]}**"}],
                    "content": None,
                    "encrypted_content": _encrypted(session.id + str(n)),
                }
            )
            for c in event.calls:
                call_id = f"call_{_hex(session.id + c.call_id, 24)}"
                items.append(
                    {
                        "type": "function_call",
                        "id": f"fc_{_hex(call_id, 24)}",
                        "name": "exec_command",
                        "arguments": json.dumps(_arguments("codex", "", c)),
                        "call_id": call_id,
                    }
                )
            for c in event.calls:
                items.append(
                    {
                        "type": "function_call_output",
                        "call_id": f"call_{_hex(session.id + c.call_id, 24)}",
                        "output": c.output.text,
                    }
                )
        yield {
            "model": MODEL,
            "instructions": h["instructions"],
            "input": list(items),
            "tools": _tools("codex", ""),
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "reasoning": {"effort": "medium", "summary": "auto"},
            "store": False,
            "stream": True,
            "include": ["reasoning.encrypted_content"],
            "prompt_cache_key": h["cache_key"],
        }


def _render_messages(session: Session) -> Iterator[JSON]:
    from . import Paste, Reply, Say, Step

    h = session.head
    cleared: set[str] = set(h.get("cleared", ()))
    clear_at: int = h.get("clear_at", len(session.events) + 1)
    turns: list[tuple[str, list[JSON], list[str]]] = []  # (role, blocks, call ids of results)
    for n, event in enumerate(session.events):
        if isinstance(event, (Say, Paste)):
            text = event.text if isinstance(event, Say) else _paste_text("claude_code", event)
            blocks = [{"type": "text", "text": text}]
            if not turns:
                blocks.insert(0, {"type": "text", "text": h["claude_md"]})
            turns.append(("user", blocks, []))
        elif isinstance(event, Reply):
            turns.append(("assistant", [{"type": "text", "text": event.text}], []))
            continue
        else:
            assert isinstance(event, Step)
            # No thinking blocks: their signatures verify only with the upstream that issued
            # them, and the benchmark's recording upstream (tests/fake_upstream.py) checks.
            blocks = [
                {
                    "type": "tool_use",
                    "id": f"toolu_{_hex(session.id + c.call_id, 22)}",
                    "name": _TOOL_NAMES["claude_code"][c.kind],
                    "input": _arguments("claude_code", "", c),
                }
                for c in event.calls
            ]
            turns.append(("assistant", blocks, []))
            turns.append(
                (
                    "user",
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": f"toolu_{_hex(session.id + c.call_id, 22)}",
                            "content": c.output.text,
                        }
                        for c in event.calls
                    ],
                    [c.call_id for c in event.calls],
                )
            )
        messages = []
        for role, blocks, ids in turns:
            if ids and n >= clear_at:
                blocks = [
                    dict(b, content=CLEARED) if i in cleared else b
                    for b, i in zip(blocks, ids, strict=True)
                ]
            messages.append({"role": role, "content": [dict(b) for b in blocks]})
        messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
        yield {
            "model": MODEL,
            "max_tokens": 32000,
            "system": h["system"],
            "messages": messages,
            "tools": _tools("claude_code", ""),
            "metadata": {"user_id": h["user_id"]},
            "thinking": {"type": "enabled", "budget_tokens": 31999},
            "stream": True,
        }
