"""Configuration: YAML (or JSON) with `${VAR}` interpolation, validated once into typed objects.

Nothing at request time reads raw config dicts: `load_config` returns a frozen `Config` or raises
`ConfigError` listing every problem with its YAML path, e.g.
`models[1].context_window: must be > 0`. `check-config` prints exactly these.

All problems come in one pass, never in rounds: unset variables, pydantic's aggregated field
errors (an unknown key with the nearest known key at its level: "did you mean ..."), and the
checks across entries (`semantic_problems`: duplicate model names, unknown policies, summariser
models that name no configured model, `max_output_tokens` that leaves no room in the window),
which read the raw data so that they run even when a field elsewhere is invalid. LiteLLM's
syntax (`os.environ/X`, a `model_list`) is answered with what to write instead.

With no config file the gateway runs `default_config()`: every model name forwarded to
`COMPACTGATE_UPSTREAM` (default: OpenAI's public API), windows from litellm's model registry,
the default policy chain.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, TypeGuard

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from policies.pinning import PinRule
from policies.registry import STEPS

from .config_errors import format_validation_error

DEFAULT_UPSTREAM = "https://api.openai.com/v1"
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_SHA256_HEX = re.compile(r"[0-9a-fA-F]{64}")
_LITELLM_ENV = re.compile(r"os\.environ/([A-Za-z_][A-Za-z0-9_]*)")
_ORIGIN = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:([0-9]{1,5}|\*))?")
_HOST = re.compile(
    r"[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*"
)
# Pages served from this machine may call the gateway from a browser; other sites may not.
LOOPBACK_ORIGINS = ("http://localhost:*", "http://127.0.0.1:*", "http://[::1]:*")
# How a model's upstream is reached (`upstream.provider`): each names one transport.
Provider = Literal["openai", "litellm", "in_process"]


class PathProblems(ValueError):
    """Raised by a validator that checks several entries: each problem already names its full
    YAML path (`auth.keys[2].key_sha256: ...`), so it is reported as it is."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerConfig(_Strict):
    max_body_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger bodies get 413")
    max_drain_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="A body over max_body_bytes is read on and dropped up to this much more, so "
        "the client can read its 413; past it the connection is closed",
    )
    max_messages: int = Field(20_000, gt=0, description="More messages get 400")
    upstream_timeout_s: float = Field(600.0, gt=0, description="Whole upstream call, non-streaming")
    connect_timeout_s: float = Field(10.0, gt=0)
    first_byte_timeout_s: float | None = Field(
        None, gt=0, description="Default: upstream_timeout_s"
    )
    stream_idle_timeout_s: float = Field(120.0, gt=0, description="Longest gap inside a stream")
    body_read_timeout_s: float = Field(
        30.0, gt=0, description="A client trickling its body is cut off"
    )
    header_read_timeout_s: float = Field(
        10.0, gt=0, description="A client trickling its request line and headers is cut off"
    )
    compress_timeout_s: float = Field(
        8.0,
        gt=0,
        description=(
            "POST /v1/compress answers within this or 503 compress_timeout (agentgateway waits "
            "10 s for its compressor, then fails open)"
        ),
    )
    max_concurrent_per_tenant: int | None = Field(None, gt=0, description="429 beyond it")
    max_open_files: int | None = Field(
        None, gt=0, description="Soft RLIMIT_NOFILE set by serve; default: the hard limit"
    )
    safety_margin_tokens: int = Field(
        32, ge=0, description="Kept free on top of the output reserve"
    )
    clamp_max_tokens: bool = Field(False, description="Lower max_tokens instead of failing")
    count_threads: int = Field(
        0,
        ge=0,
        le=64,
        description=(
            "Threads that count a request's messages together when it must wait for its count, "
            "the event loop's included (tiktoken runs in parallel in them), at most one per "
            "core; 0 or 1: the event loop alone, the least CPU when no core is idle"
        ),
    )
    stream_usage: Literal["inject", "passthrough"] = Field(
        "passthrough",
        description="inject: ask streaming upstreams for usage (calibration) and strip it again",
    )
    admin_token: str | None = Field(
        None, description="Bearer token for /metrics, /ui, events, plan"
    )
    admin_port: int | None = Field(
        None, gt=0, lt=65536, description="Serve admin surfaces there only"
    )
    readiness_upstreams: bool = Field(
        True,
        description="Check that each model has an upstream accepting connections, for /healthz "
        "detail, the overview and compactgate_upstream_reachable (never for /readyz)",
    )
    readiness_cache_s: float = Field(
        5.0, ge=0, description="How long /readyz and the upstream checks reuse their last round"
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="text: key=value lines; json: one JSON object per line"
    )
    cors_origins: list[str] = Field(
        default_factory=lambda: list(LOOPBACK_ORIGINS),
        description="Browser origins allowed to call the gateway: exact, `*`, or ending in `:*`",
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names browsers may reach the gateway by, besides loopback names and IP "
        "addresses (DNS rebinding): exact, `*.example.com`, or `*`",
    )
    websocket_queue_bytes: int = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Frames waiting on a Responses WebSocket behind the one being served; past "
        "this the socket gets an error frame and is closed",
    )

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        bad = [h for h in value if h != "*" and not _HOST.fullmatch(h.removeprefix("*."))]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not a host name: use name.example.com, *.example.com or *"
            )
        return value

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, value: list[str]) -> list[str]:
        bad = [o for o in value if o != "*" and not _ORIGIN.fullmatch(o)]
        if bad:
            raise ValueError(
                f"{bad[0]!r} is not an origin: use scheme://host[:port], scheme://host:* "
                "(any port) or *"
            )
        return value


