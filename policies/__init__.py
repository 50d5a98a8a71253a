"""The functional core: pure, deterministic decisions about what to send (design D1, D4, D5).

Nothing here does I/O, reads a clock, draws a random number or keeps global state; it imports
no web framework, HTTP client, Redis, Prometheus, litellm or asyncio (a test enforces it). The
gateway builds a `Conversation`, a `Budget` and an `Env`, and `run_chain` returns what to send.
"""

from .budget import Budget, stable_cut
from .chain import ChainResult, Policy, StepReport, run_chain, summarize_reports
from .conversation import Conversation, Message, Turn, find_safe_boundary, parse_turns
from .invariants import Violation, check
from .memo import Memo
from .pinning import PinRule, apply_pin_rules
from .registry import DEFAULT_STEPS, STEPS, build_policy, build_step, parse_step_config
from .step import Env, StepConfig, StepResult, StoredOutput
from .summaries import SummaryAnswer, SummaryRequest

__all__ = [
    "DEFAULT_STEPS",
    "STEPS",
    "Budget",
    "ChainResult",
    "Conversation",
    "Env",
    "Memo",
    "Message",
    "PinRule",
    "Policy",
    "StepConfig",
    "StepReport",
    "StepResult",
    "StoredOutput",
    "SummaryAnswer",
    "SummaryRequest",
    "Turn",
    "Violation",
    "apply_pin_rules",
    "build_policy",
    "build_step",
    "check",
    "find_safe_boundary",
    "parse_step_config",
    "parse_turns",
    "run_chain",
    "stable_cut",
    "summarize_reports",
]
