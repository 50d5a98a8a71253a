"""BM25 scores of tokenised documents against a query, in plain Python (no numpy).

The variant is BM25 with idf = log((N + 1) / df), N the number of documents and df those holding
the term (BM25+ with delta 0): never negative, so a term found in most documents, or in a corpus
of one or two, still counts. k1 = 1.5, b = 0.75. A query term no document holds adds 0; a
repeated query term adds its score once per occurrence. Deterministic: the same documents and
query give the same floats, term by term in query order.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

K1 = 1.5
B = 0.75


def scores(corpus: Sequence[Sequence[str]], query: Sequence[str]) -> list[float]:
    """The score of every document of `corpus` (lists of tokens) for `query` (tokens)."""
    lengths = [len(doc) for doc in corpus]
    if not any(lengths):
        return [0.0] * len(corpus)
    counts = [Counter(doc) for doc in corpus]
    average = sum(lengths) / len(corpus)
    holding = Counter(term for count in counts for term in count)
    idf = {term: math.log((len(corpus) + 1) / df) for term, df in holding.items()}
    total = [0.0] * len(corpus)
    for term in query:
        weight = idf.get(term, 0)
        for i, count in enumerate(counts):
            tf = count.get(term, 0)
            norm = K1 * (1 - B + B * lengths[i] / average) + tf
            total[i] += weight * (tf * (K1 + 1) / norm)
    return total
