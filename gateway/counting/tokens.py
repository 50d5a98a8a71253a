"""Token counts for OpenAI chat requests: messages, tool calls, images and tool definitions.

This module owns one rule: **a chat request's prompt tokens are the sum of its parts**, counted
the way OpenAI's cookbook (`num_tokens_from_messages`) documents for current models:

    prompt = sum(message(m) for m in messages) + PRIMING_TOKENS      (+ tools(...) if any)
    message(m) = TOKENS_PER_MESSAGE + tokens of every field value (+ TOKENS_PER_NAME for `name`)

so that the policies can add and remove messages and know exactly what changes. Each message is
counted on its own, and an exact count is remembered in a `CountCache` under a 16-byte sha256
digest of the message's canonical JSON (sorted keys), personalised per tokenizer: the proxy sees
the same prefix on every turn of a conversation, and only the new messages are tokenized.
Python's `hash()` is never used for keys; it is salted per process and workers must agree.

What is counted per field (constants below, each with its source):

* `role`, `content` (a string), `name` (+1), `tool_call_id`, `refusal`, `reasoning_content` and any
  other string field: the tokens of the text, as the cookbook does for every value.
* multi-part `content`: text and refusal parts as text; `image_url` parts by OpenAI's tile
  formula when the size can be read from a data URL's header (PNG, JPEG, GIF, WebP; only the
  header bytes of the base64 payload are decoded), else a flat `IMAGE_FLAT_TOKENS`; audio and
  file parts a flat `MEDIA_FLAT_TOKENS`; unknown parts as their compact JSON.
* assistant `tool_calls` and legacy `function_call`: per call `TOOL_CALL_TOKENS` + name + arguments.
* `None` values count nothing; the gateway's own `compactgate` extension counts nothing (it is
  stripped before forwarding).
* tool definitions (`tools`, legacy `functions`): rendered as the TypeScript-like namespace that
  OpenAI is understood to show the model, plus a fixed overhead. OpenAI publishes no formula for
  this; see `MessageCounter.tools` for the approximation and the published counts it reproduces.

Heuristic tokenizers (`exact = False`) bypass the cache: a `len()` per string is cheaper than
hashing the message, and their calibration factor changes between requests.

An exact byte-level BPE (`Tokenizer.bytes_bound`) also gets `MessageCounter.bound`, an upper
bound that costs a serialisation instead of a BPE run (see `BoundCounter` for the proof).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson

from .cache import CountCache
from .definitions import render_function_definitions
from .images import (
    IMAGE_BASE_TOKENS,
    IMAGE_FIT_SIDE,
    IMAGE_FLAT_TOKENS,
    IMAGE_SHORT_SIDE,
    IMAGE_TILE_SIDE,
    IMAGE_TILE_TOKENS,
    image_tokens,
)
from .tokenizers import Tokenizer, Utf8Bound

# --------------------------------------------------------------------------------------------
# Constants of the chat format
# --------------------------------------------------------------------------------------------

# OpenAI cookbook, "How to count tokens with tiktoken", num_tokens_from_messages, for every model
# since gpt-3.5-turbo-0613: <|start|>{role}<|message|>{content}<|end|> costs 3 besides the role
# and content tokens; a `name` field costs 1 more; every reply is primed with
# <|start|>assistant<|message|>, 3 tokens.
TOKENS_PER_MESSAGE: Final = 3
TOKENS_PER_NAME: Final = 1
PRIMING_TOKENS: Final = 3

# Per assistant tool call (or legacy function_call): name + arguments + this. 3 is the value
# measured against the API for legacy `function_call` by the community (hmarr/openai-chat-tokens:
# an assistant function_call message costs name + arguments + 3 beyond the usual message
# framing). litellm counts only the arguments (0 overhead, no name); we keep the name and the 3,
# which errs on the safe (higher) side. The call's `id` and `type` are not counted: the model
# does not write them, the API assigns them. (A tool message's `tool_call_id` *is* counted, by
# the cookbook's every-string-field rule; if the model never sees it, that overcounts by the
# id's ~10-15 tokens per tool result, on the safe side; calibration data can settle it.)
# Parallel calls may add a few wrapper tokens that this does not model.
TOOL_CALL_TOKENS: Final = 3

# Tool definitions: rendered text + this. 9 is what the community measured for a request with
# functions and no system message; when a system message exists the definitions are appended to
# it (after a newline), which saves one message's framing (4 tokens). With these, the rendering
# reproduces the cookbook's published API counts for its get_current_weather example exactly
# (gpt-4o: 101, gpt-4 / gpt-3.5-turbo: 105), and the community's measured gpt-3.5-turbo cases.
TOOLS_OVERHEAD_TOKENS: Final = 9
TOOLS_SYSTEM_MESSAGE_SAVING: Final = 4

# Audio and file parts: no public formula that does not need the media decoded (duration, pages).
MEDIA_FLAT_TOKENS: Final = 765
# A tuple: `in` compares, never hashes (a client's "type" may be a list).
MEDIA_KINDS: Final = ("input_audio", "file", "input_file", "audio", "video_url")
# The most one image or media part can cost: a high-detail image scaled to 768x2048, 2x4 tiles.
MAX_PART_TOKENS: Final = max(
    MEDIA_FLAT_TOKENS,
    IMAGE_FLAT_TOKENS,
    IMAGE_BASE_TOKENS
    + IMAGE_TILE_TOKENS
    * math.ceil(IMAGE_SHORT_SIDE / IMAGE_TILE_SIDE)
    * math.ceil(IMAGE_FIT_SIDE / IMAGE_TILE_SIDE),
)

# Message fields the gateway owns and strips before forwarding: never counted.
GATEWAY_FIELDS: Final = frozenset({"compactgate"})

_COMMON_ROLES: Final = ("system", "developer", "user", "assistant", "tool", "function")


MAX_NEWLINE_TAILS: Final = 4096  # system-prompt tails whose newline cost is remembered
MAX_HELD_DEFINITIONS: Final = 256  # tool definitions whose count is held by their identity
_dumps: Final = orjson.dumps
_SORT_KEYS: Final = orjson.OPT_SORT_KEYS
_MIN_DESCRIBED_BYTES: Final = CountCache.MIN_DESCRIBED_BYTES


def _personalisation(tokenizer_name: str) -> bytes:
    """16 bytes that separate one tokenizer's keys from another's in a shared cache."""
    return hashlib.blake2b(tokenizer_name.encode(), digest_size=16).digest()


# --------------------------------------------------------------------------------------------
# The counter
# --------------------------------------------------------------------------------------------


class MessageCounter:
    """Counts chat messages and tool definitions with one tokenizer.

    `cache=None` gives the counter a private `CountCache()`; pass a shared cache to bound the
    memory of all models together, or `CountCache(0)` to disable caching. Exact tokenizers only
    use the cache (see the module docstring).
    """

    def __init__(self, tokenizer: Tokenizer, cache: CountCache | None = None) -> None:
        self.tokenizer = tokenizer
        self.cache = cache if cache is not None else CountCache()
        self._count: Callable[[str], int] = tokenizer.count
        self._use_cache = tokenizer.exact and self.cache.max_bytes > 0
        self._person = _personalisation(tokenizer.name)
        self._keyed = hashlib.sha256(self._person)  # copied per key: personalised sha256
        self._role_tokens = {role: tokenizer.count(role) for role in _COMMON_ROLES}
        self._newlines: dict[str, int] = {}  # `_newline_cost` by tail (exact tokenizers only)
        self._held: dict[tuple[int, int], tuple[object, object, int]] = {}  # see `_definitions`
        # An upper bound of this counter's counts, cheap to compute; None when none is proven.
        self.bound: BoundCounter | None = (
            BoundCounter(self) if tokenizer.exact and tokenizer.bytes_bound else None
        )

    # -- public ------------------------------------------------------------------------------

    def use_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Swap in a recalibrated tokenizer (design D12.3); counts change from now on.

        Only meant for heuristic tokenizers, whose counts are never cached.
        """
        self.tokenizer = tokenizer
        self._count = tokenizer.count
        self._use_cache = tokenizer.exact and self.cache.max_bytes > 0
        self._person = _personalisation(tokenizer.name)
        self._keyed = hashlib.sha256(self._person)
        self._role_tokens = {role: tokenizer.count(role) for role in _COMMON_ROLES}
        self._newlines = {}
        self._held = {}
        self.bound = BoundCounter(self) if tokenizer.exact and tokenizer.bytes_bound else None

    def recorded(self, work: Callable[[], object]) -> list[str]:
        """The texts `work` would have this counter tokenize, each counted 0 meanwhile (a
        tokenizer that must ask its upstream first learns them all in one go). Event loop only."""
        seen: list[str] = []
        count = self._count

        def record(text: str) -> int:
            seen.append(text)
            return 0

        self._count = record
        try:
            work()
        finally:
            self._count = count
        return seen

    def text(self, text: str) -> int:
        """Tokens of plain text, no chat framing."""
        return self._count(text)

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Prompt tokens of a message list: `sum(message(m)) + PRIMING_TOKENS`.

        Same result as summing `message()`, with the cache consulted once for the whole list
        (this is the per-request hot path: every message is serialized and hashed, the cache
        is locked once, only the misses are tokenized).
        """
        if not self._use_cache:
            return sum(map(self._count_message, messages)) + PRIMING_TOKENS
        keys = [self._key(message) for message in messages]
        total = PRIMING_TOKENS
        new: list[tuple[bytes, int]] = []
        for message, key, count in zip(messages, keys, self.cache.get_many(keys), strict=True):
            if count is None:
                count = self._count_message(message)
                if key is not None:
                    new.append((key, count))
            total += count
        if new:
            self.cache.put_many(new)
        return total

    def keys(self, messages: Sequence[Mapping[str, Any]]) -> list[bytes | None]:
        """Each message's cache key (its fingerprint), None where it is not cached (see `_key`);
        all None for a counter that does not cache."""
        if not self._use_cache:
            return [None] * len(messages)
        return [self._key(message) for message in messages]

    def uncached(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message, tokenized without the cache; thread-safe for an exact
        tokenizer (the caller keeps what it learns: `Counting`)."""
        return self._count_message(message)

    def message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message including its framing; served from the cache when seen before."""
        key = self._key(message) if self._use_cache else None
        if key is None:
            return self._count_message(message)
        count = self.cache.get(key)
        if count is None:
            count = self._count_message(message)
            self.cache.put(key, count)
        return count

    def tools(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        functions: Sequence[Mapping[str, Any]] | None = None,
        *,
        system_text: str | None = None,
        source: object = None,
    ) -> int:
        """Tokens that tool definitions add to the prompt: an approximation, OpenAI publishes none.

        Function tools (and legacy `functions`) are rendered as a TypeScript-like namespace,

            namespace functions {

            // <description>
            type <name> = (_: {
            // <property description>
            <property>?: <type>,
            }) => any;

            } // namespace functions

        (`?` unless required; enums as unions of literals; nested objects indented by two;
        arrays as `T[]`), which the community reverse-engineered from API counts; the result is
        the text's tokens plus `TOOLS_OVERHEAD_TOKENS`. Pass `system_text`, the text of the
        request's first system message, when there is one: the definitions are then appended to
        that message, which saves `TOOLS_SYSTEM_MESSAGE_SAVING` tokens of framing but adds the
        newline that separates them from the text (0 or 1 token, depending on how the text ends).
        This reproduces the cookbook's published counts for its example and the community's
        measured gpt-3.5-turbo cases; schemas with constructs the rendering does not know
        (`$ref`, `allOf`, formats, defaults) get an estimate. Non-function tools (hosted or
        custom tools) count as their compact JSON. Returns 0 when there are no tools. The
        definitions' count is cached like a message's (the same tools come with every request).
        `source`: the request's own definitions, when `tools` was converted from them to the chat
        shape (another API's); the count is then held for that object (see `_definitions`).
        """
        if not tools and not functions:
            return 0
        holder = (tools, functions) if source is None else (source, None)
        total = self._definitions(tools, functions, holder)
        if system_text is not None:
            # token boundaries near the end of the text decide the newline's cost
            total += self._newline_cost(system_text[-64:]) - TOOLS_SYSTEM_MESSAGE_SAVING
        return total

    def known_definitions(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        functions: Sequence[Mapping[str, Any]] | None,
        holder: tuple[object, object] = (None, None),
    ) -> int | None:
        """The cached count of these tool definitions, None when not counted yet (or not cached)."""
        if (held := self._held_count(holder)) is not None:
            return held
        key = self._key([tools or [], functions or []]) if self._use_cache else None
        return None if key is None else self.cache.get(key)

    def _definitions(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        functions: Sequence[Mapping[str, Any]] | None,
        holder: tuple[object, object],
    ) -> int:
        """The definitions' count, by their key in the cache; the count is also held by the
        objects they came from (`holder`: the request's own), so the very objects counted lately
        need no key (a resumed parse hands an agent's tools on from its previous request, and
        nothing changes a parsed body in place)."""
        if (held := self._held_count(holder)) is not None:
            return held
        count = self._cached(
            [tools or [], functions or []], lambda: self._count_tools(tools, functions)
        )
        if self._use_cache:
            if len(self._held) >= MAX_HELD_DEFINITIONS:
                self._held.clear()
            self._held[id(holder[0]), id(holder[1])] = (*holder, count)
        return count

    def _held_count(self, holder: tuple[object, object]) -> int | None:
        first, second = holder
        held = self._held.get((id(first), id(second)))
        if held is not None and held[0] is first and held[1] is second:
            return held[2]
        return None

    def _newline_cost(self, tail: str) -> int:
        """Tokens the newline after `tail` adds (0 or 1 in practice: it may join a token).

        Remembered per tail for an exact tokenizer: the same system prompt comes with every
        request of a conversation, and two tokenizer calls are most of a warm `tools` count.
        """
        if not self._use_cache:
            return self._count(tail + "\n") - self._count(tail)
        cost = self._newlines.get(tail)
        if cost is None:
            cost = self._count(tail + "\n") - self._count(tail)
            if len(self._newlines) >= MAX_NEWLINE_TAILS:
                self._newlines.clear()
            self._newlines[tail] = cost
        return cost

    def _key(self, value: object) -> bytes | None:
        """The cache key of `value`: sha256 (first 16 bytes) of its canonical JSON, personalised
        by tokenizer. sha256, not blake2b: with the CPU's SHA instructions it is the faster of the
        two here, and hashing every message is most of what a warm count costs.

        None when the value is not worth caching (shorter than `CountCache.MIN_DESCRIBED_BYTES`)
        or is not plain JSON data (e.g. a Mapping that is not a dict).
        """
        try:
            canonical = _dumps(value, option=_SORT_KEYS)
        except orjson.JSONEncodeError:
            return None
        if len(canonical) < _MIN_DESCRIBED_BYTES:
            return None
        digest = self._keyed.copy()
        digest.update(canonical)
        return digest.digest()[:16]

    def _cached(self, value: object, count: Callable[[], int]) -> int:
        """`count()`, remembered under `value`'s key when the tokenizer is exact."""
        key = self._key(value) if self._use_cache else None
        if key is None:
            return count()
        result = self.cache.get(key)
        if result is None:
            result = count()
            self.cache.put(key, result)
        return result

    # -- messages ----------------------------------------------------------------------------

    def _count_message(self, message: Mapping[str, Any]) -> int:
        count = self._count
        total = TOKENS_PER_MESSAGE
        for field, value in message.items():
            if value is None or field in GATEWAY_FIELDS:
                continue
            if field == "content":
                total += count(value) if isinstance(value, str) else self._content(value)
            elif field == "role" and isinstance(value, str):
                known = self._role_tokens.get(value)
                total += known if known is not None else count(value)
            elif field == "tool_calls":
                total += self._tool_calls(value)
            elif field == "function_call":
                total += self._function_call(value)
            elif isinstance(value, str):
                total += count(value)
                if field == "name":
                    total += TOKENS_PER_NAME
            else:
                total += self._json(value)
        return total

    def _content(self, content: object) -> int:
        if not isinstance(content, list):
            return self._json(content)
        total = 0
        for part in content:
            total += self._part(part)
        return total

    def _part(self, part: object) -> int:
        if isinstance(part, str):
            return self._count(part)
        if not isinstance(part, Mapping):
            return self._json(part)
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return self._count(part["text"])
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self._count(part["refusal"])
        if kind == "image_url":
            return image_tokens(part.get("image_url"))
        if kind in MEDIA_KINDS:
            return MEDIA_FLAT_TOKENS
        return self._json(part)

    def _tool_calls(self, calls: object) -> int:
        if not isinstance(calls, list):
            return self._json(calls)
        total = 0
        for call in calls:
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                total += self._function_call(function)
            else:  # a custom tool call or something unknown: its JSON, with the same framing
                total += TOOL_CALL_TOKENS + self._json(call)
        return total

    def _function_call(self, function: object) -> int:
        if not isinstance(function, Mapping):
            return self._json(function)
        total = TOOL_CALL_TOKENS
        for field in ("name", "arguments"):
            value = function.get(field)
            if isinstance(value, str):
                total += self._count(value)
            elif value is not None:
                total += self._json(value)
        return total

    def _json(self, value: object) -> int:
        """Tokens of a value the format does not describe: its compact JSON, as a safe estimate."""
        try:
            text = orjson.dumps(value).decode()
        except orjson.JSONEncodeError:
            text = str(value)
        return self._count(text)

    # -- tools -------------------------------------------------------------------------------

    def _count_tools(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        functions: Sequence[Mapping[str, Any]] | None,
    ) -> int:
        definitions: list[Mapping[str, Any]] = []
        other = 0
        for tool in tools or ():
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if isinstance(function, Mapping):
                definitions.append(function)
            else:
                other += self._json(tool)
        definitions.extend(f for f in functions or () if isinstance(f, Mapping))
        total = other
        if definitions:
            total += self._count(render_function_definitions(definitions))
        return total + TOOLS_OVERHEAD_TOKENS


class BoundCounter(MessageCounter):
    """Never below `exact`'s count of the same messages and tools, when `exact`'s tokenizer is
    `bytes_bound` (a text has at most as many tokens as UTF-8 bytes); nothing cached.

    A message: the length of its compact JSON, plus `TOKENS_PER_MESSAGE`, plus
    `TOOL_CALL_TOKENS` per tool call (and for a `function_call`), plus `MAX_PART_TOKENS` per
    image, audio or file part. Every other term of the exact count is the tokens of a string
    value (at most its UTF-8 bytes, which its JSON string holds, escapes only adding), a `name`'s
    one token (its key's bytes cover it), or the tokens of a value's compact JSON (a part of the
    message's JSON). One C call per message instead of a walk over its fields. A message orjson
    cannot write (a lone surrogate, a Mapping that is not a dict) is counted as `exact` counts
    it, with each text's UTF-8 length for its tokens (a lone surrogate is 3 bytes there and
    in tiktoken, which replaces it by U+FFFD) and a role's exact count for the role; so is every
    message by `narrow`, the tighter and slower bound.

    Tool definitions: `exact`'s counting with each text's UTF-8 length, except that the
    newline joining them to a system message, a difference of two counts that a byte count does
    not bound, is taken as the whole joined tail (64 characters at most); definitions `exact`
    has already counted are taken from its cache, exact, which only makes the bound tighter.
    """

    def __init__(self, exact: MessageCounter) -> None:
        super().__init__(Utf8Bound(), CountCache(0))
        self._exact = exact
        self._role_tokens = dict(exact._role_tokens)  # a role's own count is known exactly

    def narrow(self, message: Mapping[str, Any]) -> int:
        """A tighter bound of `message` than `message()`, at up to twice its cost: `exact`'s
        counting with each text's UTF-8 length and the roles' exact counts, so the JSON's keys,
        quotes and escapes are left out (about 9 % lower on an agent's history). For a request
        the cheap bound does not settle: each byte taken off it is roughly a byte less to count."""
        return self._count_message(message)

    def message(self, message: Mapping[str, Any]) -> int:
        try:
            size = len(_dumps(message))
        except orjson.JSONEncodeError:
            return self._count_message(message)
        extra = TOKENS_PER_MESSAGE
        calls = message.get("tool_calls")
        if isinstance(calls, list):
            extra += TOOL_CALL_TOKENS * len(calls)
        if "function_call" in message:
            extra += TOOL_CALL_TOKENS
        content = message.get("content")
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping):
                    kind = part.get("type")
                    if kind == "image_url" or kind in MEDIA_KINDS:
                        extra += MAX_PART_TOKENS
        return size + extra

    def messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(map(self.message, messages)) + PRIMING_TOKENS

    def _definitions(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        functions: Sequence[Mapping[str, Any]] | None,
        holder: tuple[object, object],
    ) -> int:
        known = self._exact.known_definitions(tools, functions, holder)
        return known if known is not None else self._count_tools(tools, functions)

    def _newline_cost(self, tail: str) -> int:
        return self._count(tail + "\n")
