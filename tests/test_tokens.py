"""gateway.counting.tokens: the chat format's counts, images, tool definitions and the count cache."""

from __future__ import annotations

import base64
import hashlib
import struct
import zlib
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.counting.cache import CountCache
from gateway.counting.definitions import render_function_definitions
from gateway.counting.images import (
    IMAGE_FLAT_TOKENS,
    data_url_image_size,
    high_detail_image_tokens,
    image_tokens,
)
from gateway.counting.tokenizers import CharsTokenizer, Tokenizer, load_tokenizer
from gateway.counting.tokens import (
    MEDIA_FLAT_TOKENS,
    PRIMING_TOKENS,
    TOOL_CALL_TOKENS,
    MessageCounter,
)

Message = dict[str, Any]


@pytest.fixture(scope="module")
def o200k() -> Tokenizer:
    return load_tokenizer("tiktoken:o200k_base")


@pytest.fixture(scope="module")
def cl100k() -> Tokenizer:
    return load_tokenizer("tiktoken:cl100k_base")


# ------------------------------------------------------------------- published example counts

# OpenAI cookbook, "How to count tokens with tiktoken", section 6: prompt_tokens reported by
# the API for this conversation: 129 for gpt-3.5-turbo / gpt-4, 124 for gpt-4o / gpt-4o-mini.
COOKBOOK_MESSAGES: list[Message] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on "
        "opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]

# Section 7: with this tool, 105 (gpt-3.5-turbo / gpt-4) and 101 (gpt-4o / gpt-4o-mini).
COOKBOOK_TOOLS: list[Message] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES: list[Message] = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


@pytest.mark.parametrize(("spec", "expected"), [("o200k_base", 124), ("cl100k_base", 129)])
def test_cookbook_message_counts(spec: str, expected: int) -> None:
    counter = MessageCounter(load_tokenizer(f"tiktoken:{spec}"))
    assert counter.messages(COOKBOOK_MESSAGES) == expected


@pytest.mark.parametrize(("spec", "expected"), [("o200k_base", 101), ("cl100k_base", 105)])
def test_cookbook_tool_counts(spec: str, expected: int) -> None:
    counter = MessageCounter(load_tokenizer(f"tiktoken:{spec}"))
    system_text = COOKBOOK_TOOL_MESSAGES[0]["content"]
    total = counter.messages(COOKBOOK_TOOL_MESSAGES) + counter.tools(
        COOKBOOK_TOOLS, system_text=system_text
    )
    assert total == expected


_EMPTY_PARAMS = {"type": "object", "properties": {}}

