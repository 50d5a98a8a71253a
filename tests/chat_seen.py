"""What a client saw of one chat request, and the checks the fault tests make of it: shared by
the process-level fault tests (`test_faults.py`) and the in-process retry tests
(`test_upstream_retry.py`), which send the same request and expect the same answers."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx

MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something, in a few words please."},
]
ECHO = "echo: Say something, in a few words please."


@dataclass
class Seen:
    """One client request's whole response, read to its end."""

    status: int
    headers: httpx.Headers
    body: bytes
    seconds: float

    def json(self) -> Any:
        return json.loads(self.body)

    def events(self) -> list[Any]:
        """The SSE events: parsed JSON, or the string "[DONE]"."""
        out: list[Any] = []
        for block in self.body.split(b"\n\n"):
            block = block.strip()
            if not block:
                continue
            assert block.startswith(b"data: "), f"not an SSE event: {block[:80]!r}"
            data = block[6:]
            out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
        return out

    def text(self) -> str:
        return "".join(
            e["choices"][0]["delta"].get("content") or ""
            for e in self.events()
            if isinstance(e, dict) and e.get("choices")
        )


def assert_completed(seen: Seen, stream: bool) -> None:
    """A normal answer, exactly once."""
    assert seen.status == 200, seen.body[:300]
    if stream:
        events = seen.events()
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        assert seen.text() == ECHO
        assert not any(isinstance(e, dict) and "error" in e for e in events)
    else:
        assert seen.json()["choices"][0]["message"]["content"] == ECHO


def assert_error(seen: Seen, status: int, code: str) -> None:
    """One OpenAI error body, never a silent or empty answer."""
    assert seen.status == status, seen.body[:300]
    error = seen.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
