"""Graceful shutdown: SIGTERM to `compactgate serve` with a stream in flight.

What an operator would notice: after SIGTERM the gateway refuses new connections at once, lets
the streams in flight finish (the client gets every chunk and `[DONE]`), and exits 0; a stream
longer than `--shutdown-timeout` is cut at the deadline with a last SSE error event saying why
(its upstream call cancelled) and the process still exits 0, without tracebacks or abandoned
tasks in its output.
"""

from __future__ import annotations

import signal
import socket
import threading
import time
from typing import Any

import openai
import pytest

from tests.conftest import GatewayProcess, GatewayStarter
from tests.fake_upstream import FakeUpstream

pytestmark = pytest.mark.slow  # signals a real process and waits for it to finish

SMALL = [{"role": "user", "content": "Say hi."}]


def config_for(fake: FakeUpstream) -> dict[str, Any]:
    return {
        "models": [
            {"name": "m", "upstream": {"base_url": fake.base_url}, "context_window": 100_000}
        ]
    }


class StreamReader(threading.Thread):
    """Reads one streaming completion with the official client, noting when the first chunk came."""

    def __init__(self, gw: GatewayProcess) -> None:
        super().__init__(daemon=True)
        self.api = openai.OpenAI(base_url=gw.base_url, api_key="sk-x", max_retries=0, timeout=30)
        self.first_chunk = threading.Event()
        self.text = ""
        self.finished = False
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            stream = self.api.chat.completions.create(model="m", messages=SMALL, stream=True)
            for chunk in stream:
                self.first_chunk.set()
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
            self.finished = True
        except Exception as exc:  # the test inspects whatever ended the stream
            self.error = exc
        finally:
            self.first_chunk.set()


def refuses_connections(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return False
    except ConnectionRefusedError:
        return True


def assert_clean_output(gw: GatewayProcess) -> None:
    output = gw.output()
    assert "Traceback" not in output
    assert "Task was destroyed but it is pending" not in output


def test_sigterm_lets_the_stream_in_flight_finish_refuses_new_connections_and_exits_0(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    gw = start_gateway(config_for(fake_upstream))
    chunks = 25
    fake_upstream.script([{"kind": "slow_stream", "chunks": chunks, "interval": 0.1}])
    reader = StreamReader(gw)
    reader.start()
    assert reader.first_chunk.wait(10) and reader.error is None

    gw.process.popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    while not refuses_connections(gw.port):
        assert time.monotonic() - signalled < 2, "still accepting connections after SIGTERM"
        time.sleep(0.05)
    assert not reader.finished  # refused while the stream was still in flight
    gw.process.wait_for(r"not ready: draining", 5)  # readiness knew it from the signal on,
    assert not reader.finished  # not only once the lifespan ended

    reader.join(15)
    assert reader.error is None and reader.finished
    assert reader.text == "slow " * chunks  # every chunk arrived
    assert gw.process.popen.wait(10) == 0
    assert time.monotonic() - signalled < 10
    assert fake_upstream.inflight()["cancelled"] == 0
    assert_clean_output(gw)


def test_a_stream_longer_than_the_deadline_is_cut_and_the_process_still_exits_0(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    gw = start_gateway(config_for(fake_upstream), args=("--shutdown-timeout", "1"))
    fake_upstream.script([{"kind": "slow_stream", "chunks": 200, "interval": 0.1}])  # 20 s
    reader = StreamReader(gw)
    reader.start()
    assert reader.first_chunk.wait(10) and reader.error is None

    gw.process.popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert gw.process.popen.wait(10) == 0
    assert time.monotonic() - signalled < 6  # the 1 s deadline, plus the lifespan shutdown
    reader.join(10)
    # the client is told why its stream ended: a last SSE error event, which the SDK raises
    assert not reader.finished and isinstance(reader.error, openai.APIError)
    assert "shutting down" in str(reader.error)
    counters = fake_upstream.wait_idle(5)
    assert counters["inflight"] == 0 and counters["cancelled"] == 1  # the upstream call was dropped
    assert_clean_output(gw)


def test_sigterm_when_idle_exits_0_quickly(
    start_gateway: GatewayStarter, fake_upstream: FakeUpstream
) -> None:
    gw = start_gateway(config_for(fake_upstream))
    api = openai.OpenAI(base_url=gw.base_url, api_key="sk-x", max_retries=0, timeout=10)
    assert api.chat.completions.create(
        model="m", messages=SMALL
    ).choices  # a keep-alive connection stays open
    gw.process.popen.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    assert gw.process.popen.wait(10) == 0
    assert time.monotonic() - signalled < 3
    assert_clean_output(gw)
