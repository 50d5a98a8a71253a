"""What operators see (design D17): shadow mode, the event log, admin gates.

In-process (tests/in_process.py) where the app alone shows it; a real `compactgate serve` for a
second port, the process's own output, and the page in a browser.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from gateway.config import parse_config
from gateway.ops.metrics import Metrics
from gateway.path.calibration import Calibration
from gateway.routing import Router
from gateway.version import version
from tests.conftest import GatewayProcess, GatewayStarter, free_port
from tests.fake_upstream import FakeUpstream
from tests.in_process import AppStarter, LocalUpstream


def long_history(turns: int = 20) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}]
    for t in range(turns):
        messages += [
            {"role": "user", "content": f"turn {t}: " + "please look " * 40},
            {"role": "assistant", "content": f"answer {t}: " + "looked " * 60},
        ]
    messages.append({"role": "user", "content": "and now?"})
    return messages


def model(fake: FakeUpstream | LocalUpstream, **extra: Any) -> dict[str, Any]:
    return {
        "name": "m",
        "upstream": {"base_url": fake.base_url},
        "context_window": 3000,
        "max_output_tokens": 200,
        "tokenizer": "chars:4",
        "policy": "p",
        **extra,
    }


POLICIES = {"p": {"steps": [{"type": "fifo"}]}}


def log_lines(log: Path, count: int) -> list[str]:
    """The event log's lines once it has `count` (events are written just after the response)."""
    deadline = time.monotonic() + 10
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


async def log_lines_async(log: Path, count: int) -> list[str]:
    """log_lines, letting the app in this event loop run meanwhile."""
    deadline = time.monotonic() + 10
    while True:
        lines = log.read_text().splitlines() if log.exists() else []
        if len(lines) >= count or time.monotonic() > deadline:
            return lines
        await asyncio.sleep(0.05)


