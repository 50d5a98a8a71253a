"""Hostile input for every endpoint and frame the gateway takes (design D15.3).

Bodies are built from each wire API's schema, as its clients send them, and then broken:

- **Schema strategies**, one per API: `chat_bodies`, `responses_bodies` (every input item kind:
  messages of each role with string or part content, calls and their outputs of every kind,
  reasoning, `compaction` items, our own signed ones forged, `compaction_trigger` last or
  misplaced, `item_reference`, unknown items), `messages_bodies` (every block kind, thinking,
  tool pairs that may not match, `cache_control`, `context_management` edits),
  `count_tokens_bodies`, `compact_bodies` and `socket_frames` (the Responses WebSocket's
  `response.create` frames, warm-ups, continuations and junk). Strings come from a pool of
  tricky texts (NUL, special tokens, bidi controls, agents' own compaction prompts); ids are
  drawn from small pools, so calls and results collide and dangle.
- **Structural mutations** (`mutated`): one to four at random places of a body drawn from a
  schema strategy: a value of another JSON type, a value replaced by any JSON, a key removed or
  added, a value wrapped in a list or an object, nested hundreds of levels deep, a string made
  large, a list emptied or an element repeated, an item or block of an unknown type inserted.
- **Byte damage** (`mangled`): the serialised body with invalid UTF-8, a NUL, a duplicate key, a
  cut, a prefix, or random bytes.

`FUZZ` is the Hypothesis settings of the fuzz tests, from the profile `COMPACTGATE_FUZZ` names:
`ci` (the default: a few tens of seconds for the suite) or `deep` (thousands of examples, for a
run that looks harder).
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from gateway.agents.refs import PREFIX as OUR_COMPACTION

settings.register_profile(
    "fuzz-ci",
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
settings.register_profile("fuzz-deep", settings.get_profile("fuzz-ci"), max_examples=2000)
FUZZ = settings(settings.get_profile("fuzz-" + os.environ.get("COMPACTGATE_FUZZ", "ci")))

MODELS = ("big", "tiny", "tiny-summary", "tiny-error", "emulate", "native")  # `fuzz_config`


def fuzz_config(base_url: str) -> dict[str, Any]:
    """A gateway whose models (`MODELS`) cover the paths a body can take: forwarded as sent
    (`big`), compacted with and without summaries (`tiny`, `tiny-summary`), refused when nothing
    fits (`tiny-error`), remote compaction and `context_management` emulated by the gateway
    (`emulate`) or forwarded (`native`)."""

    def model(name: str, **more: Any) -> dict[str, Any]:
        tiny = {"context_window": 400, "max_output_tokens": 64}
        return {
            "name": name,
            "upstream": {"base_url": base_url},
            "tokenizer": "chars:4",
            "retry": {"max_attempts": 1},
            **({} if name == "big" else tiny),
            **more,
        }

    return {
        "server": {"max_body_bytes": 8 * 1024 * 1024},
        "models": [
            model("big", context_window=100_000_000),
            model("tiny"),
            model("tiny-summary", policy="summary"),
            model("tiny-error", policy="strict"),
            model("emulate", responses_compact="emulate", context_management="emulate"),
            model("native", responses_compact="native", context_management="native"),
        ],
        "policies": {
            "summary": {
                "steps": [{"type": "tool_output_cache"}, {"type": "sandwich"}, {"type": "fifo"}]
            },
            "strict": {"recovery_mode": "error", "steps": [{"type": "fifo"}]},
        },
        "summaries": {"wait_s": 5},
    }


# -- values --------------------------------------------------------------------------------------

AGENT_PROMPTS = [
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Summarise.",
    "Your task is to create a detailed summary of the conversation so far. CRITICAL: Respond "
    "with TEXT ONLY",
]
TRICKY_TEXT = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "<|endoftext|>",
    "<|im_start|>system",
    "\u202e\u2066",
    "\ufeff",
    "\ud7ff\ue000",
    "𝕏" * 40,
    "ä" * 300,
    "\n" * 200,
    "{" * 300,
    "word " * 600,
    "x" * 5000,
    "```python\nprint(1)\n```",
    '{"json": [1, 2, {"deep": true}]}',
    "Traceback (most recent call last):\n" * 50,
    "[tool output trimmed; ref=ref_0123456789abcdef]",
    *AGENT_PROMPTS,
]
texts = st.one_of(st.text(max_size=60), st.sampled_from(TRICKY_TEXT))
huge_numbers = st.sampled_from(
    [2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30, -(2**63) - 1, 1e308, -1e308, 5e-324, -0.0]
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    huge_numbers,
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
call_ids = st.sampled_from(["call_1", "call_2", "call_3", "call_1 ", ""])  # ids collide
tool_use_ids = st.sampled_from(["toolu_1", "toolu_2", "toolu_3", ""])
marks = st.fixed_dictionaries(
    {},
    optional={
        "pin": st.booleans(),
        "priority": st.integers(1, 3),
        "type": st.sampled_from(["message", "code", "plan_ref", "log", "other"]),
    },
)
models = st.sampled_from(MODELS)


def maybe(
    draw: st.DrawFn, target: dict[str, Any], key: str, values: st.SearchStrategy[Any]
) -> None:
    """Set `key` from `values` half of the time."""
    if draw(st.booleans()):
        target[key] = draw(values)


def marked(draw: st.DrawFn, item: dict[str, Any]) -> dict[str, Any]:
    """Now and then, the message extension on `item`."""
    if draw(st.integers(0, 5)) == 0:
        item["compactgate"] = draw(marks | json_values)
    return item


# -- Chat Completions ----------------------------------------------------------------------------


@st.composite
def chat_user(draw: st.DrawFn) -> dict[str, Any]:
    if draw(st.booleans()):
        content: Any = draw(texts)
    else:
        content = [{"type": "text", "text": draw(texts)}]
        if draw(st.booleans()):
            content.append(
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
            )
        if draw(st.integers(0, 4)) == 0:
            content.append({"type": "input_audio", "input_audio": {"data": "", "format": "wav"}})
    return marked(draw, {"role": "user", "content": content})


@st.composite
def chat_turn(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A user message, maybe rounds of tool calls and results (ids may collide or dangle), and
    an assistant answer."""
    out = [draw(chat_user())]
    for _ in range(draw(st.integers(0, 2))):
        ids = draw(st.lists(call_ids, min_size=1, max_size=3))
        calls = [
            {
                "id": i,
                "type": "function",
                "function": {
                    "name": draw(st.sampled_from(["read", "grep", ""])),
                    "arguments": draw(texts),
                },
            }
            for i in ids
        ]
        out.append({"role": "assistant", "content": draw(st.none() | texts), "tool_calls": calls})
        for i in draw(st.lists(call_ids, max_size=3)) if draw(st.booleans()) else ids:
            out.append(marked(draw, {"role": "tool", "tool_call_id": i, "content": draw(texts)}))
    if draw(st.booleans()):
        out.append({"role": "assistant", "content": draw(texts)})
    return out


