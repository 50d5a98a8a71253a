"""`policies.rollup`: the event scan, links, the rolling chain, and summary input hygiene."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import Budget, Conversation, Memo, Message
from policies.budget import stable_cut
from policies.invariants import check_tool_pairs
from policies.registry import STEPS, build_step
from policies.rollup import Rolling, begin, links, scan_cuts, summary_input, walked
from policies.step import Step
from policies.summaries import SummaryAnswer, SummaryRequest
from policies.summarising import SummarisingStep
from tests.policy_strategies import (
    FakeSummaries,
    agent,
    assistant_calls,
    budget,
    chat,
    conv,
    count,
    env,
    msg,
    tool,
)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 500), max_size=40),
    fixed=st.integers(0, 300),
    trigger=st.integers(1, 3000),
    share=st.floats(0.1, 1.0),
)
def test_scan_cuts_generalises_stable_cut(
    sizes: list[int], fixed: int, trigger: int, share: float
) -> None:
    target = int(trigger * share)
    cuts = scan_cuts(sizes, [0] * len(sizes), fixed, trigger, target, lambda unit: unit)
    assert (cuts[-1] if cuts else 0) == stable_cut(sizes, fixed, trigger, target)
    assert cuts == sorted(set(cuts))
    # prefix property: the cuts of a prefix are a prefix of the cuts
    half = len(sizes) // 2
    early = scan_cuts(sizes[:half], [0] * half, fixed, trigger, target, lambda unit: unit)
    assert cuts[: len(early)] == early


def reference_scan(
    sizes: list[int],
    kept: list[int],
    fixed: int,
    trigger: int,
    target: int,
    cap: Any,
    allowance: int,
    settle: Any,
) -> list[int]:
    """`scan_cuts` as its docstring says it: unit by unit, one unit of cut at a time."""
    cuts: list[int] = []
    cut, added = 0, fixed
    for unit, size in enumerate(sizes):
        added += size + kept[unit]
        running = added - sum(sizes[:cut]) + (allowance if cut else 0)
        if running <= trigger:
            continue
        proposed = cut
        while proposed < min(cap(unit), unit) and running > target:
            if proposed == 0:
                running += allowance
            running -= sizes[proposed]
            proposed += 1
        if proposed != cut:
            cut = settle(cut, proposed)
            cuts.append(cut)
    return cuts


@settings(max_examples=400, deadline=None)
@given(
    units=st.lists(st.tuples(st.integers(0, 500), st.integers(0, 100)), max_size=40),
    fixed=st.integers(0, 300),
    trigger=st.integers(1, 3000),
    share=st.floats(0.1, 1.0),
    allowance=st.integers(0, 400),
    caps=st.lists(st.integers(0, 40), min_size=1),
    moves=st.lists(st.integers(0, 40), min_size=1),
)
def test_scan_cuts_finds_the_cuts_a_unit_by_unit_scan_finds(
    units: list[tuple[int, int]],
    fixed: int,
    trigger: int,
    share: float,
    allowance: int,
    caps: list[int],
    moves: list[int],
) -> None:
    """The scan skips to the next crossing and to the cut by bisection: the same events and cuts
    as walking every unit, with anchored tokens, a summary's room, a step's cap and a `settle`
    that takes another cut (as `Rolling` does when a cached summary ends nearby)."""
    sizes, kept = [s for s, _ in units], [k for _, k in units]

    def cap(unit: int) -> int:
        return caps[unit % len(caps)]

    def settle(cut: int, proposed: int) -> int:
        move = moves[(cut * 7 + proposed) % len(moves)]
        return proposed if move % 3 else cut + 1 + move % (len(sizes) - cut)

    target = int(trigger * share)
    expected = reference_scan(sizes, kept, fixed, trigger, target, cap, allowance, settle)
    assert scan_cuts(sizes, kept, fixed, trigger, target, cap, allowance, settle) == expected


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 500), min_size=1, max_size=40),
    chunk=st.integers(1, 2000),
    data=st.data(),
)
def test_links_cover_the_range_one_event_at_a_time_and_only_grow(
    sizes: list[int], chunk: int, data: st.DataObject
) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(sizes)), min_size=1)))
    chain = links(cuts, sizes, chunk)
    assert chain[0][0] == 0 and chain[-1][1] == cuts[-1]
    assert all(a[1] == b[0] for a, b in itertools.pairwise(chain))
    assert all(b - a == 1 or sum(sizes[a:b]) <= chunk for a, b in chain)
    ends = {b for _, b in chain}
    assert set(cuts) <= ends  # no link straddles an event: each event's messages stand alone
    for k in range(1, len(cuts)):
        earlier = links(cuts[:k], sizes, chunk)
        assert chain[: len(earlier)] == earlier  # a new event only adds links


def _key(message: Any) -> bytes:
    return orjson.dumps(message, option=orjson.OPT_SORT_KEYS)


# Each summarising step, rewriting its summary and (where it can) appending to it.
SUMMARISING = [
    ("compaction", {"summary_tokens": 200}),
    ("sandwich", {"summary_tokens": 200}),
    ("summarize_old", {}),
    ("compaction", {"summary_tokens": 24, "append_summaries": True}),
    ("summarize_old", {"summary_length": 24, "append_summaries": True}),
]


@pytest.mark.parametrize(("step_type", "config"), SUMMARISING)
def test_a_growing_conversation_sends_each_message_to_the_summariser_once(
    step_type: str, config: dict[str, Any]
) -> None:
    """When the summarised range grows, the summary is extended with the new
    messages (one call per event), not made again from the messages it already covered."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    source = FakeSummaries()
    window = budget(4000)
    events: list[int] = []
    for turns in range(2, 120):
        result = step.apply(conv(chat(turns)), window, env(source))
        covered = int(result.detail.get("summarised_messages", 0))
        if covered and (not events or covered != events[-1]):
            events.append(covered)
        assert not result.pending
    calls = {r.canonical(): r for r in source.requests}  # a caching gateway: one call each
    assert len(events) >= 3
    assert len(calls) == len(events)
    sent = [_key(m) for r in calls.values() for m in r.messages]
    assert len(sent) == len(set(sent))  # no message summarised twice
    extending = [r for r in calls.values() if r.previous is not None]
    assert len(extending) == len(calls) - 1


