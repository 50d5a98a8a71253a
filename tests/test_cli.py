"""The `compactgate` command (gateway/cli.py): `serve` start-up and the operator's commands.

What an operator would notice: a gateway started under the usual soft limit of a few hundred or
1,024 descriptors (about 500 streams, two descriptors each) raises it to the hard limit, or to
`server.max_open_files`, and says so in its log; where the system refuses, it logs that and
serves anyway. `--version` and each subcommand's `--help` (with its defaults) answer without a
config.
"""

from __future__ import annotations

import importlib.metadata
import io
import logging
import resource
import sys
from pathlib import Path

import httpx
import pytest
import yaml

import gateway
from gateway.cli import main, raise_open_files_limit
from gateway.config import parse_config
from gateway.errors import AuthenticationError
from gateway.http.auth import Authenticator
from tests.conftest import Starter, free_port


def open_files_limits(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line")


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc/<pid>/limits")
def test_serve_raises_its_soft_limit_to_the_hard_limit(
    start_process: Starter, tmp_path: Path
) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text("models: [{name: m, upstream: {base_url: 'http://127.0.0.1:9/v1'}}]\n")
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard = min(hard, 4096)
    # started as a service manager would, with a low soft limit
    launch = (
        "import resource, sys;"
        f"resource.setrlimit(resource.RLIMIT_NOFILE, (256, {hard}));"
        "from gateway.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    port = free_port()
    process = start_process(
        [sys.executable, "-c", launch, "serve", "--config", str(config), "--port", str(port)],
        r"Uvicorn running on",
        60,
    )
    assert open_files_limits(process.pid) == (hard, hard)
    assert f"open files: soft limit set from 256 to {hard}" in process.output()


class FakeLimits:
    def __init__(self, soft: int, hard: int, refuse: bool = False) -> None:
        self.limits = (soft, hard)
        self.refuse = refuse

    def get(self, which: int) -> tuple[int, int]:
        assert which == resource.RLIMIT_NOFILE
        return self.limits

    def set(self, which: int, limits: tuple[int, int]) -> None:
        if self.refuse:
            raise ValueError("not allowed to raise maximum limit")
        self.limits = limits


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeLimits:
    limits = FakeLimits(1024, 4096)
    monkeypatch.setattr(resource, "getrlimit", limits.get)
    monkeypatch.setattr(resource, "setrlimit", limits.set)
    return limits


def test_the_hard_limit_by_default_and_a_configured_value_otherwise(fake: FakeLimits) -> None:
    assert raise_open_files_limit(None) == (4096, 4096)
    fake.limits = (1024, 4096)
    assert raise_open_files_limit(2000) == (2000, 4096)
    fake.limits = (1024, resource.RLIM_INFINITY)
    soft, hard = raise_open_files_limit(None)  # unlimited hard limit: the kernel's ceiling
    assert soft > 1024 and soft != resource.RLIM_INFINITY and hard == resource.RLIM_INFINITY


def test_a_refused_limit_is_logged_and_start_up_goes_on(
    fake: FakeLimits, caplog: pytest.LogCaptureFixture
) -> None:
    fake.refuse = True
    with caplog.at_level(logging.WARNING, logger="compactgate.serve"):
        assert raise_open_files_limit(100_000) == (1024, 4096)
    assert "could not set the soft limit from 1024 to 100000" in caplog.text


@pytest.mark.slow
def test_serve_with_an_admin_port_and_several_workers(
    start_process: Starter, tmp_path: Path
) -> None:
    """Both sockets are shared by the workers (this combination used to fail at start-up)."""
    port, admin_port = free_port(), free_port()
    config = tmp_path / "gateway.yaml"
    config.write_text(
        f"server: {{admin_port: {admin_port}}}\n"
        # nothing that workers on a memory store would need to share (design D13.7)
        "models: [{name: m, upstream: {base_url: 'http://127.0.0.1:9/v1'}, policy: p,\n"
        "          responses_compact: native}]\n"
        "policies: {p: {steps: [{type: fifo}]}}\n"
    )
    argv = [sys.executable, "-m", "gateway", "serve", "--config", str(config)]
    start_process(
        [*argv, "--port", str(port), "--workers", "2"], r"Application startup complete", 90
    )
    assert httpx.get(f"http://127.0.0.1:{admin_port}/metrics", timeout=10).status_code == 200
    assert httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).status_code == 404
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    expected = importlib.metadata.version("compactgate")
    assert capsys.readouterr().out.strip() == f"compactgate {expected}"


def test_version_falls_back_to_the_package_attribute(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    monkeypatch.setattr(gateway, "__version__", "9.8.7", raising=False)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == "compactgate 9.8.7"


def test_serve_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["serve", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for default in ("127.0.0.1", "8080", "info", "30.0"):
        assert f"(default: {default})" in text
    assert "(default: None)" not in text


def hash_key(stdin: bytes, monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return main(["hash-key"])


def test_hash_key_prints_an_entry_the_gateway_accepts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hash_key(b"sk-gw-\xc3\xa9l\xc3\xa8ve-123\n", monkeypatch) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("key_sha256: ") and "sk-gw" not in line
    entry = {**yaml.safe_load(line), "tenant": "acme"}
    authenticator = Authenticator(parse_config({"auth": {"keys": [entry]}}))
    presented = "Bearer sk-gw-élève-123".encode()  # the bytes a client sends
    scope = {"headers": [(b"authorization", presented)]}
    assert authenticator.identify(scope).tenant == "t:acme"
    with pytest.raises(AuthenticationError):
        authenticator.identify({"headers": [(b"authorization", b"Bearer sk-gw-other")]})


def test_hash_key_refuses_an_empty_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert hash_key(b"\n", monkeypatch) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "no key on stdin" in captured.err


def test_serve_logs_the_open_relay_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision is tested in tests/test_auth.py; here, that `serve` acts on it, before the
    server starts."""
    import signal

    import uvicorn

    config = tmp_path / "gateway.yaml"
    config.write_text(
        "models: [{name: m, upstream: {base_url: 'http://127.0.0.1:9/v1', api_key: sk-held}}]\n"
    )
    started: list[dict[str, object]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: started.append(options))
    monkeypatch.setattr(signal, "signal", lambda *args: None)  # keep pytest's own handlers
    monkeypatch.setattr("gateway.cli.raise_open_files_limit", lambda wanted: (0, 0))
    monkeypatch.setenv("COMPACTGATE_CONFIG", str(config))
    with caplog.at_level(logging.WARNING, logger="compactgate.serve"):
        assert main(["serve", "--host", "127.0.0.1"]) == 0
        assert "open relay" not in caplog.text
        assert main(["serve", "--host", "0.0.0.0"]) == 0
    assert [r.levelname for r in caplog.records if "open relay" in r.message] == ["WARNING"]
    assert [options["host"] for options in started] == ["127.0.0.1", "0.0.0.0"]