async def test_shadow_mode_forwards_the_original_and_reports_what_it_would_do(
    start_app: AppStarter, local_upstream: LocalUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    gw = await start_app(
        {
            "mode": "observe",
            "events": {"path": str(log)},
            "models": [model(local_upstream)],
            "policies": POLICIES,
        }
    )
    raw = json.dumps({"model": "m", "messages": long_history()}).encode()
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions",
        content=raw,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == 200
    assert response.headers["x-compactgate-would-steps"] == "fifo"
    before = int(response.headers["x-compactgate-would-tokens-before"])
    assert int(response.headers["x-compactgate-would-tokens-after"]) < before
    assert "x-compactgate-steps" not in response.headers
    [recorded] = local_upstream.chat_requests()
    assert base64.b64decode(recorded["body_b64"]) == raw  # untouched
    [event] = [json.loads(line) for line in await log_lines_async(log, 1)]
    assert event["mode"] == "observe" and event["steps"][0]["type"] == "fifo"
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    assert "compactgate_tokens_saved_total" not in metrics.replace(
        "# HELP compactgate_tokens_saved_total", ""
    ).replace("# TYPE compactgate_tokens_saved_total", "")  # nothing was saved in shadow mode


async def test_event_log_has_one_line_per_compacted_request_with_phases_and_reward(
    start_app: AppStarter, local_upstream: LocalUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    gw = await start_app(
        {"events": {"path": str(log)}, "models": [model(local_upstream)], "policies": POLICIES}
    )
    small = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert (await gw.http.post(f"{gw.base_url}/chat/completions", json=small)).status_code == 200
    big = {"model": "m", "messages": long_history()}
    response = await gw.http.post(
        f"{gw.base_url}/chat/completions", json=big, headers={"x-request-id": "req-42"}
    )
    assert response.headers["x-compactgate-steps"] == "fifo"
    lines = await log_lines_async(log, 1)
    await asyncio.sleep(0.3)  # nothing more arrives for the small request
    lines = log.read_text().splitlines()
    assert len(lines) == 1  # the small request was not compacted: no event
    event = json.loads(lines[0])
    assert event["request_id"] == "req-42" and event["model"] == "m" and event["status"] == 200
    assert event["tokens_before"] > event["tokens_after"] > 0
    assert event["phases"] == ["detection", "fifo", "success"]
    assert event["messages_removed"] > 0 and event["retries"] == 0
    assert 1.0 < event["reward"] <= 2.0
    assert "messages" not in event  # content only with log_content: true
    feed = (await gw.http.get(f"{gw.base_url}/compactgate/events")).json()
    assert feed["events"][-1]["request_id"] == "req-42"
    assert feed["totals"]["requests"] == 2 and feed["totals"]["compacted"] == 1
    assert feed["totals"]["tokens_saved"] == event["tokens_before"] - event["tokens_after"]


async def test_event_log_content_only_when_asked(
    start_app: AppStarter, local_upstream: LocalUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    gw = await start_app(
        {
            "events": {"path": str(log), "log_content": True},
            "models": [model(local_upstream)],
            "policies": POLICIES,
        }
    )
    await gw.http.post(
        f"{gw.base_url}/chat/completions", json={"model": "m", "messages": long_history()}
    )
    event = json.loads((await log_lines_async(log, 1))[0])
    assert event["messages"][-1] == {"role": "user", "content": "and now?"}


def guarded(upstream: LocalUpstream) -> dict[str, Any]:
    """The test config with the admin surfaces behind the token `s3cret`."""
    return {"server": {"admin_token": "s3cret"}, "models": [model(upstream)], "policies": POLICIES}


async def test_admin_token_guards_admin_surfaces_only(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(guarded(local_upstream))
    http = gw.http
    for path in ("/metrics", "/ui", "/v1/compactgate/events"):
        refused = await http.get(gw.url + path)
        assert refused.status_code == 401 and refused.json()["error"]["message"]
        assert (
            await http.get(gw.url + path, headers={"authorization": "Bearer s3cret"})
        ).status_code == 200
    assert (await http.get(gw.url + "/ui?token=s3cret")).status_code == 200
    assert (await http.get(gw.url + "/ui?token=wrong")).status_code == 401
    plan = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert (await http.post(gw.base_url + "/compactgate/plan", json=plan)).status_code == 401
    assert (await http.get(gw.url + "/healthz")).status_code == 200
    # the proxy itself does not need the admin token
    chat = await http.post(
        gw.base_url + "/chat/completions",
        json=plan,
        headers={"authorization": "Bearer sk-user"},
    )
    assert chat.status_code == 200
    assert "s3cret" not in gw.logs()


async def test_a_browser_without_the_admin_token_gets_a_page_saying_how_to_pass_it(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(guarded(local_upstream))
    browser = {"accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}
    page = await gw.http.get(gw.url + "/ui", headers=browser)
    assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
    text = page.text
    assert "/ui?token=" in text and "x-compactgate-admin-token" in text
    assert "Authorization: Bearer" in text and 'name="token"' in text  # a form to type it in
    wrong = await gw.http.get(gw.url + "/ui?token=nope", headers=browser)
    assert wrong.status_code == 401 and "not this gateway's admin token" in wrong.text
    assert "s3cret" not in text + wrong.text
    # API clients keep the JSON error, which names every way to pass the token
    for path in ("/ui", "/v1/compactgate/overview", "/metrics"):
        refused = await gw.http.get(gw.url + path, headers={"accept": "application/json"})
        assert refused.status_code == 401
        message = refused.json()["error"]["message"]
        assert "?token=" in message and "x-compactgate-admin-token" in message
    ok = await gw.http.get(gw.url + "/ui?token=s3cret", headers=browser)
    assert ok.status_code == 200 and 'id="models"' in ok.text


async def test_overview_counts_every_request_by_model_api_and_tenant(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    """What /ui shows, from its JSON feed: per model and API, errors with reasons, latency
    percentiles, context errors avoided as retries that were answered, costs, windows."""
    priced = model(local_upstream, pricing={"input": 2.0, "output": 8.0})
    roomy = {**model(local_upstream), "name": "roomy", "context_window": 100_000}
    del roomy["policy"]
    gw = await start_app({"models": [priced, roomy], "policies": POLICIES})
    client = gw.openai(max_retries=0)
    for _ in range(2):  # compacted
        await client.chat.completions.create(model="m", messages=long_history())
    await client.chat.completions.create(model="roomy", messages=long_history(2))
    await client.responses.create(model="m", input="hello")
    await gw.anthropic(max_retries=0).messages.create(
        model="m", max_tokens=50, messages=[{"role": "user", "content": "hi"}]
    )
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=long_history(1))
    # the upstream's window is smaller than configured: refused, compacted harder, answered
    local_upstream.script([{"kind": "context_limit", "limit": 150, "style": "openai"}])
    await client.chat.completions.create(model="roomy", messages=long_history(6))
    response = await gw.http.get(f"{gw.url}/v1/compactgate/overview?range=all")
    assert response.status_code == 200
    data = response.json()
    view = data["overview"]
    rows = {r["key"]: r for r in view["models"]}
    assert rows["m"]["requests"] == 4 and rows["m"]["errors"] == 0
    assert rows["m"]["compacted"] == 2 and rows["m"]["tokens_saved"] > 0
    assert rows["roomy"]["requests"] == 2 and rows["roomy"]["context_errors_avoided"] == 1
    assert rows["roomy"]["retries"] == 1
    assert rows["-"]["errors"] == 1 and rows["-"]["reasons"] == {"unknown_model": 1}
    for r in rows.values():
        assert r["p50_ms"] <= r["p99_ms"] and r["overhead_p50_ms"] <= r["overhead_p99_ms"]
    apis = {r["key"]: r["requests"] for r in view["apis"]}
    assert apis == {"chat": 5, "responses": 1, "messages": 1}
    assert view["totals"]["requests"] == 7 and view["totals"]["context_errors_avoided"] == 1
    metrics = (await gw.http.get(f"{gw.url}/metrics")).text
    recovered = 'compactgate_context_errors_avoided_total{model="roomy"}'
    assert exposition_value(metrics, recovered) == 1  # the same fact Grafana shows
    assert data["since_start"]["context_errors_avoided"] == 1
    # m is priced, roomy is not: the total is partial, never a zero for roomy
    assert rows["m"]["cost_usd"] > 0 and rows["m"]["unpriced"] == 0
    assert rows["roomy"]["cost_usd"] == 0 and rows["roomy"]["unpriced"] == 2
    costs = view["costs"]
    assert costs["partial"] and costs["unpriced"] == 2 and costs["answered"] == 6
    assert costs["counterfactual_usd"] > costs["actual_usd"] > 0
    windows = {w["model"]: w for w in data["windows"]}
    assert windows["roomy"]["learned"] == 150 and windows["roomy"]["effective"] == 150
    assert windows["m"]["configured"] == 3000 and windows["m"]["learned"] is None
    latest = data["requests"][0]
    assert latest["model"] == "roomy" and latest["context_error_avoided"]
    event = next(e for e in data["events"] if e["seq"] == latest["event"])
    assert event["retries"] == 1 and event["context_errors"]
    short = (await gw.http.get(f"{gw.url}/v1/compactgate/overview?range=1s")).json()
    await asyncio.sleep(1.1)
    later = (await gw.http.get(f"{gw.url}/v1/compactgate/overview?range=1s")).json()
    assert later["overview"]["totals"]["requests"] == 0 <= short["overview"]["totals"]["requests"]
    bad = await gw.http.get(f"{gw.url}/v1/compactgate/overview?range=soon")
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "range"


async def test_overview_shows_summary_cache_summariser_health_and_own_spend(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    summarising = {
        **model(local_upstream, pricing={"input": 1.0, "output": 4.0}),
        "context_window": 4096,
        "policy": "summ",
    }
    gw = await start_app(
        {
            "models": [summarising],
            "policies": {
                "summ": {"steps": [{"type": "compaction", "summary_tokens": 200}, {"type": "fifo"}]}
            },
            "summaries": {"wait_s": 30, "precompute": False},
        }
    )
    client = gw.openai(max_retries=0)
    await client.chat.completions.create(model="m", messages=long_history(30))
    data = (await gw.http.get(f"{gw.url}/v1/compactgate/overview?range=all")).json()
    summaries = data["summaries"]
    assert summaries["calls"].get("ok", 0) >= 1 and summaries["health"] == "healthy"
    hits, misses = summaries["cache_hits"], summaries["cache_misses"]
    assert misses >= 1 and summaries["cache_hit_rate"] == hits / (hits + misses)
    assert summaries["mean_ms"] > 0
    costs = data["overview"]["costs"]
    assert costs["own_calls"] == summaries["calls"]["ok"] and costs["own_unpriced"] == 0
    assert costs["own_usd"] > 0
    assert costs["net_saved_usd"] == pytest.approx(
        costs["counterfactual_usd"] - costs["actual_usd"] - costs["own_usd"]
    )


def test_admin_port_separates_admin_surfaces(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    admin_port = free_port()
    gw = start_gateway(
        {
            "server": {"admin_port": admin_port},
            "models": [model(fake_upstream)],
            "policies": POLICIES,
        }
    )
    admin = f"http://127.0.0.1:{admin_port}"
    assert httpx.get(gw.url + "/metrics").status_code == 404
    assert httpx.get(admin + "/metrics").status_code == 200
    assert httpx.get(admin + "/ui").status_code == 200
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(gw.base_url + "/chat/completions", json=chat, timeout=20).status_code == 200
    assert httpx.post(admin + "/v1/chat/completions", json=chat, timeout=20).status_code == 404
    assert (
        httpx.get(admin + "/healthz").status_code == 200
        and httpx.get(gw.url + "/healthz").status_code == 200
    )


def test_api_keys_never_reach_logs_or_metrics(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream, tmp_path: Path
) -> None:
    log = tmp_path / "events.jsonl"
    gw = start_gateway(
        {
            "events": {"path": str(log), "log_content": True},
            "models": [model(fake_upstream)],
            "policies": POLICIES,
        },
        args=("--log-level", "debug"),
    )
    secret = "sk-live-abcdef0123456789"
    for body in (
        {"model": "m", "messages": long_history()},
        {"model": "unknown", "messages": [{"role": "user", "content": "x"}]},
    ):
        httpx.post(
            f"{gw.base_url}/chat/completions",
            json=body,
            headers={"authorization": f"Bearer {secret}"},
            timeout=20,
        )
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert log_lines(log, 1)  # the compacted request's event, with content, is there to search
    for place in (metrics, gw.output(), log.read_text()):
        assert secret not in place and "abcdef0123456789" not in place


def operator_traffic(gw: GatewayProcess, fake: FakeUpstream) -> dict[str, int]:
    """Real clients through a real gateway: chat, responses and messages on a priced model `m`
    (compacted and not), on `big` (no price known), an unknown model, and a context error the
    upstream raises that the gateway recovers. Returns the requests per model."""
    chat = openai.OpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0, timeout=30)
    claude = anthropic.Anthropic(base_url=gw.url, api_key="sk-test", max_retries=0, timeout=30)
    history = long_history()
    turns = history[1:]  # Messages takes the system prompt apart
    with chat, claude:
        for _ in range(3):
            chat.chat.completions.create(model="m", messages=history)
        for _ in chat.chat.completions.create(model="m", messages=history[-1:], stream=True):
            pass
        claude.messages.create(
            model="m", max_tokens=50, system=history[0]["content"], messages=turns
        )
        claude.messages.create(model="big", max_tokens=50, messages=turns[-1:])
        chat.responses.create(model="m", input=history)
        chat.responses.create(model="big", input="hello")
        with pytest.raises(openai.NotFoundError):
            chat.chat.completions.create(model="nope", messages=history[-1:])
        # the upstream's real window is smaller than configured: refused, compacted, answered
        fake.script([{"kind": "context_limit", "limit": 150, "style": "openai"}])
        retried = chat.chat.completions.with_raw_response.create(
            model="big", messages=long_history(6)
        )
        assert retried.headers["x-compactgate-retries"] == "1"
    return {"m": 6, "big": 3, "-": 1}


def open_detail(page: Any, rows: Any, title: str) -> str:
    """Click the first of `rows` and return the drill-down's text once it shows that row (the
    tables are redrawn every refresh, so a click can land on a row being replaced: retried)."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for _ in range(5):
        row = rows.first
        key = row.get_attribute("data-request") or row.get_attribute("data-seq") or ""
        row.click()
        try:
            page.wait_for_function(
                """([title, key]) => {
                    const shown = document.querySelector("#detail");
                    const text = document.querySelector("#detail-title").textContent;
                    return !shown.hidden && text === title + key;
                }""",
                arg=[title, key],
                timeout=3_000,
            )
        except PlaywrightTimeout:  # the click landed on a row being redrawn
            continue
        return str(page.inner_text("#detail"))
    raise AssertionError(f"the drill-down never showed {title}")


@pytest.mark.slow
def test_ui_shows_an_operator_what_real_traffic_did_in_a_real_browser(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    """Chromium on /ui of a real gateway after real chat, responses and messages traffic: the
    token page, per-model rows matching the traffic, the API breakdown, costs (priced, and
    unknown where no price is known), the drill-down, live updates and time ranges."""
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="python playwright is installed by .ci/run"
    )
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.fail("Debian's chromium package is missing: .ci/run installs it")
    priced = model(fake_upstream, pricing={"input": 3.0, "output": 15.0})
    big = {**model(fake_upstream), "name": "big", "context_window": 100_000}
    del big["policy"]
    gw = start_gateway(
        {"server": {"admin_token": "s3cret"}, "models": [priced, big], "policies": POLICIES}
    )
    per_model = operator_traffic(gw, fake_upstream)
    first_done = time.monotonic()
    artifacts = Path(__file__).resolve().parent.parent / "artifacts"
    artifacts.mkdir(exist_ok=True)
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(chromium),
            args=[
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.on("pageerror", lambda error: errors.append(str(error)))
            # without the token: a page that says how to pass it, with a form to type it in
            refused = page.goto(f"{gw.url}/ui")
            assert refused is not None and refused.status == 401
            assert "/ui?token=" in page.inner_text("body")
            page.fill("input[name=token]", "s3cret")
            page.press("input[name=token]", "Enter")
            page.wait_for_selector("#models tr[data-model]", timeout=15_000)
            assert "token" not in page.url  # kept for the tab, out of the address bar

            def cell(table: str, key: str, value: str, col: str) -> str:
                return page.inner_text(f'#{table} tr[data-{key}="{value}"] td[data-col="{col}"]')

            def requests_of(value: str) -> int | None:
                row = page.locator(f'#models tr[data-model="{value}"]')
                return int(cell("models", "model", value, "requests")) if row.count() else None

            page.click('#range button[data-range="all"]')
            page.wait_for_function("document.body.dataset.range === 'all'", timeout=10_000)
            for name, count in per_model.items():
                assert requests_of(name) == count, name
            assert cell("models", "model", "m", "errors") == "0"
            assert "unknown_model" in cell("models", "model", "-", "errors")
            for col in ("p50", "p99", "overhead"):
                assert "ms" in cell("models", "model", "m", col) or " s" in cell(
                    "models", "model", "m", col
                )
            assert int(cell("models", "model", "m", "compacted")) == 5
            assert cell("models", "model", "big", "avoided") == "1"
            assert page.inner_text("#avoided") == "1"
            apis = {
                api: int(cell("apis", "api", api, "requests"))
                for api in ("chat", "responses", "messages")
            }
            assert apis == {"chat": 6, "responses": 2, "messages": 2}
            assert page.locator("#tenants tr[data-tenant]").count() == 1
            assert (
                cell(
                    "tenants",
                    "tenant",
                    page.get_attribute("#tenants tr[data-tenant]", "data-tenant") or "",
                    "requests",
                )
                == "10"
            )
            # costs: m is priced, big is not (unknown, never $0), so the totals are partial
            assert cell("models", "model", "m", "cost").startswith("$0.0")
            assert cell("models", "model", "big", "cost") == "unknown"
            for card in ("#cost-actual", "#cost-counterfactual", "#cost-net"):
                assert page.inner_text(card).startswith("$"), card
                assert "partial" in (page.get_attribute(card, "class") or ""), card
            assert "partial" in page.inner_text("#cost-note")
            assert page.inner_text('#windows tr[data-model="big"] td[data-col="learned"]') == "150"
            assert page.inner_text("#summariser-health") == "idle"
            # drill-down: a compacted request opens with its steps, tokens and cost
            on_m = page.locator('td[data-col="model"]', has_text=re.compile("^m$"))
            compacted = page.locator("#requests tr[data-request]", has=on_m, has_text="fifo")
            detail = open_detail(page, compacted, "Request ").lower()
            assert "compaction event #" in detail and "tokens before → after" in detail
            assert page.locator('#detail tr[data-step="fifo"]').count() >= 1
            assert "$0.0" in detail and "agent compaction" in detail
            page.click("#detail-close")
            assert page.locator("#detail").is_hidden()
            recovered = page.locator("#requests tr[data-request]", has_text="big").filter(
                has=page.locator('td[data-col="retries"]', has_text="1")
            )
            assert "recovered by a retry" in open_detail(page, recovered, "Request ")
            page.keyboard.press("Escape")
            event = page.locator("#events tr[data-seq]")
            assert "steps" in open_detail(page, event, "Compaction event #").lower()
            page.keyboard.press("Escape")
            # live: later traffic appears without reloading
            time.sleep(max(0.0, first_done + 10 - time.monotonic()))
            second_started = time.monotonic()
            with openai.OpenAI(base_url=gw.base_url, api_key="sk-test", max_retries=0) as chat:
                chat.chat.completions.create(model="m", messages=long_history(25))
                chat.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}]
                )
            page.wait_for_function(
                """document.querySelector('#models tr[data-model="m"] td[data-col="requests"]')
                   .textContent === '8'""",
                timeout=10_000,
            )
            # a range covering only the second batch counts only it; a wider one, both
            span = math.ceil(time.monotonic() - second_started) + 4
            assert span < time.monotonic() - first_done  # the first batch is outside it
            page.fill("#range-custom", f"{span}s")
            page.press("#range-custom", "Enter")
            page.wait_for_function(f"document.body.dataset.range === '{span}s'", timeout=10_000)
            assert requests_of("m") == 2 and requests_of("big") is None
            assert page.inner_text("#requests-total") == "2"
            assert page.inner_text("#avoided") == "0"
            page.click('#range button[data-range="5m"]')
            page.wait_for_function("document.body.dataset.range === '5m'", timeout=10_000)
            assert requests_of("m") == 8 and requests_of("big") == 3
            assert page.inner_text("#requests-total") == "12"
            page.screenshot(path=str(artifacts / "ui.png"), full_page=True)
        finally:
            browser.close()
    assert not errors, errors
    assert (artifacts / "ui.png").stat().st_size > 10_000


def exposition_value(text: str, sample: str) -> float:
    """The value of one sample line (`name{labels}`) of a text exposition."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {sample} in the exposition")


def test_metrics_exposition_has_the_estimate_mean_build_info_and_process_metrics() -> None:
    """The mean estimate error is computable (`_sum / _count`), its direction is counted apart,
    no `_created` series double the output, and a scrape says which build and process serve."""
    config = {"models": [{"name": "m", "upstream": {"base_url": "http://x/v1"}}]}
    route = Router(parse_config(config)).resolve("m")
    assert route is not None
    metrics = Metrics()
    calibration = Calibration(metrics)
    for estimated in (90, 110, 120, 100):  # against 100 reported: -10 %, +10 %, +20 %, exact
        calibration.observe(route, estimated, 100)
    text = metrics.render().decode()
    ratio = "compactgate_estimate_error_ratio"
    assert exposition_value(text, f'{ratio}_count{{model="m"}}') == 4
    assert exposition_value(text, f'{ratio}_sum{{model="m"}}') == pytest.approx(0.4)
    assert exposition_value(text, 'compactgate_estimate_under_total{model="m"}') == 1
    assert exposition_value(text, 'compactgate_estimate_over_total{model="m"}') == 2
    assert not [line for line in text.splitlines() if "_created" in line]
    info = [line for line in text.splitlines() if line.startswith("compactgate_build_info{")]
    assert len(info) == 1 and info[0].endswith(" 1.0")
    assert f'version="{version()}"' in info[0] and 'python="' in info[0]
    assert "python_info{" in text
    if Path("/proc/self/stat").exists():  # prometheus-client reads process metrics from /proc
        assert exposition_value(text, "process_resident_memory_bytes") > 0
        assert "process_open_fds " in text