def test_summary_input_drops_dangling_calls_anywhere() -> None:
    messages = (
        msg("user", "a"),
        assistant_calls("x1", content="calling x1"),
        msg("user", "b"),
        assistant_calls("x2", "x3"),
        tool("x3", "three"),
        tool("orphan", "no call"),
        assistant_calls("x4"),
    )
    cleaned = summary_input(messages)
    assert check_tool_pairs(cleaned) == []
    assert cleaned[1] == {"role": "assistant", "content": "calling x1"}
    assert [c["id"] for c in cleaned[3]["tool_calls"]] == ["x3"]
    assert len(cleaned) == 5


class Cache:
    """A summary source the way the gateway is one: `missing` until the request was computed."""

    def __init__(self) -> None:
        self.made = FakeSummaries()
        self.answers: dict[bytes, SummaryAnswer] = {}

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        return self.answers.get(request.canonical(), SummaryAnswer("missing"))

    def serve(self, step: Step, conversation: Conversation, window: Budget) -> None:
        """One client request: compute what the step lacks, run it again, until it lacks nothing."""
        result = step.apply(conversation, window, env(self))
        while result.pending:
            for request in result.pending:
                self.answers[request.canonical()] = self.made.get(request)
            result = step.apply(conversation, window, env(self))

    @property
    def calls(self) -> int:
        return len(self.made.requests)


def counted(datas: list[dict[str, Any]], scale: float) -> Conversation:
    """`datas` counted by a heuristic whose calibration multiplier is `scale`."""
    return Conversation(
        tuple(
            Message(data=d, tokens=max(1, round(count(d) * scale)), origin=i)
            for i, d in enumerate(datas)
        )
    )


