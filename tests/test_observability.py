"""What operators see (issue 8 items 1-5, R5.1-R5.4): shadow mode, the event log, admin gates.

In-process (tests/in_process.py) where the app alone shows it; a real `compactgate serve` for a
second port, the process's own output, and the page in a browser.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.calibration import Calibration
from gateway.config import parse_config
from gateway.metrics import Metrics
from gateway.routing import Router
from gateway.version import version
from tests.conftest import GatewayStarter, free_port
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


async def test_admin_token_guards_admin_surfaces_only(
    start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    gw = await start_app(
        {
            "server": {"admin_token": "s3cret"},
            "models": [model(local_upstream)],
            "policies": POLICIES,
        }
    )
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


@pytest.mark.slow
def test_ui_page_renders_live_events_in_a_real_browser(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="python playwright is installed by .ci/run"
    )
    chromium = Path("/usr/bin/chromium")
    if not chromium.exists():
        pytest.fail("Debian's chromium package is missing: .ci/run installs it")
    gw = start_gateway({"models": [model(fake_upstream)], "policies": POLICIES})
    for _ in range(3):
        httpx.post(
            f"{gw.base_url}/chat/completions",
            json={"model": "m", "messages": long_history()},
            timeout=20,
        )
    artifacts = Path(__file__).resolve().parent.parent / "artifacts"
    artifacts.mkdir(exist_ok=True)
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
            page = browser.new_page(viewport={"width": 1200, "height": 700})
            page.goto(f"{gw.url}/ui")
            page.wait_for_selector("#events tr[data-seq]", timeout=10_000)
            rows = page.locator("#events tr[data-seq]")
            assert rows.count() == 3
            assert "fifo" in rows.first.inner_text() and "success" in rows.first.inner_text()
            assert page.locator("#compacted").inner_text() == "3"
            assert int(page.locator("#saved").inner_text().rstrip("k").split(".")[0]) > 0
            # live: a new compaction appears without reloading
            httpx.post(
                f"{gw.base_url}/chat/completions",
                json={"model": "m", "messages": long_history(25)},
                timeout=20,
            )
            page.wait_for_function(
                "document.querySelectorAll('#events tr[data-seq]').length === 4", timeout=10_000
            )
            page.screenshot(path=str(artifacts / "ui.png"), full_page=True)
        finally:
            browser.close()
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
