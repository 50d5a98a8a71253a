"""The rolling summary walk: the summary that stands for the units before the cut, link by link.

The rule this module owns: **the summary is a function of the prefix and of the source's
answers**. The summarised range `[0, cut)` is split into links, one per compaction event (the
units that event newly covered; chunks of at most `chunk_tokens` when an event covers more,
`cuts.links`), and the summary of link `k` is asked for as "these messages, extending `previous`
= the summary of links `0..k-1`". The previous text is not guessed: it is the answer the same
`SummarySource` gives for the previous link's request, which is itself built the same way. When
an event moves the cut, the earlier links and their answers stay as they are and one link is
added: one summariser call per event, over the newly covered messages and the previous summary;
no message is sent to the summariser twice. Until the first link's answer is `ready` the step
changes nothing and reports that link's request as pending; while a later one is being made, the
summary of the links before it is used (the rest stays verbatim) and the missing link is
reported as pending.

With `append_summaries` on, the earlier text is frozen instead of rewritten: a link is asked for
as "only these messages, given `previous` as context" (`SummaryRequest.append`) and its answer
is appended to the text so far (`APPEND_SEPARATOR`), which stays byte-identical, so a provider's
cached prefix reaches to the end of the old summary. Once the joined text reaches the step's
length key (`Plan.append_until`, measured as characters / 4, which calibration never moves) the
next link is asked for in rewrite mode, its answer replaces the whole text, and appending starts
again after it. The mode follows from the text so far and is part of every request.

Token counts are estimates that drift (calibration), and the cut a scan proposes moves with them.
A ready summary whose range ends within `SNAP_UNITS` of the proposed cut is kept instead (its
messages are still the conversation's, in place), and the scan goes on from where that summary
ends, so drift does not make the summaries again.

Anchored messages (system/developer prompts, pinned messages and the tool groups that hold them)
are never summarised away: they stay in place and are left out of the summariser's input.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..conversation import Conversation, Message
from ..memo import Memo
from ..placement import Placement
from ..summaries import SummaryAnswer, SummaryRequest, SummarySource, prepare_for_summary
from .cuts import Cap, Units, anchored, chunks, unit_sizes

# (messages, previous summary, append mode) -> the request; every field but `messages` must not
# depend on the messages (a link is memoised by its messages' uids and the request with no
# messages).
MakeRequest = Callable[[tuple[Any, ...], str | None, bool], SummaryRequest]
SNAP_UNITS = 2  # how far from a proposed cut a ready summary's range is looked for
APPEND_SEPARATOR = "\n\n"  # between appended summary parts


def text_size(text: str) -> int:
    """Tokens of a summary text for the consolidation rule: characters / 4.

    Not the calibrated counter: its counts change between requests, and so would the event at
    which appended parts are rewritten into one.
    """
    return (len(text) + 3) // 4


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where a walk stood after its last ready event: the state before that event's last link,
    the link, and the units covered once it is taken."""

    covered: int
    answer: SummaryAnswer | None
    previous: str | None
    last: SummaryRequest
    links: int


# What a walk did at one event: (the cut `scan_cuts` proposed, the cut taken, and when they
# differ, how far a snap could look: `furthest` changes as the conversation grows, and a further
# end could be taken instead).
Decision = tuple[int, int, int | None]


def snap_high(furthest: int, proposed: int) -> int:
    """The furthest end a snap from `proposed` may take."""
    return min(furthest, proposed + SNAP_UNITS)


@dataclass(frozen=True, slots=True)
class Plan:
    """What a summarising step decided to ask for, before the source is consulted."""

    step_type: str
    units: Units
    start: int  # message index of the first unit: where the summary goes
    fixed_tokens: int  # tokens before the units
    allowance: int  # the room the summary will take once there is one
    trigger: int
    target: int
    cap: Cap
    chunk_tokens: int
    make_request: MakeRequest
    placement: Placement
    template: str
    previous_of: Callable[[SummaryAnswer], str] | None = None
    append_until: int | None = None  # append mode (`append_summaries`): rewrite from this size