@pytest.mark.parametrize(("step_type", "config"), SUMMARISING)
def test_calibration_drift_does_not_make_the_summaries_again(
    step_type: str, config: dict[str, Any]
) -> None:
    """A calibrated heuristic changes every count a little from one request to the
    next; the summarised ranges stay where the cached summaries are, so the calls stay the same."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    window = budget(4000)
    history = [chat(turns) for turns in range(2, 120)]
    steady = Cache()
    for datas in history:
        steady.serve(step, counted(datas, 1.0), window)
    drifting = Cache()
    for request, datas in enumerate(history):
        jitter = 0.97 + 0.015 * (request * 7 % 5)  # 0.97 .. 1.03, changing on every request
        drifting.serve(step, counted(datas, jitter), window)
    assert steady.calls >= 3
    assert drifting.calls <= steady.calls + 1, (steady.calls, drifting.calls)


def links_of(step: Step, datas: list[dict[str, Any]], window: Budget) -> list[SummaryRequest]:
    """The link requests a walk without a memo asks for."""
    source = FakeSummaries()
    step.apply(conv(datas), window, env(source))
    return source.requests


def with_uids(datas: list[dict[str, Any]], changed: frozenset[int] = frozenset()) -> Conversation:
    """`datas` as the gateway hands them over: fresh dicts every request, each with the uid of
    its place in the conversation (a message the client changed gets a new one)."""
    return counted_uids(datas, 1.0, changed)


@pytest.mark.parametrize(("step_type", "config"), SUMMARISING)
def test_links_seen_before_are_not_built_again_and_change_nothing(
    step_type: str, config: dict[str, Any]
) -> None:
    """Added latency: a request that repeats the conversation's earlier messages gets
    exactly the output it would get without uids or a memo, walking less: it resumes its rolling
    summary from the checkpoint the one before it left, and asks the source only for that
    checkpoint's last link (the same request object, serialised once)."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    window = budget(4000)
    shared = Memo()
    walked = []
    for turns in (40, 41, 41, 43, 60):
        datas = chat(turns)
        plain_source, memo_source = FakeSummaries(), FakeSummaries()
        plain = step.apply(conv(datas), window, env(plain_source))
        first = step.apply(with_uids(datas), window, env(memo_source, memo=shared))
        asked = list(memo_source.requests)
        again = step.apply(with_uids(datas), window, env(memo_source, memo=shared))
        assert plain.summary_used
        assert first.conversation.data() == plain.conversation.data() == again.conversation.data()
        assert first.detail == plain.detail == again.detail  # links and state as if walked
        assert all(a in plain_source.requests for a in asked)
        resumed = memo_source.requests[len(asked) :]
        assert len(resumed) == 1 and any(resumed[0] is a for a in asked)
        walked.append(len(asked))
    assert walked[0] == len(links_of(step, chat(40), window))  # nothing to resume from yet
    assert walked[2] == 1  # the same conversation again
    # Grown by a Turn or two: the checkpoint's last link, then only the links of the new events.
    # (60 Turns is several events past any checkpoint: walked from the start, same output.)
    assert walked[3] == 1 + len(links_of(step, chat(43), window)) - len(
        links_of(step, chat(41), window)
    )
    # A message the client edited is summarised as it is now, not as it was.
    datas = chat(60)
    edited = [dict(d) for d in datas]
    edited[15]["content"] = "an edited message"
    source = FakeSummaries()
    step.apply(with_uids(edited, frozenset({15})), window, env(source, memo=shared))
    assert any(m.get("content") == "an edited message" for r in source.requests for m in r.messages)


STEP_CONFIGS = [
    ("compaction", {"summary_tokens": 200}),
    ("sandwich", {"summary_tokens": 200}),
    ("sandwich", {"summary_tokens": 24, "append_summaries": True, "preserve_bottom": 2}),
    ("summarize_old", {}),
    ("compaction", {"summary_tokens": 24, "append_summaries": True}),
    ("summarize_old", {"summary_length": 24, "append_summaries": True}),
]


@settings(max_examples=60, deadline=None)
@given(
    choice=st.sampled_from(STEP_CONFIGS),
    lengths=st.lists(st.integers(8, 70), min_size=1, max_size=6),
    shape=st.sampled_from(["chat", "agent"]),
    window=st.sampled_from([1500, 4000]),
)
def test_a_walk_resumed_from_checkpoints_gives_what_a_whole_walk_gives(
    choice: tuple[str, dict[str, Any]], lengths: list[int], shape: str, window: int
) -> None:
    """Whatever a conversation's history of requests (growing, repeated, shrunk after
    an edit), a step with a memo full of checkpoints returns what it returns without one."""
    step_type, config = choice
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    shared = Memo()
    for length in lengths:
        datas = chat(length) if shape == "chat" else agent(length, output_lines=12)
        plain = step.apply(conv(datas), budget(window), env(FakeSummaries()))
        memo = step.apply(with_uids(datas), budget(window), env(FakeSummaries(), memo=shared))
        assert memo.conversation.data() == plain.conversation.data()
        assert memo.detail == plain.detail


