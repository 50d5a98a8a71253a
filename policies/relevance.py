"""Relevance of each Turn to the task at hand (design D5.8).

The task is more than the latest user message, which is often generic ("continue", "go on", a
tool result) and would score every earlier rule at 0: the query is the first user message (the
task statement), the latest one, and the recent Turns the step keeps anyway.

Scores are in 0..1 and a pure function of the texts: BM25 (`policies.bm25`: idf
log((N+1)/df), never negative) over the Turns' texts, the latest user message as the
query, divided by the best score (the most relevant Turn scores 1, one sharing no term scores 0; the
Turn holding the query is left out of that maximum).
Tokens are lowercase word runs, with every
CJK character a token of its own (Chinese and Japanese have no spaces; single characters are
what a BM25 over CJK can match without a segmenter). A Turn's text is its messages' text (the first
4,000 characters of each) plus the names and arguments of the tool calls in it.

`scorer: embeddings` uses `Env.relevance` (e.g. MiniLM cosine similarities computed by the
gateway), clipped to 0..1; without one, BM25 is the fallback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from . import bm25
from .conversation import Conversation, Turn
from .step import Env

Scorer = Literal["bm25", "embeddings"]

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
SCORED_CHARS = 4000  # of each message: enough to judge it, and scoring stays fast on huge outputs
TOKEN_RE = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")


def tokenize(text: str) -> list[str]:
    return TOKEN_RE.findall(text.lower())


def turn_text(conversation: Conversation, turn: Turn) -> str:
    parts: list[str] = []
    for message in conversation.messages[turn.start : turn.end]:
        parts.append(message.text[:SCORED_CHARS])
        for call in message.data.get("tool_calls") or ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                parts.append(str(function.get("name", "")))
                parts.append(str(function.get("arguments", "")))
    return "\n".join(parts)


def bm25_scores(
    docs: Sequence[str], query: str, skip: int | Sequence[int] | None = None
) -> list[float]:
    """BM25 of every doc against `query`, normalised so that the best is 1 (all 0 if none match).

    `skip` are docs left out of the normalisation (and scored 1): those holding the query
    itself, which would otherwise outscore every other and squash their scores.
    """
    corpus = [tokenize(doc) for doc in docs]
    terms = tokenize(query)
    if not corpus or not terms or not any(corpus):
        return [0.0] * len(docs)
    raw = [max(0.0, s) for s in bm25.scores(corpus, terms)]
    if skip is None:
        return _normalised(raw)
    skipped = {skip} if isinstance(skip, int) else set(skip)
    others = _normalised([0.0 if i in skipped else s for i, s in enumerate(raw)])
    for i in skipped:
        others[i] = 1.0
    return others


def _normalised(raw: Sequence[float]) -> list[float]:
    best = max(raw, default=0.0)
    if best <= 0:
        return [0.0] * len(raw)
    return [round(s / best, 6) for s in raw]


def task_query(conversation: Conversation, turns: Sequence[Turn], recent: int) -> str:
    """What the task is, as query terms: the latest user message's (weighted 3), the first
    one's, the task statement (weighted 2), and those of what the user said in the last `recent`
    Turns.

    Each part counts a term once (a word repeated in one message would drown the others), and
    BM25 adds a query term's score once per occurrence, so repeating a part weights it."""
    messages, roles = conversation.messages, conversation.roles()
    first = next((i for i, role in enumerate(roles) if role == "user"), None)
    latest = conversation.latest_user_index()
    parts: list[str] = []
    if latest is not None:
        parts += [_terms(messages[latest].text)] * 3
    if first is not None and first != latest:
        parts += [_terms(messages[first].text)] * 2
    for turn in turns[len(turns) - recent :] if recent else ():
        parts.extend(
            _terms(messages[i].text)
            for i in range(turn.start, turn.end)
            if roles[i] == "user" and i != latest
        )
    return "\n".join(parts)


def _terms(text: str) -> str:
    return " ".join(dict.fromkeys(tokenize(text[:SCORED_CHARS])))


def turn_scores(
    conversation: Conversation, turns: Sequence[Turn], scorer: Scorer, env: Env, recent: int = 1
) -> tuple[list[float], Scorer]:
    """(score of every Turn against the task, the scorer actually used); the last `recent`
    Turns are part of the query and score 1."""
    query = task_query(conversation, turns, recent)
    docs = [turn_text(conversation, t) for t in turns]
    own = list(range(max(0, len(turns) - recent), len(turns)))
    if scorer == "embeddings" and env.relevance is not None:
        raw = list(env.relevance(docs, query))
        if len(raw) != len(docs):
            raise ValueError(f"relevance function returned {len(raw)} scores for {len(docs)} texts")
        return [min(1.0, max(0.0, round(float(s), 6))) for s in raw], "embeddings"
    return bm25_scores(docs, query, skip=own), "bm25"