class UpstreamConfig(_Strict):
    base_url: str | None = Field(
        None, description="OpenAI-compatible base URL, e.g. http://host/v1"
    )
    model: str | None = Field(None, description="Model name sent upstream (rename)")
    api_key: str | None = Field(None, description="Gateway-held key; else the client's is passed")
    provider: Provider = Field(
        "openai",
        description=(
            "openai: an OpenAI-compatible server at base_url; litellm: chat completions "
            "translated by litellm (`model` in litellm's naming, base_url its optional api_base); "
            "in_process: a server embedded with the gateway in its process, named by base_url's "
            "host (the demo's echo model, the test suite's fake upstream)"
        ),
    )
    headers: dict[str, str] = Field(default_factory=dict, description="Extra headers to send")
    weight: float = Field(
        1.0, gt=0, description="Share of requests when a model lists several upstreams"
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if value.startswith("litellm:"):
            # The transport is declared, not spelled into the URL.
            raise ValueError(
                "a litellm route is declared with provider: litellm; base_url is then the "
                "provider's API base (http:// or https://), or left out for its default"
            )
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")

    @field_validator("api_key", "model")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _needs_url(self) -> UpstreamConfig:
        if self.provider != "litellm" and self.base_url is None:
            raise ValueError(f"base_url is required for provider {self.provider}")
        return self


class RetryConfig(_Strict):
    max_attempts: int = Field(
        3, ge=1, le=10, description="Tries per upstream call (429/5xx/connect)"
    )
    backoff_base_seconds: float = Field(0.5, ge=0)
    max_delay_seconds: float = Field(10.0, ge=0)
    cooldown_seconds: float = Field(
        5.0,
        ge=0,
        description=(
            "With several upstreams: one that failed (connection, 5xx, 429) is tried last for "
            "this long; a 429's Retry-After, when longer, is honoured instead"
        ),
    )


class PricingConfig(_Strict):
    """Prices for cost accounting, USD per million tokens; unset tiers come from the price
    map bundled with litellm, looked up by `model` (default: the upstream model name)."""

    model: str | None = Field(None, description="Name to look up in the bundled price map")
    input: float | None = Field(None, ge=0)
    output: float | None = Field(None, ge=0)
    cache_read: float | None = Field(None, ge=0)
    cache_write_5m: float | None = Field(None, ge=0)
    cache_write_1h: float | None = Field(None, ge=0)
    reasoning: float | None = Field(None, ge=0)

    def per_million(self) -> dict[str, float | None]:
        return {
            "input": self.input,
            "output": self.output,
            "cache_read": self.cache_read,
            "cache_write_5m": self.cache_write_5m,
            "cache_write_1h": self.cache_write_1h,
            "reasoning": self.reasoning,
        }


class ModelConfig(_Strict):
    name: str = Field(
        min_length=1, description="What clients send as `model`; globs like gpt-4o* work"
    )
    upstream: UpstreamConfig | None = Field(None, description="The one upstream (or upstreams)")
    upstreams: list[UpstreamConfig] | None = Field(
        None,
        min_length=1,
        description="Several upstreams for this name: balanced by weight, failed over",
    )
    context_window: int | None = Field(None, gt=0)
    max_output_tokens: int | None = Field(None, gt=0)
    tokenizer: str | None = Field(
        None, description="tiktoken:<enc> | hf:<path> | chars:<n> | upstream"
    )
    policy: str = "default"
    mode: Literal["enforce", "observe"] | None = None
    max_retries: int = Field(2, ge=0, le=5, description="Emergency retries on context errors")
    stateful_truncation: bool = Field(
        False,
        description=(
            "Responses requests whose history is held upstream (previous_response_id, "
            "conversation) cannot be compacted here: set truncation: auto on them"
        ),
    )
    retry: RetryConfig = Field(default_factory=RetryConfig)
    pricing: PricingConfig | None = None
    context_management: Literal["native", "emulate", "strip"] = Field(
        "native",
        description=(
            "Anthropic's context_management field: forwarded (native), applied by the gateway "
            "(emulate) or removed (strip) for upstreams that reject it"
        ),
    )
    responses_compact: Literal["auto", "native", "emulate"] = Field(
        "auto",
        description=(
            "POST /v1/responses/compact and compaction_trigger items: forwarded to an upstream "
            "that implements them (native), or answered by the gateway with a signed reference "
            "to a summary it holds (emulate); auto: native for api.openai.com, else emulate"
        ),
    )

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer(cls, value: str | None) -> str | None:
        if value is None or value == "upstream":
            return value
        kind, _, arg = value.partition(":")
        if kind not in ("tiktoken", "hf", "chars") or not arg:
            raise ValueError(
                "must be tiktoken:<encoding>, hf:<path to tokenizer.json>, chars:<n> or upstream"
            )
        if kind == "chars":
            try:
                if float(arg) <= 0:
                    raise ValueError
            except ValueError:
                raise ValueError(
                    "chars:<n> needs a positive number of characters per token"
                ) from None
        return value

    @model_validator(mode="after")
    def _one_or_several_upstreams(self) -> ModelConfig:
        if (self.upstream is None) == (self.upstreams is None):
            raise ValueError("give either upstream (one) or upstreams (a list), not both")
        listed = self.upstreams or []
        # The request is counted and renamed once, for the model: every upstream must take it.
        # (openai and in_process upstreams take the same HTTP request; litellm translates it.)
        if len({(u.provider == "litellm", u.model) for u in listed}) > 1:
            raise ValueError(
                "the upstreams of one model must share model (the name sent upstream) and go "
                "through litellm all or none; list a differently named model as a model of its own"
            )
        return self

    @property
    def targets(self) -> tuple[UpstreamConfig, ...]:
        """Every upstream of this model, the first being the one that names and prices it."""
        if self.upstreams is not None:
            return tuple(self.upstreams)
        assert self.upstream is not None
        return (self.upstream,)

    @property
    def primary(self) -> UpstreamConfig:
        return self.targets[0]


def _step_union() -> Any:
    classes = tuple(cls for cls, _ in STEPS.values())
    if len(classes) == 1:
        return classes[0]
    from typing import Union

    return Annotated[Union[classes], Field(discriminator="type")]  # noqa: UP007


StepItem = _step_union()


class PolicyConfig(_Strict):
    trigger_ratio: float = Field(0.8, gt=0, le=1)
    target_ratio: float = Field(0.6, gt=0, le=1)
    hold_ratio: float = Field(0.95, gt=0, le=1)
    recovery_mode: Literal["truncate", "fresh_start", "error"] = "truncate"
    max_iterations: int = Field(3, ge=1, le=10)
    precompute_ratio: float = Field(0.6, gt=0, le=1)
    steps: list[StepItem] | None = None  # type: ignore[valid-type]
    pin_rules: list[PinRule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ratios(self) -> PolicyConfig:
        if self.target_ratio > self.trigger_ratio:
            raise ValueError("target_ratio must be <= trigger_ratio")
        if "hold_ratio" in self.model_fields_set and self.hold_ratio < self.trigger_ratio:
            raise ValueError("hold_ratio must be >= trigger_ratio")
        return self


class AuthKey(_Strict):
    key_sha256: str = Field(description="sha256 of the key, 64 hex characters")
    tenant: str = Field(min_length=1)
    models: list[str] = Field(default_factory=lambda: ["*"])

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if not _SHA256_HEX.fullmatch(value):
            raise ValueError("must be 64 hex characters: the sha256 of the key, not the key")
        return value.lower()


class AuthConfig(_Strict):
    keys: list[AuthKey] = Field(default_factory=list)

    @model_validator(mode="after")
    def _one_entry_per_key(self) -> AuthConfig:
        # Two entries with one key would give one caller two tenants (or let a key read another
        # tenant's summaries): refused, naming both entries.
        first: dict[str, int] = {}
        problems = []
        for index, key in enumerate(self.keys):
            seen = first.setdefault(key.key_sha256, index)
            if seen != index:
                problems.append(
                    f"auth.keys[{index}].key_sha256: the same key as auth.keys[{seen}].key_sha256; "
                    "each key must name exactly one tenant"
                )
        if problems:
            raise PathProblems(problems)
        return self


class EventLogConfig(_Strict):
    path: str | None = Field(None, description="JSON lines file; '-' for stdout; unset: off")
    log_content: bool = False
    keep: int = Field(200, ge=0, description="Latest events kept in memory for /ui")
    keep_requests: int = Field(
        10_000, ge=1, description="Latest requests kept in memory for /ui's per-model tables"
    )


class SummariesConfig(_Strict):
    """How the gateway makes, caches and precomputes summaries (design D7)."""

    timeout_s: float = Field(120.0, gt=0, description="Longest one summary may take (all calls)")
    wait_s: float = Field(
        60.0, ge=0, description="Longest a request that cannot fit without a summary waits for it"
    )
    ttl_s: float = Field(86_400.0, gt=0, description="How long a summary stays in the store")
    precompute: bool = Field(True, description="Compute summaries ahead of need (precompute_ratio)")
    lookahead_requests: float = Field(
        2.0, gt=0, description="Precompute when the trigger is this many requests' growth away"
    )
    precompute_defer_s: float = Field(
        0.5,
        ge=0,
        description=(
            "A precomputation starts when the tenant's next request on the model has been "
            "prepared (it runs while that one is at the upstream), or after this long; 0: at once"
        ),
    )
    background_concurrency: int = Field(4, ge=1, description="Precomputations running at once")
    background_queue: int = Field(64, ge=0, description="Precomputations waiting; more are dropped")
    retry_failed_after_s: float = Field(
        30.0, ge=0, description="A failed summary is not tried again sooner (same process)"
    )
    max_input_tokens: int | None = Field(
        None, gt=0, description="Cap on one summary call's input; longer input is chunked"
    )
    local_cache_bytes: int = Field(
        32 * 1024 * 1024, ge=0, description="Summaries kept in each process, in front of the store"
    )
    token_limit_param: Literal["max_tokens", "max_completion_tokens", "none"] = Field(
        "max_tokens", description="Request field that bounds the summary's length"
    )
    remote_compaction_ttl_s: float = Field(
        7 * 86_400.0,
        gt=0,
        description=(
            "How long the summary behind an issued Responses compaction item is kept after the "
            "last request carrying the item"
        ),
    )
    remote_compaction_tokens: int = Field(
        2000, ge=16, description="Longest summary asked for when answering a Responses compaction"
    )


class ToolOutputsConfig(_Strict):
    """Masked tool output kept in the store and readable by the model (design D13.4)."""

    expand: bool = Field(True, description="Offer the read/grep tools when outputs were masked")
    ttl_s: float = Field(86_400, gt=0, description="Kept this long after the last request using it")
    read_tool: str = Field("tool_output_cache", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    grep_tool: str = Field("tool_output_cache_grep", pattern=r"^[A-Za-z0-9_-]{1,64}$")
    default_limit: int = Field(200, ge=1, le=2000, description="Lines per read when not asked")
    max_rounds: int = Field(4, ge=1, le=10, description="Internal tool rounds per request")
    ref_secret: str | None = Field(
        None,
        description=(
            "Key of ref ids and of compaction item references; default: shared via a Redis "
            "store, else random per process"
        ),
    )


# -- agents' own compaction requests (gateway.agents.signatures recognises them) ----------


class Signature(BaseModel):
    """One agent's compaction request: how its latest user message reads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="The agent, as metrics and headers name it")
    api: str | None = Field(None, description="chat | responses | messages; null: any")
    starts_with: str = Field(min_length=8, description="The latest user text begins with this")
    contains: str | None = Field(None, description="... and contains this, when set")
    fixture: str | None = Field(None, description="The captured request it was written from")
    answerable: bool = Field(
        True,
        description="The request carries the history as messages, so a summary made ahead of "
        "need can answer it; false for an agent that sends its history as one transcript",
    )


DEFAULT_SIGNATURES: tuple[Signature, ...] = (
    Signature(
        name="codex",
        api="responses",
        starts_with="You are performing a CONTEXT CHECKPOINT COMPACTION",
        fixture="tests/fixtures/agents/codex_compaction_request.json",
    ),
    Signature(
        name="claude-code",
        api="messages",
        starts_with="CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",
        contains="summary of the conversation so far",
        fixture="tests/fixtures/agents/claude_compact_request.json",
    ),
    Signature(
        name="opencode",  # the same prompt whichever API its provider speaks
        starts_with="Here is the conversation so far:",
        contains="Create a new anchored summary from the conversation history",
        fixture="tests/fixtures/agents/opencode_compaction_request.json",
        answerable=False,  # its history comes as one transcript inside the prompt
    ),
)


class AgentCompactionConfig(_Strict):
    """How the gateway tells an agent's own compaction request from an ordinary turn."""

    signatures: list[Signature] = Field(
        default_factory=lambda: list(DEFAULT_SIGNATURES),
        description="Matched on the latest user message; defaults: Codex CLI, Claude Code",
    )


class Config(_Strict):
    server: ServerConfig = Field(default_factory=ServerConfig)
    store: str = Field(
        "memory://",
        description="memory://, redis://host:port/db, "
        "redis-sentinel://h:p[,h:p...]/<service>[/<db>] or redis-cluster://h:p[,h:p...] "
        "(rediss-... for TLS)",
    )
    store_sync_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="How often each replica reads what the others learnt through a shared "
        "store (windows, calibration, agents' compaction points) and checks the store",
    )
    auth: AuthConfig | None = None
    mode: Literal["enforce", "observe"] = "enforce"
    tenant_header: str | None = Field(None, description="Header naming the tenant (else key hash)")
    events: EventLogConfig = Field(default_factory=EventLogConfig)
    models: list[ModelConfig] = Field(default_factory=list)
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    summaries: SummariesConfig = Field(default_factory=SummariesConfig)
    tool_outputs: ToolOutputsConfig = Field(default_factory=ToolOutputsConfig)
    agent_compaction: AgentCompactionConfig = Field(default_factory=AgentCompactionConfig)

    @field_validator("store")
    @classmethod
    def _store(cls, value: str) -> str:
        from .store.urls import parse_store_url

        parse_store_url(value)  # ValueError names the bad part
        return value

    @model_validator(mode="after")
    def _entries_agree(self) -> Config:
        problems = semantic_problems(self.model_dump(include={"models", "policies"}))
        if problems:
            raise PathProblems(problems)
        return self

    def policy(self, name: str) -> PolicyConfig:
        return self.policies.get(name) or self.policies.get("default") or PolicyConfig()

    @property
    def providers(self) -> frozenset[Provider]:
        """The providers the models' upstreams declare: the transports to start."""
        return frozenset(u.provider for m in self.models for u in m.targets)


class ConfigError(Exception):
    """The config is invalid; `problems` are `path: message` lines."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_config(path: str | os.PathLike[str], environ: Mapping[str, str] | None = None) -> Config:
    """Read, interpolate and validate a YAML/JSON config file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read: {exc.strerror or exc}"]) from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from None
    return parse_config(raw if raw is not None else {}, environ)


def parse_config(raw: Any, environ: Mapping[str, str] | None = None) -> Config:
    """Validate `raw`; every problem at once (variables, fields, entries that disagree)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(["(top level): must be a mapping"])
    problems: list[str] = []
    data = _interpolate(raw, os.environ if environ is None else environ, "", problems)
    # A value whose variable is unset is reported at its path: not again there or, as a missing
    # value, at its parent.
    reported = {line.partition(": ")[0] for line in problems}
    reported |= {path.rpartition(".")[0] for path in reported}
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        found = [
            p
            for p in format_validation_error(exc, Config, PathProblems)
            if p.partition(": ")[0] not in reported
        ]
        problems += [*found, *semantic_problems(data)]
    else:
        if not problems:
            return config
    raise ConfigError(list(dict.fromkeys(problems)))


def semantic_problems(data: Mapping[str, Any]) -> list[str]:
    """Problems across entries, read from the raw data (so found even when a field elsewhere is
    invalid); values of the wrong type are skipped here, pydantic reports them."""
    listed = data.get("models")
    models = (
        [m if isinstance(m, Mapping) else {} for m in listed or []]
        if isinstance(listed, list)
        else []
    )
    policies = data.get("policies")
    policies = policies if isinstance(policies, Mapping) else {}
    problems: list[str] = []
    first: dict[str, int] = {}
    for i, model in enumerate(models):
        name = model.get("name")
        if isinstance(name, str) and name:
            seen = first.setdefault(name, i)
            if seen != i:
                problems.append(
                    f"models[{i}].name: {name!r} is already models[{seen}].name, which would "
                    "always win; list several upstreams under one model (upstreams:) instead"
                )
        policy = model.get("policy")
        if isinstance(policy, str) and policy != "default" and policy not in policies:
            problems.append(f"models[{i}].policy: unknown policy {policy!r}")
        window, output = model.get("context_window"), model.get("max_output_tokens")
        if _count(window) and _count(output) and output >= window:
            problems.append(
                f"models[{i}].max_output_tokens: {output} leaves no room for the prompt in "
                f"context_window {window}; it must be below it"
            )
    names = list(dict.fromkeys(m["name"] for m in models if isinstance(m.get("name"), str)))
    for policy_name, policy in policies.items():
        steps = policy.get("steps") if isinstance(policy, Mapping) else None
        for k, step in enumerate(steps if isinstance(steps, list) else []):
            wanted = step.get("model") if isinstance(step, Mapping) else None
            if isinstance(wanted, str) and not any(fnmatch.fnmatchcase(wanted, n) for n in names):
                configured = ", ".join(names) if names else "none"
                problems.append(
                    f"policies.{policy_name}.steps[{k}].model: {wanted!r} names no configured "
                    f"model (models: {configured}); the summariser calls a model of this gateway"
                )
    return problems


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def default_config(environ: Mapping[str, str] | None = None) -> Config:
    env = os.environ if environ is None else environ
    upstream = env.get("COMPACTGATE_UPSTREAM") or DEFAULT_UPSTREAM
    return parse_config({"models": [{"name": "*", "upstream": {"base_url": upstream}}]}, env)


def _interpolate(value: Any, environ: Mapping[str, str], path: str, problems: list[str]) -> Any:
    if isinstance(value, str):
        litellm_env = _LITELLM_ENV.fullmatch(value.strip())
        if litellm_env:
            # LiteLLM reads `os.environ/X` from the environment; sent as it stands it would be a
            # literal (wrong) key. This config has one syntax for variables: say which.
            name = litellm_env.group(1)
            problems.append(
                f"{path or '(top level)'}: {value.strip()!r} is LiteLLM's syntax for an "
                f"environment variable; write ${{{name}}} here"
            )
            return ""

        def replace(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            found = environ.get(name)
            if found is None or (found == "" and default is not None):
                if default is None:
                    problems.append(
                        f"{path or '(top level)'}: environment variable {name} is not set"
                    )
                    return ""
                return default
            return found

        return _VAR.sub(replace, value)
    if isinstance(value, Mapping):
        return {
            k: _interpolate(v, environ, f"{path}.{k}" if path else str(k), problems)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate(v, environ, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    return value
