"""`compactgate plan FILE.json`: what the gateway would send for a request body, and why.

Runs the same pipeline as a real request (counting, budget, the policy chain) without any
upstream call, and prints a readable table; `--json` prints what `POST /v1/compactgate/plan`
returns. Summaries that would need an LLM call are reported as unavailable (the chain then
proceeds as it would after a failed summary).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import orjson

from ..app import assemble_core
from ..config import Config
from ..errors import GatewayError, ModelNotFoundError
from ..http.plan import plan_report
from ..wire import wire_of


def run_plan(path: str, config: Config, as_json: bool = False, api: str | None = None) -> int:
    try:
        body = Path(path).read_bytes()
    except OSError as exc:
        print(f"{path}: cannot read: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        report = asyncio.run(_plan(body, config, api))
    except GatewayError as error:
        print(
            f"{path}: {error.message}" + (f" (param: {error.param})" if error.param else ""),
            file=sys.stderr,
        )
        return 1
    if as_json:
        sys.stdout.buffer.write(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(render(report))
    return 0


async def _plan(body: bytes, config: Config, api: str | None) -> dict[str, Any]:
    request = wire_of(body, api).parse(body, config.server.max_messages)
    core = await assemble_core(config)
    try:
        route = core.router.resolve(request.model)
        if route is None:
            raise ModelNotFoundError(
                f"The model `{request.model}` is not served by this config.", param="model"
            )
        window = core.windows.effective(route)
        prepared = await core.engine.prepare(
            request, route, "plan:" + str(os.getuid()), window=window, remember=False
        )
        return plan_report(prepared, window)
    finally:
        await core.close()


def render(report: dict[str, Any]) -> str:
    """The plan as a table a person reads in one screen."""
    window = report["context_window"]
    lines = [
        f"api              {report['api']}",
        f"model            {report['model']}  "
        f"(upstream {report['upstream_model']}, tokenizer {report['tokenizer']})",
        f"context window   {window if window is not None else 'unknown'}  "
        f"({report['window_source']})",
    ]
    if report["budget"] is not None:
        lines += [
            f"reserved output  {report['reserved_output']}",
            f"message budget   {report['budget']}  "
            f"(compact above {report['trigger']}, down to {report['target']})",
        ]
    regions = report["tokens_by_region"]
    roles = ", ".join(f"{role} {count}" for role, count in sorted(report["counts_by_role"].items()))
    lines += [
        f"tokens           {report['tokens_before']} -> {report['tokens_after']}  "
        f"({'fits' if report['fits'] else 'DOES NOT FIT'})",
        f"by region        system {regions['system']}, tools {regions['tools']}, "
        f"history {regions['history']}",
        f"messages sent    {len(report['messages'])}  ({roles})",
        f"policy           {report['policy']}",
        "",
    ]
    if not report["steps"]:
        lines.append("steps            none (under the trigger: sent unchanged)")
    else:
        lines.append(
            f"{'step':<24} {'before':>8} {'after':>8} {'removed':>8} {'replaced':>9} {'added':>6}"
        )
        for step in report["steps"]:
            lines.append(
                f"{step['type']:<24} {step['tokens_before']:>8} {step['tokens_after']:>8} "
                f"{step['messages_removed']:>8} {step['messages_replaced']:>9} "
                f"{step['messages_added']:>6}" + ("" if step["changed"] else "   (no change)")
            )
    return "\n".join(lines)
