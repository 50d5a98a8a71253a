"""Several workers of one `compactgate serve` (design D13.7): they share state through the store as
replicas do, and a memory store is refused when the config needs sharing.

The two-worker test runs the real CLI on a real redis-server with the fake upstream playing the
model. Which worker accepts a new connection is the kernel's choice, so each turn stops the other
worker (SIGSTOP) while it is sent on a connection of its own, and the request's log line (JSON,
with the writer's pid) says which worker answered.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gateway.cli import main
from gateway.config import parse_config
from gateway.ops.workers import plan_workers
from tests.conftest import GatewayProcess, GatewayStarter, Starter
from tests.fake_upstream import FakeUpstream
from tests.redis_server import start_redis
from tests.test_tool_outputs_e2e import (
    CLIENT_TOOLS,
    LOG_LINES,
    client,
    config_for,
    history,
    internal_call,
    tool_results,
)

UPSTREAM = {"base_url": "http://127.0.0.1:9/v1"}
# Nothing a later request needs: fifo drops turns, remote compaction goes to the upstream.
UNSHARED = {
    "models": [{"name": "m", "upstream": UPSTREAM, "policy": "p", "responses_compact": "native"}],
    "policies": {"p": {"steps": [{"type": "fifo"}]}},
}


def test_a_memory_store_is_refused_when_the_config_needs_sharing() -> None:
    """The default chain masks tool outputs and any upstream but OpenAI's gets the gateway's
    remote compaction: each named, with the way out."""
    config = parse_config({"models": [{"name": "m", "upstream": UPSTREAM}]})
    plan = plan_workers(config, 2)
    text = "\n".join(plan.problems)
    assert "--workers 2 with store memory://" in text
    assert "'m' masks tool outputs behind refs (excerpt, tool_output_cache)" in text
    assert "'m' answers Responses remote compaction itself" in text
    assert "Use a Redis store" in text and "--workers 1" in text
    summarising = parse_config(
        {
            "models": [{**UNSHARED["models"][0], "policy": "s"}],
            "policies": {"s": {"steps": [{"type": "compaction"}]}},
        }
    )
    [need] = plan_workers(summarising, 3).problems[1:-1]
    assert "'m' sends summaries in place of old turns" in need


def test_workers_say_how_they_share() -> None:
    alone = plan_workers(parse_config(UNSHARED), 4)
    assert alone.problems == ()
    assert "each worker keeps its own state" in alone.line
    shared = plan_workers(
        parse_config({"models": [{"name": "m", "upstream": UPSTREAM}], "store": "redis://h:1/0"}),
        2,
    )
    assert shared.problems == () and "sharing state through the store redis://h:1/0" in shared.line
    assert plan_workers(parse_config({"models": [{"name": "m", "upstream": UPSTREAM}]}), 1).line


def test_serve_refuses_before_any_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps({"models": [{"name": "m", "upstream": UPSTREAM}]}))
    assert main(["serve", "--config", str(path), "--workers", "2"]) == 2
    assert "masks tool outputs behind refs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--workers", "0"])
    assert "must be 1 or more" in capsys.readouterr().err


@pytest.mark.slow
def test_a_memory_store_without_sharing_starts_and_says_so(
    start_process: Starter, tmp_path: Path
) -> None:
    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(UNSHARED))
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--workers", "2"]
    process = start_process([*argv, "--port", "0"], r"Uvicorn running on", 60)
    assert "2 workers, store memory://: each worker keeps its own state" in process.output()


def workers_of(gateway: GatewayProcess, count: int, timeout: float = 90) -> list[int]:
    """The worker pids (from uvicorn's "Started server process [pid]"), once each has started
    its app."""
    deadline = time.monotonic() + timeout
    while True:
        output = gateway.output()
        pids = [int(p) for p in re.findall(r"Started server process \[(\d+)\]", output)]
        if output.count("Application startup complete") >= count and len(pids) == count:
            return pids
        assert time.monotonic() < deadline, output[-3000:]
        time.sleep(0.2)


@contextmanager
def only(worker: int, workers: list[int]) -> Iterator[None]:
    """Every other worker stopped (SIGSTOP) meanwhile: only `worker` accepts connections."""
    others = [w for w in workers if w != worker]
    for other in others:
        os.kill(other, signal.SIGSTOP)
    try:
        yield
    finally:
        for other in others:
            os.kill(other, signal.SIGCONT)


def answered_by(gateway: GatewayProcess, request_id: str) -> int:
    """The pid that wrote the request's log line."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for line in gateway.output().splitlines():
            if request_id in line and line.startswith("{"):
                record = json.loads(line)
                if record.get("request_id") == request_id:
                    return int(record["pid"])
        time.sleep(0.1)
    raise AssertionError(f"no log line for {request_id}")


def turn(gateway: GatewayProcess, request_id: str, messages: list[dict[str, Any]]) -> str | None:
    """One turn on a connection of its own (a new client)."""
    answer = client(gateway).chat.completions.create(
        model="m", messages=messages, tools=CLIENT_TOOLS, extra_headers={"x-request-id": request_id}
    )
    return answer.choices[0].message.content


@pytest.mark.slow
def test_two_workers_on_redis_serve_one_session_alternately(
    start_gateway: GatewayStarter, start_process: Starter, fake_upstream: FakeUpstream
) -> None:
    """Turns 1 to 4 on A, B, A, B."""
    redis = start_redis(start_process)
    config = config_for(fake_upstream, store=redis.url, server={"log_format": "json"})
    gateway = start_gateway(config, args=("--workers", "2"))
    a, b = workers_of(gateway, 2)
    assert "2 workers sharing state through the store redis://" in gateway.output()

    with only(a, [a, b]):  # turn 1 on A: the big log is masked, its text stored
        turn(gateway, "turn-1", history())
    assert answered_by(gateway, "turn-1") == a
    [first] = fake_upstream.chat_requests()
    masked = next(m for m in first["json"]["messages"] if m.get("tool_call_id") == "call_0")
    ref = masked["content"].split("ref=")[1].split("]")[0].split(":")[0]

    # Turn 2 on B, which has never seen the log (the client sends another output in its place):
    # the model asks for A's ref, and B reads it from the store.
    fake_upstream.reset()
    fake_upstream.script(
        [
            internal_call("tool_output_cache_grep", ref_id=ref, pattern="disk full"),
            {"kind": "ok", "content": "via b"},
        ]
    )
    other = [
        m if m.get("tool_call_id") != "call_0" else {**m, "content": "other output line\n" * 1200}
        for m in history()
    ]
    with only(b, [a, b]):
        assert turn(gateway, "turn-2", other) == "via b"
    assert answered_by(gateway, "turn-2") == b
    [result] = tool_results(fake_upstream.chat_requests()[1])
    assert LOG_LINES[123] in result

    # Turns 3 and 4, the session grown by a turn, once on A and once on B: the same refs, so the
    # same bytes go upstream whichever worker serves it (the upstream's prompt cache hits).
    grown = [
        *history(),
        {"role": "assistant", "content": "worker-4"},
        {"role": "user", "content": "fix it"},
    ]
    forwarded = []
    for number, worker in ((3, a), (4, b)):
        fake_upstream.reset()
        with only(worker, [a, b]):
            turn(gateway, f"turn-{number}", grown)
        assert answered_by(gateway, f"turn-{number}") == worker
        [request] = fake_upstream.chat_requests()
        forwarded.append(request["json"]["messages"])
    assert forwarded[0] == forwarded[1]
    assert any(ref in str(m.get("content")) for m in forwarded[1])  # B masked it as A did
