"""The processes a benchmark run measures, each started on loopback and stopped at the end.

* `fast upstream` (`benchmarks.fast_upstream`): the baseline target "direct", and the upstream
  of every other target; a second one in emergency mode for the reactive-retry case.
* `gateway`: `python -m gateway serve --config <generated> --port P`, one worker.
* `relay`: `benchmarks.relay_floor`, the Python floor.
* `litellm`: the LiteLLM proxy from its own virtualenv under `benchmarks/.peers/`, installed
  once (pinned, see `LITELLM_SPEC`) and reused; no database, one worker.

Every wait is bounded; a target that does not come up is reported, not waited for forever.
"""

from __future__ import annotations

import os
import secrets
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
LITELLM_VENV = PEERS / "litellm-venv"
LITELLM_VERSION = "1.106.2"  # pinned; never 1.107.0 (a compromised release)
LITELLM_SPEC = f"litellm[proxy]=={LITELLM_VERSION}"
TOOLS_VENV = PEERS / "tools-venv"  # py-spy, for --profile

PASSTHROUGH_MODEL = "bench-passthrough"
COMPACT_MODEL = "bench-compact"
EMERGENCY_PREFIX = "bench-emergency-"
COMPACT_WINDOW = 32_768
SUMMARY_MODEL = "bench-summary"  # policy `compaction`: summary of old turns + the last turn
SUMMARY_WINDOW = 65_536  # the 200-message request (~60k tokens) crosses its trigger
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
        """SIGTERM, then SIGKILL after `timeout`; only this process (and its own group)."""
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


class StartError(Exception):
    """A target did not start; the message says why (with the tail of its log)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _spawn(
    name: str, argv: list[str], workdir: Path, env: dict[str, str | None] | None = None
) -> tuple[subprocess.Popen[bytes], Path]:
    """Start `argv` in its own session (so stopping it stops only what it started)."""
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
            cwd=ROOT,
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


def start_upstream(
    workdir: Path, name: str = "upstream", reject_above: int | None = None
) -> Service:
    argv = [sys.executable, "-m", "benchmarks.fast_upstream", "--port", "0"]
    if reject_above is not None:
        argv += ["--reject-above", str(reject_above)]
    process, log = _spawn(name, argv, workdir)
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
    process, log = _spawn("relay", argv, workdir)
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
    """The gateway's YAML: a passthrough model, a compacting one, emergency models (a glob),
    and a summarising one (its summaries come from the same fast upstream)."""
    steps, _ = compaction_steps()
    step_lines = "\n".join(f"      - {{type: {step}}}" for step in steps)
    common = "    max_output_tokens: 1024\n    tokenizer: tiktoken:o200k_base\n"
    return (
        "# generated by benchmarks/run.py\n"
        "models:\n"
        f"  - name: {PASSTHROUGH_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: 1000000\n{common}"
        f"  - name: {COMPACT_MODEL}\n"
        f'    upstream: {{base_url: "{upstream.origin}/v1"}}\n'
        f"    context_window: {COMPACT_WINDOW}\n{common}"
        "    policy: compact\n"
        f'  - name: "{EMERGENCY_PREFIX}*"\n'
        f'    upstream: {{base_url: "{emergency.origin}/v1"}}\n'
        f"    context_window: 1000000\n{common}"
        "    policy: compact\n"
        "    max_retries: 2\n"
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


def start_gateway(workdir: Path, config_text: str, name: str = "gateway") -> Service:
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
    process, log = _spawn(name, argv, workdir)
    return Service(name, process, port, log)


# -- LiteLLM -------------------------------------------------------------------------------


def litellm_python() -> Path:
    return LITELLM_VENV / "bin" / "python"


def litellm_installed() -> bool:
    marker = LITELLM_VENV / "installed.txt"
    if not marker.exists() or not litellm_python().exists():
        return False
    return marker.read_text().strip() == LITELLM_SPEC


def install_litellm(timeout: float) -> str | None:
    """Create the peer's virtualenv and install the pinned proxy once; None or why it failed."""
    if litellm_installed():
        return None
    PEERS.mkdir(parents=True, exist_ok=True)
    log = PEERS / "litellm-install.log"
    deadline = time.monotonic() + timeout
    try:
        with open(log, "wb") as out:
            if not litellm_python().exists():
                subprocess.run(
                    [sys.executable, "-m", "venv", str(LITELLM_VENV)],
                    check=True,
                    stdout=out,
                    stderr=out,
                    timeout=max(1.0, deadline - time.monotonic()),
                )
            subprocess.run(
                [
                    str(litellm_python()),
                    "-m",
                    "pip",
                    "install",
                    "--disable-pip-version-check",
                    "-q",
                    LITELLM_SPEC,
                ],
                check=True,
                stdout=out,
                stderr=out,
                timeout=max(1.0, deadline - time.monotonic()),
            )
    except subprocess.TimeoutExpired:
        return f"installing {LITELLM_SPEC} timed out after {timeout:.0f} s (log: {log})"
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"installing {LITELLM_SPEC} failed: {exc} (log: {log})"
    (LITELLM_VENV / "installed.txt").write_text(LITELLM_SPEC + "\n")
    return None


def litellm_config(upstream: Service, master_key: str) -> str:
    return (
        "# generated by benchmarks/run.py: no database, one model to the fast upstream\n"
        "model_list:\n"
        f"  - model_name: {PASSTHROUGH_MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{PASSTHROUGH_MODEL}\n"
        f"      api_base: {upstream.origin}/v1\n"
        "      api_key: sk-bench-upstream\n"
        "litellm_settings:\n"
        "  telemetry: false\n"
        "general_settings:\n"
        f"  master_key: {master_key}\n"
    )


def start_litellm(workdir: Path, upstream: Service, master_key: str) -> Service:
    config = workdir / "litellm.yaml"
    config.write_text(litellm_config(upstream, master_key))
    port = free_port()
    executable = LITELLM_VENV / "bin" / "litellm"
    argv = [
        str(executable),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        "1",
    ]
    env: dict[str, str | None] = {
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no network fetch of the cost map at start-up
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "DATABASE_URL": None,  # no database
    }
    process, log = _spawn("litellm", argv, workdir, env)
    return Service("litellm", process, port, log)


def new_master_key() -> str:
    return "sk-" + secrets.token_hex(32)


def litellm_version() -> str | None:
    if not litellm_python().exists():
        return None
    try:
        out = subprocess.run(
            [
                str(litellm_python()),
                "-c",
                "import importlib.metadata as m; print(m.version('litellm'))",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (subprocess.TimeoutExpired, OSError):
        return None
    return out.stdout.strip() or None


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
