"""A labelled metric's children, each made once: the request path's way to a series.

`metric.labels(*values)` builds a tuple, checks it and takes a lock on every call; a served
request makes a dozen. `Children` holds them by label values instead.
"""

from __future__ import annotations

from typing import Any


class Children(dict[tuple[str, ...], Any]):
    """One metric's children by their label values: `metric.labels(*values)` made on the first
    use of a label set and held, because `labels()` builds a tuple, checks it and takes a lock
    on every call, and every served request makes a dozen. A child is made only when asked for
    (a series appears on `/metrics` once it has been counted, as with `labels()`). Only for
    bounded label sets: model labels are capped (`model_label`); APIs, statuses, tiers and arms
    are few."""

    __slots__ = ("metric",)

    def __init__(self, metric: Any) -> None:
        super().__init__()
        self.metric = metric

    def __missing__(self, values: tuple[str, ...]) -> Any:
        found = self[values] = self.metric.labels(*values)
        return found
