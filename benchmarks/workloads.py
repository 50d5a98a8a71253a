"""The request bodies the benchmark sends: deterministic, built once, varied by byte substitution.

Two shapes:

* small: 3 messages (system, assistant, user), a few hundred bytes;
* agent: 200 messages, about 60k o200k tokens: a system prompt, the user's task, then cycles of
  an assistant tool call (sometimes two in parallel) and its tool results (code listings, logs,
  test output), with a short assistant remark and a user follow-up every few cycles, ending on a
  user message. The request also carries `tools` definitions, as agent requests do.

Every message of the agent conversation carries a conversation marker (`cv` + 8 digits: in text,
in a tool call's arguments, in a tool result's first line), so that swapping the marker gives a
conversation whose every message is new to the gateway's count cache ("first time seen"). The
last message carries a second marker (`nw` + 8 digits), so that swapping only that one gives
"the same conversation, one new message appended" (199 messages seen before, 1 new).
Markers have a fixed length, so every variant has the same size; substitution is one
`bytes.replace`, cheap enough to do between requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import orjson

Message = dict[str, Any]

CONV_MARK = b"cv99999999"
NEW_MARK = b"nw99999999"
MODEL_MARK = b"md99999999"  # in a model name: `distinct_model` gives each request its own model

_WORDS = (
    "the request context window budget policy summary token message assistant tool result file "
    "function error retry upstream gateway config model stream chunk header value index test "
    "build deploy cache memory limit offset line search match update delete create return "
    "parser handler worker queue schedule timeout connection client server session record "
    "a an of to in for with on at by from and or not is are was were be this that it"
).split()
_IDENTS = (
    "load_config parse_body count_tokens resolve_route send_upstream relay_stream retry_after "
    "build_plan compact_history mask_output drop_turns check_pairs render_error read_chunk"
).split()
_LEVELS = ("INFO", "INFO", "INFO", "DEBUG", "WARN", "ERROR")

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Repository-relative path"},
                    "query": {"type": "string", "description": "What to look for"},
                },
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository and return its numbered lines."),
        ("grep", "Search the repository for a regular expression."),
        ("run_tests", "Run the test suite or one test file and return its output."),
        ("edit_file", "Replace a range of lines of a file."),
    )
]


def _prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)).capitalize() + "."


def _code(rng: random.Random, mark: str, lines: int) -> str:
    out = [f"# {mark} src/{rng.choice(_WORDS)}/{rng.choice(_IDENTS)}.py"]
    for number in range(1, lines + 1):
        ident = rng.choice(_IDENTS)
        if number % 3 == 1:
            text = f"def {ident}_{number}(self, {rng.choice(_WORDS)}: int) -> str:"
        elif number % 3 == 2:
            call = f"{rng.choice(_IDENTS)}({rng.randint(0, 9999)}, '{rng.choice(_WORDS)}')"
            text = f"    value = self.{call}"
        else:
            text = f"    return value  # {_prose(rng, 5)}"
        out.append(f"{number:5d}  {text}")
    return "\n".join(out)


def _log(rng: random.Random, mark: str, lines: int) -> str:
    out = [f"$ pytest -q  # {mark}"]
    for _ in range(lines):
        out.append(
            f"2025-03-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:"
            f"{rng.randint(0, 59):02d}Z {rng.choice(_LEVELS)} {rng.choice(_IDENTS)}: "
            + _prose(rng, 9)
        )
    return "\n".join(out)


def agent_messages(count: int = 200, seed: int = 9) -> list[Message]:
    """A deterministic agent conversation of `count` messages, each carrying `CONV_MARK`.

    The last message is a user message carrying `NEW_MARK` as well.
    """
    rng = random.Random(seed)
    mark = CONV_MARK.decode()
    messages: list[Message] = [
        {"role": "system", "content": f"[{mark}] You are a coding agent. " + _prose(rng, 700)},
        {"role": "user", "content": f"[{mark}] " + _prose(rng, 60)},
    ]
    call = 0
    cycle = 0
    while len(messages) < count - 1:
        cycle += 1
        if cycle % 6 == 0 and len(messages) < count - 3:
            messages.append({"role": "assistant", "content": f"[{mark}] " + _prose(rng, 50)})
            messages.append({"role": "user", "content": f"[{mark}] " + _prose(rng, 30)})
            continue
        parallel = 2 if cycle % 4 == 0 and len(messages) < count - 4 else 1
        calls = []
        for _ in range(parallel):
            call += 1
            arguments = {"path": f"src/{mark}/{rng.choice(_IDENTS)}.py", "query": _prose(rng, 4)}
            calls.append(
                {
                    "id": f"call_{mark}_{call:06d}",
                    "type": "function",
                    "function": {
                        "name": rng.choice(("read_file", "grep", "run_tests")),
                        "arguments": orjson.dumps(arguments).decode(),
                    },
                }
            )
        messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        for item in calls:
            if rng.random() < 0.55:
                result = _code(rng, mark, rng.randint(22, 50))
            else:
                result = _log(rng, mark, rng.randint(13, 28))
            messages.append({"role": "tool", "tool_call_id": item["id"], "content": result})
    messages = messages[: count - 1]
    while messages[-1].get("tool_calls"):  # never end on a call whose results were cut off
        messages.pop()
    while len(messages) < count - 1:
        messages.append({"role": "assistant", "content": f"[{mark}] " + _prose(rng, 20)})
    new = NEW_MARK.decode()
    messages.append({"role": "user", "content": f"[{mark}] [{new}] Next: " + _prose(rng, 40)})
    return messages


def small_messages() -> list[Message]:
    return [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "What is the capital of France?"},
    ]


def _body(model: str, messages: list[Message], stream: bool, tools: bool) -> bytes:
    payload: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": 256}
    if tools:
        payload["tools"] = TOOLS
    if stream:
        payload["stream"] = True
    return orjson.dumps(payload)


def _mark(prefix: bytes, number: int) -> bytes:
    return prefix[:2] + b"%08d" % (number % 100_000_000)


@dataclass(frozen=True)
class Workload:
    """One request shape for one model name, with its variants.

    `fixed(i)` is the same body every time; `first_time(i)` a new conversation for each `i`
    (every message new); `appended(i)` the fixed conversation with a new last message;
    `distinct_model(i)` that under a model name of its own.
    """

    name: str
    template: bytes
    messages: int

    def fixed(self, i: int) -> bytes:
        return self.template

    def first_time(self, i: int) -> bytes:
        return self.template.replace(CONV_MARK, _mark(CONV_MARK, i)).replace(
            NEW_MARK, _mark(NEW_MARK, i)
        )

    def appended(self, i: int) -> bytes:
        return self.template.replace(NEW_MARK, _mark(NEW_MARK, i))

    def distinct_model(self, i: int) -> bytes:
        """`appended(i)` sent under a model name of its own (the name must contain MODEL_MARK)."""
        return self.appended(i).replace(MODEL_MARK, _mark(MODEL_MARK, i))


def small(model: str, stream: bool = False) -> Workload:
    return Workload("small", _body(model, small_messages(), stream, tools=False), 3)


def agent(model: str, stream: bool = False, count: int = 200) -> Workload:
    return Workload(f"agent{count}", _body(model, agent_messages(count), stream, tools=True), count)


def token_count(body: bytes, encoding: str = "o200k_base") -> int:
    """Tokens of a body's messages and tools as the gateway counts them (for the report)."""
    from gateway.counting.cache import CountCache
    from gateway.counting.tokenizers import load_tokenizer
    from gateway.counting.tokens import MessageCounter

    payload = orjson.loads(body)
    counter = MessageCounter(load_tokenizer(f"tiktoken:{encoding}"), CountCache(0))
    return counter.messages(payload["messages"]) + counter.tools(payload.get("tools"))
