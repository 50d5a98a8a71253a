"""The real Codex CLI compacting itself, through the gateway and straight to the upstream.

Run: `python -m benchmarks.bench_codex_compaction [--steps 24] [--output-tokens 6000]
[--limit 20000] [--model-delay 0] [--summary-delay 0]`. About ten seconds with no delays;
loopback only; needs the agents (`scripts/install-agents`).

One session, run twice against the same fake upstream (`tests/fake_upstream.py`, a process
speaking the Responses API, counting every prompt as the characters of its JSON / 4 and
answering a compaction prompt with a short summary): `codex exec` with a shell tool whose every
call prints ~28 KB (4,000 numbered lines), of which Codex keeps `--output-tokens` tokens
(`tool_output_token_limit`; ~6k tokens each, by the upstream's count), compacting its own
history past `--limit` tokens (`model_auto_compact_token_limit`) for `--steps` steps, then the
model's last answer. Straight: Codex talks to the upstream. Gateway: Codex talks to a
`compactgate serve` process (one worker, memory store, `chars:4`, a 200k window so that only
agents' compaction is at work) in front of the same upstream; the gateway is new, so Codex's
first compaction is forwarded and teaches it.

The fake answers a turn `--model-delay` seconds late and a summary `--summary-delay` seconds
late, as a model takes its time: the session's wall time then shows what a compaction request
costs Codex while it waits (a summary made ahead started while the turn before it was at the
upstream).

Printed, per arm: Codex's compaction requests (answered by the gateway / forwarded), requests
and tokens the upstream read (split: Codex's ordinary turns, compaction requests that reached
it, the gateway's own summaries made ahead of need), and the gateway arm's tokens as a share
of the straight arm's. The targets (issue 40): at least 80 % of the compaction requests
answered, and the upstream reading fewer tokens through the gateway than straight.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.codex_compaction import (
    CODEX,
    ROOT,
    Tally,
    compactions_of,
    gateway_config,
    run_codex,
    script,
    settings,
)

ANSWERED_TARGET = 0.8


class Process:
    """A child process started until a line of its output matches `ready`."""

    def __init__(self, argv: list[str], ready: str, log: Path) -> None:
        self.log = log
        self.handle = log.open("w")
        self.process = subprocess.Popen(
            argv, cwd=ROOT, stdout=self.handle, stderr=subprocess.STDOUT, text=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            found = re.search(ready, log.read_text(), re.M)
            if found:
                self.match = found
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{argv[:4]} did not start: see {log}")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        self.handle.close()


def measure(
    args: argparse.Namespace, directory: Path
) -> tuple[Tally, Tally, dict[str, float], list[float]]:
    fake = Process(
        [sys.executable, "-m", "tests.fake_upstream", "--port", "0"],
        r"^READY (\d+)$",
        directory / "upstream.log",
    )
    root = f"http://127.0.0.1:{fake.match.group(1)}"
    control = httpx.Client(base_url=root, timeout=30)
    lines = settings(args.limit, args.output_tokens)
    try:

        def prepare() -> None:
            control.post("/_fake/reset").raise_for_status()
            control.post("/_fake/config", json={"summary_delay_s": args.summary_delay})
            moves = script(args.steps, args.output_tokens, args.model_delay)
            control.post("/_fake/script", json=moves)

        prepare()
        (directory / "straight").mkdir()
        started = time.perf_counter()
        run_codex(f"{root}/v1", directory / "straight", lines)
        seconds = [time.perf_counter() - started]
        straight = Tally.of(control.get("/_fake/requests").json())

        prepare()
        path = directory / "gateway.json"
        path.write_text(json.dumps(gateway_config(f"{root}/v1")))
        port = _free_port()
        gateway = Process(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port)],
            r"Uvicorn running on|CompactGate listening on",
            directory / "gateway.log",
        )
        try:
            (directory / "through").mkdir()
            started = time.perf_counter()
            run_codex(f"http://127.0.0.1:{port}/v1", directory / "through", lines)
            seconds.append(time.perf_counter() - started)
            time.sleep(0.3)  # a summary still being made ahead is counted once it is in
            through = Tally.of(control.get("/_fake/requests").json())
            outcomes = compactions_of(httpx.get(f"http://127.0.0.1:{port}/metrics").text)
        finally:
            gateway.stop()
    finally:
        fake.stop()
    return straight, through, outcomes, seconds


def report(
    args: argparse.Namespace,
    straight: Tally,
    through: Tally,
    outcomes: dict[str, float],
    seconds: list[float],
) -> None:
    answered = int(outcomes.get("answered", 0))
    forwarded = int(outcomes.get("forwarded", 0))
    asked = answered + forwarded
    share = answered / asked if asked else 0.0
    ratio = through.tokens / straight.tokens
    print(
        f"Codex CLI, {args.steps} steps, ~{args.output_tokens}-token tool outputs, compacting "
        f"past {args.limit} tokens; the model answers a turn in {args.model_delay:g} s and "
        f"writes a summary in {args.summary_delay:g} s"
    )
    print(f"{'':34}{'straight':>12}{'gateway':>12}")
    rows = [
        ("compaction requests by Codex", straight.compactions, asked),
        ("  answered by the gateway", 0, answered),
        ("  forwarded to the upstream", straight.compactions, through.compactions),
        ("upstream requests", straight.requests, through.requests),
        ("  Codex's turns", straight.ordinary, through.ordinary),
        ("  summaries made ahead of need", 0, through.background),
        ("upstream tokens read", straight.tokens, through.tokens),
        ("  by compaction requests", straight.compaction_tokens, through.compaction_tokens),
        ("  by summaries made ahead", 0, through.background_tokens),
    ]
    for name, left, right in rows:
        print(f"{name:34}{left:>12,}{right:>12,}")
    print(f"{'session, seconds':34}{seconds[0]:>12.1f}{seconds[1]:>12.1f}")
    verdict = "met" if share >= ANSWERED_TARGET and ratio < 1 else "NOT met"
    print(
        f"answered {answered}/{asked} ({share:.0%}, target >= {ANSWERED_TARGET:.0%}); upstream "
        f"tokens through the gateway / straight: {ratio:.3f} (target < 1): {verdict}"
    )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--output-tokens", type=int, default=6000)
    parser.add_argument("--limit", type=int, default=20_000)
    parser.add_argument("--summary-delay", type=float, default=0.0)
    parser.add_argument("--model-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not CODEX.exists():
        raise SystemExit(f"{CODEX} is missing: run scripts/install-agents")
    with tempfile.TemporaryDirectory() as directory:
        report(args, *measure(args, Path(directory)))


if __name__ == "__main__":
    main()
