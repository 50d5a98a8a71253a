"""Cache-stable cuts and rolling summaries: what `sandwich`, `compaction` and `summarize_old` share.

The rule this package owns: **what a step summarises is a function of the conversation's
prefix**, so between compaction events every request carries the same summary text and the
provider's prompt cache keeps hitting. Three parts, each with its own rule:

- `cuts`: where the cut stands after each event (`scan_cuts`), over units of the history;
- `walk`: the rolling summary of the units before the cut, asked for link by link (`Rolling`);
- `replay`: the walks kept across requests, so a resent history is not walked again (`walked`).
"""

from .cuts import Cap, Settle, Units, anchored, chunks, links, scan_cuts, unit_sizes
from .replay import Walks, walked
from .walk import (
    APPEND_SEPARATOR,
    SNAP_UNITS,
    MakeRequest,
    Plan,
    Rolling,
    Scan,
    begin,
    summary_input,
    text_size,
)

__all__ = [
    "APPEND_SEPARATOR",
    "SNAP_UNITS",
    "Cap",
    "MakeRequest",
    "Plan",
    "Rolling",
    "Scan",
    "Settle",
    "Units",
    "Walks",
    "anchored",
    "begin",
    "chunks",
    "links",
    "scan_cuts",
    "summary_input",
    "text_size",
    "unit_sizes",
    "walked",
]