# prompt_tokens that hmarr/openai-chat-tokens measured against gpt-3.5-turbo (cl100k_base) in its
# test suite: (messages, legacy functions, tokens). Used here as measured facts to compare the
# tool-definition and function_call approximations against.
COMMUNITY_MEASURED: list[tuple[list[Message], list[Message] | None, int]] = [
    ([{"role": "user", "content": "hello"}], None, 8),
    (
        [
            {"role": "system", "content": "# Important: you're the best robot"},
            {"role": "user", "content": "hello robot"},
            {"role": "assistant", "content": "hello world"},
        ],
        None,
        27,
    ),
    ([{"role": "user", "content": "hello"}], [{"name": "foo", "parameters": _EMPTY_PARAMS}], 31),
    (
        [{"role": "user", "content": "hello"}],
        [{"name": "foo", "description": "Do a foo", "parameters": _EMPTY_PARAMS}],
        36,
    ),
    (
        [{"role": "user", "content": "hello"}],
        [
            {
                "name": "bing_bong",
                "description": "Do a bing bong",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "foo": {"type": "string"},
                        "bar": {"type": "number", "description": "A number"},
                    },
                },
            }
        ],
        57,
    ),
    (
        [{"role": "user", "content": "hello"}],
        [
            {
                "name": "bing_bong",
                "description": "Do a bing bong",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "foo": {
                            "type": "object",
                            "properties": {
                                "bar": {"type": "string", "enum": ["a", "b", "c"]},
                                "baz": {"type": "boolean"},
                            },
                        }
                    },
                },
            }
        ],
        68,
    ),
    (
        [
            {
                "role": "assistant",
                "content": "",
                "function_call": {"name": "do_stuff", "arguments": '{"foo": "bar", "baz": 1.5}'},
            }
        ],
        None,
        26,
    ),
    (
        [{"role": "system", "content": "Hello"}, {"role": "user", "content": "Hi there"}],
        [{"name": "do_stuff", "parameters": _EMPTY_PARAMS}],
        35,
    ),
    (
        [{"role": "system", "content": "Hello:"}, {"role": "user", "content": "Hi there"}],
        [{"name": "do_stuff", "parameters": _EMPTY_PARAMS}],
        35,
    ),
    (
        [{"role": "user", "content": "hello"}],
        [
            {
                "name": "get_recipe",
                "parameters": {
                    "type": "object",
                    "required": ["ingredients", "instructions", "time_to_cook"],
                    "properties": {
                        "ingredients": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["name", "unit", "amount"],
                                "properties": {
                                    "name": {"type": "string"},
                                    "unit": {
                                        "enum": ["grams", "ml", "cups", "pieces", "teaspoons"],
                                        "type": "string",
                                    },
                                    "amount": {"type": "number"},
                                },
                            },
                        },
                        "instructions": {
                            "type": "array",
                            "items": {"type": "string"},
                            "description": "Steps to prepare the recipe (no numbering)",
                        },
                        "time_to_cook": {
                            "type": "number",
                            "description": "Total time to prepare the recipe in minutes",
                        },
                    },
                },
            }
        ],
        106,
    ),
]


@pytest.mark.parametrize(("messages", "functions", "expected"), COMMUNITY_MEASURED)
def test_community_measured_counts(
    cl100k: Tokenizer, messages: list[Message], functions: list[Message] | None, expected: int
) -> None:
    counter = MessageCounter(cl100k)
    system_text = next((m["content"] for m in messages if m["role"] == "system"), None)
    total = counter.messages(messages) + counter.tools(None, functions, system_text=system_text)
    assert total == expected


# ------------------------------------------------------------------- fields and content


