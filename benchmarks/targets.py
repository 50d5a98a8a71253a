"""The processes a benchmark run measures, each started on loopback and stopped at the end.

* `fast upstream` (`benchmarks.fast_upstream`): the baseline target "direct", and the upstream
  of every other target; a second one in emergency mode for the reactive-retry case.
* `gateway`: `python -m gateway serve --config <generated> --port P`, one worker.
* `relay`: `benchmarks.relay_floor`, the Python floor.
* `litellm`, `headroom`: other proxies, each from its own virtualenv (`benchmarks.peers`).

Every wait is bounded; a target that does not come up is reported, not waited for forever.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PEERS = ROOT / "benchmarks" / ".peers"
TOOLS_VENV = PEERS / "tools-venv"  # py-spy, for --profile

PASSTHROUGH_MODEL = "bench-passthrough"
RESPONSES_MODEL = "bench-codex"  # the Responses cases' model
MESSAGES_MODEL = "bench-claude"  # the Messages cases' model (peers route it to Anthropic's API)
COMPACT_MODEL = "bench-compact"
EMERGENCY_PREFIX = "bench-emergency-"
COMPACT_WINDOW = 32_768
SUMMARY_MODEL = "bench-summary"  # policy `compaction`: summary of old turns + the last turn
SUMMARY_WINDOW = 65_536  # the 200-message request (~60k tokens) crosses its trigger
COUNT_MODEL = "bench-count"  # nothing compacted, but the request must be counted first:
COUNT_WINDOW = 128_000  # ~60k tokens fit its trigger (~101k), ~205k bytes of text do not
DEFAULT_CHAIN_MODEL = "bench-default"  # no policy named: the default chain, ledger included
DEFAULT_CHAIN_WINDOW = 65_536  # the 200-message request crosses its trigger and is compacted
EMERGENCY_REJECT_ABOVE = 65_536  # bytes: the 200-message body is rejected, a compacted one is not


@dataclass
class Service:
    """A started process listening on 127.0.0.1:`port`."""

    name: str
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout`; only this process (and its own group). Its
        stdout pipe is closed either way."""
        try:
            if self.process.poll() is not None:
                return
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(5)
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


class StartError(Exception):
    """A target did not start; the message says why (with the tail of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(
    name: str,
    argv: list[str],
    workdir: Path,
    env: dict[str, str | None] | None = None,
    root: Path = ROOT,
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `argv` in `root` (a checkout), in its own session (so stopping it stops only what it
    started)."""
    environ = dict(os.environ)
    for key, value in (env or {}).items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    log = workdir / f"{name}.log"
    with open(log, "wb") as stderr:
        process = subprocess.Popen(
            argv,
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env=environ,
            start_new_session=True,
        )
    return process, log


