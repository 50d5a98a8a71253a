"""Tokenizers, loaded offline: one `Tokenizer` per config spec, and the default spec per model.

This module owns one rule: **loading a tokenizer never touches the network and never writes a
file.** tiktoken, left to itself, downloads its BPE files on first use and caches them in a
temporary directory; on an air-gapped host, in CI and on these machines that first call fails with
a ConnectionError, at start-up or (worse) on the first request. So:

* `tiktoken:<encoding>` reads the BPE file from the copy that litellm's wheel ships in
  `litellm/litellm_core_utils/tokenizers/` (found with `importlib.util.find_spec`, so litellm is
  never imported; importing it costs seconds), or from a directory the operator pre-seeded through
  `TIKTOKEN_CACHE_DIR` / `DATA_GYM_CACHE_DIR`. Files there are named as tiktoken's own cache names
  them: the sha1 of the public blob URL. The bytes are checked against the sha256 that tiktoken
  itself expects before anything is parsed. The encoding's split pattern, special tokens and
  expected hash come from the installed tiktoken (`tiktoken_ext.openai_public`), so nothing here
  duplicates them; only the one file-loading call is rerouted (see `bpe._offline_constructors`).
* `hf:<path>` loads a local `tokenizer.json` with the `tokenizers` library (`from_file`; no hub).
* `chars:<chars_per_token>` is the heuristic: `ceil(code points / chars_per_token)`,
  times a calibration `correction` (design D12.3) that the calibrator sets with `with_correction`.

`load_tokenizer` caches one instance per spec; instances are immutable and safe to share across
threads. Every failure is a `TokenizerError` whose message says what is wrong and how to fix it;
it is raised at config load, never at request time.
"""

from __future__ import annotations

import functools
import math
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson
import tiktoken

from .bpe import TokenizerError, load_tiktoken_encoding


@runtime_checkable
class Tokenizer(Protocol):
    """What the counting layer needs from a tokenizer."""

    @property
    def name(self) -> str:
        """The spec it was loaded from, e.g. "tiktoken:o200k_base"."""
        ...

    @property
    def exact(self) -> bool:
        """False for heuristics: their counts are estimates to be calibrated."""
        ...

    @property
    def bytes_bound(self) -> bool:
        """True when every token stands for at least one byte of the text's UTF-8 (a byte-level
        BPE): the text's UTF-8 length (`utf8_length`) is then never below its count."""
        ...

    def count(self, text: str) -> int:
        """Tokens in `text`, special-token strings counted as ordinary text."""
        ...


# --------------------------------------------------------------------------------------------
# The three kinds of tokenizer
# --------------------------------------------------------------------------------------------


_NO_SPECIAL: frozenset[str] = frozenset()


class TiktokenTokenizer:
    """An exact tiktoken encoding. `count` is `len(encoding.encode_ordinary(text))`.

    Every tiktoken encoding offered here is a byte-level BPE: the text's UTF-8 bytes are split
    into tokens that each stand for one or more of those bytes, and decoding the tokens gives the
    bytes back. So a text never has more tokens than UTF-8 bytes (`bytes_bound`). A lone
    surrogate, which a JSON string may carry, is replaced by U+FFFD (3 bytes) before encoding;
    `utf8_length` counts it as 3 bytes too.
    """

    exact = True
    bytes_bound = True

    def __init__(self, name: str, encoding: tiktoken.Encoding) -> None:
        self.name = name
        self.encoding = encoding
        self._encode = encoding.encode_ordinary
        # The tokens as one buffer of u32, not a list of Python ints: 15-20 % less time on long
        # texts. It is what tiktoken's own `encode_to_numpy` calls; with no special token
        # allowed, special-token strings are ordinary text, as in `encode_ordinary` (tested).
        core = getattr(encoding, "_core_bpe", None)
        self._buffer: Callable[[str, frozenset[str]], Any] | None = getattr(
            core, "encode_to_tiktoken_buffer", None
        )

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._buffer is not None:
            try:
                view = memoryview(self._buffer(text, _NO_SPECIAL))
            except UnicodeEncodeError:  # a lone surrogate: encode_ordinary replaces it
                return len(self._encode(text))
            return view.nbytes // view.itemsize
        return len(self._encode(text))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.name!r})"


class HuggingFaceTokenizer:
    """A local `tokenizer.json` (the `tokenizers` library); special tokens are not added.

    Not `bytes_bound`: a normalizer, a word-prefix marker or an unknown-token rule can give a
    text more tokens than bytes (a SentencePiece model with byte fallback does).
    """

    exact = True
    bytes_bound = False

    def __init__(self, name: str, tokenizer: Any) -> None:  # tokenizers.Tokenizer (no stubs)
        self.name = name
        self._tokenizer = tokenizer

    def count(self, text: str) -> int:
        if not text:
            return 0
        return len(self._tokenizer.encode(text, add_special_tokens=False))

    def __repr__(self) -> str:
        return f"HuggingFaceTokenizer({self.name!r})"


