"""Shared fixtures: real processes, started and always stopped by the test run; test layers.

Every test is in one layer, marked at collection (`pytest -m e2e`, `-m "not slow"` ...):
    e2e         it uses a real process: a fixture below (the fake upstream process, a gateway
                process, any process started through them), or its module says so
    in_process  it drives the ASGI app in its own event loop (tests/in_process.py)
    property    Hypothesis generates its inputs (and is not one of the above)
    unit        everything else
`slow` is given by hand, to what takes seconds by design; `pytest -m "not slow"` is the fast lane.

End-to-end tests talk to real processes (the fake upstream now, `compactgate serve` later), so
this module owns their life cycle: `start_process` launches `argv` in its own process group,
waits for a line matching `ready_pattern` on its output, and the fixture that handed it out
stops the whole group at teardown, so no test can leak a server.

Fixtures:
    start_process          function-scoped starter: start_process(argv, ready_pattern, timeout)
    start_process_session  the same, for session-scoped fixtures
    start_module_process   the same, for module-scoped fixtures
    fake_upstream_server   the fake upstream process, one per session
    fake_upstream          that process, reset before each test (a tests.fake_upstream.FakeUpstream)
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.fake_upstream import FakeUpstream
from tests.in_process import local_upstream, start_app  # noqa: F401  (fixtures, see there)

REPO_ROOT = Path(__file__).resolve().parent.parent


class ProcessStartError(RuntimeError):
    """The process exited, or never printed its ready line, within the timeout."""


class RunningProcess:
    """A child process whose combined stdout/stderr is drained by a thread and kept in memory."""

    def __init__(self, argv: Sequence[str], *, cwd: Path, env: dict[str, str] | None) -> None:
        self.argv = list(argv)
        self.lines: list[str] = []
        self._new_line = threading.Condition()
        self.popen = subprocess.Popen(
            self.argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,  # its own process group, so stop() reaches its children
        )
        self._reader = threading.Thread(target=self._drain, name=f"drain-{self.pid}", daemon=True)
        self._reader.start()
        self.match: re.Match[str] | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def _drain(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            with self._new_line:
                self.lines.append(line.rstrip("\n"))
                self._new_line.notify_all()
        with self._new_line:
            self._new_line.notify_all()

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """Block until an output line matches `pattern` (searched from the first line)."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._new_line:
            while True:
                finished = self.popen.poll() is not None and not self._reader.is_alive()
                lines = list(self.lines)
                for line in lines[seen:]:
                    if match := regex.search(line):
                        return match
                seen = len(lines)
                if finished:
                    raise ProcessStartError(self._failure(f"exited with {self.popen.returncode}"))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise ProcessStartError(self._failure(f"no line matching {pattern!r}"))
                self._new_line.wait(min(remaining, 0.1))

    def output(self) -> str:
        return "\n".join(self.lines)

    def _failure(self, what: str) -> str:
        tail = "\n".join(self.lines[-40:])
        return f"{' '.join(self.argv)}: {what}; last output:\n{tail}"

    def stop(self, timeout: float = 5.0) -> int:
        """SIGTERM the process group, SIGKILL it if it lingers; returns the exit code."""
        if self.popen.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.popen.wait(timeout)
        self._reader.join(timeout)
        if self.popen.stdout is not None:
            self.popen.stdout.close()
        return self.popen.returncode

    def _signal(self, signum: int) -> None:
        try:
            os.killpg(self.pid, signum)  # our own child's group: start_new_session above
        except ProcessLookupError:
            pass


def start_process(
    argv: Sequence[str],
    ready_pattern: str,
    timeout: float = 30.0,
    *,
    cwd: Path = REPO_ROOT,
    env: dict[str, str] | None = None,
) -> RunningProcess:
    """Start `argv` and wait for its ready line; on failure the process is stopped and the error
    carries its last output. The caller must stop() it (the fixtures below do)."""
    process = RunningProcess(argv, cwd=cwd, env=env)
    try:
        process.match = process.wait_for(ready_pattern, timeout)
    except ProcessStartError:
        process.stop()
        raise
    return process


Starter = Callable[..., RunningProcess]


def _starter(started: list[RunningProcess]) -> Starter:
    def start(
        argv: Sequence[str], ready_pattern: str, timeout: float = 30.0, **kwargs: object
    ) -> RunningProcess:
        process = start_process(argv, ready_pattern, timeout, **kwargs)  # type: ignore[arg-type]
        started.append(process)
        return process

    return start


