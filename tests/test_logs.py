"""Request lines (gateway/ops/logs.py): whatever a client puts in the strings a line carries (its
request id, its model name), the line stays one line, reads back field by field, and names a
tenant without revealing the credential or header value behind it. In-process, the failure kind
a failed request's line gives; the JSON output of a real process is in tests/test_request_log.py.
"""

from __future__ import annotations

import json
import logging
import re

from hypothesis import given
from hypothesis import strategies as st

from gateway.ops.logs import (
    MAX_VALUE_CHARS,
    JsonFormatter,
    RequestLine,
    clip,
    request_fields,
    tenant_label,
)
from tests.configs import one_model
from tests.in_process import AppGateway, AppStarter, LocalUpstream

PAIR = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s"]+)(?: |$)')
TEXT = st.text(st.characters(codec="utf-8"), max_size=300)


def read_text_line(line: str) -> dict[str, str]:
    """A text request line back into its fields (quoted values are JSON strings)."""
    out = {}
    position = 0
    for match in PAIR.finditer(line):
        assert match.start() == position, f"unparsable at {position}: {line!r}"
        key, value = match.groups()
        out[key] = json.loads(value) if value.startswith('"') else value
        position = match.end()
    assert position == len(line), line
    return out


@given(request_id=TEXT, model=TEXT, steps=TEXT)
def test_a_text_line_is_one_line_that_reads_back(request_id: str, model: str, steps: str) -> None:
    fields = request_fields(
        request_id=clip(request_id), api="chat", status=200, model=clip(model), steps=steps
    )
    line = str(RequestLine(fields))
    assert "\n" not in line and "\r" not in line
    back = read_text_line(line)
    assert back["request_id"] == clip(request_id) and back["model"] == clip(model)
    assert back["steps"] == steps and back["status"] == "200" and back["stream"] == "false"
    assert list(back) == list(fields)


@given(model=TEXT)
def test_a_json_line_is_one_object_with_the_fields(model: str) -> None:
    fields = request_fields(request_id="r", api="passthrough", status=502, model=clip(model))
    record = logging.LogRecord("compactgate.access", logging.INFO, "", 0, "%s", None, None)
    record.fields = fields
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert {k: parsed[k] for k in fields} == fields
    assert parsed["logger"] == "compactgate.access" and parsed["level"] == "info"


@given(secret=st.text(min_size=1, max_size=80))
def test_a_tenant_not_named_by_the_config_appears_only_as_a_pseudonym(secret: str) -> None:
    for tenant in (f"k:{secret}", f"h:{secret}"):
        label = tenant_label(tenant)
        assert re.fullmatch(r"anon-[0-9a-f]{12}", label)
        assert label == tenant_label(tenant)  # the same tenant, the same name, every time
    assert tenant_label(f"t:{secret}") == clip(secret)


def test_long_client_strings_are_cut() -> None:
    assert len(clip("x" * 10_000)) == MAX_VALUE_CHARS + 3
    assert clip("short") == "short"


# -- the reason a failed request's line gives (in-process) -----------------------------------


def line_of(gw: AppGateway, request_id: str) -> str:
    [line] = [x for x in gw.logs().splitlines() if f"request_id={request_id} " in x]
    return line


async def test_a_context_error_out_of_retries_is_logged_as_context_overflow(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(one_model(local_upstream.base_url, context_window=100_000, max_retries=0))
    local_upstream.configure({"context_limit": 10, "style": "openai"})
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": "word " * 200}]},
        headers={"x-request-id": "overflow"},
    )
    assert response.status_code == 400
    assert " status=400 reason=context_overflow " in line_of(gw, "overflow")


async def test_limits_and_bad_bodies_are_logged_with_their_kind(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        {
            "server": {"max_body_bytes": 1000},
            "models": [{"name": "m", "upstream": {"base_url": local_upstream.base_url}}],
        }
    )
    for request_id, body, status, reason in (
        ("big", b'{"model": "m", "input": "' + b"x" * 2000 + b'"}', 413, "body_too_large"),
        ("broken", b'{"model": "m", "messages": [', 400, "bad_request"),
    ):
        response = await gw.http.post(
            f"{gw.base_url}/responses" if request_id == "big" else f"{gw.base_url}/messages",
            content=body,
            headers={"x-request-id": request_id, "content-type": "application/json"},
        )
        assert response.status_code == status
        assert f" status={status} reason={reason} " in line_of(gw, request_id)
    assert local_upstream.requests() == []