@dataclass(frozen=True)
class CharsTokenizer:
    """The heuristic: `ceil(len(text) * correction / chars_per_token)`.

    `len` of a Python `str` counts code points, so a CJK character or an emoji is one character,
    not three or four bytes. `correction` is the calibration multiplier (design D12.3)
    (1.0 = uncalibrated); instances are immutable, so calibration derives a new tokenizer
    with `with_correction(factor)` and swaps it in, and a shared cached instance never changes
    under another model. The correction is part of `name` (e.g. "chars:2.5*1.0312") so that
    anything keyed by tokenizer name keeps corrected and uncorrected counts apart.
    """

    chars_per_token: float
    correction: float = 1.0
    exact: bool = field(default=False, init=False)
    bytes_bound: bool = field(default=False, init=False)  # a ratio estimate bounds nothing
    name: str = field(default="", init=False)
    _factor: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for label, value in (
            ("chars_per_token", self.chars_per_token),
            ("correction", self.correction),
        ):
            if not (math.isfinite(value) and value > 0):
                raise TokenizerError(
                    f"chars tokenizer: {label} must be a positive number, got {value!r}; "
                    "write e.g. 'chars:2.5' (cautious for mixed text; ~4 for English-only text)"
                )
        base = f"chars:{self.chars_per_token:g}"
        name = base if self.correction == 1.0 else f"{base}*{self.correction:.6g}"
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "_factor", self.correction / self.chars_per_token)

    def count(self, text: str) -> int:
        # round() first so that float noise (1.1 / 2.5 * 100 = 44.00000000000001) does not
        # push an exact multiple up by one token.
        return math.ceil(round(len(text) * self._factor, 6))

    def with_correction(self, factor: float) -> CharsTokenizer:
        """The same heuristic with calibration multiplier `factor` (absolute, not compounded)."""
        return CharsTokenizer(self.chars_per_token, factor)


