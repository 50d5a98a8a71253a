"""`content_type_chunking` and `policies.chunking` (design D5.2)."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policies import check, run_chain
from policies.chunking import (
    CODE_LINE_RE,
    LOG_LINE_RE,
    NUMBER_RE,
    _code_lines,
    _log_lines,
    collapse_repeats,
    compact_log,
    compress,
    detect,
    elide,
    minify_code,
    minify_json,
)
from policies.memo import Memo
from policies.registry import build_policy
from policies.steps.content_type_chunking import ContentTypeChunking, ContentTypeChunkingConfig
from tests.policy_strategies import assistant_calls, budget, conv, env, msg, tool


def stdlib_sources() -> list[str]:
    import argparse
    import dataclasses
    import difflib
    import json.decoder

    return [inspect.getsource(m) for m in (textwrap, json.decoder, difflib, argparse, dataclasses)]


PY_SNIPPET = '''\
#!/usr/bin/env python3
# A module comment


def f(x):
    # comment inside
    s = """a string
    # not a comment

    with a blank line"""


    return x + 1  # trailing comment stays


class C:
    # only a comment here

    def g(self):
        pass
'''


def test_defaults_are_the_documented_ones() -> None:
    ratios = ContentTypeChunkingConfig().ratios
    assert (ratios.code, ratios.text, ratios.plan_ref, ratios.log, ratios.other) == (
        0.7,
        0.5,
        1.0,
        0.4,
        0.6,
    )
    assert ContentTypeChunkingConfig().compress_prose is False
    assert (
        ContentTypeChunkingConfig.model_validate({"ratios": {"json": 0.5}}).ratios.of("json") == 0.5
    )


@pytest.mark.parametrize("source", stdlib_sources())
def test_python_keeps_its_ast_and_its_indentation(source: str) -> None:
    small = minify_code(source)
    assert len(small) < len(source)
    assert ast.dump(ast.parse(small)) == ast.dump(ast.parse(source))
    original = source.splitlines()
    position = 0
    for line in small.splitlines():  # every kept line is an original line, in order
        position = original.index(line, position) + 1


def test_python_strings_keep_their_hashes_and_blank_lines() -> None:
    small = minify_code(PY_SNIPPET)
    assert "    # not a comment\n\n    with a blank line" in small
    assert "# A module comment" not in small and "# comment inside" not in small
    assert "# only a comment here" not in small
    assert "return x + 1  # trailing comment stays" in small
    assert small.startswith("#!/usr/bin/env python3\n")
    assert "\n\n\n" not in small
    ast.parse(small)


def test_fenced_code_in_markdown_and_other_languages() -> None:
    text = "Here:\n```js\n// setup\nconst a = 1;\n\n\n\nlet b = 2; // keep\n```\nAnd prose # stays."
    small = minify_code(text)
    assert small == "Here:\n```js\nconst a = 1;\n\nlet b = 2; // keep\n```\nAnd prose # stays."
    broken = "```python\n# comment\ndef broken(:\n```"
    assert minify_code(broken) == broken  # says Python, does not parse: untouched


def test_json_loses_only_insignificant_whitespace() -> None:
    value = {"a": [1, 2.50, {"b": "x  y\n z"}], "big": 12345678901234567890, "c": None}
    pretty = json.dumps(value, indent=2)
    small = minify_json(pretty)
    assert small is not None and json.loads(small) == value and len(small) < len(pretty)
    assert '"x  y\\n z"' in small and "2.5" in small
    assert minify_json('{"a": 1,}') is None  # not JSON: untouched
    assert minify_json('"just a string"') is None
    assert detect(pretty) == "json"


def test_logs_collapse_repeats_and_keep_head_and_tail() -> None:
    lines = [f"2024-05-01 10:00:{i % 60:02d} INFO worker {i} heartbeat ok" for i in range(300)]
    lines += ["2024-05-01 10:05:00 ERROR worker 7 crashed: disk full"] * 5
    lines += [f"2024-05-01 10:06:{i:02d} WARN retry {i} against host-{i * 7}" for i in range(40)]
    log = "\n".join(lines)
    assert detect(log) == "log"
    collapsed = collapse_repeats(log)
    assert "[... 298 similar lines ...]" in collapsed
    assert "[previous line repeated 4 more times]" in collapsed
    small = compact_log(log, 0.4)
    assert len(small) <= 0.45 * len(log)
    assert small.splitlines()[-1] == lines[-1]  # the end of a log is kept


def test_log_elision_marks_what_it_cut() -> None:
    log = "\n".join(
        f"[{i}.{i}] line with unique {chr(65 + i % 26) * (i % 7)} text {i * i}" for i in range(400)
    )
    small = compact_log(log, 0.4)
    assert "lines elided by compactgate" in small
    assert len(small) < 0.45 * len(log)


@given(
    before=st.sampled_from(
        ["Our customers are mostly small bakeries.", "我们的客户大多是小面包店。"]
    ),
    after=st.sampled_from(["", "The first error is the one that matters.", "うちの顧客です。"]),
    lines=st.integers(6, 80),
    lossy=st.booleans(),
)
def test_a_log_pasted_in_a_fence_between_sentences_is_compressed_and_the_prose_kept(
    before: str, after: str, lines: int, lossy: bool
) -> None:
    log = "\n".join(
        f"2024-10-01T12:{i % 60:02d}:00Z WARN job {chr(65 + i % 26) * (1 + i % 7)} retried"
        for i in range(lines)
    )
    text = f"{before}\n```\n{log}\n```\n{after}"
    assert detect(text) == "log"
    small = compress(text, "log", 0.4, lossy=lossy, prose=False)
    assert small.startswith(f"{before}\n```\n")
    assert small.endswith(f"\n```\n{after}")
    assert len(small) < len(text) or not lossy


@given(
    before=st.sampled_from(["The staging database is at 10.1.2.3.", "我们的客户大多是小面包店。"]),
    lines=st.integers(6, 80),
    lossy=st.booleans(),
)
def test_a_sentence_typed_before_an_unfenced_log_is_kept_whole(
    before: str, lines: int, lossy: bool
) -> None:
    log = "\n".join(
        f"2024-10-01T12:{i % 60:02d}:00Z WARN job {chr(65 + i % 26) * (1 + i % 7)} retried"
        for i in range(lines)
    )
    small = compress(f"{before}\n{log}", "log", 0.4, lossy=lossy, prose=False)
    assert small.startswith(f"{before}\n")
    assert small[len(before) + 1 :] == (compact_log(log, 0.4) if lossy else collapse_repeats(log))


def test_prose_detection_and_elision() -> None:
    prose = "This is a sentence about the plan. " * 50
    assert detect(prose) == "text"
    assert "words elided by compactgate" in elide(prose, 0.5)


def big_history(**kinds: object) -> list[dict]:
    code = stdlib_sources()[0]
    log = "\n".join(f"2024-05-01 10:00:{i % 60:02d} INFO step {i} ok" for i in range(400))
    data = [msg("system", "s"), msg("user", "look at this code:\n```python\n" + code + "\n```")]
    data += [msg("assistant", "ok"), msg("user", "run it"), assistant_calls("c1")]
    data += [tool("c1", log), msg("assistant", "it ran"), msg("user", "prose " * 800)]
    data += [msg("assistant", "noted"), msg("user", "and now?")]
    return data


def test_step_compresses_old_messages_by_type_and_keeps_invariants() -> None:
    data = big_history()
    conversation = conv(data)
    step = ContentTypeChunking(ContentTypeChunkingConfig())
    result = step.apply(conversation, budget(6000), env())
    out = {m.origin: m for m in result.conversation.messages}
    assert result.replaced >= 2
    assert len(out[1].text) < len(data[1]["content"])  # code, minified
    assert len(out[5].text) < len(data[5]["content"])  # log, collapsed
    assert out[7].text == data[7]["content"]  # prose: untouched by default
    assert out[9] == conversation.messages[9]  # the last Turn
    assert check(conversation, result.conversation) == []


def test_marks_pins_and_priorities_decide() -> None:
    data = big_history()
    conversation = conv(data, kinds={5: "plan_ref"}, pins=[1])
    result = ContentTypeChunking(ContentTypeChunkingConfig()).apply(
        conversation, budget(6000), env()
    )
    assert result.conversation.messages[5] == conversation.messages[5]  # plan_ref: verbatim
    assert result.conversation.messages[1] == conversation.messages[1]  # pinned: untouched
    p1 = conv(data, priorities={5: 1})
    lossless = ContentTypeChunking(ContentTypeChunkingConfig()).apply(p1, budget(6000), env())
    assert "elided" not in lossless.conversation.messages[5].text  # priority 1: no lossy transforms
    prose = ContentTypeChunking(ContentTypeChunkingConfig(compress_prose=True))
    squeezed = prose.apply(conversation, budget(3000), env())
    assert "words elided" in squeezed.conversation.messages[7].text


def test_stable_under_appending() -> None:
    data = big_history()
    policy = build_policy("c", [{"type": "content_type_chunking"}])
    first = run_chain(conv(data), budget(6000), policy, env()).conversation.data()
    grown = [*data, msg("assistant", "fine"), msg("user", "next")]
    second = run_chain(conv(grown), budget(6000), policy, env()).conversation.data()
    assert second[: len(first)] == first


# The fast paths in `chunking` answer exactly what the plain regexes and the one-pass key list do.

LINE_PIECES = st.sampled_from(
    [
        *"0123456789abcdefxXABCDEF:-T .[](){};#/\t\r\x0b\x1c\u3000٣_éÜ",
        "INFO",
        "ERROR",
        "WARNING",
        " at ",
        'File "',
        '", line ',
        "2024-01-02 ",
        "12:34:56",
        "0xdead",
        "deadbeef12",
        "def ",
        "return",
        "if x:",
        "};",
        "[ 12.5]",
        "```",
        "\n",
    ]
)
TEXTS = st.lists(LINE_PIECES, max_size=60).map("".join)


def reference_collapse(text: str) -> str:
    lines = text.split("\n")
    keys = NUMBER_RE.sub("0", text).split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        j = i + 1
        while j < len(lines) and keys[j] == keys[i]:
            j += 1
        run = lines[i:j]
        if len(run) >= 2 and all(line == run[0] for line in run):
            out += [run[0], f"[previous line repeated {len(run) - 1} more times]"]
        elif len(run) >= 3 and lines[i].strip():
            out += [run[0], f"[... {len(run) - 2} similar lines ...]", run[-1]]
        else:
            out += run
        i = j
    return "\n".join(out)


LOG_AND_CODE_LINES = [
    '  File "app.py", line 12, in main',
    "    at com.example.Main(Main.java:3)",
    "[  12.345] usb 1-1: new device",
    "[\t7] x",
    "2024-01-02T03:04 started",
    "ts 12:34:56 ok",
    "a12:34:56 glued to a word",
    "12:34:567 too long",
    "level=INFO done",
    "INFOS is not a level",
    "the error was mild",
    "    return x;",
    "if (x) {",
    "}",
    "from os import path",
    "plain words here",
    "",
]


@settings(max_examples=300, deadline=None)
@example("\n".join(LOG_AND_CODE_LINES))
@given(TEXTS)
def test_line_tests_match_the_plain_regexes(text: str) -> None:
    for line in text.split("\n"):
        assert _log_lines([line], 1) == bool(LOG_LINE_RE.search(line))
        assert _code_lines([line], 1) == bool(CODE_LINE_RE.search(line))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(["", "a", "2024-01-01 00:00:0", "x٣"]), max_size=8), TEXTS)
def test_collapse_repeats_matches_the_one_pass_keys(heads: list[str], tail: str) -> None:
    lines = [head + str(i % 3) for i, head in enumerate(heads)] + tail.split("\n")
    text = "\n".join(lines + lines[:3])
    assert collapse_repeats(text) == reference_collapse(text)


def test_a_shared_memo_changes_no_output() -> None:
    data = big_history()
    policy = build_policy("c", [{"type": "content_type_chunking"}])
    memo = Memo()
    cold = run_chain(conv(data), budget(6000), policy, env()).conversation.data()
    first = run_chain(conv(data), budget(6000), policy, env(memo=memo)).conversation.data()
    again = run_chain(conv(data), budget(6000), policy, env(memo=memo)).conversation.data()
    assert len(memo) > 0
    assert cold == first == again


def test_python_that_makes_the_parser_warn_is_still_minified_and_prints_nothing() -> None:
    # A string with an invalid escape (\d) makes CPython's parser warn. That warning reached the
    # gateway's stderr for every such message, and where warnings are errors the block read as
    # "does not parse" and was sent unminified. Now: minified like any Python, no warning, and
    # the process's warning filters untouched.
    import warnings

    from policies.chunking import minify_code

    line = '    return re.findall("\\d+", s)'
    text = f"```python\n# a comment-only line\ndef digits(s):\n{line}\n```"
    filters = list(warnings.filters)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        small = minify_code(text)
    assert "# a comment-only line" not in small and line in small
    assert [str(w.message) for w in seen] == []
    assert warnings.filters == filters
