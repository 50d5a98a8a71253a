"""The Codex CLI session that compacts itself, as the test and the benchmark run it.

`codex exec` (agents/node_modules, `scripts/install-agents`) on a task the fake upstream
(`tests/fake_upstream.py`) scripts: one shell call per step printing 4,000 numbered lines, of
which Codex keeps `output_tokens` tokens (`tool_output_token_limit`), then the model's last
answer; Codex compacts its own history past `limit` tokens (`model_auto_compact_token_limit`).
`Tally` reads what the upstream read (its own count of every prompt: the characters of its
JSON / 4, the usage it reports): Codex's turns, its compaction requests that reached it, the
gateway's own summaries made ahead of need (not streamed; Codex always streams).

Shared by `tests/test_real_agents.py` and `benchmarks/bench_codex_compaction.py` (which imports
it from here, so no test depends on a benchmark).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.fake_agent_apis import asks_for_summary, prompt_tokens

ROOT = Path(__file__).resolve().parent.parent
CODEX = ROOT / "agents" / "node_modules" / ".bin" / "codex"
FINAL = "All the numbered parts are listed."
TASK = "List the numbered parts and report."
CHARS_PER_TOKEN = 4.0  # the fake upstream's count, reported as its usage


def script(steps: int, output_tokens: int, delay: float = 0.0) -> list[dict[str, Any]]:
    """The model's moves: one shell call per step (4,000 numbered lines each), then the answer;
    each `delay` seconds after the request."""
    calls = [
        {
            "kind": "tool_calls",
            "reasoning": True,
            "delay_s": delay,
            "tool_calls": [
                {
                    "name": "exec_command",
                    "arguments": {
                        "cmd": f"seq {step}00000 {step}03999",
                        "max_output_tokens": output_tokens,
                    },
                }
            ],
        }
        for step in range(1, steps + 1)
    ]
    return [*calls, {"kind": "ok", "content": FINAL, "delay_s": delay}]


def settings(limit: int, output_tokens: int) -> str:
    """Codex's config.toml lines for the session (before its provider's table)."""
    return (
        "model_context_window = 200000\n"
        f"model_auto_compact_token_limit = {limit}\n"
        f"tool_output_token_limit = {output_tokens}\n"
    )


def run_codex(base_url: str, directory: Path, lines: str, timeout: float = 600) -> str:
    """`codex exec` on the task with `base_url` as its Responses provider; its JSON-lines
    output, once it has finished without an error."""
    home, work = directory / "codex-home", directory / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f'model = "m"\nmodel_provider = "upstream"\n{lines}'
        "[model_providers.upstream]\n"
        f'name = "Upstream"\nbase_url = "{base_url}"\n'
        'env_key = "UPSTREAM_KEY"\nwire_api = "responses"\n'
    )
    env = {**os.environ, "CODEX_HOME": str(home), "UPSTREAM_KEY": "sk-codex", "NO_COLOR": "1"}
    run = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", "danger-full-access",
         "--json", TASK],
        cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if run.returncode != 0 or FINAL not in run.stdout:
        raise RuntimeError(f"codex failed ({run.returncode}): {run.stderr[-3000:]}")
    return run.stdout


@dataclass(frozen=True, slots=True)
class Tally:
    """What the upstream read in one arm (its own count of each prompt)."""

    requests: int
    tokens: int
    ordinary: int  # Codex's turns
    compactions: int  # Codex's compaction requests that reached the upstream
    compaction_tokens: int
    background: int  # the gateway's own summaries made ahead of need
    background_tokens: int

    @classmethod
    def of(cls, records: list[dict[str, Any]]) -> Tally:
        """Codex always streams; the gateway's own summary calls do not."""
        sent = [r["json"] for r in records if r["path"] == "/v1/responses" and r["json"]]
        sizes = [prompt_tokens(body, CHARS_PER_TOKEN) for body in sent]
        summary = [asks_for_summary(body) for body in sent]
        own = [s and body.get("stream") is not True for s, body in zip(summary, sent, strict=True)]
        agent = [s and not o for s, o in zip(summary, own, strict=True)]
        return cls(
            requests=len(sent),
            tokens=sum(sizes),
            ordinary=sum(not s for s in summary),
            compactions=sum(agent),
            compaction_tokens=sum(n for n, a in zip(sizes, agent, strict=True) if a),
            background=sum(own),
            background_tokens=sum(n for n, o in zip(sizes, own, strict=True) if o),
        )


def compactions_of(metrics: str) -> dict[str, float]:
    """The gateway's `compactgate_agent_compactions_total` for Codex, by outcome."""
    found = re.findall(
        r'^compactgate_agent_compactions_total\{agent="codex",outcome="(\w+)"\} ([0-9.e+]+)$',
        metrics,
        re.M,
    )
    return {outcome: float(value) for outcome, value in found}


def gateway_config(upstream: str) -> dict[str, Any]:
    model = {
        "name": "m",
        "upstream": {"base_url": upstream},
        "tokenizer": "chars:4",
        "context_window": 200_000,
        "max_output_tokens": 2000,
    }
    return {"models": [model]}
