"""Agents' own compaction (design D8): recognising an agent's compaction request, answering it
from a summary made ahead of need, Responses remote compaction and Anthropic's
`context_management` on any upstream; reached from the request path through `hooks.py`."""
