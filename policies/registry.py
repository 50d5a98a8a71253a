"""The table of step types: YAML `type` -> (config model, step factory).

A read-only table built from the step modules, not a mutable global filled by decorators:
what exists is visible in one place. Adding a step touches its module and this table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from .step import Step, StepConfig, StepFactory
from .steps import fifo

STEPS: Mapping[str, tuple[type[StepConfig], StepFactory]] = MappingProxyType(
    {
        fifo.FifoConfig.TYPE: (fifo.FifoConfig, fifo.Fifo),
    }
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