@st.composite
def chat_bodies(draw: st.DrawFn) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        role = draw(st.sampled_from(["system", "developer"]))
        messages.append({"role": role, "content": draw(texts)})
    for turn in draw(st.lists(chat_turn(), min_size=1, max_size=6)):
        messages += turn
    body: dict[str, Any] = {"model": draw(models), "messages": messages}
    if draw(st.booleans()):
        body["stream"] = True
        maybe(draw, body, "stream_options", st.fixed_dictionaries({"include_usage": st.booleans()}))
    maybe(
        draw,
        body,
        draw(st.sampled_from(["max_tokens", "max_completion_tokens"])),
        st.integers(1, 300),
    )
    if draw(st.booleans()):
        body["tools"] = [
            {"type": "function", "function": {"name": "read", "parameters": draw(json_values)}}
        ]
    maybe(draw, body, "tool_choice", st.sampled_from(["auto", "none", "required"]))
    return body


# -- Responses -----------------------------------------------------------------------------------

PART_KINDS = ("input_text", "output_text", "input_image", "input_file", "refusal", "summary_text")
CALL_KINDS = ("function_call", "custom_tool_call", "computer_call", "local_shell_call")


@st.composite
def response_part(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(PART_KINDS))
    if kind == "input_image":
        return {"type": kind, "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "auto"}
    if kind == "input_file":
        return {"type": kind, "file_id": "file_1"}
    if kind == "refusal":
        return {"type": kind, "refusal": draw(texts)}
    part: dict[str, Any] = {"type": kind, "text": draw(texts)}
    if kind == "output_text":
        part["annotations"] = []
    return part


@st.composite
def response_message(draw: st.DrawFn) -> dict[str, Any]:
    role = draw(st.sampled_from(["user", "user", "assistant", "developer", "system"]))
    content: Any = (
        draw(texts) if draw(st.booleans()) else draw(st.lists(response_part(), max_size=3))
    )
    item: dict[str, Any] = {"role": role, "content": content}
    if draw(st.booleans()):
        item["type"] = "message"
    if role == "assistant" and draw(st.booleans()):
        item["id"] = f"msg_{draw(st.integers(0, 3))}"
    return marked(draw, item)


@st.composite
def response_call(draw: st.DrawFn) -> list[dict[str, Any]]:
    """A call of any kind and (most of the time) its output; ids from a small pool."""
    kind = draw(st.sampled_from(CALL_KINDS))
    call_id = draw(call_ids)
    call: dict[str, Any] = {"type": kind, "call_id": call_id}
    maybe(draw, call, "id", st.sampled_from(["fc_1", "fc_2", "ctc_1"]))
    if kind == "function_call":
        call.update(name=draw(st.sampled_from(["shell", "read", ""])), arguments=draw(texts))
    elif kind == "custom_tool_call":
        call.update(name="apply_patch", input=draw(texts))
    elif kind == "local_shell_call":
        call["action"] = {"type": "exec", "command": ["ls"]}
    items = [call]
    if draw(st.integers(0, 4)):
        output: Any = (
            draw(texts) if draw(st.booleans()) else draw(st.lists(response_part(), max_size=2))
        )
        answered = call_id if draw(st.integers(0, 5)) else draw(call_ids)
        items.append(
            marked(draw, {"type": f"{kind}_output", "call_id": answered, "output": output})
        )
    return items


@st.composite
def response_other(draw: st.DrawFn) -> dict[str, Any]:
    """Reasoning, hosted tools, compaction items (a provider's, and our own forged), references,
    MCP approvals, a trigger, and kinds no adapter knows."""
    kind = draw(
        st.sampled_from(
            [
                "reasoning",
                "web_search_call",
                "compaction",
                "compaction_ours",
                "item_reference",
                "mcp_approval_request",
                "mcp_approval_response",
                "compaction_trigger",
                "unknown",
            ]
        )
    )
    if kind == "reasoning":
        item: dict[str, Any] = {
            "type": "reasoning",
            "id": f"rs_{draw(st.integers(0, 3))}",
            "summary": [{"type": "summary_text", "text": draw(texts)}],
        }
        maybe(draw, item, "encrypted_content", st.sampled_from(["gAAAA==", "", "x" * 200]))
        return item
    if kind == "compaction":
        return {
            "type": "compaction",
            "encrypted_content": draw(st.sampled_from(["gAAAAopaque", ""])),
        }
    if kind == "compaction_ours":
        forged = draw(st.sampled_from(["", "abc", "abc.def", "0" * 32 + ".0", "\x00."]))
        return {"type": "compaction", "encrypted_content": OUR_COMPACTION + forged}
    if kind == "item_reference":
        return {"type": "item_reference", "id": draw(st.sampled_from(["msg_1", "rs_0", ""]))}
    if kind == "mcp_approval_request":
        return {
            "type": kind,
            "id": "mcpr_1",
            "name": "tool",
            "arguments": "{}",
            "server_label": "s",
        }
    if kind == "mcp_approval_response":
        return {
            "type": kind,
            "approval_request_id": draw(st.sampled_from(["mcpr_1", "x"])),
            "approve": True,
        }
    if kind == "compaction_trigger":
        return {"type": "compaction_trigger"}
    if kind == "web_search_call":
        return {"type": kind, "id": "ws_1", "status": "completed"}
    return {"type": draw(st.sampled_from(["future_item", "x" * 100, "message_v2"])), "id": "u_1"}


@st.composite
def response_items(draw: st.DrawFn) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for _ in range(draw(st.integers(0, 8))):
        pick = draw(st.integers(0, 5))
        if pick <= 2:
            items.append(draw(response_message()))
        elif pick <= 4:
            items += draw(response_call())
        else:
            items.append(draw(response_other()))
    if draw(st.integers(0, 4)) == 0:
        items.append({"type": "compaction_trigger"})
    return items


TOOLS_RESPONSES = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("function"), "name": st.sampled_from(["shell", "read"])},
            optional={"parameters": json_values, "description": texts, "strict": st.booleans()},
        ),
        st.just({"type": "web_search"}),
        st.just({"type": "custom", "name": "apply_patch"}),
    ),
    max_size=3,
)


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"model": draw(models)}
    body["input"] = draw(texts) if draw(st.integers(0, 4)) == 0 else draw(response_items())
    maybe(draw, body, "instructions", texts)
    maybe(draw, body, "stream", st.booleans())
    maybe(draw, body, "tools", TOOLS_RESPONSES)
    maybe(draw, body, "max_output_tokens", st.integers(1, 300))
    maybe(draw, body, "store", st.booleans())
    maybe(draw, body, "reasoning", st.just({"effort": "low", "summary": "auto"}))
    maybe(draw, body, "include", st.just(["reasoning.encrypted_content"]))
    maybe(draw, body, "prompt_cache_key", texts)
    maybe(draw, body, "truncation", st.sampled_from(["auto", "disabled"]))
    if draw(st.integers(0, 5)) == 0:
        body[draw(st.sampled_from(["previous_response_id", "conversation"]))] = "resp_1"
    return body


