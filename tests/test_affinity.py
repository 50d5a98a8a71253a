"""The conversation key (gateway/path/affinity.py, design D13.6): stable from turn to turn, from the
agents' own session where they send one (headers captured from Codex CLI 0.169 and Claude Code
2.1.331 against the fake upstream), else from the conversation's opening; returned on every
answer as `x-compactgate-conversation`, through the official SDKs."""

from __future__ import annotations

import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from gateway.path.affinity import conversation_key
from tests.in_process import AppStarter, LocalUpstream

CODEX_SESSION = "01a22493-4f2a-7f90-96c6-fdf8b71407e8"
CLAUDE_SESSION = "e4e870ad-7a38-4a93-bc77-d18a5e7a938d"
# Claude Code's metadata.user_id, as it sent it
CLAUDE_USER_ID = (
    '{"device_id":"38d05f001a83fba881f66fbadf9c6f7ff60cd28ba1c155a2863cfea920c01d42",'
    f'"account_uuid":"","session_id":"{CLAUDE_SESSION}"}}'
)
KEY = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def opening(first: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": first},
    ]
    for turn in range(turns):
        messages += [
            {"role": "assistant", "content": f"step {turn} done"},
            {"role": "user", "content": f"next {turn}"},
        ]
    return messages


def key(headers: list[tuple[bytes, bytes]] = (), payload: Any = None, **kw: Any) -> str:  # type: ignore[assignment]
    messages = kw.get("messages", opening("fix the build", 0))
    return conversation_key(list(headers), payload or {}, messages, kw.get("tenant", "t")).value


def test_an_agents_session_gives_one_key_whichever_field_carries_it() -> None:
    from_header = key([(b"x-claude-code-session-id", CLAUDE_SESSION.encode())])
    from_metadata = key(payload={"metadata": {"user_id": CLAUDE_USER_ID}})
    assert from_header == from_metadata
    codex = key([(b"session-id", CODEX_SESSION.encode())])
    assert codex == key([(b"session_id", CODEX_SESSION.encode())])
    assert codex != from_header
    # the session decides, whatever the messages say
    assert codex == key([(b"session-id", CODEX_SESSION.encode())], messages=opening("x", 9))


def test_the_opening_decides_without_a_session_and_later_turns_do_not() -> None:
    first = key(messages=opening("fix the build", 0))
    assert key(messages=opening("fix the build", 12)) == first
    assert key(messages=opening("write the docs", 0)) != first
    assert key(messages=opening("fix the build", 0), tenant="other") != first


def test_a_key_the_client_echoes_is_kept_and_a_malformed_one_ignored() -> None:
    echoed = key([(b"x-compactgate-conversation", b"o0123abc")], messages=opening("new", 0))
    assert echoed == "o0123abc"
    bad = key([(b"x-compactgate-conversation", b"no spaces allowed")])
    assert bad == key()
    # an agent's session outranks an echoed key
    both = [(b"session-id", CODEX_SESSION.encode()), (b"x-compactgate-conversation", b"k")]
    assert key(both) == key([(b"session-id", CODEX_SESSION.encode())])


@given(
    headers=st.lists(st.tuples(st.binary(max_size=30), st.binary(max_size=300)), max_size=5),
    user_id=st.one_of(st.none(), st.text(max_size=300), st.integers()),
    contents=st.lists(
        st.one_of(st.text(), st.none(), st.lists(st.dictionaries(st.text(), st.text()))),
        max_size=4,
    ),
    roles=st.lists(
        st.sampled_from(["system", "developer", "user", "assistant", "tool"]), max_size=4
    ),
)
def test_any_request_gets_a_header_safe_key(
    headers: list[tuple[bytes, bytes]], user_id: Any, contents: list[Any], roles: list[str]
) -> None:
    messages = [{"role": r, "content": c} for r, c in zip(roles, contents, strict=False)]
    value = conversation_key(headers, {"metadata": {"user_id": user_id}}, messages, "t").value
    assert KEY.fullmatch(value)


async def test_every_answer_carries_the_key_through_the_sdks(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gateway = await start_app(
        {
            "tenant_header": "x-team",
            "models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}],
        }
    )
    team = {"x-team": "blue"}  # the tenant is then "h:blue"
    chat = gateway.openai(default_headers=team)
    keys = set()
    for turns in range(3):
        raw = await chat.chat.completions.with_raw_response.create(
            model="m", messages=opening("fix the build", turns)
        )
        keys.add(raw.headers["x-compactgate-conversation"])
    assert len(keys) == 1
    responses = await chat.responses.with_raw_response.create(
        model="m", input="hello", extra_headers={"session-id": CODEX_SESSION}
    )
    assert responses.headers["x-compactgate-conversation"] == key(
        [(b"session-id", CODEX_SESSION.encode())], tenant="h:blue"
    )
    messages = await gateway.anthropic(default_headers=team).messages.with_raw_response.create(
        model="m",
        max_tokens=100,
        messages=[{"role": "user", "content": "hi"}],
        metadata={"user_id": CLAUDE_USER_ID},
    )
    assert messages.headers["x-compactgate-conversation"] == key(
        [(b"x-claude-code-session-id", CLAUDE_SESSION.encode())], tenant="h:blue"
    )
