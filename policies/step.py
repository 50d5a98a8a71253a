"""What every policy step is: a typed config and a pure `apply`.

A step receives the conversation, the budget and an `Env` (the few pure services a step may
use: the token counter, the summary source, the ref function) and returns a `StepResult`. It
never mutates its input and never does I/O. Steps are listed under their YAML `type`
in `policies/registry.py`; adding a step touches its own module and that table.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from .budget import Budget
from .conversation import Conversation
from .memo import Memo
from .summaries import NoSummaries, SummaryRequest, SummarySource


class StepConfig(BaseModel):
    """Base of every step's YAML config: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    type: str


@dataclass(frozen=True, slots=True)
class StoredOutput:
    """Full text of a tool output the step cut or replaced; the gateway persists it under `ref`.

    `byte_size` and `line_count` are derived from `text` when asked for:
    a step may return hundreds of outputs per request and the gateway rarely reads them.
    """

    ref: str
    text: str

    @property
    def byte_size(self) -> int:
        """UTF-8 bytes of the full text."""
        text = self.text
        return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))

    @property
    def line_count(self) -> int:
        return self.text.count("\n") + 1 if self.text else 0


def _no_ref(text: str) -> str:
    raise LookupError("no ref function configured")


@dataclass(frozen=True, slots=True)
class Env:
    """Pure services a step may use."""

    count: Callable[[Mapping[str, Any]], int]  # tokens of one message as forwarded
    summaries: SummarySource = field(default_factory=NoSummaries)
    ref_for: Callable[[str], str] = _no_ref  # deterministic, unguessable ref for a tool output
    count_text: Callable[[str], int] | None = None  # tokens of bare text (defaults to len/4)
    # Relevance of each text to a query (e.g. sentence-embedding cosine), for `scorer: embeddings`;
    # None: the relevance steps fall back to BM25.
    relevance: Callable[[Sequence[str], str], Sequence[float]] | None = None
    # Pure per-text results (content types, compressed forms); the gateway passes one that
    # lives across requests. Never changes an output, only how long it takes.
    memo: Memo = field(default_factory=Memo)
    # What `count`, `count_text` and `ref_for` depend on (the gateway: its route, tokenizer and
    # tenant): a memo entry whose value they made carries it in its key, so one memo serving
    # routes that count differently, or tenants whose refs differ, never hands one another's.
    scope: Hashable = None

    def text_tokens(self, text: str) -> int:
        if self.count_text is not None:
            return self.count_text(text)
        return (len(text) + 3) // 4


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a step did. `conversation` is the input itself when the step changed nothing."""

    conversation: Conversation
    removed: int = 0  # messages dropped
    replaced: int = 0  # messages whose content was replaced or shortened
    added: int = 0  # messages the step inserted (summaries, placeholders)
    stored: tuple[StoredOutput, ...] = ()
    pending: tuple[SummaryRequest, ...] = ()  # summaries it wanted but the source lacked
    summary_used: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def unchanged(cls, conversation: Conversation, **detail: Any) -> StepResult:
        return cls(conversation, detail=detail)


class Step(Protocol):
    type: ClassVar[str]

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult: ...


@runtime_checkable
class Finishing(Protocol):
    """A step that tidies its own output once the whole chain has run (the ledger drops the
    entries that a kept message still holds: only the end of the chain knows which)."""

    def finish(self, conversation: Conversation, env: Env) -> Conversation: ...


StepFactory = Callable[[Any], Step]