# -- layers -------------------------------------------------------------------------------------

E2E_FIXTURES = frozenset(
    {"start_process", "start_module_process", "start_process_session", "fake_upstream_server"}
)
IN_PROCESS_FIXTURES = frozenset({"start_app", "local_upstream"})
LAYERS = ("e2e", "in_process", "property", "unit")
# Files that run for minutes. Spread over workers (`-n 2 --dist loadfile`, as .ci/run does),
# they start first, while the other workers still have the rest of the suite to share.
LONGEST_FIRST = ("test_soak_short.py",)  # in benchmarks/


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give each test its layer marker, unless it (or its module) names one itself."""
    if config.getoption("numprocesses", None):
        items.sort(key=lambda item: item.path.name not in LONGEST_FIRST)  # stable
    for item in items:
        if any(item.get_closest_marker(layer) for layer in LAYERS):
            continue
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & E2E_FIXTURES:
            item.add_marker(pytest.mark.e2e)
        elif fixtures & IN_PROCESS_FIXTURES:
            item.add_marker(pytest.mark.in_process)
        elif getattr(getattr(item, "obj", None), "is_hypothesis_test", False):
            item.add_marker(pytest.mark.property)
        else:
            item.add_marker(pytest.mark.unit)


def _stopped_after() -> Iterator[Starter]:
    """A starter for a fixture: what it started stops when the fixture ends."""
    started: list[RunningProcess] = []
    yield _starter(started)
    for process in reversed(started):
        process.stop()


@pytest.fixture(name="start_process")
def start_process_fixture() -> Iterator[Starter]:
    """start_process(argv, ready_pattern, timeout) for one test; everything stops afterwards."""
    yield from _stopped_after()


@pytest.fixture(scope="module")
def start_module_process() -> Iterator[Starter]:
    """Like start_process, for processes shared by one module's tests."""
    yield from _stopped_after()


@pytest.fixture(scope="session")
def start_process_session() -> Iterator[Starter]:
    """Like start_process, for processes shared by the whole session."""
    yield from _stopped_after()


def fake_upstream_process(start: Starter) -> Iterator[FakeUpstream]:
    """A fake upstream process (tests/fake_upstream.py) started by `start`, for a fixture to
    yield from."""
    process = start(
        [sys.executable, "-m", "tests.fake_upstream", "--port", "0"], r"^READY (\d+)$", 30
    )
    assert process.match is not None
    fake = FakeUpstream(int(process.match.group(1)))
    yield fake
    fake.close()


@pytest.fixture(scope="session")
def fake_upstream_server(start_process_session: Starter) -> Iterator[FakeUpstream]:
    """One fake upstream process for the whole session."""
    yield from fake_upstream_process(start_process_session)


@pytest.fixture
def fake_upstream(fake_upstream_server: FakeUpstream) -> FakeUpstream:
    """The session's fake upstream with records, script, config and counters cleared."""
    fake_upstream_server.reset()
    return fake_upstream_server


# -- the gateway as a real process --------------------------------------------------------------


class GatewayProcess:
    """A running `compactgate serve`; `url` is its origin, `base_url` what an SDK is given."""

    def __init__(self, process: RunningProcess, port: int, config_path: Path) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.base_url = f"{self.url}/v1"
        self.config_path = config_path

    def output(self) -> str:
        return "\n".join(self.process.lines)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


GatewayStarter = Callable[..., GatewayProcess]


def serve_argv(config_path: Path, port: int, args: Sequence[str] = ()) -> list[str]:
    """The command line of `compactgate serve` with this config, on this port."""
    gateway = [sys.executable, "-m", "gateway", "serve"]
    return [*gateway, "--config", str(config_path), "--port", str(port), *args]


@pytest.fixture
def start_gateway(start_process: Starter, tmp_path: Path) -> GatewayStarter:
    """start_gateway(config_dict, env=None, args=()) -> GatewayProcess, stopped after the test."""
    import json

    counter = iter(range(1000))

    def start(
        config: dict[str, object], env: dict[str, str] | None = None, args: Sequence[str] = ()
    ) -> GatewayProcess:
        path = tmp_path / f"gateway-{next(counter)}.yaml"
        path.write_text(json.dumps(config))
        port = free_port()
        full_env = {**os.environ, **(env or {})}
        process = start_process(
            serve_argv(path, port, args),
            r"Uvicorn running on|CompactGate listening on",
            60,  # generous: CI machines are busy
            env=full_env,
        )
        return GatewayProcess(process, port, path)

    return start