class Rolling:
    """The rolling summary, asked for link by link as `scan_cuts` finds the events (its settle).

    Each link is asked for as "these messages, extending the answer so far" (in append mode:
    "only these messages", appended to it). The walk stops at the first link that is `missing`
    (reported as `pending`) or `failed`; what was ready before it is kept, so a grown range keeps
    its older summary until the new link arrives (a failure never corrupts what was there), and
    the scan goes on without asking.

    Counts drift (a heuristic tokenizer is calibrated from the upstream's usage), and a drifted
    count moves a proposed cut by a unit or so, which would change every link after it and make
    the whole summary again. So when the link ending at the proposed cut is missing, a ready link
    from the same start ending up to `SNAP_UNITS` units earlier or later (never past `furthest`,
    where the step's own limit puts the last cut) is taken instead, and the scan goes on from
    there. This is not an approximation: a cached summary stands for exactly the messages it was
    made from, and they are still the conversation's, in place.

    Every event is recorded as a `Decision`, and the state after the last event whose links were
    ready as a `Checkpoint`: `replay.Walks` keeps them across requests and `restore`s a later
    walk from one, so a resent history is not walked link by link again.
    """

    def __init__(
        self,
        conversation: Conversation,
        units: Units,
        fixed: frozenset[int],
        sizes: Sequence[int],
        plan: Plan,
        source: SummarySource,
        memo: Memo | None = None,
    ) -> None:
        self.conversation = conversation
        self.units = units
        self.fixed = fixed
        self.sizes = sizes
        self.plan = plan
        self.source = source
        self.memo = memo if memo is not None else Memo()
        self.furthest = min(plan.cap(len(sizes) - 1), len(sizes) - 1)
        self.answer: SummaryAnswer | None = None  # summary of units [0, covered), parts joined
        self.covered = 0
        self.previous: str | None = None
        self.pending: SummaryRequest | None = None  # the first link the source did not have
        self.failed = False  # the source failed on the first link it did not have
        self.links = 0
        # What the step's config puts in a request, as bytes: they keep their hash, which a
        # request object would compute again for every link.
        self.template = plan.make_request((), None, False).canonical()
        # For the link keys, read once: a request walks every link of its rolling summary.
        self.uids = [m.uid for m in conversation.messages]
        self.anchored = sorted(fixed)
        self.decisions: list[Decision] = []  # one per event settled, walked or replayed
        self._replayed = 0  # events taken from a checkpoint: not walked again
        self._events = 0  # events settled so far
        self.reached: tuple[int, Checkpoint] | None = None  # (events, state) after the last ready
        self._last: tuple[SummaryRequest, SummaryAnswer | None, str | None] | None = None

    def restore(
        self, checkpoint: Checkpoint, last: SummaryAnswer, decisions: Sequence[Decision]
    ) -> None:
        """Stand where a recorded walk stood after `decisions`: `last` is the source's answer
        to the checkpoint's last link; `settle` takes those events as they were taken."""
        self.answer, self.previous = checkpoint.answer, checkpoint.previous
        self._take(checkpoint.last, last, checkpoint.covered)
        self.links = checkpoint.links
        self.decisions, self._replayed = list(decisions), len(decisions)

    @property
    def stopped(self) -> bool:
        return self.pending is not None or self.failed

    def settle(self, cut: int, proposed: int) -> int:
        events, self._events = self._events, self._events + 1
        if events < self._replayed:  # the checkpoint's events
            return self.decisions[events][1]
        taken = self._settle(cut, proposed)
        high = None if taken == proposed else snap_high(self.furthest, proposed)
        self.decisions.append((proposed, taken, high))
        if not self.stopped and self._last is not None:
            request, answer, previous = self._last
            checkpoint = Checkpoint(self.covered, answer, previous, request, self.links)
            self.reached = (events + 1, checkpoint)
        return taken

    def _settle(self, cut: int, proposed: int) -> int:
        spans = chunks(cut, proposed, self.sizes, self.plan.chunk_tokens)
        self.links += len(spans)
        for first, last in spans[:-1]:
            if self.stopped:
                return proposed
            self._ask(first, last)
        first, last = spans[-1]
        if self.stopped or self._ask(first, last) != "missing":
            return proposed
        for end in self._nearby(first, last):
            request = self._request(first, end)
            if request is not None and (found := self.source.get(request)).status == "ready":
                self.pending = None
                self._take(request, found, end)
                return end
        return proposed

    def _ask(self, first: int, last: int) -> str:
        request = self._request(first, last)
        if request is None:  # only anchored messages: nothing to summarise
            if self.answer is not None:
                self.covered = last
            return "ready"
        got = self.source.get(request)
        if got.status == "missing":
            self.pending = request
        elif got.status == "failed":
            self.failed = True
        else:
            self._take(request, got, last)
        return got.status

    def _request(self, first: int, last: int) -> SummaryRequest | None:
        start, end = self.units.bounds[first], self.units.bounds[last]
        included: Sequence[Message] = self.conversation.messages[start:end]
        fixed = self.anchored
        at = bisect.bisect_left(fixed, start)
        if at < len(fixed) and fixed[at] < end:  # anchored messages stay out of the summary
            included = [m for i, m in enumerate(included, start) if i not in self.fixed]
            uids = tuple([m.uid for m in included])
        else:
            uids = tuple(self.uids[start:end])
        if not included or None in uids:
            return self._build(included)
        # Every later request asks for the same links again: the same messages (equal uids
        # mean equal data) under the same instructions and previous summary give the same
        # request, so the one built before is reused with its canonical bytes already made.
        # (`make_request` takes the messages, the previous text and the mode; all else it puts
        # in comes from the step's config, the same for every link of this run.)
        key = ("summary link", self.template, self.previous, self._appending(), uids)
        chars = 4 * sum(self.sizes[first:last]) + len(self.previous or "")  # of `included`
        return self.memo.get(key, lambda: self._build(included), chars)

    def _build(self, included: Sequence[Message]) -> SummaryRequest | None:
        data = summary_input(tuple([m.data for m in included]))
        return self.plan.make_request(data, self.previous, self._appending()) if data else None

    def _appending(self) -> bool:
        """Whether the next link's answer is appended: there is a text to append to and it is
        still under `append_until` (else the link rewrites it into one, bounding its length)."""
        until = self.plan.append_until
        return until is not None and self.answer is not None and text_size(self.answer.text) < until

    def _take(self, request: SummaryRequest, answer: SummaryAnswer, last: int) -> None:
        self._last = (request, self.answer, self.previous)
        if request.append and self.answer is not None:
            # The earlier text stays as it was; `<retain>` is the newest answer's (it lists what
            # is still needed from the whole conversation, so it is asked for whole each time).
            text = self.answer.text + APPEND_SEPARATOR + answer.text
            answer = SummaryAnswer.ready(text, answer.retain)
        self.answer, self.covered = answer, last
        previous_of = self.plan.previous_of
        self.previous = previous_of(answer) if previous_of is not None else answer.text

    def _nearby(self, first: int, proposed: int) -> list[int]:
        low, high = max(first + 1, proposed - SNAP_UNITS), snap_high(self.furthest, proposed)
        ends = [end for end in range(low, high + 1) if end != proposed]
        return sorted(ends, key=lambda end: (abs(end - proposed), end))


