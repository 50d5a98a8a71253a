"""tiktoken's BPE files read offline: from the copy litellm's wheel ships, or from a directory
the operator pre-seeded (`TIKTOKEN_CACHE_DIR` / `DATA_GYM_CACHE_DIR`), checked against the hash
tiktoken expects before anything is parsed. Never the network, never a write (see
`tokenizers.py` for the rule and why).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import importlib.util
import os
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tiktoken
from tiktoken_ext import openai_public  # type: ignore[import-untyped]


class TokenizerError(Exception):
    """A tokenizer spec that cannot be loaded: bad syntax, missing file, hash mismatch."""


# The encodings a BPE file can be found for. gpt2 (a different file format) is not offered.
TIKTOKEN_ENCODINGS: tuple[str, ...] = (
    "o200k_base",
    "o200k_harmony",
    "cl100k_base",
    "p50k_base",
    "p50k_edit",
    "r50k_base",
)


def bpe_search_dirs() -> list[Path]:
    """Where BPE files are looked for, in order: litellm's wheel, then a pre-seeded tiktoken cache.

    Reads the environment; never changes it. litellm is located, not imported.
    """
    dirs: list[Path] = []
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            dirs.append(Path(location) / "litellm_core_utils" / "tokenizers")
    for variable in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        value = os.environ.get(variable)
        if value:
            dirs.append(Path(value))
    return dirs


def bpe_cache_name(blob_url: str) -> str:
    """The file name tiktoken's cache gives the BPE file fetched from `blob_url`."""
    return hashlib.sha1(blob_url.encode()).hexdigest()


def _read_bpe_offline(blob_url: str, expected_hash: str | None = None) -> dict[bytes, int]:
    """Find `blob_url`'s file in `bpe_search_dirs()`, check its sha256, parse its lines."""
    file_name = bpe_cache_name(blob_url)
    searched = bpe_search_dirs()
    for directory in searched:
        path = directory / file_name
        if not path.is_file():
            continue
        data = path.read_bytes()
        actual = hashlib.sha256(data).hexdigest()
        if expected_hash is not None and actual != expected_hash:
            raise TokenizerError(
                f"tiktoken BPE file {path} (for {blob_url}) has sha256 {actual}, expected "
                f"{expected_hash}: the file is corrupt or from another tiktoken version; "
                "reinstall the package that ships it or replace the file"
            )
        return _parse_bpe(data, path)
    where = ", ".join(str(d) for d in searched) or "(no directory: litellm is not installed)"
    raise TokenizerError(
        f"no offline copy of {blob_url}: looked for {file_name} in {where}. The gateway never "
        "downloads tokenizer files; install the pinned litellm (its wheel ships them), or put the "
        f"file named {file_name} into a directory and point TIKTOKEN_CACHE_DIR at it, or "
        "configure 'chars:2.5' for this model"
    )


def _parse_bpe(data: bytes, path: Path) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), start=1):
        if not line:
            continue
        token, _, rank = line.partition(b" ")
        try:
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (binascii.Error, ValueError) as error:
            raise TokenizerError(
                f"{path} line {number} is not '<base64> <rank>': {error}"
            ) from error
    return ranks


def _refuse_data_gym(*_args: object, **_kwargs: object) -> dict[bytes, int]:
    raise TokenizerError("the gpt2 encoding (data-gym format) is not available offline")


@functools.cache
def _offline_constructors() -> dict[str, Callable[[], dict[str, Any]]]:
    """tiktoken's own encoding constructors, rebound so their file loading is `_read_bpe_offline`.

    Each constructor in `tiktoken_ext.openai_public` builds the encoding's parameters (split
    pattern, special tokens) and calls the module-level `load_tiktoken_bpe(url, expected_hash)`,
    which would download. We make copies of those functions whose globals are a private copy of
    the module namespace with that one name (and its sibling for the data-gym format) replaced.
    Nothing global is patched: tiktoken, its registry and os.environ are untouched, and the
    definitions stay those of the installed tiktoken version.
    """
    namespace: dict[str, Any] = dict(vars(openai_public))
    namespace["load_tiktoken_bpe"] = _read_bpe_offline
    namespace["data_gym_to_mergeable_bpe_ranks"] = _refuse_data_gym
    rebound: dict[str, Callable[[], dict[str, Any]]] = {}
    for encoding_name, original in openai_public.ENCODING_CONSTRUCTORS.items():
        copy = types.FunctionType(
            original.__code__,
            namespace,
            original.__name__,
            original.__defaults__,
            original.__closure__,
        )
        namespace[original.__name__] = copy  # o200k_harmony calls o200k_base() through globals
        rebound[encoding_name] = copy
    return rebound


def load_tiktoken_encoding(encoding_name: str) -> tiktoken.Encoding:
    """Build `encoding_name` from an offline, checked BPE file (uncached; see load_tokenizer)."""
    if encoding_name not in TIKTOKEN_ENCODINGS:
        raise TokenizerError(
            f"unknown tiktoken encoding {encoding_name!r}; "
            f"use one of {', '.join(TIKTOKEN_ENCODINGS)}"
        )
    constructor = _offline_constructors()[encoding_name]
    parameters = constructor()
    return tiktoken.Encoding(**parameters)
