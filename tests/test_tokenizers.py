"""gateway.counting.tokenizers: offline loading, the three spec kinds, errors, model -> encoding."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.counting import bpe
from gateway.counting.bpe import bpe_cache_name, load_tiktoken_encoding
from gateway.counting.tokenizers import (
    CharsTokenizer,
    HuggingFaceTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    TokenizerError,
    default_tokenizer_spec,
    load_tokenizer,
)

O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every outgoing connection and name lookup fails, as on an air-gapped host."""

    def refuse(*_args: object, **_kwargs: object) -> None:
        raise OSError("network is unreachable (test)")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture
def fresh_caches() -> Iterator[None]:
    """Make load_tokenizer really load (and leave no test-specific tokenizer cached)."""
    load_tokenizer.cache_clear()
    bpe._offline_constructors.cache_clear()
    yield
    load_tokenizer.cache_clear()
    bpe._offline_constructors.cache_clear()


# ---------------------------------------------------------------------------------- tiktoken


@pytest.mark.usefixtures("fresh_caches")
def test_tiktoken_loads_and_counts_with_the_network_unreachable(
    no_network: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where tiktoken would cache
    environ_before = dict(os.environ)

    o200k = load_tokenizer("tiktoken:o200k_base")
    cl100k = load_tokenizer("tiktoken:cl100k_base")

    # Counts published in OpenAI's cookbook ("How to count tokens with tiktoken").
    assert o200k.count("お誕生日おめでとう") == 8
    assert cl100k.count("お誕生日おめでとう") == 9
    assert cl100k.count("tiktoken is great!") == 6
    assert isinstance(o200k, TiktokenTokenizer)
    assert o200k.encoding.encode_ordinary("お誕生日おめでとう") == [
        8930, 9697, 243, 128225, 8930, 17693, 4344, 48669,
    ]  # fmt: skip
    assert o200k.exact and o200k.name == "tiktoken:o200k_base"
    assert dict(os.environ) == environ_before
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_loading_never_imports_litellm() -> None:
    """litellm is only the carrier of the BPE files: importing it would cost seconds."""
    code = (
        "import sys\n"
        "from gateway.counting.tokenizers import load_tokenizer\n"
        "assert load_tokenizer('tiktoken:cl100k_base').count('hello world') == 2\n"
        "assert 'litellm' not in sys.modules, 'litellm was imported'\n"
    )
    root = Path(__file__).resolve().parent.parent
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True, timeout=60)


def test_special_tokens_in_text_count_as_text() -> None:
    tokenizer = load_tokenizer("tiktoken:o200k_base")
    assert tokenizer.count("<|endoftext|>") > 1  # not the single special token, and no raise
    assert tokenizer.count("") == 0


def test_loaded_tokenizers_are_cached_per_spec() -> None:
    assert load_tokenizer("tiktoken:o200k_base") is load_tokenizer("tiktoken:o200k_base")
    assert load_tokenizer("chars:2.5") is load_tokenizer("chars:2.5")


@pytest.mark.usefixtures("fresh_caches")
def test_hash_mismatch_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / bpe_cache_name(O200K_URL)).write_bytes(b"aGVsbG8= 0\n")
    monkeypatch.setattr(bpe, "bpe_search_dirs", lambda: [tmp_path])
    with pytest.raises(TokenizerError, match="sha256"):
        load_tiktoken_encoding("o200k_base")


@pytest.mark.usefixtures("fresh_caches")
def test_missing_file_says_how_to_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bpe, "bpe_search_dirs", lambda: [tmp_path])
    with pytest.raises(TokenizerError, match="TIKTOKEN_CACHE_DIR") as caught:
        load_tokenizer("tiktoken:cl100k_base")
    assert bpe_cache_name(O200K_URL.replace("o200k", "cl100k")) in str(caught.value)


def test_cache_names_match_tiktokens_and_the_shipped_files() -> None:
    assert bpe_cache_name(O200K_URL) == "fb374d419588a4632f3f557e76b4b70aebbca790"
    shipped = bpe.bpe_search_dirs()[0]
    data = (shipped / "fb374d419588a4632f3f557e76b4b70aebbca790").read_bytes()
    assert hashlib.sha256(data).hexdigest().startswith("446a9538")


def test_a_preseeded_tiktoken_cache_dir_is_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
    assert bpe.bpe_search_dirs()[-1] == tmp_path


def test_unknown_encoding() -> None:
    with pytest.raises(TokenizerError, match="o200k_base"):
        load_tokenizer("tiktoken:gpt2")


# ---------------------------------------------------------------------------------- chars