def summary_input(messages: tuple[Any, ...]) -> tuple[Any, ...]:
    """Messages as a summariser gets them: no tool call without its result, anywhere in the range.

    `prepare_for_summary` strips the trailing assistant's tool calls. A client's history
    can also carry a call without a result mid-range (or a result without its call); those are
    removed the same way, so a summariser never receives a history a provider would reject.
    """
    messages = prepare_for_summary(messages)
    answered = {str(m.get("tool_call_id", "")) for m in messages if m.get("role") == "tool"}
    called: set[str] = set()
    out: list[Any] = []
    for message in messages:
        calls = message.get("tool_calls") if message.get("role") == "assistant" else None
        if calls:
            kept = [c for c in calls if isinstance(c, Mapping) and str(c.get("id", "")) in answered]
            called.update(str(c.get("id", "")) for c in kept)
            if len(kept) != len(calls):
                message = {k: v for k, v in message.items() if k != "tool_calls"}
                if kept:
                    message["tool_calls"] = kept
                elif not message.get("content"):
                    continue
        elif message.get("role") == "tool" and str(message.get("tool_call_id", "")) not in called:
            continue
        out.append(message)
    return tuple(out)


Scan = tuple[Sequence[int], Sequence[int], int, int, int, Cap, int]  # `scan_cuts`'s arguments


def begin(
    conversation: Conversation, plan: Plan, source: SummarySource, memo: Memo | None
) -> tuple[Rolling, Scan]:
    """A walk of `plan`'s units, and the scan it settles (`scan_cuts(*scan, walk.settle)`)."""
    fixed = anchored(conversation)
    sizes, kept = unit_sizes(conversation, plan.units, fixed)
    # The summary's room is its maximum length, but never more than a quarter of the trigger:
    # a small window with a long `summary_tokens` would otherwise compact on almost every Turn.
    allowance = min(plan.allowance, max(0, plan.trigger // 4))
    if plan.append_until is not None:
        allowance *= 2  # appended parts grow to about twice the length before they are rewritten
    rolling = Rolling(conversation, plan.units, fixed, sizes, plan, source, memo)
    return rolling, (sizes, kept, plan.fixed_tokens, plan.trigger, plan.target, plan.cap, allowance)
