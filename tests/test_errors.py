"""Every error body the gateway builds comes from the one table (gateway/errors.py), and the
bodies clients already see stay exactly as they were: the router's 404 and 405, and an admin
feed's bad query."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import ERROR_TABLE, GatewayError, error_body, reason_of
from tests.in_process import AppStarter, LocalUpstream


def config(upstream: LocalUpstream) -> dict[str, Any]:
    return {"models": [{"name": "m", "upstream": {"base_url": upstream.base_url}}]}


def envelope(message: str, param: str | None = None) -> dict[str, Any]:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }


async def test_the_routers_own_answers_keep_their_bodies(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    missing = await gw.http.get(f"{gw.url}/no-such-page")
    assert missing.status_code == 404
    assert missing.headers["content-type"] == "application/json"
    assert missing.json() == envelope("Not found.")
    wrong_method = await gw.http.post(f"{gw.url}/healthz")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == envelope("Method Not Allowed")


async def test_an_admin_feeds_bad_query_is_a_400_naming_it(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(config(local_upstream))
    bad = await gw.http.get(f"{gw.url}/v1/compactgate/events?limit=many")
    assert bad.status_code == 400
    assert bad.json() == envelope("limit and after must be integers.", "limit")


@pytest.mark.parametrize("kind", sorted(ERROR_TABLE, key=lambda k: k.__name__))
def test_every_kind_has_a_row_a_reason_and_an_openai_body(kind: type[GatewayError]) -> None:
    error = kind("what went wrong", param="p")
    status, error_type, code, reason = ERROR_TABLE[kind]
    assert (error.status, error.error_type, error.code) == (status, error_type, code)
    assert reason_of(error) == reason
    assert error.body() == error_body("what went wrong", error_type, "p", code)
    assert orjson.loads(error.body()) == {
        "error": {"message": "what went wrong", "type": error_type, "param": "p", "code": code}
    }