def test_chars_counts_code_points_not_bytes() -> None:
    tokenizer = CharsTokenizer(2.5)
    assert tokenizer.count("") == 0
    assert tokenizer.count("abcde") == 2
    assert tokenizer.count("abcdef") == 3  # ceil(2.4)
    assert tokenizer.count("上下文窗口") == 2  # 5 code points, 15 UTF-8 bytes
    assert tokenizer.count("👍") == 1  # 1 code point, 4 bytes
    assert not tokenizer.exact
    assert tokenizer.name == "chars:2.5"
    assert load_tokenizer("chars:4").count("x" * 400) == 100


def test_chars_correction_derives_a_new_tokenizer() -> None:
    base = CharsTokenizer(2.5)
    corrected = base.with_correction(1.1)
    assert corrected.count("x" * 100) == 44
    assert base.count("x" * 100) == 40  # unchanged: instances are shared and immutable
    assert corrected.name == "chars:2.5*1.1"
    assert corrected.with_correction(1.0) == base  # absolute, not compounded
    with pytest.raises(TokenizerError):
        base.with_correction(0.0)
    with pytest.raises(AttributeError):
        base.correction = 2.0  # type: ignore[misc]


# ---------------------------------------------------------------------------------- hf


@pytest.fixture
def word_level_json(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, pre_tokenizers, trainers

    tokenizer = HFTokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "[CLS]"])
    tokenizer.train_from_iterator(
        ["hello world", "the gateway counts tokens", "hello gateway"], trainer=trainer
    )
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


@pytest.mark.usefixtures("fresh_caches")
def test_hf_tokenizer_from_a_local_file(word_level_json: Path, no_network: None) -> None:
    tokenizer = load_tokenizer(f"hf:{word_level_json}")
    assert isinstance(tokenizer, HuggingFaceTokenizer)
    assert tokenizer.exact and tokenizer.name == f"hf:{word_level_json}"
    assert tokenizer.count("hello world") == 2
    assert tokenizer.count("hello unknown gateway") == 3  # [UNK] is one token
    assert tokenizer.count("") == 0


@pytest.mark.parametrize(
    ("content", "match"),
    [(None, "cannot be read"), ("not json", "not JSON"), ('{"version": "1.0"}', "no 'model'")],
)
@pytest.mark.usefixtures("fresh_caches")
def test_hf_errors_are_clear(tmp_path: Path, content: str | None, match: str) -> None:
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(TokenizerError, match=match):
        load_tokenizer(f"hf:{path}")


# ---------------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    "spec",
    ["", "o200k_base", "tiktoken:", "bpe:foo", "chars:abc", "chars:0", "chars:-1", "chars:nan"],
)
def test_bad_specs_raise_tokenizer_error(spec: str) -> None:
    with pytest.raises(TokenizerError):
        load_tokenizer(spec)


def test_every_kind_satisfies_the_protocol(word_level_json: Path) -> None:
    for spec in ("tiktoken:cl100k_base", "chars:3", f"hf:{word_level_json}"):
        assert isinstance(load_tokenizer(spec), Tokenizer)


@pytest.mark.parametrize(
    ("model", "spec"),
    [
        ("gpt-4o", "tiktoken:o200k_base"),
        ("gpt-4o-mini-2024-07-18", "tiktoken:o200k_base"),
        ("openai/gpt-4o", "tiktoken:o200k_base"),
        ("openrouter/openai/GPT-4o", "tiktoken:o200k_base"),
        ("chatgpt-4o-latest", "tiktoken:o200k_base"),
        ("gpt-4.1", "tiktoken:o200k_base"),
        ("gpt-4.1-nano-2025-04-14", "tiktoken:o200k_base"),
        ("gpt-4.5-preview", "tiktoken:o200k_base"),
        ("o1", "tiktoken:o200k_base"),
        ("o1-mini", "tiktoken:o200k_base"),
        ("o3-pro-2025-06-10", "tiktoken:o200k_base"),
        ("o4-mini", "tiktoken:o200k_base"),
        ("gpt-5", "tiktoken:o200k_base"),
        ("gpt-5.1-codex", "tiktoken:o200k_base"),
        ("azure/gpt-5-mini", "tiktoken:o200k_base"),
        ("ft:gpt-4o-mini-2024-07-18:acme::abc123", "tiktoken:o200k_base"),
        ("gpt-4", "tiktoken:cl100k_base"),
        ("gpt-4-0613", "tiktoken:cl100k_base"),
        ("gpt-4-turbo-2024-04-09", "tiktoken:cl100k_base"),
        ("gpt-4-32k", "tiktoken:cl100k_base"),
        ("gpt-3.5-turbo", "tiktoken:cl100k_base"),
        ("gpt-3.5-turbo-0125", "tiktoken:cl100k_base"),
        ("azure/gpt-35-turbo", "tiktoken:cl100k_base"),
        ("claude-sonnet-4-5", None),
        ("llama3.1:8b", None),
        ("o1x", None),
        ("gpt-4.2", None),
        ("my-gpt-4o-deployment", None),
    ],
)
def test_default_tokenizer_spec(model: str, spec: str | None) -> None:
    assert default_tokenizer_spec(model) == spec