@st.composite
def compact_bodies(draw: st.DrawFn) -> dict[str, Any]:
    """`POST /v1/responses/compact`: a Responses body (its input may be empty or missing)."""
    body = draw(responses_bodies())
    body.pop("stream", None)
    if draw(st.integers(0, 5)) == 0:
        body.pop("input", None)
    return body


# -- Messages ------------------------------------------------------------------------------------

BLOCK_KINDS = (
    "text",
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
    "compaction",
    "unknown",
)


@st.composite
def block(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(BLOCK_KINDS))
    if kind == "text":
        made: dict[str, Any] = {"type": "text", "text": draw(texts)}
    elif kind == "image":
        source = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
        made = {"type": "image", "source": source}
    elif kind == "document":
        made = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": draw(texts)},
        }
    elif kind == "tool_use":
        made = {
            "type": "tool_use",
            "id": draw(tool_use_ids),
            "name": "Bash",
            "input": draw(json_values),
        }
    elif kind == "tool_result":
        content: Any = (
            draw(texts) if draw(st.booleans()) else [{"type": "text", "text": draw(texts)}]
        )
        made = {"type": "tool_result", "tool_use_id": draw(tool_use_ids), "content": content}
        maybe(draw, made, "is_error", st.booleans())
    elif kind == "thinking":
        made = {
            "type": "thinking",
            "thinking": draw(texts),
            "signature": draw(st.sampled_from(["sig==", ""])),
        }
    elif kind == "redacted_thinking":
        made = {"type": "redacted_thinking", "data": "opaque"}
    elif kind == "server_tool_use":
        made = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    elif kind == "web_search_tool_result":
        made = {"type": kind, "tool_use_id": "srvtoolu_1", "content": []}
    elif kind == "compaction":
        made = {"type": "compaction"}
        maybe(draw, made, "content", texts)
    else:
        made = {"type": draw(st.sampled_from(["future_block", "container_upload"]))}
    if draw(st.integers(0, 6)) == 0:
        made["cache_control"] = draw(
            st.sampled_from([{"type": "ephemeral"}, {"type": "ephemeral", "ttl": "1h"}, {"ttl": 5}])
        )
    return made


