"""Summaries for the policies that ask for them: made once, kept, and ready before they are needed.

- `summarizer`: the LLM call (a `SummaryRequest` in, text out);
- `cache`: the store's encoding and key, and the tier in this process in front of the store;
- `service`: the fetcher the pipeline asks (single-flight, failures remembered);
- `precompute`: after a response, the summary the next requests will ask for, made ahead;
- `prediction`: how a conversation grows and what a chain summarised, for those predictions.
"""

from .precompute import ChainRunner, Job, Precompute
from .service import RequestSummaries, SummaryAsk, SummaryService, unsummarisable
from .summarizer import Summarizer, SummarizerError

__all__ = [
    "ChainRunner",
    "Job",
    "Precompute",
    "RequestSummaries",
    "Summarizer",
    "SummarizerError",
    "SummaryAsk",
    "SummaryService",
    "unsummarisable",
]
