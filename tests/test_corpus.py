"""The evaluation corpus (tests/corpus): three halves, enough distinct items, no statement
shared between halves, every item and every piece of content a final question depends on
really sent by the client."""

from __future__ import annotations

import itertools
import json

from tests.corpus import (
    HALVES,
    JUDGED,
    LANGUAGES,
    SHAPES,
    Content,
    all_items,
    load,
    sessions,
    statement_items,
)


def test_halves_say_which_they_are_and_share_no_item() -> None:
    assert load("dev")["note"].startswith("DEV HALF")
    assert load("heldout")["note"].startswith("HELD-OUT HALF")
    assert load("fresh")["note"].startswith("FRESH HALF")
    assert "never tuned on" in load("fresh")["note"]
    assert set(JUDGED) == set(HALVES) - {"dev"}
    dev = {i.text for i in all_items("dev")}
    held = {i.text for i in all_items("heldout")}
    assert len(dev | held) >= 200
    assert not dev & held


def test_the_fresh_half_shares_no_statement_domain_or_code_with_the_others() -> None:
    """Written blind, it is distinct material: not one item, typed statement or question
    of another half, 40 statements or more per language, another domain and another code
    language, so a rule fitted to the other halves' vocabulary or code lines is not tested
    on the same shapes again."""
    fresh = {i.text.casefold() for i in all_items("fresh")}
    for half in ("dev", "heldout"):
        assert not fresh & {i.text.casefold() for i in all_items(half)}, half
    for language in LANGUAGES:
        mine = statement_items("fresh", language)
        assert len(mine) >= 40, language
        said = {s["say"] for s, _ in mine} | {s["ask"] for s, _ in mine}
        ours = load("fresh")["languages"][language]
        for half in ("dev", "heldout"):
            theirs = load(half)["languages"][language]
            assert not said & {s[k] for s in theirs["statements"] for k in ("say", "ask")}
            assert ours["domain"]["project"] != theirs["domain"]["project"]
            assert ours["domain"]["code"] != theirs["domain"]["code"]
            assert not set(ours["domain"]["modules"]) & set(theirs["domain"]["modules"])
        for statement, items in mine:  # an item is the user's words, never the page's
            for item in items:
                assert item.text in statement["say"], item
                assert item.text not in ours["doc"], item


def test_every_shape_and_language_in_every_half_and_every_item_sent() -> None:
    for half in HALVES:
        built = sessions(half)
        assert {(s.shape, s.language) for s in built} == {(a, b) for a in SHAPES for b in LANGUAGES}
        sent = set()
        for s in built:
            text = json.dumps(list(s.requests())[-1], ensure_ascii=False)
            for item in s.items:
                assert json.dumps(item.text, ensure_ascii=False)[1:-1] in text, (s.id, item)
                sent.add(item.id)
            for need in s.depends_on:
                probe = need.probe() if isinstance(need, Content) else need.text
                assert json.dumps(probe, ensure_ascii=False)[1:-1] in text, (s.id, need)
        assert sent == {i.id for i in all_items(half)}


def test_a_session_is_the_same_bytes_every_time() -> None:
    first = [list(s.requests()) for s in sessions("heldout", shapes=("codex", "claude_code"))]
    again = [list(s.requests()) for s in sessions("heldout", shapes=("codex", "claude_code"))]
    assert first == again


def test_client_appends_between_requests_except_where_the_client_itself_rewrites() -> None:
    """A client resends its history and appends; Claude Code's cache marker moves and its
    micro-compaction rewrites older results once, which the prefix measure must allow for."""
    shapes = ("aider", "codex", "opencode", "chat")
    for s in [s for half in HALVES for s in sessions(half, shapes=shapes)]:
        bodies = list(s.requests())
        key = "input" if s.api == "responses" else "messages"
        for before, after in itertools.pairwise(bodies):
            assert after[key][: len(before[key])] == before[key], s.id
