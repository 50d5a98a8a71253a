"""Which upstream, window, tokenizer and policy serve a client's `model` name.

Resolved once per model name: configured models are compiled at start-up; names matched by a
glob entry (`name: "*"`, `gpt-4o*`) are compiled on first use and kept in a bounded table.
The context window comes from config, else litellm's registry, else `max_output_tokens x 4`,
and never exceeds the registry's hard limit (design D2.4). An unknown window disables the
proactive check for that model; the reactive path still learns the real one from errors.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from policies import Policy, build_policy

from . import model_registry
from .config import (
    DEFAULT_UPSTREAM,
    Config,
    ModelConfig,
    PolicyConfig,
    PricingConfig,
    RetryConfig,
    UpstreamConfig,
)
from .counting.cache import CountCache
from .counting.tokenizers import UpstreamTokenizer, default_tokenizer_spec, load_tokenizer
from .counting.tokens import MessageCounter

log = logging.getLogger("compactgate.routing")

DEFAULT_CHARS_TOKENIZER = "chars:2.5"
_MAX_GLOB_ROUTES = 4096


@dataclass(frozen=True, slots=True)
class Route:
    name: str  # what the client sends as `model`
    upstream: UpstreamConfig
    upstream_model: str  # what is sent upstream
    context_window: int | None
    window_source: str  # config | registry | max_output_tokens x 4 | unknown
    max_output_tokens: int | None
    tokenizer: str
    counter: MessageCounter
    policy_name: str
    policy_config: PolicyConfig
    policy: Policy
    mode: str  # enforce | observe
    max_retries: int  # emergency retries after a context-window error
    stateful_truncation: bool  # set truncation: auto where the history is held upstream
    retry: RetryConfig  # 429/5xx/connection retries
    pricing: PricingConfig | None = None  # cost accounting's prices (else the price map's)
    context_management: str = "native"  # Messages' context_management: native|emulate|strip
    responses_compact: str = "emulate"  # Responses remote compaction: native|emulate
    upstreams: tuple[UpstreamConfig, ...] = ()  # all of them when several: `upstream` is the first

    @property
    def targets(self) -> tuple[UpstreamConfig, ...]:
        """The upstreams requests for this name may go to (failover order is the balancer's)."""
        return self.upstreams or (self.upstream,)

    @property
    def renamed(self) -> bool:
        return self.upstream_model != self.name


class Router:
    """Model name -> Route. Thread-safe enough for one event loop; bounded for glob names."""

    def __init__(self, config: Config) -> None:
        self._config = config
        self._counters: dict[str, MessageCounter] = {}
        configured = {"default": config.policy("default"), **config.policies}
        self._policies = {
            name: build_policy(name, pc.steps, pc.max_iterations, pc.recovery_mode)
            for name, pc in configured.items()
        }
        self._exact: dict[str, Route] = {}
        self._globs: list[ModelConfig] = []
        self._resolved: dict[str, Route | None] = {}
        self._defaults: dict[tuple[str, str | None, int | None, int | None], Route] = {}
        for model in config.models:
            if any(ch in model.name for ch in "*?["):
                self._globs.append(model)
            elif model.name not in self._exact:
                self._exact[model.name] = self._build(model.name, model)

    def routes(self) -> list[Route]:
        """Configured (non-glob) routes, in config order."""
        return list(self._exact.values())

    def resolve(self, name: str) -> Route | None:
        route = self._exact.get(name)
        if route is not None:
            return route
        if name in self._resolved:
            return self._resolved[name]
        found: Route | None = None
        for model in self._globs:
            if fnmatch.fnmatchcase(name, model.name):
                found = self._build(name, model)
                break
        if len(self._resolved) >= _MAX_GLOB_ROUTES:
            self._resolved.pop(next(iter(self._resolved)))
        self._resolved[name] = found
        return found

    def default_route(
        self,
        name: str,
        *,
        upstream_model: str | None = None,
        context_window: int | None = None,
        max_output_tokens: int | None = None,
    ) -> Route:
        """`name` with every model setting at its default (the registry's window and
        tokenizer, the default policy, the default upstream for its summaries), but for what
        the caller knows of the model: for `/v1/compress` and the LiteLLM callback on a config
        that lists no models. Never what `resolve` answers (such a config forwards nothing).
        Bounded like the names matched by a glob."""
        key = (name, upstream_model, context_window, max_output_tokens)
        route = self._defaults.get(key)
        if route is None:
            upstream = UpstreamConfig(base_url=DEFAULT_UPSTREAM, model=upstream_model)
            model = ModelConfig(
                name=name,
                upstream=upstream,
                context_window=context_window,
                max_output_tokens=max_output_tokens,
            )
            route = self._build(name, model)
            if len(self._defaults) >= _MAX_GLOB_ROUTES:
                self._defaults.pop(next(iter(self._defaults)))
            self._defaults[key] = route
        return route

    def _counter(self, spec: str) -> MessageCounter:
        counter = self._counters.get(spec)
        if counter is None:
            counter = MessageCounter(load_tokenizer(spec), CountCache())
            self._counters[spec] = counter
        return counter

    def _route_counter(self, spec: str) -> MessageCounter:
        """Exact tokenizers are shared between routes; a heuristic (`chars:`, which calibration
        corrects per model) and `upstream` (which remembers its upstream's counts) are the
        route's own."""
        if spec == "upstream":
            return MessageCounter(UpstreamTokenizer(), CountCache(0))
        if spec.startswith("chars:"):
            return MessageCounter(load_tokenizer(spec), CountCache(0))
        return self._counter(spec)

    def _build(self, name: str, model: ModelConfig) -> Route:
        upstream_model = model.primary.model or name
        info = model_registry.lookup(upstream_model) or model_registry.lookup(name)
        window, source = _window(model, info)
        max_output = model.max_output_tokens or (info.max_output_tokens if info else None)
        spec = model.tokenizer or default_tokenizer_spec(upstream_model) or DEFAULT_CHARS_TOKENIZER
        policy_name = model.policy if model.policy in self._policies else "default"
        return Route(
            name=name,
            upstream=model.primary,
            upstreams=model.targets,
            upstream_model=upstream_model,
            context_window=window,
            window_source=source,
            max_output_tokens=max_output,
            tokenizer=spec,
            counter=self._route_counter(spec),
            policy_name=policy_name,
            policy_config=self._config.policy(policy_name),
            policy=self._policies[policy_name],
            mode=model.mode or self._config.mode,
            max_retries=model.max_retries,
            stateful_truncation=model.stateful_truncation,
            retry=model.retry,
            pricing=model.pricing,
            context_management=model.context_management,
            responses_compact=compact_mode(model),
        )


def compact_mode(model: ModelConfig) -> str:
    """`responses_compact` resolved: only OpenAI's own API is known to implement remote
    compaction; any other upstream gets the gateway's."""
    if model.responses_compact != "auto":
        return model.responses_compact
    host = urlsplit(model.primary.base_url or "").hostname or ""
    return "native" if host == "api.openai.com" else "emulate"


def _window(model: ModelConfig, info: model_registry.ModelInfo | None) -> tuple[int | None, str]:
    hard = info.max_input_tokens if info else None
    if model.context_window is not None:
        if hard is not None and model.context_window > hard:
            log.warning(
                "model %s: context_window %d is above the registry's %d; using %d",
                model.name,
                model.context_window,
                hard,
                hard,
            )
            return hard, "registry (config above hard limit)"
        return model.context_window, "config"
    if hard is not None:
        return hard, "registry"
    if model.max_output_tokens is not None:
        return model.max_output_tokens * 4, "max_output_tokens x 4"
    return None, "unknown"
