"""The evaluation corpus (benchmarks/corpus): two halves, enough distinct items, every item
and every piece of content a final question depends on really sent by the client."""

from __future__ import annotations

import itertools
import json

from benchmarks.corpus import HALVES, LANGUAGES, SHAPES, Content, all_items, load, sessions


def test_halves_say_which_they_are_and_share_no_item() -> None:
    assert load("dev")["note"].startswith("DEV HALF")
    assert load("heldout")["note"].startswith("HELD-OUT HALF")
    dev = {i.text for i in all_items("dev")}
    held = {i.text for i in all_items("heldout")}
    assert len(dev | held) >= 200
    assert not dev & held


def test_every_shape_and_language_in_both_halves_and_every_item_sent() -> None:
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
    for s in sessions("dev", shapes=("aider", "codex", "opencode", "chat")):
        bodies = list(s.requests())
        key = "input" if s.api == "responses" else "messages"
        for before, after in itertools.pairwise(bodies):
            assert after[key][: len(before[key])] == before[key], s.id
