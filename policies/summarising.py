"""What the summarising steps share: their config keys, their summary requests, and the step.

The rule this module keeps: **a step summarises if and only if it is a `SummarisingStep`**. The
chain leaves such steps out of its cheap pass to the target, and the gateway fetches their
summaries and makes them ahead of need; nothing is told apart by the shape of its config. A
summarising step only says which units it scans, where the cut may go and how the summary is
asked for (`SummarisingStep.plan`); `summarise` walks the rolling summary (`rollup`) and puts it
in place of the units before the cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, cast

from pydantic import Field, field_validator

from .budget import Budget
from .conversation import Conversation, drop
from .placement import SUMMARY_TEMPLATE, Placement, has_summary, place_summary
from .rollup import Cap, Plan, Units, begin, walked
from .step import Env, StepConfig, StepResult
from .summaries import SummaryAnswer, SummaryPurpose, SummaryRequest


class SummarisingConfig(StepConfig):
    """Keys every summarising step has: where the summary goes and how it reads."""

    placement: Placement = "system"
    template: str = Field(
        SUMMARY_TEMPLATE, description="How the summary is shown; must contain {summary}"
    )
    model: str | None = Field(
        None, description="Model the gateway summarises with; unset: the request's model"
    )
    append_summaries: bool = Field(
        False,
        description=(
            "Keep earlier summary text frozen so the prompt-cache prefix survives: each event's "
            "summary of only the newly covered messages is appended to it; once the text reaches "
            "the step's summary length, the next event rewrites it into one. Off: every event "
            "rewrites the whole summary"
        ),
    )

    @field_validator("template")
    @classmethod
    def _has_slot(cls, value: str) -> str:
        if "{summary}" not in value:
            raise ValueError("template must contain {summary}")
        return value


def chunk_tokens(budget: Budget, summary_tokens: int) -> int:
    """Most message tokens one summariser call gets: what fits next to the previous summary.

    The summariser is the same model or one with a larger window, so the request's
    own limit, less room for the previous summary and the instructions, always fits.
    """
    return max(1, budget.target, budget.limit - summary_tokens - 512)


def bullets(prompt: str, directives: Sequence[str]) -> str:
    """`prompt` with `directives` appended as bullet points."""
    if not directives:
        return prompt
    return prompt.rstrip() + "\n" + "\n".join(f"- {d}" for d in directives)


class SummarisingStep:
    """Base of the steps that replace the history before a stable cut by a rolling summary.

    Every summary request of a step differs only in its messages, previous text and mode
    (`request`): the instructions, length, retain section and model come from the config.
    """

    type: ClassVar[str]

    def __init__(
        self,
        config: SummarisingConfig,
        instructions: str,
        summary_tokens: int,
        retain: str | None = None,
    ) -> None:
        self.config = config
        self.instructions = instructions
        self.summary_tokens = summary_tokens  # the longest summary asked for
        self.retain = retain  # the <retain> section's instructions, when one is asked for

    def plan(self, conversation: Conversation, budget: Budget) -> Plan | None:
        """What to scan and where the cut may go; None when there is too little to summarise."""
        raise NotImplementedError

    def apply(self, conversation: Conversation, budget: Budget, env: Env) -> StepResult:
        plan = self.plan(conversation, budget)
        if plan is None:
            return StepResult.unchanged(conversation, reason="not enough messages")
        return summarise(conversation, plan, env)

    def request(
        self, messages: tuple[Any, ...], previous: str | None, append: bool
    ) -> SummaryRequest:
        return SummaryRequest(
            purpose=cast(SummaryPurpose, self.type),
            messages=messages,
            instructions=self.instructions,
            max_tokens=self.summary_tokens,
            previous=previous,
            retain_instructions=self.retain,
            model=self.config.model,
            append=append,
        )

    def _plan(
        self,
        conversation: Conversation,
        budget: Budget,
        units: Units,
        start: int,
        *,
        trigger: int,
        target: int,
        cap: Cap,
        allowance: int | None = None,
        previous_of: Callable[[SummaryAnswer], str] | None = None,
    ) -> Plan:
        """The plan for `units` from message `start` on; `allowance` (the room the summary takes)
        defaults to `summary_tokens`."""
        room = self.summary_tokens if allowance is None else allowance
        return Plan(
            step_type=self.type,
            units=units,
            start=start,
            fixed_tokens=sum(m.tokens for m in conversation.messages[:start]),
            allowance=room,
            trigger=trigger,
            target=target,
            cap=cap,
            chunk_tokens=chunk_tokens(budget, room),
            make_request=self.request,
            placement=self.config.placement,
            template=self.config.template,
            previous_of=previous_of,
            append_until=self.summary_tokens if self.config.append_summaries else None,
        )


def summarise(conversation: Conversation, plan: Plan, env: Env) -> StepResult:
    """Replace the units before the stable cut by their rolling summary, or explain why not."""
    if has_summary(conversation, plan.step_type):
        return StepResult.unchanged(conversation, reason="already summarised")
    if len(plan.units) < 2:
        return StepResult.unchanged(conversation, reason="nothing to summarise")
    rolling, scan = begin(conversation, plan, env.summaries, env.memo)
    cuts = walked(rolling, scan)
    if not cuts:
        return StepResult.unchanged(conversation, reason="under threshold")
    pending = (rolling.pending,) if rolling.pending is not None else ()
    state = "failed" if rolling.failed else "pending" if pending else "ready"
    if rolling.answer is None:
        return StepResult(conversation, pending=pending, detail={"summary": state})
    result, removed = drop(conversation, plan.units.indices(0, rolling.covered))
    if not removed:
        return StepResult(conversation, pending=pending, detail={"reason": "nothing droppable"})
    placed, added, replaced = place_summary(
        result,
        plan.start,
        rolling.answer.text,
        rolling.answer.retain,
        plan.placement,
        plan.template,
        plan.step_type,
        env,
    )
    if placed.tokens >= conversation.tokens:
        return StepResult(conversation, pending=pending, detail={"reason": "summary not smaller"})
    return StepResult(
        placed,
        removed=removed,
        added=added,
        replaced=replaced,
        pending=pending,
        summary_used=True,
        detail={
            "summary": state if rolling.covered == cuts[-1] else f"partial, {state}",
            "summarised_messages": removed,
            "summary_links": rolling.links,
        },
    )
