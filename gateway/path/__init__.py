"""The request path after the engine: forwarding with failover, relaying, recovering from a
context error (the retry window), the gateway's own calls, the learnt windows, and the
bookkeeping of each answer."""
