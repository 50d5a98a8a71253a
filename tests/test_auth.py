"""Gateway keys and tenants (gateway/http/auth.py, design D16.1), end to end and at the unit level.

What a user would notice: with `auth.keys` configured, no key or a wrong key is a 401 and a model
outside the key's globs is a 403, both as OpenAI error bodies the official client raises as
`AuthenticationError` / `PermissionDeniedError`, with nothing sent upstream; a good key works on
every surface (chat, models, passthrough, plan) and is never forwarded to the upstream, which gets
the gateway-held key or no credential at all.

In-process (tests/in_process.py); a real `compactgate serve` shows the 401 comes before the body.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config import parse_config
from gateway.http import auth as auth_module
from gateway.http.auth import Authenticator, Identity, open_relay_warning, presented_key
from tests.conftest import GatewayProcess
from tests.fake_upstream import FakeUpstream
from tests.gateway_process import gateway_process
from tests.in_process import AppGateway, AppStarter, LocalUpstream

ALPHA = "sk-gw-alpha-0123456789"
BETA = "sk-gw-beta-9876543210"
UPSTREAM_KEY = "sk-upstream-held-by-the-gateway"
SMALL = [{"role": "user", "content": "Say hi."}]


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def auth_config(fake: FakeUpstream | LocalUpstream) -> dict[str, Any]:
    def model(name: str, **upstream: Any) -> dict[str, Any]:
        return {
            "name": name,
            "upstream": {"base_url": fake.base_url, **upstream},
            "context_window": 100_000,
        }

    return {
        "auth": {
            "keys": [
                {"key_sha256": sha256(ALPHA), "tenant": "alpha", "models": ["m", "gpt-*"]},
                {"key_sha256": sha256(BETA).upper(), "tenant": "beta"},  # models default: all
            ]
        },
        "models": [model("m"), model("held", api_key="${UPSTREAM_KEY}"), model("gpt-*")],
    }


@pytest.fixture(scope="module")
def gateway(
    fake_upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    config = auth_config(fake_upstream_server)
    with gateway_process(
        config, tmp_path_factory.mktemp("auth"), env={"UPSTREAM_KEY": UPSTREAM_KEY}
    ) as gw:
        yield gw


@pytest.fixture
async def app(start_app: AppStarter, local_upstream: LocalUpstream) -> AppGateway:
    return await start_app(auth_config(local_upstream), env={"UPSTREAM_KEY": UPSTREAM_KEY})


def client(gw: AppGateway, key: str) -> openai.AsyncOpenAI:
    return gw.openai(api_key=key, timeout=20)


def upstream_headers(fake: LocalUpstream) -> dict[str, str]:
    [recorded] = fake.requests()
    return {k.lower(): v for k, v in recorded["headers"]}


def assert_openai_error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    return error


# -- end to end --------------------------------------------------------------------------------


async def test_no_key_or_a_wrong_key_is_401_and_nothing_goes_upstream(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    body = {"model": "m", "messages": SMALL}
    no_key = await app.http.post(f"{app.base_url}/chat/completions", json=body)
    error = assert_openai_error(no_key, 401, "invalid_api_key")
    assert error["type"] == "authentication_error"
    for wrong in (f"Basic {ALPHA}", "Bearer", f"Bearer {ALPHA}x", f"Bearer {sha256(ALPHA)}"):
        response = await app.http.post(
            f"{app.base_url}/chat/completions", json=body, headers={"authorization": wrong}
        )
        assert_openai_error(response, 401, "invalid_api_key")
    with pytest.raises(openai.AuthenticationError) as info:
        await client(app, "sk-not-a-gateway-key").chat.completions.create(model="m", messages=SMALL)
    assert info.value.status_code == 401
    assert local_upstream.requests() == []


async def test_a_good_key_works_and_is_never_forwarded(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    reply = await client(app, ALPHA).chat.completions.create(model="m", messages=SMALL)
    assert reply.choices[0].message.content
    headers = upstream_headers(local_upstream)
    assert "authorization" not in headers and "api-key" not in headers
    assert ALPHA not in str(local_upstream.requests())

    local_upstream.reset()
    await client(app, BETA).chat.completions.create(model="held", messages=SMALL)
    assert upstream_headers(local_upstream)["authorization"] == f"Bearer {UPSTREAM_KEY}"

    local_upstream.reset()  # Azure's header works too, and is not forwarded either
    response = await app.http.post(
        f"{app.base_url}/chat/completions",
        json={"model": "m", "messages": SMALL},
        headers={"api-key": BETA},
    )
    assert response.status_code == 200
    assert BETA not in str(local_upstream.requests())


async def test_a_model_outside_the_keys_globs_is_403(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    alpha = client(app, ALPHA)
    for model in ("held", "claude-3", "M"):  # configured, unknown, and case matters
        with pytest.raises(openai.PermissionDeniedError) as info:
            await alpha.chat.completions.create(model=model, messages=SMALL)
        assert info.value.status_code == 403
        assert info.value.body["code"] == "model_not_allowed"
        assert info.value.body["param"] == "model"
    assert local_upstream.requests() == []
    assert (await alpha.chat.completions.create(model="gpt-4o-mini", messages=SMALL)).choices
    beta = client(app, BETA)
    assert (await beta.chat.completions.create(model="held", messages=SMALL)).choices


async def test_models_list_shows_only_what_the_key_may_use(app: AppGateway) -> None:
    assert [m.id for m in (await client(app, ALPHA).models.list()).data] == ["m"]
    assert [m.id for m in (await client(app, BETA).models.list()).data] == ["m", "held"]
    with pytest.raises(openai.AuthenticationError):
        await client(app, "sk-wrong").models.list()


async def test_passthrough_needs_a_key_and_never_forwards_it(
    app: AppGateway, local_upstream: LocalUpstream
) -> None:
    with pytest.raises(openai.AuthenticationError):
        await client(app, "sk-wrong").embeddings.create(model="m", input="hello")
    assert (await app.http.get(f"{app.base_url}/files/abc")).status_code == 401
    assert local_upstream.requests() == []
    assert (await client(app, ALPHA).embeddings.create(model="m", input="hello")).data
    assert "authorization" not in upstream_headers(local_upstream)
    with pytest.raises(openai.PermissionDeniedError):
        await client(app, ALPHA).embeddings.create(model="held", input="hello")


async def test_plan_needs_a_key(app: AppGateway) -> None:
    body = {"model": "m", "messages": SMALL}
    assert_openai_error(
        await app.http.post(f"{app.base_url}/compactgate/plan", json=body),
        401,
        "invalid_api_key",
    )
    ok = await app.http.post(
        f"{app.base_url}/compactgate/plan",
        json=body,
        headers={"authorization": f"Bearer {ALPHA}"},
    )
    assert ok.status_code == 200 and ok.json()["model"] == "m"
    denied = await app.http.post(
        f"{app.base_url}/compactgate/plan",
        json={**body, "model": "held"},
        headers={"authorization": f"Bearer {ALPHA}"},
    )
    assert_openai_error(denied, 403, "model_not_allowed")


async def test_plan_with_an_admin_token_and_keys_takes_each_in_its_own_header(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """The plan endpoint is an admin surface that acts for a tenant: the caller's key goes in
    `Authorization`, the admin token in `x-compactgate-admin-token`; neither stands in for the
    other, and the admin token never reaches the upstream or the log."""
    admin = "admin-s3cret-token"
    config = auth_config(local_upstream)
    gw = await start_app(
        {**config, "server": {"admin_token": admin}}, env={"UPSTREAM_KEY": UPSTREAM_KEY}
    )
    plan_url = f"{gw.base_url}/compactgate/plan"
    body = {"model": "m", "messages": SMALL}

    async def plan(**headers: str) -> httpx.Response:
        return await gw.http.post(plan_url, json=body, headers=headers)

    key = {"authorization": f"Bearer {ALPHA}"}
    token = {"x-compactgate-admin-token": admin}
    assert_openai_error(await plan(**key), 401, "invalid_admin_token")
    assert_openai_error(await plan(**token), 401, "invalid_api_key")
    assert_openai_error(
        await plan(**key, **{"x-compactgate-admin-token": "wrong"}), 401, "invalid_admin_token"
    )
    both = await plan(**key, **token)
    assert both.status_code == 200, both.text
    assert both.json()["model"] == "m"
    # the other admin surfaces take either header, as before
    for headers in (token, {"authorization": f"Bearer {admin}"}):
        assert (await gw.http.get(f"{gw.url}/metrics", headers=headers)).status_code == 200
    assert_openai_error(await gw.http.get(f"{gw.url}/metrics"), 401, "invalid_admin_token")
    # a client that sends the admin header on the proxy path does not leak it upstream
    chat = await gw.http.post(
        f"{gw.base_url}/chat/completions", json=body, headers={**key, **token}
    )
    assert chat.status_code == 200, chat.text
    assert "x-compactgate-admin-token" not in upstream_headers(local_upstream)
    assert admin not in gw.logs()


def test_401_comes_before_the_body_is_read(
    gateway: GatewayProcess, fake_upstream: FakeUpstream
) -> None:
    """An unauthenticated client cannot make the gateway wait for (or buffer) a large body."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 30000000\r\n\r\n{"model":'
        )
        started = time.monotonic()
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:200]
    assert time.monotonic() - started < 5