@pytest.mark.parametrize(("step_type", "config"), SUMMARISING)
def test_a_remade_earlier_summary_reaches_the_later_links(
    step_type: str, config: dict[str, Any]
) -> None:
    """A summary can be made again with other text (its cache entry expired, another replica
    made it). Once the old chain is gone from the cache, the later links extend what the cache
    holds now, not what was memoised with the same messages before: the memo is keyed by the
    previous summary too, and a checkpoint is taken only while the source still has its last
    link. While the source has that link, the chain it ends is still a summary of exactly these
    messages, and it is kept (nothing is made again)."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    window = budget(4000)
    datas = chat(60)
    shared = Memo()
    old = step.apply(with_uids(datas), window, env(FakeSummaries(words=8), memo=shared))
    holding = FakeSummaries(words=3)  # still has the old chain's last link
    step.apply(with_uids(datas), window, env(holding, memo=shared))
    assert len(holding.requests) == 1 and _OLD in (holding.requests[0].previous or "")
    remade, plain = Expired(words=3), FakeSummaries(words=3)
    result = step.apply(with_uids(datas), window, env(remade, memo=shared))
    expected = step.apply(conv(datas), window, env(plain))
    assert any(r.previous is not None for r in plain.requests)  # a later link extends one
    assert _OLD in (remade.requests[0].previous or "")  # the checkpoint's link: gone
    assert remade.requests[1:] == plain.requests
    assert result.conversation.data() == expected.conversation.data() != old.conversation.data()


_OLD = " etc" * 8  # the end of every text FakeSummaries(words=8) makes


class Expired(FakeSummaries):
    """The cache after the old chain expired: links that extend an old text are gone."""

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        if _OLD in (request.previous or ""):
            self.requests.append(request)
            return SummaryAnswer("missing")
        return super().get(request)


def _summary_text(conversation: Conversation, step_type: str) -> str:
    """The summary as forwarded: the inserted summary message's text inside the template."""
    [content] = [
        m.data["content"]
        for m in conversation.messages
        if m.kind == f"summary:{step_type}" and m.data["content"].startswith("[Earlier")
    ]
    prefix = "[Earlier conversation summary: "
    assert content.startswith(prefix) and content.endswith("]")
    return content[len(prefix) : -1]