def utf8_length(text: str) -> int:
    """Bytes of `text` in UTF-8, a lone surrogate counted as the 3 bytes of its replacement."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class Utf8Bound:
    """Not a tokenizer: the upper bound of a `bytes_bound` tokenizer's count, its UTF-8 length.

    Counting with it costs a length per string instead of a BPE run; `MessageCounter.bound`
    uses it to bound a whole request from above.
    """

    name = "utf8-bytes"
    exact = False
    bytes_bound = True  # its count is its UTF-8 length

    def count(self, text: str) -> int:
        return utf8_length(text)

    def __repr__(self) -> str:
        return "Utf8Bound()"


# --------------------------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------------------------

SPEC_HELP = (
    "use 'tiktoken:<encoding>', 'hf:<path to tokenizer.json>', 'chars:<chars per token>' "
    "or 'upstream'"
)
UPSTREAM_FALLBACK_CHARS = 4.0  # a text the upstream has not counted yet (or could not)
UPSTREAM_KNOWN_CHARS = 64 * 1024 * 1024  # texts whose upstream count is remembered


class UpstreamTokenizer:
    """The upstream's own tokenizer (`tokenizer: upstream`): counts it gave, remembered per text.

    Counting stays synchronous and pure: before a request is counted, the gateway asks the
    upstream for the texts it has not counted yet (`missing`, then `learn`). A text it could
    not get a count for is estimated by `chars:4` meanwhile. One instance per route (each
    upstream has its own tokenizer); bounded by the characters of the texts it remembers.
    """

    exact = False  # counts of unknown texts are estimates: never cached as exact
    bytes_bound = False  # the upstream's tokenizer is unknown

    def __init__(self, max_chars: int = UPSTREAM_KNOWN_CHARS) -> None:
        self.name = "upstream"
        self.fallback = CharsTokenizer(UPSTREAM_FALLBACK_CHARS)
        self._known: OrderedDict[str, int] = OrderedDict()
        self._chars = 0
        self._max_chars = max_chars

    def count(self, text: str) -> int:
        found = self._known.get(text)
        return found if found is not None else self.fallback.count(text)

    def missing(self, texts: Iterable[str]) -> list[str]:
        """The distinct texts of `texts` the upstream has not counted yet."""
        known = self._known
        return list(dict.fromkeys(t for t in texts if t and t not in known))

    def learn(self, texts: Sequence[str], counts: Sequence[int]) -> None:
        for text, count in zip(texts, counts, strict=True):
            if text not in self._known:
                self._chars += len(text)
            self._known[text] = count
            self._known.move_to_end(text)
        while self._chars > self._max_chars and self._known:
            old, _ = self._known.popitem(last=False)
            self._chars -= len(old)

    def __repr__(self) -> str:
        return f"UpstreamTokenizer({len(self._known)} texts known)"


@functools.lru_cache(maxsize=64)
def load_tokenizer(spec: str) -> Tokenizer:
    """The tokenizer for a config spec, built once per spec (process-wide cache).

    `tiktoken:o200k_base` (also cl100k_base, p50k_base, ...), `hf:/abs/or/relative/tokenizer.json`,
    `chars:2.5`. Raises TokenizerError, never a download.
    """
    if spec == "upstream":
        raise TokenizerError("'upstream' is one tokenizer per route: see UpstreamTokenizer")
    kind, sep, argument = spec.partition(":")
    if not sep or not argument.strip():
        raise TokenizerError(
            f"tokenizer spec {spec!r} has no '<kind>:<argument>' form; {SPEC_HELP}"
        )
    argument = argument.strip()
    if kind == "tiktoken":
        return TiktokenTokenizer(f"tiktoken:{argument}", load_tiktoken_encoding(argument))
    if kind == "hf":
        return _load_hf(argument)
    if kind == "chars":
        try:
            chars_per_token = float(argument)
        except ValueError:
            raise TokenizerError(
                f"tokenizer spec {spec!r}: {argument!r} is not a number; write e.g. 'chars:2.5'"
            ) from None
        return CharsTokenizer(chars_per_token)
    raise TokenizerError(f"tokenizer spec {spec!r}: unknown kind {kind!r}; {SPEC_HELP}")


def _load_hf(path_text: str) -> HuggingFaceTokenizer:
    """Load a local tokenizer.json; the common mistakes are reported as TokenizerError.

    The file is read and JSON-checked here so that a missing file, a non-JSON file or a JSON file
    that is not a tokenizer get a clear message. The Rust binding raises a bare `Exception` for
    deeper schema errors; those are not caught (no broad except) and fail start-up as they are.
    """
    try:
        from tokenizers import Tokenizer as HFTokenizer  # a Rust extension; loaded only when used
    except ImportError:
        raise TokenizerError(
            f"tokenizer {'hf:' + path_text!r} needs the `tokenizers` package: "
            "pip install 'compactgate[hf]'"
        ) from None

    path = Path(path_text).expanduser()
    fix = "give the path of a local tokenizer.json (the gateway never downloads from a model hub)"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TokenizerError(
            f"hf tokenizer file {str(path)!r} cannot be read ({error}); {fix}"
        ) from error
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise TokenizerError(
            f"hf tokenizer file {str(path)!r} is not JSON ({error}); {fix}"
        ) from error
    if not isinstance(document, dict) or not isinstance(document.get("model"), dict):
        raise TokenizerError(
            f"hf tokenizer file {str(path)!r} is JSON but not a tokenizers file "
            f"(no 'model' object); {fix}"
        )
    return HuggingFaceTokenizer(f"hf:{path_text}", HFTokenizer.from_str(text))


# --------------------------------------------------------------------------------------------
# Model name -> default spec
# --------------------------------------------------------------------------------------------

# First match wins; matched against the bare model name (provider prefix and "ft:" removed,
# lower-cased). A dated or sized suffix ("-2024-08-06", "-mini", "-32k") is allowed after each.
_END = r"(?=$|[-:@_])"  # end of the family name: end of string or a suffix separator
_MODEL_ENCODINGS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(chat)?gpt-4o" + _END), "o200k_base"),
    (re.compile(r"gpt-4\.[15]" + _END), "o200k_base"),
    (re.compile(r"gpt-5(?=$|[-:@_.])"), "o200k_base"),  # gpt-5, gpt-5-mini, gpt-5.1
    (re.compile(r"o[134]" + _END), "o200k_base"),  # o1, o1-mini, o3-pro, o4-mini
    (re.compile(r"gpt-oss" + _END), "o200k_base"),  # o200k_harmony: the same vocabulary
    (re.compile(r"gpt-4" + _END), "cl100k_base"),  # gpt-4, gpt-4-turbo, gpt-4-0613, gpt-4-32k
    (re.compile(r"gpt-3\.5-turbo" + _END), "cl100k_base"),
    (re.compile(r"gpt-35-turbo" + _END), "cl100k_base"),  # Azure's spelling
    (re.compile(r"text-embedding-(3-small|3-large|ada-002)" + _END), "cl100k_base"),
)


def bare_model_name(model: str) -> str:
    """`openrouter/openai/GPT-4o` -> `gpt-4o`; `ft:gpt-4o-mini:org::id` -> `gpt-4o-mini:org::id`."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return name.removeprefix("ft:")


def default_tokenizer_spec(model: str) -> str | None:
    """`tiktoken:o200k_base` / `tiktoken:cl100k_base` for OpenAI model families, else None.

    None means "unknown": the caller falls back to the chars heuristic.
    """
    name = bare_model_name(model)
    for pattern, encoding_name in _MODEL_ENCODINGS:
        if pattern.match(name):
            return f"tiktoken:{encoding_name}"
    return None
