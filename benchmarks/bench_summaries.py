"""Summaries in a simulated 100-turn agent session (issue 5 "Benchmarks").

Run: `python -m benchmarks.bench_summaries [--turns 100] [--step compaction] [--compare]`.
About a minute (two minutes with `--compare`); loopback only. For each run it starts the gateway
(one worker, memory store) with a policy `<step>` + `fifo` over a 16 384-token window
(`tiktoken:o200k_base`: an exact tokenizer, so counts never drift with calibration), and an
upstream in this process that answers the agent's calls after `--model-delay` seconds and
summarisation calls (told apart by the summariser's system prompt) after `--summary-delay`
seconds, about two agent cycles, each summary numbered so that the run can tell which ones the
agent's later calls carried. One deterministic agent then works through `--turns` Turns: a user
message, one to four tool rounds (tool outputs of 150 to 1 200 tokens, `--tool-delay` for the
tool to run), a final answer. The same session also runs with a `fifo`-only policy (no
summaries) as the baseline for latency; `--compare` adds a run without precompute.

Printed per summarising run:

* summariser calls per 100 Turns, and how many summaries were never used (neither carried by
  an agent call nor extended by a later summary);
* compacting requests (over the summarising step's threshold) and the share served from a ready
  summary: compacted without waiting for a summary call (one that came back while the request
  was in the gateway, just before the request went on). The others were sent whole while their
  summary was being made (they fit), or waited for it;
* the gateway's added latency (client latency minus the upstream's delay) on the compacting
  requests served from a ready summary, next to the same requests through the fifo-only policy,
  and on the requests under the threshold.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import socket
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiohttp import web

from gateway.echo_upstream import estimate_prompt_tokens
from gateway.summarizer import SYSTEM_PROMPT

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 16_384
MAX_TOKENS = 1024
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} in the repository",
            "parameters": {"type": "object", "properties": {"arg": {"type": "string"}}},
        },
    }
    for name in ("read_file", "grep", "run_tests", "edit_file")
]
_WORDS = (
    "request context window budget policy summary token message assistant tool result file "
    "function error retry upstream gateway config model stream chunk header value index test "
    "build deploy cache memory limit offset line search match update delete create return"
).split()
RESUME_S = 0.05  # a request that waited for a summary goes on within this of its arrival
_USED = re.compile(r"SUMMARY#(\d+):")


# -- the upstream --------------------------------------------------------------------------------


@dataclass
class Upstream:
    model_delay: float
    summary_delay: float
    summaries: int = 0
    calls: int = 0
    used: set[int] = field(default_factory=set)  # summary numbers seen in the agent's calls
    arrivals: dict[str, float] = field(default_factory=dict)  # x-bench-seq -> perf_counter
    summary_ends: list[float] = field(default_factory=list)  # perf_counter of each answer

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        raw = await request.read()
        payload = orjson.loads(raw)
        messages = payload.get("messages") or [{}]
        # A summary is used when an agent call carries it, or a later summary extends it.
        self.used.update(int(n) for n in _USED.findall(raw.decode()))
        if messages[0].get("content") == SYSTEM_PROMPT:
            self.summaries += 1
            number = self.summaries
            await asyncio.sleep(self.summary_delay)
            self.summary_ends.append(time.perf_counter())
            text = f"<summary>SUMMARY#{number}: " + " ".join(_WORDS[:40]) * 10 + "</summary>"
        else:
            self.calls += 1
            self.arrivals[request.headers.get("x-bench-seq", "")] = time.perf_counter()
            await asyncio.sleep(self.model_delay)
            text = "Working on it."
        prompt = estimate_prompt_tokens(payload)  # what a provider would report, chars/4
        body = {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 0,
            "model": str(payload.get("model")),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 8, "total_tokens": prompt + 8},
        }
        return web.json_response(body)


# -- the agent -----------------------------------------------------------------------------------


def _prose(rng: random.Random, tokens: int) -> str:
    words = []
    while len(" ".join(words)) < tokens * 4:
        words.append(rng.choice(_WORDS))
    return " ".join(words)


@dataclass
class Sample:
    steps: str
    tokens_before: int
    latency: float  # as the agent saw it
    sent: float  # perf_counter when the agent sent it
    arrived: float  # perf_counter when the upstream received it


@dataclass
class Result:
    samples: list[Sample] = field(default_factory=list)


async def run_agent(
    client: httpx.AsyncClient, upstream: Upstream, turns: int, tool_delay: float, seed: int = 5
) -> Result:
    rng = random.Random(seed)
    result = Result()
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. " + _prose(rng, 300)}
    ]

    async def call() -> None:
        body = {"model": "agent", "messages": messages, "tools": TOOLS, "max_tokens": MAX_TOKENS}
        raw = orjson.dumps(body)
        seq = str(len(result.samples))
        started = time.perf_counter()
        headers = {"x-bench-seq": seq, "x-request-id": f"bench-{seq}"}
        response = await client.post("/chat/completions", content=raw, headers=headers)
        latency = time.perf_counter() - started
        response.raise_for_status()
        result.samples.append(
            Sample(
                response.headers["x-compactgate-steps"],
                int(response.headers["x-compactgate-tokens-before"]),
                latency,
                started,
                upstream.arrivals.get(seq, started),
            )
        )

    for turn in range(turns):
        messages.append(
            {"role": "user", "content": f"Task {turn}: " + _prose(rng, rng.randint(30, 80))}
        )
        for round_ in range(rng.choice([1, 2, 2, 3, 3, 4])):
            await call()
            call_id = f"call_{turn}_{round_}"
            tool = rng.choice(TOOLS)["function"]["name"]
            arguments = orjson.dumps({"arg": f"src/module_{rng.randint(1, 60)}.py"}).decode()
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {"name": tool, "arguments": arguments},
                        }
                    ],
                }
            )
            await asyncio.sleep(tool_delay)
            output = _prose(rng, rng.randint(150, 1200))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": output})
        await call()
        messages.append(
            {"role": "assistant", "content": "Done: " + _prose(rng, rng.randint(60, 160))}
        )
    return result


# -- the gateway ---------------------------------------------------------------------------------


async def start_gateway(
    config: dict[str, Any], directory: Path
) -> tuple[asyncio.subprocess.Process, int, Path]:
    """`compactgate serve` on a free port; ready once /healthz answers (30 s at most)."""
    path = directory / f"gateway-{time.monotonic_ns()}.json"
    path.write_text(json.dumps(config))
    log = path.with_suffix(".log")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", str(port),
            "--log-level", "warning", cwd=ROOT, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    async with httpx.AsyncClient(timeout=1) as client:
        while True:
            try:
                if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                    return process, port, log
            except httpx.TransportError:
                pass
            if process.returncode is not None or time.monotonic() > deadline:
                process.kill() if process.returncode is None else None
                raise RuntimeError("the gateway did not start:\n" + log.read_text()[-3000:])
            await asyncio.sleep(0.1)


def config_for(
    upstream_port: int, step: str, mode: str, lookahead: float, events: Path
) -> dict[str, Any]:
    """`mode`: precompute | no-precompute | fifo (the baseline: no summaries at all)."""
    step_config: dict[str, Any] = {"type": step}
    step_config["summary_length" if step == "summarize_old" else "summary_tokens"] = 500
    steps = [{"type": "fifo"}] if mode == "fifo" else [step_config, {"type": "fifo"}]
    return {
        "models": [
            {
                "name": "agent",
                "upstream": {"base_url": f"http://127.0.0.1:{upstream_port}/v1"},
                "context_window": WINDOW,
                "tokenizer": "tiktoken:o200k_base",
                "policy": "agent",
            }
        ],
        "policies": {"agent": {"steps": steps}},
        "summaries": {"precompute": mode == "precompute", "lookahead_requests": lookahead},
        "events": {"path": str(events)},  # one line per compacted request, with step details
    }


async def threshold(client: httpx.AsyncClient, step: str) -> int:
    """The summarising step's threshold, in the units of `x-compactgate-tokens-before`."""
    body = {"model": "agent", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS,
            "max_tokens": MAX_TOKENS}  # fmt: skip
    plan = (await client.post("/compactgate/plan", content=orjson.dumps(body))).json()
    ratio = {"compaction": 0.8, "sandwich": 0.7}.get(step)
    limit = plan["budget"]
    fixed = (
        plan["tokens_before"]
        - plan["tokens_by_region"]["history"]
        - plan["tokens_by_region"]["system"]
    )
    trigger = plan["trigger"] if ratio is None else int(limit * ratio)
    return trigger + fixed


