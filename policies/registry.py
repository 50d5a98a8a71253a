"""The table of step types: YAML `type` -> (config model, step factory).

A read-only table built from the step modules, not a mutable global filled by decorators:
what exists is visible in one place. Adding a step touches its module and this table.

`DEFAULT_STEPS` is the chain a policy without `steps` gets: no LLM calls, least loss first.
`excerpt` cuts the oldest large user and tool messages to their head (and tail) with the rest
behind a ref, landing at the target; `tool_output_cache` replaces old tool output by refs the
model can expand (nothing is lost for good), `content_type_chunking` squeezes JSON, code and
logs in older Turns, `ledger` carries what the user stated in the Turns about to go into one
block after the system prompt, and `fifo` drops the oldest whole Turns when that was not
enough. All are cache-stable between events. Summaries are only used when a policy lists a
summarising step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .chain import Policy
from .recovery import RecoveryMode
from .step import Step, StepConfig, StepFactory
from .steps import (
    compaction,
    content_type_chunking,
    discard_low_rel,
    emergency,
    excerpt,
    fifo,
    ledger,
    prioritize_recent,
    sandwich,
    sliding_window,
    summarize_old,
    tool_output_cache,
)

STEPS: Mapping[str, tuple[type[StepConfig], StepFactory]] = MappingProxyType(
    {
        tool_output_cache.ToolOutputCacheConfig.TYPE: (
            tool_output_cache.ToolOutputCacheConfig,
            tool_output_cache.ToolOutputCache,
        ),
        fifo.FifoConfig.TYPE: (fifo.FifoConfig, fifo.Fifo),
        sliding_window.SlidingWindowConfig.TYPE: (
            sliding_window.SlidingWindowConfig,
            sliding_window.SlidingWindow,
        ),
        sandwich.SandwichConfig.TYPE: (sandwich.SandwichConfig, sandwich.Sandwich),
        compaction.CompactionConfig.TYPE: (compaction.CompactionConfig, compaction.Compaction),
        summarize_old.SummarizeOldConfig.TYPE: (
            summarize_old.SummarizeOldConfig,
            summarize_old.SummarizeOld,
        ),
        prioritize_recent.PrioritizeRecentConfig.TYPE: (
            prioritize_recent.PrioritizeRecentConfig,
            prioritize_recent.PrioritizeRecent,
        ),
        content_type_chunking.ContentTypeChunkingConfig.TYPE: (
            content_type_chunking.ContentTypeChunkingConfig,
            content_type_chunking.ContentTypeChunking,
        ),
        discard_low_rel.DiscardLowRelConfig.TYPE: (
            discard_low_rel.DiscardLowRelConfig,
            discard_low_rel.DiscardLowRel,
        ),
        emergency.EmergencyConfig.TYPE: (emergency.EmergencyConfig, emergency.Emergency),
        ledger.LedgerConfig.TYPE: (ledger.LedgerConfig, ledger.Ledger),
        excerpt.ExcerptConfig.TYPE: (excerpt.ExcerptConfig, excerpt.Excerpts),
    }
)

DEFAULT_STEPS: tuple[StepConfig, ...] = (
    excerpt.ExcerptConfig(),
    tool_output_cache.ToolOutputCacheConfig(),
    content_type_chunking.ContentTypeChunkingConfig(),
    ledger.LedgerConfig(),
    fifo.FifoConfig(),
)


def step_types() -> Sequence[str]:
    return sorted(STEPS)


def parse_step_config(raw: Mapping[str, Any]) -> StepConfig:
    """Validate one YAML step (`{type: fifo, ...}`) into its typed config.

    Raises ValueError for an unknown type and pydantic's ValidationError for bad fields.
    """
    type_name = raw.get("type")
    if not isinstance(type_name, str) or type_name not in STEPS:
        raise ValueError(f"unknown step type {type_name!r} (known: {', '.join(step_types())})")
    config_cls, _ = STEPS[type_name]
    return config_cls.model_validate(dict(raw))


def build_step(config: StepConfig) -> Step:
    _, factory = STEPS[config.type]
    return factory(config)


def build_policy(
    name: str,
    steps_configs: Sequence[StepConfig | Mapping[str, Any]] | None = None,
    max_iterations: int = 3,
    recovery_mode: RecoveryMode = "truncate",
) -> Policy:
    """A runnable policy from step configs (typed, or raw YAML mappings); None: `DEFAULT_STEPS`."""
    configs = DEFAULT_STEPS if steps_configs is None else steps_configs
    steps = tuple(
        build_step(c if isinstance(c, StepConfig) else parse_step_config(c)) for c in configs
    )
    return Policy(
        name=name, steps=steps, max_iterations=max_iterations, recovery_mode=recovery_mode
    )