@pytest.mark.parametrize(
    ("step_type", "config", "length"),
    [
        ("compaction", {"summary_tokens": 100}, 100),
        ("compaction", {"summary_tokens": 100, "retain_directives": ["Keep refs."]}, 100),
        ("sandwich", {"summary_tokens": 100}, 100),
        ("summarize_old", {"summary_length": 100}, 100),
    ],
)
def test_append_summaries_keep_the_earlier_text_frozen_until_it_is_rewritten(
    step_type: str, config: dict[str, Any], length: int
) -> None:
    """With `append_summaries`, the summary forwarded after an event starts with
    the exact text forwarded before it, the new part summarising only the newly covered messages,
    until the text reaches the length key; then one event rewrites it into one, and appending
    starts again."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config, append_summaries=True))
    window = budget(4000)
    answer = FakeSummaries(words=40).get  # ~48 tokens a part: rewritten after the third
    before: list[SummaryRequest] = []
    text, covered = "", 0
    frozen = rewritten = 0
    for turns in range(2, 160):
        source = FakeSummaries(words=40)
        result = step.apply(conv(chat(turns)), window, env(source))
        assert not result.pending
        if not result.summary_used:
            assert not before  # once there is a summary, every later request carries one
            continue
        now = int(result.detail["summarised_messages"])
        assert source.requests[: len(before)] == before  # earlier links are asked as before
        new = source.requests[len(before) :]
        expected = text
        for request in new:
            assert request.previous is None if not expected else expected in request.previous
            part = answer(request).text
            assert request.append == (bool(expected) and (len(expected) + 3) // 4 < length)
            expected = f"{expected}\n\n{part}" if request.append else part
        assert sum(len(r.messages) for r in new) == now - covered  # only the new messages
        forwarded = _summary_text(result.conversation, step_type)
        assert forwarded == expected
        if new and text:
            if forwarded.startswith(text + "\n\n"):
                frozen += 1
            else:
                assert (len(text) + 3) // 4 >= length and "\n\n" not in forwarded
                rewritten += 1
        before, text, covered = list(source.requests), forwarded, now
    assert frozen >= 3 and rewritten >= 1, (frozen, rewritten)


def test_append_mode_is_part_of_the_cache_key_and_rewrite_keys_are_unchanged() -> None:
    """Summaries cached before `append` existed keep their keys; an appending request has its
    own (the same messages summarised alone are another answer)."""
    request = SummaryRequest("sandwich", ({"role": "user", "content": "hi"},), "Sum.", 100, "old")
    assert request.canonical() == (
        b'{"instructions":"Sum.","max_tokens":100,"messages":[{"content":"hi","role":"user"}],'
        b'"model":null,"previous":"old","purpose":"sandwich","retain":null}'
    )
    appending = SummaryRequest(
        "sandwich", ({"role": "user", "content": "hi"},), "Sum.", 100, "old", append=True
    )
    assert orjson.loads(appending.canonical()) == {
        **orjson.loads(request.canonical()),
        "append": True,
    }


@pytest.mark.parametrize("append", [False, True])
def test_compaction_leaves_room_for_the_appended_parts(append: bool) -> None:
    """Appended parts grow to about twice `summary_tokens` before they are rewritten: the scan
    counts that much room for them, so a compacted request stays under the threshold."""
    step = build_step(STEPS["compaction"][0](summary_tokens=200, append_summaries=append))
    window = budget(4000)
    threshold = int(window.limit * 0.8)
    for turns in range(2, 150):  # answers of ~190 tokens: each part near the longest asked for
        result = step.apply(conv(chat(turns)), window, env(FakeSummaries(words=180)))
        if result.summary_used:
            assert result.conversation.tokens <= threshold, turns


class Lacking(FakeSummaries):
    """A summary cache that lacks some links (the same ones on every request) and holds the
    rest: `lacked(request)` says which."""

    def __init__(self, lacked: Any) -> None:
        super().__init__()
        self.lacked = lacked

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        if self.lacked(request):
            self.requests.append(request)
            return SummaryAnswer("missing")
        return super().get(request)


def counted_uids(
    datas: list[dict[str, Any]], scale: float, changed: frozenset[int] = frozenset()
) -> Conversation:
    """`with_uids`, counted by a heuristic whose calibration multiplier is `scale`; the messages
    `changed` have been edited: a new uid."""
    return Conversation(
        tuple(
            Message(
                data=dict(d),
                tokens=max(1, round(count(d) * scale)),
                origin=i,
                uid=i + 1 + (100_000 if i in changed else 0),
            )
            for i, d in enumerate(datas)
        )
    )


@pytest.mark.parametrize(
    ("step_type", "config"),
    [
        ("compaction", {"summary_tokens": 200}),
        ("sandwich", {"summary_tokens": 200}),
        ("summarize_old", {}),
        ("summarize_old", {"summary_length": 24, "append_summaries": True}),
    ],
)
def test_a_walk_that_took_a_nearby_summary_resumes_from_it(
    step_type: str, config: dict[str, Any]
) -> None:
    """Added latency: when the summary a cut needs is missing and one ending a unit
    away is ready (the counts drifted; a precomputation predicted the other cut), the walk takes
    that one, and the requests after it resume from there: the same conversation again asks the
    source for one link, a grown one for that link and the new ones, and each gets what a walk
    without a memo gets."""
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    window = budget(4000)
    lacked = links_of(step, chat(60), window)[1].canonical()
    walked, links = [], []
    shared = Memo()
    for turns in (60, 60, 64, 64):
        datas = chat(turns)
        plain_source = Lacking(lambda r: r.canonical() == lacked)
        plain = step.apply(conv(datas), window, env(plain_source))
        memo_source = Lacking(lambda r: r.canonical() == lacked)
        memo = step.apply(with_uids(datas), window, env(memo_source, memo=shared))
        assert memo.conversation.data() == plain.conversation.data()
        assert memo.detail == plain.detail
        assert plain.detail["summary"] == "ready"  # past the missing link: a nearby one taken
        assert any(r.canonical() == lacked for r in plain_source.requests)
        walked.append(len(memo_source.requests))
        links.append(plain.detail["summary_links"])
    assert walked[0] > 2
    assert walked[1] == walked[3] == 1
    assert walked[2] == 1 + links[2] - links[1]


@settings(max_examples=60, deadline=None)
@given(
    choice=st.sampled_from(STEP_CONFIGS),
    requests=st.lists(
        st.tuples(
            st.integers(8, 70), st.sampled_from([0.95, 1.0, 1.05]), st.sampled_from([0, 0, 60])
        ),
        min_size=1,
        max_size=6,
    ),
    shape=st.sampled_from(["chat", "agent"]),
    window=st.sampled_from([1500, 4000]),
    seed=st.integers(0, 255),
)
def test_walks_resumed_past_nearby_summaries_give_what_whole_walks_give(
    choice: tuple[str, dict[str, Any]],
    requests: list[tuple[int, float, int]],
    shape: str,
    window: int,
    seed: int,
) -> None:
    """With a cache that holds some links and lacks others, counts that drift between
    requests and a last message that is sometimes longer (edited, or another branch), walks take
    nearby summaries, stop at missing ones, and resume from checkpoints, and a step with a memo
    still returns what it returns without one."""
    step_type, config = choice
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    shared = Memo()

    def lacked(request: SummaryRequest) -> bool:
        return hashlib.sha256(bytes([seed]) + request.canonical()).digest()[0] % 3 == 0

    for length, scale, longer in requests:
        for more in {0, longer}:  # the request, then (if drawn) it with a longer last message
            datas = chat(length) if shape == "chat" else agent(length, output_lines=12)
            datas[-1] = {**datas[-1], "content": datas[-1]["content"] + " and more" * more}
            changed = frozenset({len(datas) - 1}) if more else frozenset()
            plain = step.apply(counted(datas, scale), budget(window), env(Lacking(lacked)))
            memo = step.apply(
                counted_uids(datas, scale, changed),
                budget(window),
                env(Lacking(lacked), memo=shared),
            )
            assert memo.conversation.data() == plain.conversation.data()
            assert memo.detail == plain.detail


def test_a_nearby_summary_is_looked_for_again_once_the_conversation_allows_more() -> None:
    """A walk takes a nearby summary only up to where the step's own limit puts the last
    cut, and that limit grows with the conversation. A request that can look further (here: past
    a missing one to a ready one that is nearer the proposed cut) gets what a walk without a memo
    gets, not the walk an earlier request took."""
    step = build_step(STEPS["summarize_old"][0]())
    window = budget(4000)
    turns = next(t for t in itertools.count(10) if len(links_of(step, chat(t), window)) == 2)
    # The second event's link, Turns [first, end): new with this Turn, so it ends at the limit.
    link = links_of(step, chat(turns), window)[1]
    first = int(link.messages[0]["content"].split()[1])
    end = int(link.messages[-1]["content"].split()[1]) + 1

    def lacked(request: SummaryRequest) -> bool:
        """The links from `first` that end at the proposed cut or one Turn before it."""
        head, tail = request.messages[0]["content"], request.messages[-1]["content"]
        return head.startswith(f"question {first} ") and tail.startswith(
            (f"answer {end - 1} ", f"answer {end - 2} ")
        )

    shared = Memo()
    covered = []
    for grown in (turns, turns + 2):
        datas = chat(grown)
        plain_source = Lacking(lacked)
        plain = step.apply(conv(datas), window, env(plain_source))
        memo = step.apply(with_uids(datas), window, env(Lacking(lacked), memo=shared))
        assert memo.conversation.data() == plain.conversation.data()
        assert memo.detail == plain.detail
        taken = [
            r.messages[-1]["content"].split()[1]
            for r in plain_source.requests
            if r.messages[0]["content"].startswith(f"question {first} ") and not lacked(r)
        ]
        covered.append(int(taken[0]) + 1)
    assert covered == [end - 2, end + 1]  # two Turns short at first, then one Turn further


@pytest.mark.parametrize(
    ("step_type", "config", "turns", "edited", "more"),
    [
        ("sandwich", {"summary_tokens": 200}, 25, 50, 10),  # the last answer, longer
        ("summarize_old", {}, 34, 66, 10),  # an answer after the summarised range, rewritten
    ],
)
def test_a_recorded_walk_is_not_replayed_where_the_scan_now_proposes_another_cut(
    step_type: str, config: dict[str, Any], turns: int, edited: int, more: int
) -> None:
    """A message edited after the summarised range (an answer made longer) moves where
    the last event cuts (sandwich: more to shed; summarize_old: the trigger is crossed a Turn
    earlier) while everything a checkpoint is keyed by stays the same. The replay takes a
    recorded cut only where the scan proposes what it proposed then: the request gets the summary
    of its own range, as a walk without a memo does, and asks again for one link besides it."""
    step = build_step(STEPS[step_type][0](**config))
    window = budget(4000)
    before = chat(turns)
    after = chat(turns)
    after[edited] = {**after[edited], "content": after[edited]["content"] + " and more" * more}
    old, new = links_of(step, before, window), links_of(step, after, window)
    assert len(old) == len(new) >= 2  # no event added or lost
    assert [r.canonical() for r in old[:-1]] == [r.canonical() for r in new[:-1]]
    assert old[-1].canonical() != new[-1].canonical()  # the last event cuts elsewhere
    shared = Memo()
    step.apply(with_uids(before), window, env(FakeSummaries(), memo=shared))
    plain = step.apply(conv(after), window, env(FakeSummaries()))
    memo_source = FakeSummaries()
    memo = step.apply(
        with_uids(after, changed=frozenset({edited})), window, env(memo_source, memo=shared)
    )
    assert memo.conversation.data() == plain.conversation.data()
    assert memo.detail == plain.detail
    # The link before the moved one, from its checkpoint, and the moved one.
    assert [r.canonical() for r in memo_source.requests] == [r.canonical() for r in new[-2:]]


class Mixed(FakeSummaries):
    """A summary cache whose links are ready, missing or failed, each always the same way."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.seed = seed

    def get(self, request: SummaryRequest) -> SummaryAnswer:
        kind = hashlib.sha256(bytes([self.seed]) + request.canonical()).digest()[0] % 5
        if kind < 2:
            return SummaryAnswer("missing")
        if kind == 2 and self.seed % 4 == 0:  # failures in a quarter of the examples
            return SummaryAnswer("failed")
        return super().get(request)


