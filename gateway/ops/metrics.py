"""Prometheus metrics, all prefixed `compactgate_`.

Each app gets its own registry (tests build several apps in one process). With several uvicorn
workers, set `PROMETHEUS_MULTIPROC_DIR` (the CLI does it for `--workers > 1`): values then live
in shared files and `/metrics` aggregates every worker through prometheus-client's
multiprocess collector.

Labels are bounded: `model` is the route name, and at most `MAX_MODEL_LABELS` distinct names are
kept before new ones are counted as `other` (a client can send any model name). API keys and
tenants never appear in labels.

Counters and histograms carry no `_created` series: they double the exposition's size and no
query here uses them. Each registry also exports `compactgate_build_info` and the platform's
`python_info`; the process's `process_*` metrics (CPU, memory, descriptors) too, except in
multiprocess mode, where they would describe only whichever worker answered the scrape.
"""

from __future__ import annotations

import os
import platform
from typing import Any

from prometheus_client import (
    PLATFORM_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    multiprocess,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..version import version
from .children import Children

disable_created_metrics()

MAX_MODEL_LABELS = 200
LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
    120,
)
OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1)
# Non-negative bounds only: prometheus-client drops a histogram's `_sum` when a bucket bound is
# negative, and the mean error (`_sum / _count`) is what calibration is judged by.
RATIO_BUCKETS = (0.01, 0.03, 0.05, 0.1, 0.2, 0.5, 1, 2)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        r = self.registry
        self.build_info = Gauge(
            "compactgate_build_info",
            "Always 1; the labels say which gateway and Python serve",
            ["version", "python"],
            registry=r,
            multiprocess_mode="max",
        )
        self.build_info.labels(version(), platform.python_version()).set(1)
        if not self.multiprocess:
            ProcessCollector(registry=r)
            r.register(PLATFORM_COLLECTOR)
        self.requests = Counter(
            "compactgate_requests",
            "Requests by model, status and API (chat, responses, messages, count_tokens, "
            "models, passthrough)",
            ["model", "status", "api"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "compactgate_request_duration_seconds",
            "Total time per request, as the client sees it",
            ["model", "api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_seconds = Histogram(
            "compactgate_upstream_duration_seconds",
            "Time spent waiting for and reading the upstream",
            ["model", "api"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead_seconds = Histogram(
            "compactgate_gateway_overhead_seconds",
            "The gateway's own time per request (total - upstream)",
            ["model", "api"],
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.tokens_before = Counter(
            "compactgate_tokens_before",
            "Prompt tokens the client sent (estimated)",
            ["model", "api"],
            registry=r,
        )
        self.tokens_after = Counter(
            "compactgate_tokens_after",
            "Prompt tokens forwarded upstream (estimated)",
            ["model", "api"],
            registry=r,
        )
        self.tokens_saved = Counter(
            "compactgate_tokens_saved",
            "Prompt tokens removed by compaction from requests that were answered (a request "
            "that then failed saved nothing)",
            ["model", "api"],
            registry=r,
        )
        self.embedded = Counter(
            "compactgate_embedded",
            "Conversations handed to the engine inside another program (the LiteLLM callback), "
            "by outcome: compacted, unchanged, recompacted, unknown_model, failed_open",
            ["outcome"],
            registry=r,
        )
        self.compactions = Counter(
            "compactgate_compactions",
            "Requests changed by a step, by step type",
            ["step"],
            registry=r,
        )
        self.upstream_malformed = Counter(
            "compactgate_upstream_malformed",
            "Upstream 2xx answers that were not the API's format (not JSON, truncated, not its "
            "event stream), answered 502 or ended with an error event, by model and API",
            ["model", "api"],
            registry=r,
        )
        self.context_errors = Counter(
            "compactgate_context_errors",
            "Context-window errors from upstreams, by provider signature",
            ["signature"],
            registry=r,
        )
        self.emergency_retries = Counter(
            "compactgate_emergency_retries",
            "Retries after a context-window error",
            ["model"],
            registry=r,
        )
        self.context_errors_avoided = Counter(
            "compactgate_context_errors_avoided",
            "Requests the upstream refused with a context-window error that were answered after "
            "the gateway compacted them and retried",
            ["model"],
            registry=r,
        )
        self.over_window_answered = Counter(
            "compactgate_over_window_answered",
            "Answered requests the gateway estimated larger than the model's window and "
            "compacted to fit before sending (an estimate: the upstream never saw them whole)",
            ["model"],
            registry=r,
        )
        self.window_lowered = Counter(
            "compactgate_window_lowered",
            "Times a model's effective window was lowered from an error",
            ["model"],
            registry=r,
        )
        self.upstream_retries = Counter(
            "compactgate_upstream_retries",
            "Retries after 429/5xx/connection failures",
            ["model", "reason"],
            registry=r,
        )
        self.upstream_failovers = Counter(
            "compactgate_upstream_failovers",
            "Requests moved to another upstream of their model after 429/5xx/connection failures",
            ["model", "reason"],
            registry=r,
        )
        self.summary_cache = Counter(
            "compactgate_summary_cache", "Summary cache lookups", ["result"], registry=r
        )
        self.summarizer_calls = Counter(
            "compactgate_summarizer_calls", "Summariser calls by outcome", ["outcome"], registry=r
        )
        self.summarizer_seconds = Histogram(
            "compactgate_summarizer_duration_seconds",
            "Summariser call latency",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.estimate_error = Histogram(
            "compactgate_estimate_error_ratio",
            "|estimate - reported prompt_tokens| / reported",
            ["model"],
            buckets=RATIO_BUCKETS,
            registry=r,
        )
        self.estimate_under = Counter(
            "compactgate_estimate_under",
            "Answers whose reported prompt_tokens exceeded the gateway's estimate",
            ["model"],
            registry=r,
        )
        self.estimate_over = Counter(
            "compactgate_estimate_over",
            "Answers whose reported prompt_tokens were below the gateway's estimate",
            ["model"],
            registry=r,
        )
        # Cost accounting (`costs`): USD by arm (what was billed, what the client's own request
        # would have cost) and component (input, cache_read, cache_write, output; the actual
        # arm also `summaries`, the gateway's own summariser calls).
        self.cost_usd = Counter(
            "compactgate_cost_usd",
            "USD billed (arm=actual) and what the uncompacted requests would have cost "
            "(arm=counterfactual), by component",
            ["arm", "component"],
            registry=r,
        )
        self.net_saved_usd = Gauge(
            "compactgate_net_saved_usd_total",
            "Counterfactual minus actual minus the gateway's own LLM spend, in USD (may be "
            "negative)",
            registry=r,
            multiprocess_mode="sum",
        )
        self.billed_tokens = Counter(
            "compactgate_billed_tokens",
            "Tokens the upstream billed for answered requests, by tier (input is the uncached "
            "part; output excludes reasoning)",
            ["tier"],
            registry=r,
        )
        self.cost_partial = Counter(
            "compactgate_cost_partial",
            "Requests or summariser calls whose usage had a tier with no known price (their "
            "cost is not in compactgate_cost_usd_total)",
            ["arm"],
            registry=r,
        )
        self.agent_compactions = Counter(
            "compactgate_agent_compactions",
            "Coding agents' own compaction requests, by agent and what the gateway did",
            ["agent", "outcome"],
            registry=r,
        )
        self.agent_forwarded = Counter(
            "compactgate_agent_compaction_forwarded",
            "Agents' compaction requests the gateway forwarded, by why it did not answer them "
            "(not_ready, stale, backoff)",
            ["agent", "reason"],
            registry=r,
        )
        self.agent_background_tokens = Counter(
            "compactgate_agent_background_tokens",
            "Prompt tokens the gateway's own summary calls made ahead of agents' compactions "
            "sent upstream (its count)",
            ["agent"],
            registry=r,
        )
        self.agent_saved_tokens = Counter(
            "compactgate_agent_saved_tokens",
            "Prompt tokens of agents' compaction requests answered by the gateway, which "
            "never went upstream (its count)",
            ["agent"],
            registry=r,
        )
        self.agent_unused_summaries = Counter(
            "compactgate_agent_unused_summaries",
            "Summaries made ahead of an agent's compaction that no answer used",
            ["agent"],
            registry=r,
        )
        self.inflight = Gauge(
            "compactgate_inflight_requests",
            "Requests being served",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.store_errors = Counter(
            "compactgate_store_errors",
            "Store operations that failed (degraded to no cache)",
            ["op"],
            registry=r,
        )
        self.store_reachable = Gauge(
            "compactgate_store_reachable",
            "1 while the store answers, 0 during an outage (design D13.1)",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.signing_key_mismatch = Gauge(
            "compactgate_signing_key_mismatch",
            "1 when the store holds a signing key of refs other than this process's (design D13.2)",
            registry=r,
            multiprocess_mode="livemax",
        )
        self.invariant_violations = Counter(
            "compactgate_invariant_violations",
            "Compactions refused because they broke an invariant",
            ["rule"],
            registry=r,
        )
        self.policy_errors = Counter(
            "compactgate_policy_errors",
            "Compactions abandoned because a policy step failed (the request went as it came)",
            registry=r,
        )
        self.internal_tool_rounds = Counter(
            "compactgate_internal_tool_rounds",
            "Extra upstream rounds run to expand masked tool outputs",
            ["model"],
            registry=r,
        )
        self.memo_messages = Counter(
            "compactgate_memo_messages",
            "Messages of requests by per-conversation memo (prefix_counts: token counts and "
            "uids, resent_parse: parses) and result (reused: found unchanged in the "
            "conversation's previous request in this process, so taken over; new); design D13.6",
            ["memo", "result"],
            registry=r,
        )
        self._models: set[str] = set()
        # Bounded: model labels are capped (`model_label`), APIs and statuses are few.
        self._families: dict[Any, Children] = {}
        # Label sets known up front exist from the start, at 0, so a dashboard shows 0, not
        # "No data", before the first lookup.
        for result in ("hit", "miss"):
            self.summary_cache.labels(result)
        for memo in ("prefix_counts", "resent_parse"):
            for result in ("reused", "new"):
                self.memo_messages.labels(memo, result)

    def model_label(self, name: str) -> str:
        if name in self._models:
            return name
        if len(self._models) >= MAX_MODEL_LABELS:
            return "other"
        self._models.add(name)
        return name

    def children(self, metric: Any) -> Children:
        """`metric`'s children by label values, each looked up once (`Children`); the same
        mapping on every call, so a caller may hold it."""
        found = self._families.get(metric)
        if found is None:
            found = self._families[metric] = Children(metric)
        return found

    def child(self, metric: Any, *values: str) -> Any:
        """`metric.labels(*values)`, looked up once per label set (`children`)."""
        family = self._families.get(metric)
        return (family if family is not None else self.children(metric))[values]

    def memo(self, name: str, reused: int, messages: int) -> None:
        """One request's messages through a per-conversation memo (`counting.prefix.
        MemoReport`): `reused` of `messages` found unchanged in the previous request."""
        family = self.children(self.memo_messages)
        if reused:
            family[(name, "reused")].inc(reused)
        if messages > reused:
            family[(name, "new")].inc(messages - reused)

    def estimate(self, model: str, estimated: int, reported: int) -> None:
        """One answer's token estimate against the upstream's count (`reported` > 0): the size of
        the error in the histogram, its direction in the under/over counters."""
        key = (model,)
        self.children(self.estimate_error)[key].observe(abs(estimated - reported) / reported)
        if estimated < reported:
            self.children(self.estimate_under)[key].inc()
        elif estimated > reported:
            self.children(self.estimate_over)[key].inc()

    def render(self) -> bytes:
        if self.multiprocess:
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            registry.register(PLATFORM_COLLECTOR)  # static facts, the same in every worker
            return generate_latest(registry)
        return generate_latest(self.registry)