@st.composite
def anthropic_message(draw: st.DrawFn, role: str) -> dict[str, Any]:
    if draw(st.integers(0, 3)) == 0:
        content: Any = draw(texts)
    else:
        content = draw(st.lists(block(), min_size=0, max_size=4))
    return marked(draw, {"role": role, "content": content})


EDITS = st.lists(
    st.one_of(
        st.fixed_dictionaries(
            {"type": st.just("clear_tool_uses_20250919")},
            optional={
                "trigger": st.just({"type": "input_tokens", "value": 10}) | json_values,
                "keep": st.just({"type": "tool_uses", "value": 1}) | json_values,
                "clear_at_least": st.just({"type": "input_tokens", "value": 5}) | json_values,
                "exclude_tools": st.lists(st.sampled_from(["Bash", "Read"])) | json_values,
                "clear_tool_inputs": st.booleans() | json_values,
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("clear_thinking_20251015")},
            optional={
                "keep": st.sampled_from(["all", {"type": "thinking_turns", "value": 1}])
                | json_values
            },
        ),
        st.fixed_dictionaries(
            {"type": st.just("compact_20260112")},
            optional={
                "trigger": st.just({"type": "input_tokens", "value": 50_000}) | json_values,
                "instructions": texts | json_values,
                "pause_after_compaction": st.booleans() | json_values,
            },
        ),
        json_values,
    ),
    max_size=3,
)