def test_string_content_and_empty_content(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    # 3 framing + "user" (1) + content
    assert counter.message({"role": "user", "content": ""}) == 4
    assert counter.message({"role": "user", "content": "hello world"}) == 4 + 2
    assert counter.messages([]) == PRIMING_TOKENS


def test_cjk_and_emoji(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    assert counter.message({"role": "user", "content": "お誕生日おめでとう"}) == 4 + 8
    emoji = "🎉👍🏽 ok"
    assert counter.message({"role": "user", "content": emoji}) == 4 + o200k.count(emoji)
    assert o200k.count(emoji) >= 4  # multi-byte code points need several tokens


def test_special_token_text_in_content_counts_as_text(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    assert counter.message({"role": "user", "content": "<|endoftext|>"}) > 5


def _call(call_id: str, name: str, arguments: str) -> Message:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_none_content_with_tool_calls(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    arguments = '{"path": "src/app.py"}'
    message = {
        "role": "assistant",
        "content": None,
        "tool_calls": [_call("call_abc", "read_file", arguments)],
    }
    expected = 3 + 1 + TOOL_CALL_TOKENS + o200k.count("read_file") + o200k.count(arguments)
    assert counter.message(message) == expected


def test_parallel_tool_calls_add_up(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    first = _call("call_1", "read_file", '{"path": "a.py"}')
    second = _call("call_2", "grep", '{"pattern": "TODO", "path": "."}')

    def assistant(*calls: Message) -> Message:
        return {"role": "assistant", "content": None, "tool_calls": list(calls)}

    base = counter.message(assistant())
    one = counter.message(assistant(first)) - base
    two = counter.message(assistant(second)) - base
    assert counter.message(assistant(first, second)) == base + one + two
    assert one == TOOL_CALL_TOKENS + o200k.count("read_file") + o200k.count('{"path": "a.py"}')


def test_tool_result_counts_its_id_and_content(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    message = {"role": "tool", "tool_call_id": "call_abc123", "content": "42 files"}
    assert counter.message(message) == 3 + 1 + o200k.count("call_abc123") + o200k.count("42 files")


def test_legacy_function_call_and_name(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    call = {"name": "lookup", "arguments": '{"q": "x"}'}
    assert counter.message({"role": "assistant", "content": None, "function_call": call}) == (
        3 + 1 + TOOL_CALL_TOKENS + o200k.count("lookup") + o200k.count('{"q": "x"}')
    )
    named = {"role": "function", "name": "lookup", "content": "done"}
    assert counter.message(named) == 3 + o200k.count("function") + o200k.count("lookup") + 1 + 1


def test_reasoning_content_and_refusal_are_counted(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    plain = {"role": "assistant", "content": "Yes."}
    thought = "Let me think about the budget first."
    assert counter.message({**plain, "reasoning_content": thought}) == counter.message(
        plain
    ) + o200k.count(thought)
    assert counter.message({"role": "assistant", "content": None, "refusal": "No."}) == 4 + 2


def test_gateway_extension_is_not_counted(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    plain = {"role": "user", "content": "keep this"}
    pinned = {**plain, "compactgate": {"pin": True, "priority": 3, "type": "plan_ref"}}
    assert counter.message(pinned) == counter.message(plain)


def test_multi_part_content(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    parts = [
        {"type": "text", "text": "What is in "},
        {"type": "text", "text": "this picture?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
    ]
    expected = (
        4
        + o200k.count("What is in ")
        + o200k.count("this picture?")
        + IMAGE_FLAT_TOKENS
        + MEDIA_FLAT_TOKENS
    )
    assert counter.message({"role": "user", "content": parts}) == expected


# ------------------------------------------------------------------- images


def _png(width: int, height: int) -> bytes:
    """A real RGB PNG (all black), built with zlib and struct."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + b"\x00" * (3 * width) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def test_png_data_url_high_low_and_auto_detail(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    url = _data_url(_png(16, 16))
    assert data_url_image_size(url) == (16, 16)

    def message(detail: str | None) -> Message:
        image: Message = {"url": url} if detail is None else {"url": url, "detail": detail}
        return {"role": "user", "content": [{"type": "image_url", "image_url": image}]}

    assert counter.message(message("low")) == 4 + 85
    assert counter.message(message("high")) == 4 + 85 + 170  # one tile
    assert counter.message(message(None)) == 4 + 85 + 170  # auto counts as high


def test_png_1024_square_costs_765() -> None:
    url = _data_url(_png(1024, 1024))
    assert image_tokens({"url": url, "detail": "high"}) == 765  # scaled to 768x768, 4 tiles


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        (1024, 1024, 765),  # OpenAI's example: 768x768, 4 tiles
        (2048, 4096, 1105),  # OpenAI's example: 1024x2048 -> 768x1536, 6 tiles
        (512, 512, 255),  # no upscaling: one tile
        (3000, 1000, 1445),  # fit: 2048x682, 4x2 tiles
        (100, 100, 255),
    ],
)
def test_tile_formula(width: int, height: int, tokens: int) -> None:
    assert high_detail_image_tokens(width, height) == tokens


def test_low_detail_and_unknown_size() -> None:
    assert image_tokens({"url": "https://example.com/x.jpg", "detail": "low"}) == 85
    assert image_tokens({"url": "https://example.com/x.jpg"}) == IMAGE_FLAT_TOKENS
    assert image_tokens("https://example.com/x.jpg") == IMAGE_FLAT_TOKENS
    assert image_tokens({"url": "data:image/png;base64,!!!notbase64!!!"}) == IMAGE_FLAT_TOKENS
    assert image_tokens(None) == IMAGE_FLAT_TOKENS


def test_only_the_header_of_the_payload_is_read() -> None:
    png = _png(600, 300)
    encoded = base64.b64encode(png[:33]).decode()  # signature + IHDR, 33 bytes = 44 chars
    url = f"data:image/png;base64,{encoded}" + "@" * 1000  # the rest is not even base64
    assert data_url_image_size(url) == (600, 300)


def test_jpeg_gif_and_webp_headers() -> None:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + b"\x00" * 9
    exif = b"\xff\xe1" + struct.pack(">H", 2 + 3000) + b"\x00" * 3000  # a large APP1 segment
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 1000, 3000, 1) + b"\x01\x11\x00"
    jpeg = b"\xff\xd8" + app0 + exif + sof0 + b"\xff\xda" + b"\x00" * 20
    assert data_url_image_size(_data_url(jpeg, "image/jpeg")) == (3000, 1000)
    assert image_tokens({"url": _data_url(jpeg, "image/jpeg")}) == 1445

    gif = b"GIF89a" + struct.pack("<HH", 600, 300) + b"\x00" * 10
    assert data_url_image_size(_data_url(gif, "image/gif")) == (600, 300)

    def riff(chunk: bytes, payload: bytes) -> bytes:
        body = b"WEBP" + chunk + struct.pack("<I", len(payload)) + payload
        return b"RIFF" + struct.pack("<I", len(body)) + body

    lossy = riff(b"VP8 ", b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", 513, 512) + b"\x00")
    lossless_bits = (100 - 1) | ((700 - 1) << 14)
    lossless = riff(b"VP8L", b"\x2f" + lossless_bits.to_bytes(4, "little") + b"\x00" * 4)
    extended = riff(
        b"VP8X", b"\x00" * 4 + (999).to_bytes(3, "little") + (1999).to_bytes(3, "little")
    )
    assert data_url_image_size(_data_url(lossy, "image/webp")) == (513, 512)
    assert data_url_image_size(_data_url(lossless, "image/webp")) == (100, 700)
    assert data_url_image_size(_data_url(extended, "image/webp")) == (1000, 2000)


# ------------------------------------------------------------------- tool definitions


def test_no_tools_cost_nothing(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    assert counter.tools(None) == 0
    assert counter.tools([], []) == 0


def test_rendering_of_nested_and_union_schemas() -> None:
    function = {
        "name": "search",
        "description": "Search the repository.\nReturns matches.",
        "parameters": {
            "type": "object",
            "required": ["query"],
            "properties": {
                "query": {"type": "string", "description": "What to look for"},
                "limit": {"type": ["integer", "null"]},
                "mode": {"anyOf": [{"const": "regex"}, {"const": "literal"}]},
                "paths": {"type": "array", "items": {"type": "string"}},
                "options": {
                    "type": "object",
                    "properties": {"case": {"type": "boolean"}, "ref": {"$ref": "#/defs/x"}},
                },
            },
        },
    }
    assert render_function_definitions([function]) == (
        "namespace functions {\n"
        "\n"
        "// Search the repository.\n"
        "// Returns matches.\n"
        "type search = (_: {\n"
        "// What to look for\n"
        "query: string,\n"
        "limit?: number | null,\n"
        'mode?: "regex" | "literal",\n'
        "paths?: string[],\n"
        "options?: {\n"
        "  case?: boolean,\n"
        "  ref?: any,\n"
        "},\n"
        "}) => any;\n"
        "\n"
        "} // namespace functions"
    )


def test_non_function_tools_count_as_json(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k)
    hosted = {"type": "web_search_preview", "search_context_size": "low"}
    assert counter.tools([hosted]) == o200k.count(orjson.dumps(hosted).decode()) + 9


def test_tools_count_is_cached(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k, CountCache())
    first = counter.tools(COOKBOOK_TOOLS)
    hits = counter.cache.hits
    assert counter.tools(orjson.loads(orjson.dumps(COOKBOOK_TOOLS))) == first  # equal: by key
    assert counter.cache.hits == hits + 1
    assert counter.tools(COOKBOOK_TOOLS) == first  # the same objects: held, no key made
    assert counter.cache.hits == hits + 1


_TOOL_SETS = [
    COOKBOOK_TOOLS,
    COOKBOOK_TOOLS[:1],
    [{"type": "function", "function": {"name": "grep", "parameters": {"type": "object"}}}],
    [{"type": "web_search"}],
]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(range(len(_TOOL_SETS))),
            st.sampled_from([None, 0, 2]),
            st.booleans(),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_tools_count_is_the_uncached_count_whichever_objects_come_again(
    o200k: Tokenizer, picks: list[tuple[int, int | None, bool, bool]]
) -> None:
    """Tool definitions come again as the very objects (a resumed parse hands them on) or as
    equal copies, with or without legacy `functions`, with or without a system message, or
    converted from another API's definitions (new objects each time, held by their source):
    each count is the one a counter without any cache gives."""
    cached = MessageCounter(o200k, CountCache())
    plain = MessageCounter(o200k, CountCache(0))
    functions = [[t["function"] for t in s if "function" in t] for s in _TOOL_SETS]
    for tools_at, functions_at, system, converted in picks:
        tools = _TOOL_SETS[tools_at]
        legacy = None if functions_at is None else functions[functions_at]
        text = "You are terse." if system else None
        if converted:  # as the Responses and Messages adapters count their own definitions
            copy = orjson.loads(orjson.dumps(tools))
            expected = plain.tools(copy, system_text=text)
            assert cached.tools(copy, system_text=text, source=tools) == expected
            continue
        expected = plain.tools(tools, legacy, system_text=text)
        assert cached.tools(tools, legacy, system_text=text) == expected
        if cached.bound is not None:
            assert cached.bound.tools(tools, legacy) >= cached.tools(tools, legacy)


# ------------------------------------------------------------------- the sum rule

_text = st.text(st.characters(codec="utf-8"), max_size=60)
_tool_call = st.builds(
    _call, st.text("abc123", min_size=1, max_size=8), st.sampled_from(["grep", "read"]), _text
)
_part = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    st.just({"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": "low"}}),
)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
    optional={
        "content": st.one_of(st.none(), _text, st.lists(_part, max_size=3)),
        "name": st.text("xyz_", min_size=1, max_size=6),
        "tool_calls": st.lists(_tool_call, min_size=1, max_size=3),
        "tool_call_id": st.text("abc123", min_size=1, max_size=8),
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_message, max_size=8), cache_bytes=st.sampled_from([0, 4096, 1 << 20]))
def test_a_list_counts_as_the_sum_of_its_messages_plus_priming(
    messages: list[Message], cache_bytes: int
) -> None:
    for tokenizer in (load_tokenizer("tiktoken:o200k_base"), CharsTokenizer(2.5)):
        counter = MessageCounter(tokenizer, CountCache(cache_bytes))
        expected = sum(counter.message(m) for m in messages) + PRIMING_TOKENS
        assert counter.messages(messages) == expected
        uncached = MessageCounter(tokenizer, CountCache(0))
        assert uncached.messages(messages) == expected  # the cache never changes a count


# ------------------------------------------------------------------- the cache


def _long_message(index: int) -> Message:
    return {"role": "tool", "tool_call_id": f"call_{index}", "content": f"line {index}\n" * 40}


def test_second_count_is_served_from_the_cache(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k, CountCache())
    history = [_long_message(i) for i in range(20)]
    first = counter.messages(history)
    assert (counter.cache.hits, counter.cache.misses) == (0, 20)
    second = counter.messages([*history, _long_message(99)])
    stats = counter.cache.stats
    assert (stats.hits, stats.misses, stats.entries) == (20, 21, 21)
    assert second == first + counter.message(_long_message(99))


def test_keys_are_canonical_personalised_sha256_digests(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k, CountCache())
    message = _long_message(1)
    reordered = dict(reversed(list(message.items())))
    person = hashlib.blake2b(b"tiktoken:o200k_base", digest_size=16).digest()
    expected = hashlib.sha256(person + orjson.dumps(message, option=orjson.OPT_SORT_KEYS)).digest()[
        :16
    ]
    assert counter._key(message) == counter._key(reordered) == expected
    counter.message(message)
    counter.message(reordered)
    assert counter.cache.hits == 1


def test_memory_stays_under_the_byte_bound_with_lru_eviction(o200k: Tokenizer) -> None:
    cache = CountCache(max_bytes=10 * CountCache.ENTRY_BYTES)
    counter = MessageCounter(o200k, cache)
    for i in range(50):
        counter.message(_long_message(i))
        counter.message(_long_message(0))  # keep the first one recently used
        assert cache.held_bytes <= cache.max_bytes
    assert len(cache) == 10 and cache.evictions == 40
    hits = cache.hits
    counter.message(_long_message(0))
    counter.message(_long_message(49))
    assert cache.hits == hits + 2


def test_cache_memory_is_at_most_twice_what_it_describes(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k, CountCache())
    messages = [{"role": "user", "content": "x" * n} for n in range(0, 400, 7)]
    counter.messages(messages)
    sizes = [len(orjson.dumps(m, option=orjson.OPT_SORT_KEYS)) for m in messages]
    described = sum(size for size in sizes if size >= CountCache.MIN_DESCRIBED_BYTES)
    assert len(counter.cache) == sum(size >= CountCache.MIN_DESCRIBED_BYTES for size in sizes)
    assert 0 < counter.cache.held_bytes <= 2 * described


def test_a_shared_cache_keeps_tokenizers_apart(o200k: Tokenizer, cl100k: Tokenizer) -> None:
    cache = CountCache()
    message = {"role": "user", "content": "お誕生日おめでとう " * 10}
    counts = [MessageCounter(t, cache).message(message) for t in (o200k, cl100k, o200k, cl100k)]
    assert counts[0] == counts[2] != counts[1] == counts[3]
    assert cache.hits == 2


def test_heuristic_counts_bypass_the_cache() -> None:
    counter = MessageCounter(CharsTokenizer(2.5), CountCache())
    counter.messages([_long_message(i) for i in range(5)])
    assert len(counter.cache) == 0 and counter.cache.misses == 0


def test_disabled_cache_and_text(o200k: Tokenizer) -> None:
    counter = MessageCounter(o200k, CountCache(0))
    counter.messages([_long_message(1), _long_message(1)])
    assert len(counter.cache) == 0
    assert counter.text("hello world") == 2
    with pytest.raises(ValueError):
        CountCache(-1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text(st.sampled_from("ab \n.:{}é漢😀"), max_size=80).filter(bool), min_size=1, max_size=6
    ),
    st.sampled_from(["", " ", "\n", "x", " x"]),
)
def test_remembered_newline_costs_equal_a_fresh_count(
    o200k: Tokenizer, prompts: list[str], suffix: str
) -> None:
    """The tools' count with a system prompt (its newline cost is remembered per tail) is the
    count a counter that remembers nothing makes, however tails repeat or share their ends."""
    tools = [{"type": "function", "function": {"name": "f", "description": "d"}}]
    remembering = MessageCounter(o200k, CountCache())
    for prompt in [*prompts, *(p + suffix for p in prompts), *prompts]:
        fresh = MessageCounter(o200k, CountCache(0))
        assert remembering.tools(tools, system_text=prompt) == fresh.tools(
            tools, system_text=prompt
        )
