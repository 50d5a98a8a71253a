"""CompactGate inside a LiteLLM proxy:

    litellm_settings: {callbacks: gateway.integrations.litellm.hook}

`hook` is an instance of LiteLLM's `CustomLogger` (litellm 1.106.2). Its proxy pre-call hook
compacts the request's conversation in the proxy's own process and event loop with the
gateway's engine (`embedded.Embedded`, built once, lazily, on the first request): chat
`messages`, Anthropic `messages` (with `system`) on `/v1/messages`, Responses `input` items;
the request's tools and output limit count against the budget as on the gateway's doors.

- Configuration: `COMPACTGATE_CONFIG` names a gateway config; its models are LiteLLM's model
  group names (`model_name`), with their windows, tokenizers and policies. Without it, every
  model group is compacted with the defaults, its window and output limit read from LiteLLM's
  own model info (`model_info.max_input_tokens` in the proxy config, else LiteLLM's map).
- Fail-open: anything that goes wrong while compacting (the engine cannot be built, a body it
  cannot read, a bug) leaves the request as it came; one warning line (the error's kind, never
  content) and `compactgate_embedded_total{outcome="failed_open"}`. A model the config does not
  serve is left alone (`unknown_model`).
- Context-window errors: LiteLLM 1.106.2 gives a callback no way to retry a call itself, but
  its router re-runs the deployment hooks on a fallback. With a second model group for the same
  deployment named in `router_settings.context_window_fallbacks`, the deployment's refusal is
  noted (`async_post_call_failure_deployment_hook`) and the fallback's messages are compacted
  again from the client's original against a tighter window (`async_pre_call_deployment_hook`,
  design D6.2); one retry per fallback group. Without such a group the refusal reaches the
  client as LiteLLM reports it (docs/integrations/litellm.md).
- Metrics live in the hook's own registry: `COMPACTGATE_METRICS_PORT` serves them on loopback.

Only this module imports litellm; nothing in the gateway imports this module.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import orjson

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # (a test process) never fetch it
import litellm
from litellm.integrations.custom_logger import CustomLogger

from ..config import Config, load_config
from ..ops.metrics import Metrics
from ..wire.context_errors import ContextError, classify
from .embedded import Compacted, Embedded, ModelInfo, count, digest

log = logging.getLogger("compactgate.litellm")

CHAT_CALLS = frozenset({"completion", "acompletion"})
MESSAGES_CALLS = frozenset({"anthropic_messages"})
RESPONSES_CALLS = frozenset({"responses", "aresponses"})
# Per call type: the field holding the conversation, the API it is written in, the fields that
# change the budget, and the one holding the system prompt.
SHAPES: dict[str, tuple[str, str, tuple[str, ...], str | None]] = {
    **{c: ("messages", "chat", ("tools", "functions", "max_tokens", "max_completion_tokens"), None)
       for c in CHAT_CALLS},
    **{c: ("messages", "messages", ("tools", "max_tokens", "system"), "system")
       for c in MESSAGES_CALLS},
    **{c: ("input", "responses", ("tools", "max_output_tokens", "instructions"), "instructions")
       for c in RESPONSES_CALLS},
}  # fmt: skip
REFUSED = 1024  # refusals remembered until their fallback is prepared


class CompactGateHook(CustomLogger):
    """LiteLLM's callback (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.metrics: Metrics | None = None
        self.embedded: Embedded | None = None
        self._building: asyncio.Lock | None = None
        self._refused: OrderedDict[bytes, ContextError] = OrderedDict()

    # -- the proxy's pre-call hook ---------------------------------------------------------

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict[str, Any], call_type: str
    ) -> dict[str, Any]:
        """`data` with its conversation compacted; as it came when anything fails."""
        shape = SHAPES.get(str(getattr(call_type, "value", call_type)))  # a str, or CallTypes
        field = shape[0] if shape is not None else None
        if shape is None or not isinstance(data.get(field or ""), list) or not data[field or ""]:
            return data
        try:
            embedded = await self._engine()
            done = await self._compact(embedded, data, shape, _tenant(user_api_key_dict))
        except Exception as error:  # fail open, whatever it was
            log.warning("compactgate: request left as it came (%s)", type(error).__name__)
            if self.metrics is not None:
                count(self.metrics, "failed_open")
            return data
        if done is not None and done.changed:
            data[shape[0]] = done.messages
            system_field = shape[3]
            if system_field is not None and done.system is not None:
                data[system_field] = done.system
        return data

    async def _compact(
        self,
        embedded: Embedded,
        data: Mapping[str, Any],
        shape: tuple[str, str, tuple[str, ...], str | None],
        tenant: str,
    ) -> Compacted | None:
        field, api, budget_fields, _ = shape
        model = str(data.get("model") or "")
        extra = {k: data[k] for k in budget_fields if data.get(k) is not None}
        info = _model_info(model) if not embedded.core.config.models else None
        return await embedded.compact(model, data[field], tenant, extra, info, api)

    # -- LiteLLM's context-window refusals -------------------------------------------------

    async def async_post_call_failure_deployment_hook(
        self,
        request_data: Mapping[str, Any],
        exception: Exception,
        call_type: Any,
        fallback_depth: int | None = None,
    ) -> None:
        """A deployment refused a list this hook handed out for its context: remember it, so
        that a context-window fallback compacts it again."""
        error = _context_error(exception)
        messages = request_data.get("messages") or request_data.get("input")
        if error is None or not isinstance(messages, list):
            return
        self._refused[digest(messages)] = error
        while len(self._refused) > REFUSED:
            self._refused.popitem(last=False)

    async def async_pre_call_deployment_hook(
        self, kwargs: dict[str, Any], call_type: Any
    ) -> dict[str, Any] | None:
        """A fallback after a context refusal: the client's original compacted again, tighter."""
        embedded = self.embedded
        field = "messages" if isinstance(kwargs.get("messages"), list) else "input"
        sent = kwargs.get(field)
        if embedded is None or not self._refused or not isinstance(sent, list):
            return None
        error = self._refused.pop(digest(sent), None)
        if error is None:
            return None
        try:
            again = await embedded.recompact(sent, error)
        except Exception as failure:  # fail open: the fallback goes as it is
            log.warning("compactgate: retry left as it came (%s)", type(failure).__name__)
            count(embedded.core.metrics, "failed_open")
            return None
        if again is None or not again.changed:
            return None
        return {**kwargs, field: again.messages}

    # -- the engine, built once in the proxy's loop ----------------------------------------

    async def _engine(self) -> Embedded:
        if self.embedded is not None:
            return self.embedded
        if self._building is None:
            self._building = asyncio.Lock()
        async with self._building:
            if self.embedded is None:
                metrics = self.metrics = self.metrics or Metrics()
                _serve_metrics(metrics)
                path = os.environ.get("COMPACTGATE_CONFIG")
                config = load_config(path) if path else Config()
                self.embedded = await Embedded.start(config, metrics, api="litellm")
        return self.embedded