@dataclass
class Report:
    mode: str
    turns: int
    summary_calls: int
    unused: int
    samples: list[Sample]
    model_delay: float
    summary_ends: list[float]
    over: int  # the summarising step's threshold, as x-compactgate-tokens-before counts
    states: dict[int, str]  # request index -> the summarising step's summary state (event log)


async def one_run(args: argparse.Namespace, mode: str, directory: Path) -> Report:
    # The fifo baseline only measures the gateway's own time: no need to wait for a model.
    model_delay = 0.0 if mode == "fifo" else args.model_delay
    tool_delay = 0.0 if mode == "fifo" else args.tool_delay
    upstream = Upstream(model_delay, args.summary_delay)
    runner = web.AppRunner(upstream.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    upstream_port = runner.addresses[0][1]
    events = directory / f"events-{mode}.jsonl"
    config = config_for(upstream_port, args.step, mode, args.lookahead, events)
    process, port, _ = await start_gateway(config, directory)
    try:
        base = f"http://127.0.0.1:{port}/v1"
        auth = {"authorization": "Bearer sk-bench"}
        async with httpx.AsyncClient(base_url=base, timeout=120, headers=auth) as client:
            over = await threshold(client, args.step)
            result = await run_agent(client, upstream, args.turns, tool_delay)
            await asyncio.sleep(args.summary_delay + 0.5)  # let the last precomputation land
    finally:
        process.terminate()
        await process.wait()
        await runner.cleanup()
    unused = upstream.summaries - len(upstream.used)
    return Report(
        mode,
        args.turns,
        upstream.summaries,
        unused,
        result.samples,
        model_delay,
        upstream.summary_ends,
        over,
        _summary_states(events, args.step),
    )


def _summary_states(events: Path, step: str) -> dict[int, str]:
    """From the event log: `ready`, or `partial, ...` (an earlier summary, the rest verbatim)."""
    states: dict[int, str] = {}
    if not events.exists():
        return states
    for line in events.read_bytes().splitlines():
        event = orjson.loads(line)
        request_id = str(event.get("request_id", ""))
        for report in event.get("steps", []):
            if report.get("type") == step and request_id.startswith("bench-"):
                states[int(request_id[6:])] = str(report.get("summary", ""))
    return states


def _ms(values: list[float]) -> str:
    if not values:
        return "-"
    values = sorted(values)
    p95 = values[min(len(values) - 1, int(len(values) * 0.95))]
    return f"median {statistics.median(values):.1f} ms, p95 {p95:.1f} ms (n={len(values)})"


def print_report(report: Report, baseline: Report | None, args: argparse.Namespace) -> None:
    samples = report.samples
    compacting = [
        i for i, s in enumerate(samples) if s.steps != "none" or s.tokens_before > report.over
    ]

    def waited_for_summary(sample: Sample) -> bool:
        # It reached the upstream right after a summary came back that was made while it waited.
        return any(
            sample.sent < end <= sample.arrived and sample.arrived - end < RESUME_S
            for end in report.summary_ends
        )

    deferred = [i for i in compacting if samples[i].steps == "none"]
    waited = [i for i in compacting if i not in deferred and waited_for_summary(samples[i])]
    ready = [i for i in compacting if i not in deferred and i not in waited]
    earlier = [i for i in ready if report.states.get(i, "ready").startswith("partial")]
    share = len(ready) / len(compacting) * 100 if compacting else 0.0
    per_100 = report.summary_calls * 100 / report.turns
    print(f"\n== {args.step} + fifo, {report.mode} ==")
    print(f"turns {report.turns}, requests {len(samples)}")
    print(
        f"summariser calls: {report.summary_calls} ({per_100:.1f} per 100 turns), "
        f"never used: {report.unused}"
    )
    print(
        f"compacting requests: {len(compacting)}; served from a ready summary: {len(ready)} "
        f"({share:.1f} %); sent whole while the summary was made: {len(deferred)}; "
        f"waited for it: {len(waited)}"
    )
    print(
        f"  of those served from a ready summary, {len(earlier)} used the summary so far while "
        "the newest part was being made (the rest of the history verbatim; it fit)"
    )

    def added(run: Report, indices: list[int]) -> list[float]:
        return [(run.samples[i].latency - run.model_delay) * 1000 for i in indices]

    print(f"added latency, compacting from a ready summary: {_ms(added(report, ready))}")
    if baseline is not None:
        print(f"  the same requests, fifo only (no summaries): {_ms(added(baseline, ready))}")
    plain = [i for i in range(len(samples)) if i not in set(compacting)]
    print(f"added latency, requests under the threshold:    {_ms(added(report, plain))}")


async def main_async(args: argparse.Namespace) -> None:
    modes = ["precompute", "fifo"] + (["no-precompute"] if args.compare else [])
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-summaries-") as tmp:
        reports = {mode: await one_run(args, mode, Path(tmp)) for mode in modes}
    for mode in modes:
        if mode != "fifo":
            print_report(reports[mode], reports["fifo"], args)
    print(
        f"\n(total {time.perf_counter() - started:.0f} s; model delay {args.model_delay} s, "
        f"summary delay {args.summary_delay} s, tool delay {args.tool_delay} s)"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_summaries")
    parser.add_argument("--turns", type=int, default=100)
    parser.add_argument(
        "--step", choices=("compaction", "sandwich", "summarize_old"), default="compaction"
    )
    parser.add_argument("--model-delay", type=float, default=0.1)
    parser.add_argument("--summary-delay", type=float, default=0.3)
    parser.add_argument("--tool-delay", type=float, default=0.02)
    parser.add_argument("--lookahead", type=float, default=2.0, help="summaries.lookahead_requests")
    parser.add_argument("--compare", action="store_true", help="also run without precompute")
    asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
