"""`compactgate demo`: the real gateway, a demo stand-in model, a long agent session, offline.

Starts the echo upstream (a 4,096-token stand-in, see `echo_upstream`, embedded in the gateway:
`upstream.provider: in_process`) and the real gateway in this process, then plays an agent that
reads files and logs turn after turn through the official `openai` client. Each turn prints what
the client sent, what the gateway forwarded, which steps acted, and whether the upstream would
have refused the request without the gateway.
`--llm` does the same against a real local model, SmolLM2-135M-Instruct on llama.cpp's own server
(`local_llm`, the optional extra `llm`), whose 2,048-token window is enforced for real: the
"without gateway" column is then llama.cpp's own token count of the request, and a request the
gateway's estimate let through but the model refused shows up as a retry.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ..config import parse_config

if TYPE_CHECKING:
    from ..upstream import ServerFactory

DEMO_WINDOW = 4096
DEMO_MAX_TOKENS = 200
LLM_WINDOW = 2048
LLM_MAX_TOKENS = 16  # a 135M model on a CPU: short answers keep the demo under two minutes
FILES = [
    "src/app.py",
    "logs/build.log",
    "src/db.py",
    "README.md",
    "tests/test_api.py",
    "logs/deploy.log",
]


@dataclass
class Stage:
    """The upstream the demo runs against, and how the table describes it."""

    model: str  # the name the client sends
    base_url: str
    window: int
    max_tokens: int
    output_lines: int  # lines of each file the agent reads
    tool_budget: int  # tool_output_cache's context_budget_tokens
    banner: str
    would_refuse: Callable[[dict[str, Any]], Awaitable[bool]]  # without the gateway
    close: Callable[[], Awaitable[None]]
    extra_config: dict[str, Any]
    tokenizer: str = "chars:4"  # how the gateway counts this model
    provider: str = "openai"  # `in_process`: served by `servers`, inside the gateway
    servers: dict[str, ServerFactory] = field(default_factory=dict)


def run_demo(llm: bool = False, turns: int = 14) -> int:
    if llm:
        from . import local_llm

        problem = local_llm.available()
        if problem is not None:
            print(
                f"compactgate demo --llm needs the optional local-model extra.\n{problem}",
                file=sys.stderr,
            )
            return 2
    try:
        return asyncio.run(_demo(turns, llm))
    except KeyboardInterrupt:
        print("\ncompactgate demo: interrupted.", file=sys.stderr)
        return 130


async def _echo_stage() -> Stage:
    from .echo_upstream import estimate_prompt_tokens, start_echo_upstream

    upstream = await start_echo_upstream(context_window=DEMO_WINDOW)

    async def would_refuse(body: dict[str, Any]) -> bool:
        return estimate_prompt_tokens(body) + DEMO_MAX_TOKENS > DEMO_WINDOW

    return Stage(
        model="demo-echo",
        base_url=upstream.base_url,
        window=DEMO_WINDOW,
        max_tokens=DEMO_MAX_TOKENS,
        output_lines=60,
        tool_budget=1200,
        banner=(
            "a DEMO STAND-IN model\n('compactgate-echo': it echoes, it does not think) with a "
            f"{DEMO_WINDOW}-token context window."
        ),
        would_refuse=would_refuse,
        close=upstream.close,
        extra_config={},
        provider="in_process",
        servers=upstream.servers,
    )


async def _llm_stage() -> Stage:
    import httpx

    from .local_llm import MODEL_NAME, LocalModel, LocalModelSettings, keep_python_signal_handlers

    print(f"Starting {MODEL_NAME} on llama.cpp's server (a few seconds) ...", flush=True)
    local = LocalModel(LocalModelSettings(n_ctx=LLM_WINDOW))
    with keep_python_signal_handlers():  # Ctrl-C must still stop the demo
        base_url = await asyncio.to_thread(local.start)
    root = base_url.removesuffix("/v1")
    http = httpx.AsyncClient(timeout=60)

    async def would_refuse(body: dict[str, Any]) -> bool:
        """llama.cpp's own count: its chat template applied, then its tokenizer."""
        rendered = await http.post(f"{root}/apply-template", json={"messages": body["messages"]})
        tokens = await http.post(f"{root}/tokenize", json={"content": rendered.json()["prompt"]})
        return len(tokens.json()["tokens"]) >= LLM_WINDOW

    async def close() -> None:
        await http.aclose()
        await asyncio.to_thread(local.stop)

    return Stage(
        model="smollm2-local",
        base_url=base_url,
        window=LLM_WINDOW,
        max_tokens=LLM_MAX_TOKENS,
        output_lines=10,
        tool_budget=400,
        banner=(
            f"a REAL local model\n({MODEL_NAME} on llama.cpp, CPU) with a {LLM_WINDOW}-token "
            "context window. The gateway counts with the model's own tokenizer "
            "(tokenizer: upstream)."
        ),
        tokenizer="upstream",
        would_refuse=would_refuse,
        close=close,
        # A 135M model does not use the gateway's read-back tools: do not offer them.
        extra_config={"tool_outputs": {"expand": False}},
    )


