"""A real `redis-server` for the tests, on a free loopback port, with nothing written to disk.

    server = start_redis(start_process)      # or start_process_session for a shared one
    server.url                               # redis://127.0.0.1:<port>/0

The process is started through the conftest starters, so the fixture that handed them out stops
it at teardown. Persistence is off (`--save ''`, `--appendonly no`): every server starts empty.
Tests that need Redis are skipped, with the reason, when `redis-server` is not installed
(`.ci/run` installs it).
"""

from __future__ import annotations

import shutil
import socket
from dataclasses import dataclass

import pytest

from tests.conftest import ProcessStartError, RunningProcess, Starter

READY = r"Ready to accept connections"


@dataclass(frozen=True, slots=True)
class RedisServer:
    process: RunningProcess
    port: int

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.process.stop()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(start: Starter, port: int | None = None, attempts: int = 3) -> RedisServer:
    """Start redis-server on `port` (default: a free one; retried if another process took it)."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        argv = [
            binary, "--port", str(chosen), "--bind", "127.0.0.1", "--save", "", "--appendonly",
            "no", "--protected-mode", "yes", "--loglevel", "notice", "--daemonize", "no",
        ]  # fmt: skip
        try:
            return RedisServer(start(argv, READY, 15), chosen)
        except ProcessStartError:
            if port is not None or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