# -- units -------------------------------------------------------------------------------------


def scope(*headers: tuple[str, str]) -> dict[str, Any]:
    return {"headers": [(k.lower().encode(), v.encode()) for k, v in headers]}


def keys_config(**extra: Any) -> Any:
    keys = [
        {"key_sha256": sha256(k), "tenant": t}
        for k, t in (("k1", "one"), ("k2", "two"), ("k3", "three"))
    ]
    return parse_config({"auth": {"keys": keys}, **extra})


def test_every_configured_hash_is_compared_even_after_a_match(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[bytes] = []
    real = auth_module.hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return real(a, b)

    monkeypatch.setattr(auth_module.hmac, "compare_digest", counting)
    authenticator = Authenticator(keys_config())
    assert authenticator.identify(scope(("authorization", "Bearer k1"))).tenant == "t:one"
    assert len(calls) == 3  # the first entry matched; the other two were still compared
    calls.clear()
    with pytest.raises(auth_module.AuthenticationError):
        authenticator.identify(scope(("authorization", "Bearer nope")))
    assert len(calls) == 3


def test_without_keys_the_tenant_is_a_hash_of_the_credential() -> None:
    authenticator = Authenticator(parse_config({}))
    a1 = authenticator.identify(scope(("authorization", "Bearer sk-a")))
    a2 = authenticator.identify(scope(("authorization", "Bearer sk-a")))
    b = authenticator.identify(scope(("authorization", "Bearer sk-b")))
    azure = authenticator.identify(scope(("api-key", "sk-a")))
    assert a1 == a2 and a1.tenant != b.tenant and azure.tenant != a1.tenant
    assert "sk-a" not in a1.tenant and a1.tenant.startswith("k:")
    assert a1.may_use("anything")
    headers = [(b"authorization", b"Bearer sk-a")]
    assert authenticator.upstream_headers(headers) == headers  # the client's key goes upstream


def test_tenant_header_is_honoured_only_without_keys() -> None:
    open_gateway = Authenticator(parse_config({"tenant_header": "X-Tenant"}))
    assert open_gateway.identify(scope(("x-tenant", "acme"))).tenant == "h:acme"
    keyed = Authenticator(keys_config(tenant_header="X-Tenant"))
    identity = keyed.identify(scope(("x-tenant", "two"), ("authorization", "Bearer k1")))
    assert identity.tenant == "t:one"  # a client cannot claim another tenant's state
    stripped = keyed.upstream_headers(
        [
            (b"authorization", b"Bearer k1"),
            (b"api-key", b"k1"),
            (b"x-api-key", b"k1"),
            (b"x-ok", b"1"),
        ]
    )
    assert stripped == [(b"x-ok", b"1")]


def _first(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes:
    return next((value for key, value in headers if key == name), b"")


def _tenant_by_the_rule(headers: list[tuple[bytes, bytes]], tenant_header: bytes | None) -> str:
    """The rule as the module's docstring states it, header by header."""
    if tenant_header is not None and (named := _first(headers, tenant_header)):
        return "h:" + named.decode("latin-1")
    credential = b""
    for name in auth_module.CREDENTIAL_HEADERS:
        if credential := _first(headers, name):
            break
    return "k:" + hashlib.sha256(credential).hexdigest()[:32]


_header_lists = st.lists(
    st.tuples(
        st.sampled_from([b"authorization", b"api-key", b"x-api-key", b"x-tenant", b"x-other"]),
        st.sampled_from([b"", b"Bearer a", b"b", b"acme", b"\xe9t\xe9"]),
    ),
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_header_lists, min_size=1, max_size=8), st.booleans())
def test_an_open_gateway_names_every_request_s_tenant_by_the_rule(
    requests: list[list[tuple[bytes, bytes]]], with_header: bool
) -> None:
    """Without keys, the tenant is the tenant header's first value when it is set and not empty,
    else the hash of the first credential header (in the list's order) whose first value is not
    empty: for any headers, repeats and empty values, however many requests came before."""
    config = parse_config({"tenant_header": "X-Tenant"} if with_header else {})
    authenticator = Authenticator(config)
    for headers in requests:
        expected = _tenant_by_the_rule(headers, b"x-tenant" if with_header else None)
        assert authenticator.identify({"headers": headers}).tenant == expected


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ((("authorization", "Bearer abc"),), b"abc"),
        ((("authorization", "bearer   abc  "),), b"abc"),
        ((("authorization", "Basic abc"),), None),
        ((("authorization", "Bearer"),), None),
        ((("api-key", " abc "),), b"abc"),
        ((("x-api-key", "abc"),), b"abc"),  # Anthropic clients (Claude Code, the SDK)
        ((), None),
    ],
)
def test_presented_key(headers: tuple[tuple[str, str], ...], key: bytes | None) -> None:
    assert presented_key(scope(*headers)) == key