@st.composite
def messages_bodies(draw: st.DrawFn, count_tokens: bool = False) -> dict[str, Any]:
    messages = []
    role = draw(st.sampled_from(["user", "user", "assistant"]))
    for _ in range(draw(st.integers(1, 8))):
        messages.append(draw(anthropic_message(role)))
        role = "assistant" if role == "user" or draw(st.integers(0, 6)) == 0 else "user"
    if draw(st.integers(0, 6)) == 0:
        messages.insert(0, {"role": "system", "content": draw(texts)})  # Claude Code does this
    body: dict[str, Any] = {"model": draw(models), "messages": messages}
    if not count_tokens or draw(st.integers(0, 4)) == 0:
        body["max_tokens"] = draw(st.integers(1, 128_000))
    if draw(st.booleans()):
        system: Any = draw(texts)
        if draw(st.booleans()):
            system = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
        body["system"] = system
    maybe(draw, body, "stream", st.booleans())
    maybe(
        draw,
        body,
        "tools",
        st.lists(
            st.fixed_dictionaries(
                {
                    "name": st.sampled_from(["Bash", "Read"]),
                    "input_schema": st.just({"type": "object"}),
                },
                optional={"cache_control": st.just({"type": "ephemeral"}), "description": texts},
            ),
            max_size=3,
        ),
    )
    maybe(draw, body, "thinking", st.just({"type": "enabled", "budget_tokens": 1024}))
    maybe(draw, body, "metadata", st.just({"user_id": "user_1"}))
    if draw(st.booleans()):
        body["context_management"] = {"edits": draw(EDITS)}
    return body


def count_tokens_bodies() -> st.SearchStrategy[dict[str, Any]]:
    return messages_bodies(count_tokens=True)


# -- the Responses WebSocket ---------------------------------------------------------------------


@st.composite
def socket_frames(draw: st.DrawFn) -> list[Any]:
    """What a client sends on one socket: `response.create` frames with Responses bodies (some
    mutated), warm-ups, continuations of the socket's last answer, acknowledgements, and junk
    (binary frames, text that is not JSON, other frame types)."""
    frames: list[Any] = []
    for _ in range(draw(st.integers(1, 4))):
        pick = draw(st.integers(0, 9))
        if pick <= 4:
            body = draw(mutated(responses_bodies()) if draw(st.booleans()) else responses_bodies())
            if isinstance(body, dict):
                frames.append({"type": "response.create", **body})
            else:
                frames.append({"type": "response.create", "body": body})
        elif pick == 5:
            body = draw(responses_bodies())
            frames.append({"type": "response.create", **body, "generate": False})
        elif pick == 6:
            continuation = {
                "model": draw(models),
                "previous_response_id": "last",
                "input": draw(response_items()),
            }
            frames.append({"type": "response.create", **continuation})
        elif pick == 7:
            frames.append(
                {"type": draw(st.sampled_from(["response.processed", "session.update", ""]))}
            )
        else:
            frames.append(
                draw(st.sampled_from([b"\x00\xff", "not json", "[]", "null", '{"type": 1}']))
            )
    return frames


# -- structural mutations ------------------------------------------------------------------------

MUTATIONS = (
    "retype",
    "replace",
    "delete",
    "add_key",
    "wrap",
    "deep",
    "large",
    "empty",
    "repeat",
    "unknown_item",
)


def other_type(draw: st.DrawFn, value: Any) -> Any:
    """A value of a JSON type other than `value`'s."""
    choices = [
        st.none(),
        st.booleans(),
        st.integers(-5, 10**6) | huge_numbers,
        st.floats(allow_nan=False, allow_infinity=False),
        texts,
        st.lists(json_values, max_size=3),
        st.dictionaries(st.text(max_size=6), json_values, max_size=3),
    ]
    kinds = (type(None), bool, int, float, str, list, dict)
    allowed = [s for s, k in zip(choices, kinds, strict=True) if type(value) is not k]
    return draw(st.one_of(allowed))


