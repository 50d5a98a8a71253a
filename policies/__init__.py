"""The functional core: pure, deterministic decisions about what to send (R3, R4).

Nothing here does I/O, reads a clock, draws a random number or keeps global state; it imports
no web framework, HTTP client, Redis, Prometheus, litellm or asyncio (a test enforces it). The
gateway builds a `Conversation`, a `Budget` and an `Env`, and `run_chain` returns what to send.
"""

from .budget import Budget, stable_cut
from .chain import ChainResult, Policy, StepReport, run_chain, summarize_reports
from .conversation import Conversation, Message, Turn, find_safe_boundary, parse_turns
from .invariants import Violation, check
from .step import Env, StepConfig, StepResult, StoredOutput
from .summaries import SummaryAnswer, SummaryRequest

__all__ = [
    "Budget",
    "ChainResult",
    "Conversation",
    "Env",
    "Message",
    "Policy",
    "StepConfig",
    "StepReport",
    "StepResult",
    "StoredOutput",
    "SummaryAnswer",
    "SummaryRequest",
    "Turn",
    "Violation",
    "check",
    "find_safe_boundary",
    "parse_turns",
    "run_chain",
    "stable_cut",
    "summarize_reports",
]