def _read_ready(process: subprocess.Popen[bytes], timeout: float) -> int | None:
    """The port from the process's `READY <port>` line, or None after `timeout`."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline and process.poll() is None:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                continue
            data = os.read(process.stdout.fileno(), 4096)
            if not data:
                break
            buffer += data
            for line in buffer.splitlines():
                if line.startswith(b"READY "):
                    return int(line.split()[1])
    return None


def start_ready(name: str, argv: list[str], workdir: Path) -> Service:
    """`argv` started, once it has printed `READY <port>` (within 30 s)."""
    process, log = spawn(name, argv, workdir)
    port = _read_ready(process, 30)
    service = Service(name, process, port or 0, log)
    if port is None:
        service.stop()
        raise StartError(f"{name} did not start:\n{service.log_tail()}")
    return service


def start_upstream(
    workdir: Path, name: str = "upstream", reject_above: int | None = None
) -> Service:
    argv = [sys.executable, "-m", "benchmarks.fast_upstream", "--port", "0"]
    if reject_above is not None:
        argv += ["--reject-above", str(reject_above)]
    process, log = spawn(name, argv, workdir)
    port = _read_ready(process, 30)
    service = Service(name, process, port or 0, log)
    if port is None:
        service.stop()
        raise StartError(f"{name} did not start:\n{service.log_tail()}")
    return service


def start_relay(workdir: Path, upstream: Service) -> Service:
    argv = [
        sys.executable,
        "-m",
        "benchmarks.relay_floor",
        "--upstream",
        upstream.origin,
        "--port",
        "0",
    ]
    process, log = spawn("relay", argv, workdir)
    port = _read_ready(process, 30)
    service = Service("relay", process, port or 0, log)
    if port is None:
        service.stop()
        raise StartError(f"relay did not start:\n{service.log_tail()}")
    return service


def compaction_steps() -> tuple[list[str], str]:
    """The compaction chain and its note: tool_output_cache + fifo, or fifo if the former is not
    registered yet."""
    from policies.registry import STEPS

    if "tool_output_cache" in STEPS:
        return ["tool_output_cache", "fifo"], "tool_output_cache + fifo"
    return ["fifo"], "fifo only (tool_output_cache is not registered in policies/registry.py yet)"


def gateway_config(upstream: Service, emergency: Service) -> str:
    """The gateway's YAML: passthrough models (one for the Messages cases), a compacting one,
    emergency models (a glob), and a summarising one (its summaries come from the same fast
    upstream)."""
    steps, _ = compaction_steps()
    step_lines = "\n".join(f"      - {{type: {step}}}" for step in steps)
    common = "    max_output_tokens: 1024\n    tokenizer: tiktoken:o200k_base\n"
    return (
        "# generated by benchmarks/run.py\n"
        "models:\n"
        f"  - name: {PASSTHROUGH_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: 1000000\n{common}"
        f"  - name: {RESPONSES_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: 1000000\n{common}"
        f"  - name: {MESSAGES_MODEL}\n"  # Claude Code asks for 32000 output tokens
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        "    context_window: 1000000\n    max_output_tokens: 32000\n"
        "    tokenizer: tiktoken:o200k_base\n"
        f"  - name: {COMPACT_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: {COMPACT_WINDOW}\n{common}"
        "    policy: compact\n"
        f'  - name: "{EMERGENCY_PREFIX}*"\n'
        f'    upstream: {{base_url: "{emergency.origin}/v1"}}\n'
        f"    context_window: 1000000\n{common}"
        "    policy: compact\n"
        "    max_retries: 2\n"
        f"  - name: {COUNT_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: {COUNT_WINDOW}\n{common}"
        f"  - name: {DEFAULT_CHAIN_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: {DEFAULT_CHAIN_WINDOW}\n{common}"
        f"  - name: {SUMMARY_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: {SUMMARY_WINDOW}\n{common}"
        "    policy: summary\n"
        "policies:\n"
        "  compact:\n"
        "    steps:\n"
        f"{step_lines}\n"
        "  summary:\n"
        "    steps:\n"
        "      - {type: compaction, retain_last_turns: 1}\n"
    )


def start_gateway(
    workdir: Path, config_text: str, name: str = "gateway", root: Path = ROOT
) -> Service:
    """The gateway of the checkout at `root` (this one unless told), serving `config_text`."""
    config = workdir / f"{name}.yaml"
    config.write_text(config_text)
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]
    process, log = spawn(name, argv, workdir, root=root)
    return Service(name, process, port, log)


# -- py-spy --------------------------------------------------------------------------------


def py_spy(timeout: float) -> tuple[str | None, str | None]:
    """A py-spy executable (PATH, or installed once into `TOOLS_VENV`), or None and why."""
    found = shutil.which("py-spy")
    if found:
        return found, None
    local = TOOLS_VENV / "bin" / "py-spy"
    if local.exists():
        return str(local), None
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(TOOLS_VENV)],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
        subprocess.run(
            [
                str(TOOLS_VENV / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "py-spy",
            ],
            check=True,
            capture_output=True,
            timeout=timeout,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return None, f"py-spy could not be installed: {exc}"
    return (str(local), None) if local.exists() else (None, "py-spy installed no executable")