def nested(depth: int, leaf: Any) -> Any:
    for _ in range(depth):
        leaf = [leaf]
    return leaf


@st.composite
def mutated(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> Any:
    """A body from `base` with one to four structural faults at random places."""
    body = copy.deepcopy(draw(base))  # st.just values are shared between examples
    for _ in range(draw(st.integers(1, 4))):
        places = list(places_in(body, ()))
        path = draw(st.sampled_from(places))
        body = mutate(draw, body, path, draw(st.sampled_from(MUTATIONS)))
    return body


def places_in(value: Any, path: tuple[Any, ...]) -> Iterator[tuple[Any, ...]]:
    yield path
    if isinstance(value, dict):
        for key, child in value.items():
            yield from places_in(child, (*path, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            yield from places_in(child, (*path, index))


def mutate(draw: st.DrawFn, root: Any, path: tuple[Any, ...], kind: str) -> Any:
    if not path:
        return other_type(draw, root) if kind in ("retype", "replace") else root
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    value = parent[last]
    if kind == "retype":
        parent[last] = other_type(draw, value)
    elif kind == "replace":
        parent[last] = draw(json_values)
    elif kind == "delete":
        del parent[last]
    elif kind == "add_key" and isinstance(value, dict):
        value[draw(st.sampled_from(["type", "role", "content", "id", "x", "compactgate"]))] = draw(
            json_values
        )
    elif kind == "wrap":
        parent[last] = [value] if draw(st.booleans()) else {"value": value}
    elif kind == "deep":
        parent[last] = nested(draw(st.sampled_from([40, 200, 600])), value)
    elif kind == "large":
        size = draw(st.sampled_from([10_000, 300_000]))
        if isinstance(value, str):
            parent[last] = "z" * size
        elif len(encode(value)) < 1000:  # a long list of it, never a huge body
            # copies, not one object many times: a later "large" on a string inside would
            # otherwise grow every item at once (300 x 300 kB, over the 40 MB frame limit)
            parent[last] = [copy.deepcopy(value) for _ in range(size // 1000)]
    elif kind == "empty":
        parent[last] = type(value)() if isinstance(value, list | dict | str) else None
    elif kind == "repeat" and isinstance(value, list) and value:
        value.append(value[draw(st.integers(0, len(value) - 1))])
    elif kind == "unknown_item" and isinstance(value, list):
        value.insert(
            draw(st.integers(0, len(value))),
            {
                "type": draw(st.sampled_from(["future_kind", "message", "tool_result", "text"])),
                "x": 1,
            },
        )
    return root


# -- bytes ---------------------------------------------------------------------------------------


def encode(value: Any) -> bytes:
    """JSON as a client would send it; unlike orjson, integers beyond 64 bits are allowed."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")


@st.composite
def mangled(draw: st.DrawFn, base: st.SearchStrategy[Any]) -> bytes:
    """A serialised body from `base`, then damaged the way a broken client or an attacker would."""
    raw = encode(draw(base))
    kind = draw(st.sampled_from(["utf8", "nul", "duplicate", "truncate", "bytes", "wrap"]))
    at = draw(st.integers(0, len(raw)))
    if kind == "utf8":
        bad = draw(
            st.sampled_from(
                [
                    b"\xff",
                    b"\xc3\x28",
                    b"\xed\xa0\x80",
                    b"\xf4\x90\x80\x80",
                    b"\xc0\xaf",
                    b"\xe2\x82",
                ]
            )
        )
        return raw[:at] + bad + raw[at:]
    if kind == "nul":
        return raw[:at] + b"\x00" + raw[at:]
    if kind == "duplicate":
        key = draw(
            st.sampled_from(
                [b'"model":', b'"messages":', b'"input":', b'"stream":', b'"max_tokens":']
            )
        )
        return raw[:1] + key + encode(draw(json_values)) + b"," + raw[1:]
    if kind == "truncate":
        return raw[:at]
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    return draw(st.sampled_from([b"\xef\xbb\xbf", b" \n\t", b"[", b"null"])) + raw
