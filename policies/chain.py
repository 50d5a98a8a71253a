"""The policy chain (design D4): run the configured steps until the request fits.

Rule: nothing happens while the messages are at or under `budget.trigger` (unless the reactive
path forces a pass). Past it, a compaction event: the steps run in order, each compacting toward
`budget.target`, and the chain stops as soon as the messages are back under the trigger; at most
`max_iterations` passes. An event ends at or under the target: when the first pass stopped
between target and trigger (masking alone could not get further), a second pass runs the steps
that ask for no summary against `Budget.at_event()`, so the later steps cut too (a summarised
range stays where the first pass put it, the one the precomputation predicted). The room that
leaves lets the conversation grow by appending until the next event, which keeps the provider's
prefix cache warm. If the result is still over `budget.limit`, the `emergency` step runs, and if
even that cannot fit, the policy's recovery mode decides (design D5.10).

Every step that ran is reported with its tokens before and after and what it removed: the
headers, the plan endpoint, the metrics and the event log are all built from these reports.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from .budget import Budget
from .conversation import Conversation
from .recovery import RecoveryMode, recover
from .step import Env, Finishing, Step, StepResult, StoredOutput
from .steps.emergency import Emergency, EmergencyConfig
from .summaries import SummaryRequest
from .summarising import SummarisingStep


@dataclass(frozen=True, slots=True)
class StepReport:
    type: str
    tokens_before: int
    tokens_after: int
    messages_removed: int = 0
    messages_replaced: int = 0
    messages_added: int = 0
    summary_used: bool = False
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        return bool(
            self.tokens_before != self.tokens_after
            or self.messages_removed
            or self.messages_replaced
            or self.messages_added
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "messages_removed": self.messages_removed,
            "messages_replaced": self.messages_replaced,
            "messages_added": self.messages_added,
            "summary_used": self.summary_used,
            "changed": self.changed,
            **dict(self.detail),
        }


@dataclass(frozen=True, slots=True)
class Policy:
    """A named, configured chain."""

    name: str
    steps: tuple[Step, ...]
    max_iterations: int = 3
    recovery_mode: RecoveryMode = "truncate"


@dataclass(frozen=True, slots=True)
class ChainResult:
    conversation: Conversation
    tokens_before: int
    tokens_after: int
    steps: tuple[StepReport, ...] = ()
    fits: bool = True
    triggered: bool = False
    recovery: str | None = None  # the recovery that ran, if any
    error: str | None = None  # recovery_mode "error" and it could not fit: what did not fit
    stored: tuple[StoredOutput, ...] = ()
    pending: tuple[SummaryRequest, ...] = ()

    @property
    def changed(self) -> bool:
        return any(s.changed for s in self.steps)

    def changed_steps(self) -> list[str]:
        """Step types that changed the request, in order, each once."""
        seen: list[str] = []
        for report in self.steps:
            if report.changed and report.type not in seen:
                seen.append(report.type)
        return seen


class _Run:
    """Accumulates the reports, stored outputs and pending summaries of one chain run."""

    def __init__(self, conversation: Conversation, budget: Budget, env: Env) -> None:
        self.conversation = conversation
        self.budget = budget
        self.env = env
        self.reports: list[StepReport] = []
        self.stored: list[StoredOutput] = []
        self.pending: list[SummaryRequest] = []
        self.note: Mapping[str, Any] = {}  # added to every report (which pass it ran in)

    def apply(self, step: Step) -> StepResult:
        before = self.conversation.tokens
        result = step.apply(self.conversation, self.budget, self.env)
        self.conversation = result.conversation
        self.stored.extend(result.stored)
        self.pending.extend(r for r in result.pending if r not in self.pending)
        self.reports.append(
            StepReport(
                type=step.type,
                tokens_before=before,
                tokens_after=self.conversation.tokens,
                messages_removed=result.removed,
                messages_replaced=result.replaced,
                messages_added=result.added,
                summary_used=result.summary_used,
                detail={**result.detail, **self.note} if self.note else result.detail,
            )
        )
        return result

    def finish(self, step: Finishing) -> None:
        """The step's tidying after the chain, reported as one more run of that step."""
        before = self.conversation
        self.conversation = step.finish(before, self.env)
        if self.conversation is not before:
            removed = len(before.messages) - len(self.conversation.messages)
            self.reports.append(
                StepReport(
                    type=step.type,  # type: ignore[attr-defined]
                    tokens_before=before.tokens,
                    tokens_after=self.conversation.tokens,
                    messages_removed=removed,
                    messages_replaced=0 if removed else 1,
                    detail={"finish": True},
                )
            )


