"""Several worker processes on one port (`compactgate serve --workers N`, design D13.7): what they
need from the store, and the line each start says about it.

The rule this module owns: workers share nothing but the listening socket, so they share state
the way replicas do, through the store. With a Redis store they are replicas on one machine.
With a `memory://` store each worker keeps its own, which is only sound when nothing a request
leaves behind is needed by a later request that another worker may serve: a configuration that
masks tool outputs behind refs (`excerpt`, `tool_output_cache`, the default chain), sends
summaries in place of turns (a summarising step), or answers Responses remote compaction itself
(`responses_compact: emulate`, the default for any upstream but OpenAI's) is refused, naming
each model and what would break. What a worker only learns or remembers for speed (its prefix
memos, its in-process caches) is its own either way (design D13.3).
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.registry import DEFAULT_STEPS
from policies.summarising import SummarisingConfig

from ..config import Config
from ..routing import compact_mode
from ..store.urls import mask_store_url, parse_store_url

REF_STEPS = frozenset({"excerpt", "tool_output_cache"})  # steps whose cut text sits behind a ref


@dataclass(frozen=True, slots=True)
class WorkersPlan:
    """What `--workers N` means for a config: refused (`problems`), or the start-up line."""

    problems: tuple[str, ...]
    line: str


def plan_workers(config: Config, workers: int) -> WorkersPlan:
    """Whether `workers` processes can serve `config`, and how they share (module docstring)."""
    url = parse_store_url(config.store)
    masked = mask_store_url(config.store)
    if workers <= 1:
        return WorkersPlan((), f"1 worker, store {masked}")
    if url.shared:
        return WorkersPlan(
            (), f"{workers} workers sharing state through the store {masked}, as replicas do"
        )
    needs = needs_sharing(config)
    if needs:
        problems = (
            f"--workers {workers} with store {masked}: each worker would keep its own memory "
            "store, and this config leaves state that a later request, served by another "
            "worker, must find:",
            *(f"  {need}" for need in needs),
            "Use a Redis store (store: redis://host:port/0, or a Sentinel set or a Cluster) "
            "or --workers 1.",
        )
        return WorkersPlan(problems, "")
    return WorkersPlan(
        (),
        f"{workers} workers, store {masked}: each worker keeps its own state (nothing this "
        "config does needs sharing; counts, summaries and memos are made once per worker)",
    )


def needs_sharing(config: Config) -> list[str]:
    """What the config's models do that a later request served elsewhere depends on."""
    needs = []
    for model in config.models:
        policy = config.policy(model.policy)
        steps = DEFAULT_STEPS if policy.steps is None else policy.steps
        types = {step.type for step in steps}
        if types & REF_STEPS:
            named = ", ".join(sorted(types & REF_STEPS))
            needs.append(
                f"model {model.name!r} masks tool outputs behind refs ({named}) that a later "
                "turn expands"
            )
        if any(isinstance(step, SummarisingConfig) for step in steps):
            needs.append(
                f"model {model.name!r} sends summaries in place of old turns, which later turns "
                "must find again"
            )
        if compact_mode(model) == "emulate":
            needs.append(
                f"model {model.name!r} answers Responses remote compaction itself "
                "(responses_compact: emulate, the default off OpenAI's API): its compaction "
                "items point at summaries in the store"
            )
    return needs