def walk_state(rolling: Rolling, cuts: list[int]) -> tuple[Any, ...]:
    """Everything a walk ends with that the step's result or a later request depends on."""
    return (
        cuts,
        rolling.answer,
        rolling.covered,
        rolling.previous,
        rolling.pending,
        rolling.failed,
        rolling.links,
        rolling.decisions,
    )


# A conversation's requests: its first length in Turns, then for each request the Turns added
# since the one before (fewer: a branch), the calibration drift, and a message edited (or none).
SEQUENCES = st.tuples(
    st.integers(8, 50),
    st.lists(
        st.tuples(st.integers(-4, 6), st.sampled_from([0.95, 1.0, 1.05]), st.integers(-1, 70)),
        min_size=1,
        max_size=10,
    ),
)


@settings(max_examples=150, deadline=None)
@given(
    choice=st.sampled_from(STEP_CONFIGS),
    sequence=SEQUENCES,
    shape=st.sampled_from(["chat", "agent"]),
    window=st.sampled_from([1500, 4000]),
    seed=st.integers(0, 255),
)
def test_the_replayed_walk_equals_the_plain_walk(
    choice: tuple[str, dict[str, Any]],
    sequence: tuple[int, list[tuple[int, float, int]]],
    shape: str,
    window: int,
    seed: int,
) -> None:
    """The replay cache never changes a walk: over a sequence of requests (growing, going back,
    drifting counts, edited messages) and a cache that holds some links, lacks others and fails
    on some, the walk resumed from the requests before ends exactly where a walk of the same
    request with nothing remembered ends."""
    step_type, config = choice
    config_cls, _ = STEPS[step_type]
    step = build_step(config_cls(**config))
    assert isinstance(step, SummarisingStep)
    shared = Memo()
    length, requests = sequence
    for added, scale, edited in requests:
        length = max(4, length + added)
        datas = chat(length) if shape == "chat" else agent(length, output_lines=12)
        conversation = counted_uids(datas, scale, frozenset({edited}))
        plan = step.plan(conversation, budget(window))
        if plan is None or len(plan.units) < 2:
            continue
        rolling, scan = begin(conversation, plan, Mixed(seed), Memo())
        plain = walk_state(rolling, scan_cuts(*scan, rolling.settle))
        rolling, scan = begin(conversation, plan, Mixed(seed), shared)
        assert walk_state(rolling, walked(rolling, scan)) == plain