def _tenant(user_api_key_dict: Any) -> str:
    """The caller as LiteLLM authenticated it (its team, else its key's hash): masked tool
    outputs and summaries are kept per tenant. Never logged as it is (D16.6)."""
    who = getattr(user_api_key_dict, "team_id", None) or getattr(user_api_key_dict, "token", None)
    return "l:" + hashlib.sha256(str(who or "").encode()).hexdigest()[:32]


def _model_info(model_group: str) -> ModelInfo:
    """What the proxy knows of a model group: its deployment's model name and window (the
    proxy config's `model_info`, else LiteLLM's map). Nothing when it cannot tell."""
    try:
        from litellm.proxy import proxy_server

        router = proxy_server.llm_router
        if router is None:
            return ModelInfo()
        deployments = router.get_model_list(model_name=model_group) or []
        params = deployments[0].get("litellm_params", {}) if deployments else {}
        name = str(params.get("model") or "") or None
        group = router.get_model_group_info(model_group=model_group)
    except Exception:  # the defaults then
        return ModelInfo()
    provider_free = name.split("/", 1)[-1] if name else None
    window = getattr(group, "max_input_tokens", None) if group is not None else None
    output = getattr(group, "max_output_tokens", None) if group is not None else None
    return ModelInfo(provider_free, _positive(window), _positive(output))


def _positive(value: Any) -> int | None:
    """A token count LiteLLM reports (it gives floats: 8192.0), or None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    return int(value)


def _context_error(exception: Exception) -> ContextError | None:
    """What LiteLLM's `ContextWindowExceededError` says, in the gateway's terms (the numbers
    read from its message where a provider row recognises it); None for any other error."""
    if not isinstance(exception, litellm.ContextWindowExceededError):
        return None
    message = str(getattr(exception, "message", "") or exception)
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error"}})
    return classify(400, body) or ContextError("litellm", None, None)


def _serve_metrics(metrics: Metrics) -> None:
    port = os.environ.get("COMPACTGATE_METRICS_PORT")
    if port:
        from prometheus_client import start_http_server

        start_http_server(int(port), addr="127.0.0.1", registry=metrics.registry)


hook = CompactGateHook()