def run_chain(
    conversation: Conversation,
    budget: Budget,
    policy: Policy,
    env: Env,
    *,
    force: bool = False,
) -> ChainResult:
    """Apply `policy` to `conversation`; pure and deterministic.

    `force` runs the steps even under the trigger (the upstream rejected the request).
    """
    tokens_before = conversation.tokens
    if tokens_before <= budget.trigger and not force:
        return ChainResult(
            conversation, tokens_before, tokens_before, fits=tokens_before <= budget.limit
        )

    run = _Run(conversation, budget, env)
    _passes(run, policy, budget.trigger, force)
    cheap = tuple(s for s in policy.steps if not isinstance(s, SummarisingStep))
    if run.conversation.tokens > budget.target and cheap:
        run.budget, run.note = budget.at_event(), {"to_target": True}
        _passes(run, replace(policy, steps=cheap), budget.target, False)
        run.budget, run.note = budget, {}
    for step in policy.steps:
        # a `Finishing` step, told by its method: the protocol's isinstance costs ~10 µs a step
        if getattr(step, "finish", None) is not None:
            run.finish(cast(Finishing, step))

    recovery: str | None = None
    error: str | None = None
    if run.conversation.tokens > budget.limit:
        run.apply(Emergency(EmergencyConfig()))
    if run.conversation.tokens > budget.limit:
        outcome = recover(run.conversation, budget, env, policy.recovery_mode)
        recovery = outcome.mode
        error = outcome.error
        if outcome.result is not None:
            before = run.conversation.tokens
            run.conversation = outcome.result.conversation
            run.pending.extend(r for r in outcome.result.pending if r not in run.pending)
            run.reports.append(
                StepReport(
                    type=f"recovery:{outcome.mode}",
                    tokens_before=before,
                    tokens_after=run.conversation.tokens,
                    messages_removed=outcome.result.removed,
                    messages_replaced=outcome.result.replaced,
                    messages_added=outcome.result.added,
                    summary_used=outcome.result.summary_used,
                    detail=outcome.result.detail,
                )
            )

    tokens_after = run.conversation.tokens
    return ChainResult(
        conversation=run.conversation,
        tokens_before=tokens_before,
        tokens_after=tokens_after,
        steps=tuple(run.reports),
        fits=tokens_after <= budget.limit and error is None,
        triggered=True,
        recovery=recovery,
        error=error,
        stored=tuple(run.stored),
        pending=tuple(run.pending),
    )


def _passes(run: _Run, policy: Policy, goal: int, force: bool) -> None:
    """Run the steps in order until the messages are at or under `goal` (at least one step when
    forced), at most `max_iterations` times over."""
    for _ in range(max(1, policy.max_iterations)):
        progressed = False
        for step in policy.steps:
            if run.conversation.tokens <= goal and not (force and not run.reports):
                break
            before = run.conversation
            run.apply(step)
            progressed = progressed or run.conversation != before
        if run.conversation.tokens <= goal or not progressed:
            break


def summarize_reports(reports: Sequence[StepReport]) -> str:
    """`x-compactgate-steps` value: changed step types, comma-separated, or `none`."""
    seen: list[str] = []
    for report in reports:
        if report.changed and report.type not in seen:
            seen.append(report.type)
    return ",".join(seen) if seen else "none"