async def _demo(turns: int, llm: bool = False) -> int:
    import openai
    import uvicorn

    from ..app import build_app

    stage = await (_llm_stage() if llm else _echo_stage())
    config = parse_config(
        {
            "models": [
                {
                    "name": stage.model,
                    "upstream": {"base_url": stage.base_url, "provider": stage.provider},
                    "context_window": stage.window,
                    "max_output_tokens": stage.max_tokens,
                    "tokenizer": stage.tokenizer,
                    "policy": "agent",
                }
            ],
            "policies": {
                "agent": {
                    "trigger_ratio": 0.8,
                    "target_ratio": 0.6,
                    "steps": [
                        {"type": "tool_output_cache", "context_budget_tokens": stage.tool_budget},
                        {"type": "fifo"},
                    ],
                }
            },
            **stage.extra_config,
        }
    )
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            build_app(config, stage.servers),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            lifespan="on",
        )
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    print(
        f"compactgate demo: gateway on http://127.0.0.1:{port}/v1 in front of {stage.banner}\n"
        f"An agent reads files turn after turn; its history soon outgrows the window.\n"
    )
    header = (
        f"{'turn':>4}  {'msgs':>4}  {'sent':>6} -> {'fwd':>6}  {'steps':<24} {'retries':>7}"
        "  without gateway"
    )
    print(header)
    print("-" * len(header))
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="demo-key", max_retries=0
    )
    messages: list[dict[str, Any]] = [
        {
            "role": "system",
            "content": "You are a coding agent. Use the tools to inspect the project.",
        }
    ]
    saved = 0
    rescued = 0
    started = time.perf_counter()
    try:
        for turn in range(1, turns + 1):
            path = FILES[(turn - 1) % len(FILES)]
            messages += _agent_turn(turn, path, stage.output_lines)
            body: dict[str, Any] = {
                "model": stage.model,
                "messages": messages,
                "max_tokens": stage.max_tokens,
            }
            direct_fails = await stage.would_refuse(body)
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
                f"{turn:>4}  {len(messages):>4}  {before:>6} -> {after:>6}  "
                f"{steps:<24} {retries:>7}  {verdict}"
            )
            messages.append({"role": "assistant", "content": reply})
    except openai.APIConnectionError:
        if not server.should_exit:
            raise
        print("\ncompactgate demo: interrupted.", file=sys.stderr)
        return 130
    finally:
        await client.close()
        server.should_exit = True
        try:
            await serving
        finally:
            await stage.close()  # the local model too, however the demo ends
    elapsed = time.perf_counter() - started
    print(
        f"\n{turns} turns in {elapsed:.1f} s: {rescued} requests the model would have refused "
        f"were answered; {saved} prompt tokens were not sent.\nThe latest user message, "
        "the system prompt and every"
        " tool call/result pair were kept. Try `compactgate plan` on your own request bodies."
    )
    return 0


def _agent_turn(turn: int, path: str, size: int = 60) -> list[dict[str, Any]]:
    """A user question, the agent's tool call, and the (large) tool output."""
    call_id = f"call_{turn:03d}"
    if path.endswith(".log"):
        lines = [
            f"2026-11-21T10:{turn:02d}:{i:02d} INFO step {i} of job {turn}: ok" for i in range(size)
        ]
    else:
        lines = [
            f"def function_{turn}_{i}(x):\n    return x * {i}  # helper {i}"
            for i in range(size * 3 // 4)
        ]
    return [
        {"role": "user", "content": f"Turn {turn}: what does {path} do? Look at it and summarise."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {
                        "name": "read_file",
                        "arguments": orjson.dumps({"path": path}).decode(),
                    },
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "\n".join(lines)},
    ]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
