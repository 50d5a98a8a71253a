"""Cache-stable cuts and rolling summaries: what `sandwich`, `compaction` and `summarize_old` share.

The rule this module owns: **what a step summarises is a function of the conversation's prefix**.
The history is split into units (Turns, or tool-group-safe segments) and scanned from the start
as if the proxy had watched it grow (`scan_cuts`, the generalisation of `budget.stable_cut`). The
summarised range `[0, cut)` only grows at compaction events, so between events every request
carries the same summary text and the provider's prompt cache keeps hitting.

Summaries are rolling and incremental. The summarised range `[0, cut)` is split into links, one
per compaction event (the units that event newly covered; chunks of at most `chunk_tokens` when
an event covers more, `links`), and the summary of link `k` is asked for as "these messages,
extending `previous` = the summary of links `0..k-1`". The previous text is not guessed: it is
the answer the same `SummarySource` gives for the previous link's request, which is itself built
the same way, so the whole chain is a deterministic function of the prefix and of the source's
answers (`Rolling`, which the scan consults at every event). When an event moves the cut, the
earlier links and their answers stay as they are and one link is added: one summariser call per
event, over the newly covered messages and the previous summary, however long the session grows;
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
again after it. The mode follows from the text so far and is part of every request, so the chain
is still a deterministic function of the prefix and the answers, and the link memo stays exact.

Token counts are estimates that drift (calibration, design D12.3), and the cut a scan proposes
moves with them. A ready summary whose range ends within `SNAP_UNITS` of the proposed cut is kept
instead (a summary stays valid while its messages are still the conversation's, in place), and
the scan goes on from where that summary ends, so drift does not make the summaries again.

Anchored messages (system/developer prompts, pinned messages and the tool groups that hold them)
are never summarised away: they stay in place and are left out of the summariser's input.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, field_validator

from .budget import Budget
from .conversation import (
    PROTECTED_ROLES,
    Conversation,
    Message,
    Turn,
    drop,
    safe_cuts,
)
from .memo import Memo
from .placement import SUMMARY_TEMPLATE, Placement, has_summary, place_summary
from .step import Env, StepConfig, StepResult
from .summaries import SummaryAnswer, SummaryRequest, SummarySource, prepare_for_summary

Cap = Callable[[int], int]  # unit index at a crossing -> the furthest the cut may go
Settle = Callable[[int, int], int]  # (the cut so far, the cut proposed) -> the cut taken


def scan_cuts(
    sizes: Sequence[int],
    kept: Sequence[int],
    fixed: int,
    trigger: int,
    target: int,
    cap: Cap,
    allowance: int = 0,
    settle: Settle | None = None,
) -> list[int]:
    """Cut positions after each compaction event, in order; empty when nothing crossed `trigger`.

    `sizes[u]` are the tokens a unit gives up when it falls before the cut, `kept[u]` the tokens
    of it that stay anyway (anchored messages). Scanning left to right, whenever the running total
    passes `trigger`, the cut advances while the total is over `target` and the cut is below
    `cap(u)`; `allowance` (the summary that replaces the cut units) counts from the first cut on.
    With `kept` and `allowance` zero and `cap(u) = u` this is exactly `budget.stable_cut`.

    `settle`, when given, is told of every move and may take another cut than the one proposed
    (past the cut so far, at most `len(sizes)`); the scan goes on from the cut taken. `Rolling`
    uses it to keep the ranges that cached summaries already cover.
    """
    prefix = list(itertools.accumulate(sizes, initial=0))
    # added[u]: `fixed` and every unit up to u, given up or kept. Token counts are never
    # negative, so it only grows: the next unit that crosses is found by bisection, not by
    # walking the hundreds of units in between.
    added = list(itertools.accumulate(map(operator.add, sizes, kept), initial=fixed))[1:]
    cuts: list[int] = []
    cut = 0
    unit = 0
    while True:
        unit = bisect.bisect_right(added, trigger + prefix[cut] - (allowance if cut else 0), unit)
        if unit >= len(sizes):
            return cuts
        running = added[unit] - prefix[cut] + (allowance if cut else 0)
        limit = min(cap(unit), unit)  # never past the unit that crossed
        if running > target and cut < limit:
            if cut == 0:
                running += allowance  # from the first cut on, the summary takes room too
            # The first cut past this one that brings the total to `target`, or `limit`.
            proposed = bisect.bisect_left(prefix, prefix[cut] + running - target, cut + 1, limit)
            cut = proposed if settle is None else settle(cut, proposed)
            cuts.append(cut)
        unit += 1


def anchored(conversation: Conversation) -> frozenset[int]:
    """Messages no summary may replace: the client's system/developer prompts, pinned messages,
    and their whole tool groups.

    Unlike `Conversation.is_protected` this leaves out "the latest user message", which changes
    with every request; `drop` still keeps that one in the output.
    """
    messages, roles = conversation.messages, conversation.roles()
    # Found by the tuples' own (C) scans: a request has hundreds of messages, a few of them
    # prompts or pins.
    fixed = {
        i for role in PROTECTED_ROLES for i in _positions(roles, role) if messages[i].origin >= 0
    }
    pinned = list(itertools.compress(range(len(messages)), map(_PIN, messages)))
    # Prompts are never part of a tool group (only assistant and tool messages are); pinned
    # messages can be.
    if pinned:
        fixed.update(pinned)
        for group in conversation.tool_groups():
            if fixed.intersection(group):
                fixed.update(group)
    return frozenset(fixed)


_PIN = operator.attrgetter("pin")
_TOKENS = operator.attrgetter("tokens")


def _positions(values: tuple[str, ...], value: str) -> Iterator[int]:
    """Indices of `value` in `values`, in order."""
    at = -1
    while True:
        try:
            at = values.index(value, at + 1)
        except ValueError:
            return
        yield at


@dataclass(frozen=True, slots=True)
class Units:
    """Consecutive message ranges `[bounds[u], bounds[u + 1])` the scan works on."""

    bounds: tuple[int, ...]

    def __len__(self) -> int:
        return max(0, len(self.bounds) - 1)

    def indices(self, first: int, last: int) -> range:
        """Message indices of units `[first, last)`."""
        return range(self.bounds[first], self.bounds[last])

    @classmethod
    def of_turns(cls, turns: Sequence[Turn]) -> Units:
        if not turns:
            return cls(())
        return cls((*(t.start for t in turns), turns[-1].end))

    @classmethod
    def of_segments(cls, conversation: Conversation, start: int) -> Units:
        """Tool-group-safe segments of `[start, len)`: a cut between two never splits a group."""
        end = len(conversation)
        if start >= end:
            return cls(())
        return cls((start, *safe_cuts(conversation, start)))

    def after(self, bound: int) -> Units:
        """The units from `bound` (one of `bounds`) on."""
        at = self.bounds.index(bound)
        return Units(self.bounds[at:]) if at < len(self.bounds) - 1 else Units(())


def unit_sizes(
    conversation: Conversation, units: Units, fixed: frozenset[int]
) -> tuple[list[int], list[int]]:
    """(droppable tokens, anchored tokens) of every unit."""
    messages = conversation.messages
    # Tokens up to each message; a unit's tokens are the difference at its bounds. The anchored
    # messages are few (prompts, pins): they are moved from `sizes` to `kept` one by one.
    before = list(itertools.accumulate(map(_TOKENS, messages), initial=0))
    bounds = units.bounds
    at_bounds = [before[b] for b in bounds]
    sizes = list(map(operator.sub, at_bounds[1:], at_bounds))
    kept = [0] * len(sizes)
    if fixed and sizes:
        for i in fixed:
            u = bisect.bisect_right(bounds, i) - 1
            if 0 <= u < len(sizes):
                sizes[u] -= messages[i].tokens
                kept[u] += messages[i].tokens
    return sizes, kept


def chunks(first: int, last: int, sizes: Sequence[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """`[first, last)` split greedily into unit ranges of at most `chunk_tokens` (or one unit)."""
    result: list[tuple[int, int]] = []
    start, total = first, 0
    for unit in range(first, last):
        if unit > start and total + sizes[unit] > chunk_tokens:
            result.append((start, unit))
            start, total = unit, 0
        total += sizes[unit]
    if start < last:
        result.append((start, last))
    return result


def links(cuts: Sequence[int], sizes: Sequence[int], chunk_tokens: int) -> list[tuple[int, int]]:
    """Unit ranges the summarised range `[0, cuts[-1])` is asked for in, one after the other.

    One link per compaction event: the units that event newly covered, `[cuts[i-1], cuts[i])`,
    split greedily into chunks of at most `chunk_tokens` when one event covers more (a long
    history seen for the first time). A function of the sizes before the last cut only, and
    `links(cuts[:k])` is a prefix of `links(cuts)`: when an event moves the cut, the earlier links
    stay as they were and one link is added, so the summary is extended with the new messages
    (one summariser call over them and the previous summary), never made again from older ones.
    """
    result: list[tuple[int, int]] = []
    first = 0
    for cut in cuts:
        result.extend(chunks(first, cut, sizes, chunk_tokens))
        first = max(first, cut)
    return result


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
RECENT_WALKS = 4  # a conversation's recent walks kept to resume from (a branch, a prediction)


class Replay:
    """A `settle` that takes the cuts a recorded walk took, while the scan proposes what it
    proposed then; from the first event that differs on, it takes the proposed cuts and counts
    nothing more."""

    def __init__(self, decisions: Sequence[Decision], furthest: int) -> None:
        self.decisions = decisions
        self.furthest = furthest
        self.matched = 0  # events replayed
        self._events = 0
        self._off = False

    def settle(self, cut: int, proposed: int) -> int:
        event, self._events = self._events, self._events + 1
        if not self._off and event < len(self.decisions):
            was, taken, high = self.decisions[event]
            if was == proposed and (high is None or high == snap_high(self.furthest, proposed)):
                self.matched += 1
                return taken
        self._off = True
        return proposed


def snap_high(furthest: int, proposed: int) -> int:
    """The furthest end a snap from `proposed` may take."""
    return min(furthest, proposed + SNAP_UNITS)


class Rolling:
    """The rolling summary, asked for link by link as `scan_cuts` finds the events (its settle).

    Each link is asked for as "these messages, extending the answer so far" (in append mode:
    "only these messages", appended to it). The walk stops at the first link that is `missing`
    (reported as `pending`) or `failed`; what was ready before it is kept, so a grown range keeps
    its older summary until the new link arrives (a failure never corrupts what was
    there: design D7.4), and the scan goes on without asking.

    Counts drift (a heuristic tokenizer is calibrated from the upstream's usage), and a
    drifted count moves a proposed cut by a unit or so, which would change every link after it
    and make the whole summary again. So when the link ending at the proposed cut is missing, a
    ready link from the same start ending up to `SNAP_UNITS` units earlier or later (never past
    `furthest`, where the step's own limit puts the last cut) is taken instead, and the scan goes
    on from there. This is not an approximation: a cached summary stands
    for exactly the messages it was made from, and they are still the conversation's, in place.

    The walk is as long as the conversation's list of events, and a client resends the same
    history every turn: between two events it walks the same links to the same answers. So the
    state after the last event whose links were ready is kept in the memo (a `Checkpoint`),
    keyed by everything the walk up to there depends on: the step's config, what it did at each
    event (`Decision`s, snaps included), the units and their sizes, anchored messages and the
    messages (uids). The conversation's recent walks are kept under its first unit. A later
    request replays each with `scan_cuts` (no source asked): the events it proposes as that walk
    did are taken as that walk took them, and the walk `resume`s from the checkpoint of the most
    events replayed, asking the source only for that checkpoint's last link (its request carries
    every earlier answer, as `previous`); the events after it are walked.
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
        self._template = plan.make_request((), None, False).canonical()
        # For the link keys, read once: a request walks every link of its rolling summary.
        self._uids = [m.uid for m in conversation.messages]
        self._fixed = sorted(fixed)
        self._decisions: list[Decision] = []  # one per event settled, walked or replayed
        self._replayed = 0  # events taken from a checkpoint: not walked again
        self._events = 0  # events settled so far
        self._reached: tuple[int, Checkpoint] | None = None  # (events, state) to remember
        self._last: tuple[SummaryRequest, SummaryAnswer | None, str | None] | None = None

    def resume(self, scan: tuple[Any, ...]) -> list[int] | None:
        """Start from the checkpoint of a recent walk of this conversation, if the source still
        has its last link: the one that replays the most events of `scan_cuts(*scan)`, or the
        one an event before. The cuts when every event was replayed; None when events are left
        to walk (`settle` takes the replayed ones as they were)."""
        head = self._head_key()
        recent = self.memo.peek(head) if head is not None else None
        if not isinstance(recent, tuple):
            return None
        best: tuple[int, list[int], Sequence[Decision]] = (0, [], ())
        for decisions in recent:
            replay = Replay(decisions, self.furthest)
            cuts = scan_cuts(*scan, replay.settle)
            if replay.matched > best[0]:
                best = (replay.matched, cuts, decisions)
            # All but a new event: another walk may have it too (a prediction), but a scan
            # costs more than walking one event.
            if replay.matched >= len(cuts) - 1:
                break
        matched, cuts, decisions = best
        if decisions and decisions is not recent[0]:  # tried first next time
            rest = tuple(r for r in recent if r is not decisions)
            self.memo.replace(head, (decisions, *rest), 8 * len(recent) * len(decisions))
        for events in range(matched, max(0, matched - 2), -1):
            key = self._checkpoint_key(tuple(decisions[:events]))
            found = self.memo.peek(key) if key is not None else None
            if not isinstance(found, Checkpoint):
                continue
            got = self.source.get(found.last)
            if got.status != "ready":
                continue
            self.answer, self.previous = found.answer, found.previous
            self._take(found.last, got, found.covered)
            self.links = found.links
            self._decisions, self._replayed = list(decisions[:events]), events
            return cuts if events == len(cuts) else None
        return None

    def remember(self) -> None:
        """Keep the state after the last event whose links were ready, and the walk up to it
        among the conversation's recent walks."""
        if self._reached is None:
            return
        events, checkpoint = self._reached
        decisions = tuple(self._decisions[:events])
        key = self._checkpoint_key(decisions)
        head = self._head_key()
        if key is None or head is None:
            return
        texts = (checkpoint.previous, checkpoint.answer.text if checkpoint.answer else None)
        chars = sum(len(t) for t in texts if t) + len(key[-1])  # the texts, a word per uid
        self.memo.put(key, checkpoint, chars)
        recent = self.memo.peek(head)
        recent = recent if isinstance(recent, tuple) else ()
        if recent and recent[0] == decisions:
            return
        # A walk this one extends replays no more than this one does.
        kept = [r for r in recent if r != decisions[: len(r)]][: RECENT_WALKS - 1]
        self.memo.replace(head, (decisions, *kept), 8 * (1 + len(kept)) * len(decisions))

    def _head_key(self) -> tuple[Any, ...] | None:
        """Where a conversation's recent walks are kept: the step's config and its first unit."""
        bounds = self.units.bounds
        if len(bounds) < 2:
            return None
        uids = tuple(self._uids[bounds[0] : bounds[1]])
        if None in uids:
            return None
        plan = self.plan
        return ("rolling walks", self._template, plan.chunk_tokens, plan.append_until, uids)

    def _checkpoint_key(self, decisions: tuple[Decision, ...]) -> tuple[Any, ...] | None:
        """What a walk that decided `decisions` depends on; None when a message has no uid (its
        data would have to be compared)."""
        if not decisions:
            return None
        reach = max(max(was, taken, high or 0) for was, taken, high in decisions)
        bounds = self.units.bounds
        start, end = bounds[0], bounds[reach]
        uids = tuple(self._uids[start:end])
        if None in uids:
            return None
        fixed = self._fixed
        anchored = tuple(fixed[bisect.bisect_left(fixed, start) : bisect.bisect_left(fixed, end)])
        plan = self.plan
        return (
            "rolling checkpoint",
            self._template,
            plan.chunk_tokens,
            plan.append_until,
            decisions,
            bounds[: reach + 1],
            tuple(self.sizes[:reach]),
            anchored,
            uids,
        )

    @property
    def stopped(self) -> bool:
        return self.pending is not None or self.failed

    def settle(self, cut: int, proposed: int) -> int:
        events, self._events = self._events, self._events + 1
        if events < self._replayed:  # the checkpoint's events
            return self._decisions[events][1]
        taken = self._settle(cut, proposed)
        high = None if taken == proposed else snap_high(self.furthest, proposed)
        self._decisions.append((proposed, taken, high))
        if not self.stopped and self._last is not None:
            request, answer, previous = self._last
            checkpoint = Checkpoint(self.covered, answer, previous, request, self.links)
            self._reached = (events + 1, checkpoint)
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
        fixed = self._fixed
        at = bisect.bisect_left(fixed, start)
        if at < len(fixed) and fixed[at] < end:  # anchored messages stay out of the summary
            included = [m for i, m in enumerate(included, start) if i not in self.fixed]
            uids = tuple([m.uid for m in included])
        else:
            uids = tuple(self._uids[start:end])
        if not included or None in uids:
            return self._build(included)
        # Every later request asks for the same links again: the same messages (equal uids
        # mean equal data) under the same instructions and previous summary give the same
        # request, so the one built before is reused with its canonical bytes already made.
        # (`make_request` takes the messages, the previous text and the mode; all else it puts
        # in comes from the step's config, the same for every link of this run.)
        key = ("summary link", self._template, self.previous, self._appending(), uids)
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
    """Messages as a summariser gets them: `prepare_for_summary`, then its rule anywhere in range.

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


def bullets(prompt: str, directives: Sequence[str]) -> str:
    """`prompt` with `directives` appended as bullet points."""
    if not directives:
        return prompt
    return prompt.rstrip() + "\n" + "\n".join(f"- {d}" for d in directives)


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


def summarise(conversation: Conversation, plan: Plan, env: Env) -> StepResult:
    """Replace the units before the stable cut by their rolling summary, or explain why not."""
    if has_summary(conversation, plan.step_type):
        return StepResult.unchanged(conversation, reason="already summarised")
    if len(plan.units) < 2:
        return StepResult.unchanged(conversation, reason="nothing to summarise")
    fixed = anchored(conversation)
    sizes, kept = unit_sizes(conversation, plan.units, fixed)
    # The summary's room is its maximum length, but never more than a quarter of the trigger:
    # a small window with a long `summary_tokens` would otherwise compact on almost every Turn.
    allowance = min(plan.allowance, max(0, plan.trigger // 4))
    if plan.append_until is not None:
        allowance *= 2  # appended parts grow to about twice the length before they are rewritten
    rolling = Rolling(conversation, plan.units, fixed, sizes, plan, env.summaries, env.memo)
    scan = (sizes, kept, plan.fixed_tokens, plan.trigger, plan.target, plan.cap, allowance)
    cuts = rolling.resume(scan)
    if cuts is None:
        cuts = scan_cuts(*scan, rolling.settle)
    rolling.remember()
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


class SummarisingConfig(StepConfig):
    """Keys every summarising step has (design D5.11): where the summary goes and how it reads."""

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

    The summariser is the same model or one with a larger window (the step's `model`), so the
    request's own limit, less room for the previous summary and the instructions, always fits.
    """
    return max(1, budget.target, budget.limit - summary_tokens - 512)