def test_identity_globs() -> None:
    identity = Identity("t:x", ("gpt-4o*", "m"))
    assert identity.may_use("gpt-4o-mini") and identity.may_use("m")
    assert not identity.may_use("gpt-4") and not identity.may_use("mm")


# -- the open-relay warning at start-up ----------------------------------------------------------


def relay_config(*upstreams: dict[str, Any], keys: bool = False) -> Any:
    models = [{"name": f"m{i}", "upstream": up} for i, up in enumerate(upstreams)]
    auth = {"keys": [{"key_sha256": sha256("k1"), "tenant": "one"}]} if keys else None
    return parse_config({"models": models, "auth": auth})


HELD = {"base_url": "http://llm.internal/v1", "api_key": "sk-held"}
PASSED = {"base_url": "http://llm.internal/v1"}


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "gateway.example.com"])
def test_a_held_key_without_gateway_keys_on_a_network_address_warns(host: str) -> None:
    warning = open_relay_warning(relay_config(PASSED, HELD), host, {})
    assert warning is not None
    assert host in warning and "m1" in warning and "m0" not in warning
    assert "auth.keys" in warning and "compactgate hash-key" in warning
    assert "sk-held" not in warning


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_not_an_open_relay(host: str) -> None:
    assert open_relay_warning(relay_config(HELD), host, {}) is None


def test_gateway_keys_or_client_credentials_are_not_an_open_relay() -> None:
    assert open_relay_warning(relay_config(HELD, keys=True), "0.0.0.0", {}) is None
    # The client's own credential is forwarded: the gateway spends nothing of its own, even with
    # a provider key in its environment (an openai-provider route never reads it).
    env = {"OPENAI_API_KEY": "sk-env"}
    assert open_relay_warning(relay_config(PASSED), "0.0.0.0", env) is None


def test_credentials_held_in_headers_or_the_environment_count() -> None:
    in_headers = {**PASSED, "headers": {"X-Api-Key": "sk-held"}}
    warning = open_relay_warning(relay_config(in_headers), "0.0.0.0", {})
    assert warning is not None and "upstream.headers" in warning
    litellm = {"provider": "litellm", "model": "anthropic/claude-sonnet-4"}
    assert open_relay_warning(relay_config(litellm), "0.0.0.0", {}) is None
    env = {"ANTHROPIC_API_KEY": "sk-ant-env-secret", "HOME": "/root"}
    warning = open_relay_warning(relay_config(litellm), "0.0.0.0", env)
    assert warning is not None and "ANTHROPIC_API_KEY" in warning
    assert "sk-ant-env-secret" not in warning
