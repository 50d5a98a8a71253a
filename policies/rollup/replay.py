"""The cross-request replay cache: a resent history is not walked link by link again.

The rule this module owns: **a resumed walk gives exactly what a whole walk gives**. The walk is
as long as the conversation's list of events, and a client resends the same history every turn:
between two events it walks the same links to the same answers. So the state after the last
event whose links were ready (a `walk.Checkpoint`) is kept in the memo, keyed by everything the
walk up to there depends on: the step's config, what it did at each event (`Decision`s, snaps
included), the units and their sizes, anchored messages and the messages (uids). A walk without
uids is keyed by nothing and never cached. The conversation's recent walks are kept under its
first unit. A later request replays each with `scan_cuts` (no source asked): the events it
proposes as that walk did are taken as that walk took them, and the walk resumes from the
checkpoint of the most events replayed, asking the source only for that checkpoint's last link
(its request carries every earlier answer, as `previous`); the events after it are walked.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from .cuts import scan_cuts
from .walk import Checkpoint, Decision, Rolling, Scan, snap_high

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


class Walks:
    """A conversation's recent walks and their checkpoints, in the memo the walk was given."""

    def __init__(self, walk: Rolling) -> None:
        self.walk = walk
        self.memo = walk.memo

    def resume(self, scan: Scan) -> list[int] | None:
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
            replay = Replay(decisions, self.walk.furthest)
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
            got = self.walk.source.get(found.last)
            if got.status != "ready":
                continue
            self.walk.restore(found, got, decisions[:events])
            return cuts if events == len(cuts) else None
        return None

    def remember(self) -> None:
        """Keep the state after the last event whose links were ready, and the walk up to it
        among the conversation's recent walks."""
        if self.walk.reached is None:
            return
        events, checkpoint = self.walk.reached
        decisions = tuple(self.walk.decisions[:events])
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
        bounds = self.walk.units.bounds
        if len(bounds) < 2:
            return None
        uids = tuple(self.walk.uids[bounds[0] : bounds[1]])
        if None in uids:
            return None
        plan = self.walk.plan
        return ("rolling walks", self.walk.template, plan.chunk_tokens, plan.append_until, uids)

    def _checkpoint_key(self, decisions: tuple[Decision, ...]) -> tuple[Any, ...] | None:
        """What a walk that decided `decisions` depends on; None when a message has no uid (its
        data would have to be compared)."""
        if not decisions:
            return None
        reach = max(max(was, taken, high or 0) for was, taken, high in decisions)
        bounds = self.walk.units.bounds
        start, end = bounds[0], bounds[reach]
        uids = tuple(self.walk.uids[start:end])
        if None in uids:
            return None
        fixed = self.walk.anchored
        anchored = tuple(fixed[bisect.bisect_left(fixed, start) : bisect.bisect_left(fixed, end)])
        plan = self.walk.plan
        return (
            "rolling checkpoint",
            self.walk.template,
            plan.chunk_tokens,
            plan.append_until,
            decisions,
            bounds[: reach + 1],
            tuple(self.walk.sizes[:reach]),
            anchored,
            uids,
        )


def walked(rolling: Rolling, scan: Scan) -> list[int]:
    """`scan_cuts(*scan, rolling.settle)`, resumed from a recent walk of the conversation where
    one replays, and remembered for the next request."""
    walks = Walks(rolling)
    cuts = walks.resume(scan)
    if cuts is None:
        cuts = scan_cuts(*scan, rolling.settle)
    walks.remember()
    return cuts
