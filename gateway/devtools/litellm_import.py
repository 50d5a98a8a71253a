"""LiteLLM proxy config (`model_list:`) -> this gateway's config, for `compactgate import-litellm`.

LiteLLM lists deployments: each entry names the client-facing `model_name` and the call's
`litellm_params` (`model` with a provider prefix, `api_base`, `api_key`, `weight`/`rpm`/`tpm`,
`extra_headers`) and optionally `model_info` (token limits). Here one model name has one entry
with its upstream, or several (`upstreams:`) for several deployments. The rules:

- `openai/<name>` (and OpenAI-compatible servers: `hosted_vllm/`, `lm_studio/`, `llamafile/`, or a
  bare name with an `api_base`) become direct upstreams (`base_url`, `model: <name>`); a bare or
  `openai/` name without `api_base` goes to OpenAI's API. Every other provider goes through
  litellm (`provider: litellm`, `model` kept with its prefix, `api_base` as `base_url`).
- `os.environ/X` becomes `${X}`; a key written out in the file is kept, with a warning.
- `weight`, else `rpm`, else `tpm` becomes the upstream's `weight` (LiteLLM's shuffle uses them so).
- `model_info.max_input_tokens` -> `context_window`, `max_output_tokens` (or `max_tokens`) ->
  `max_output_tokens`; `num_retries` -> `retry.max_attempts` (one more), `cooldown_time` ->
  `retry.cooldown_seconds`.
- What has no equivalent is dropped and said in a warning, never silently: deployments of one
  name that send different models (one name sends one model upstream here), request defaults
  (`temperature`, ...), `api_version`, the proxy's `master_key` (gateway keys are `auth.keys`).

Pure: a mapping in, the new config and the warnings out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import DEFAULT_UPSTREAM

DIRECT_PREFIXES = ("openai", "hosted_vllm", "lm_studio", "llamafile")
_ENV = re.compile(r"os\.environ/([A-Za-z_][A-Za-z0-9_]*)")
_USED = frozenset(
    {"model", "api_base", "base_url", "api_key", "weight", "rpm", "tpm", "extra_headers"}
)
_DROPPED_QUIETLY = frozenset({"timeout", "stream_timeout", "max_retries"})


@dataclass(slots=True)
class Converted:
    config: dict[str, Any]
    warnings: list[str] = field(default_factory=list)


def convert(litellm: Mapping[str, Any]) -> Converted:
    """Our config for a LiteLLM proxy config; raises ValueError when it has no `model_list`."""
    entries = litellm.get("model_list")
    if not isinstance(entries, list) or not entries:
        raise ValueError("no model_list: this is not a LiteLLM proxy config")
    warnings: list[str] = []
    retry = _retry(litellm, warnings)
    models: dict[str, dict[str, Any]] = {}
    for index, entry in enumerate(entries):
        where = f"model_list[{index}]"
        if not isinstance(entry, Mapping) or not isinstance(entry.get("model_name"), str):
            warnings.append(f"{where}: no model_name; skipped")
            continue
        params = entry.get("litellm_params")
        if not isinstance(params, Mapping) or not isinstance(params.get("model"), str):
            warnings.append(f"{where}: no litellm_params.model; skipped")
            continue
        name = entry["model_name"]
        upstream = _upstream(params, where, warnings)
        model = models.get(name)
        if model is None:
            model = {"name": name, "upstreams": [upstream]}
            model.update(_limits(entry.get("model_info"), where, warnings))
            if retry:
                model["retry"] = dict(retry)
            models[name] = model
            continue
        first = model["upstreams"][0]
        if (first.get("provider"), first.get("model")) != (
            upstream.get("provider"),
            upstream.get("model"),
        ):
            warnings.append(
                f"{where}: {name!r} here sends {upstream.get('model')!r} where its first "
                f"deployment sends {first.get('model')!r}; one model name sends one model "
                "upstream in this gateway: skipped (give it a model name of its own)"
            )
            continue
        model["upstreams"].append(upstream)
    out = []
    for model in models.values():
        listed = model.pop("upstreams")
        if len(listed) == 1:
            listed[0].pop("weight", None)
            model = {"name": model["name"], "upstream": listed[0], **model}
        else:
            model = {"name": model["name"], "upstreams": listed, **model}
        out.append(model)
    settings = litellm.get("general_settings")
    if isinstance(settings, Mapping) and settings.get("master_key"):
        warnings.append(
            "general_settings.master_key: not converted; gateway keys are auth.keys entries "
            '(printf %s "$KEY" | compactgate hash-key)'
        )
    return Converted({"models": out}, warnings)


def _upstream(params: Mapping[str, Any], where: str, warnings: list[str]) -> dict[str, Any]:
    prefix, slash, rest = params["model"].partition("/")
    if not slash:
        prefix, rest = "", params["model"]
    api_base = _env(params.get("api_base") or params.get("base_url"))
    upstream: dict[str, Any]
    if prefix in DIRECT_PREFIXES or (prefix == "" and api_base):
        upstream = {"base_url": str(api_base or DEFAULT_UPSTREAM), "model": rest}
    elif prefix == "":
        upstream = {"base_url": DEFAULT_UPSTREAM, "model": rest}
    else:
        upstream = {"provider": "litellm", "model": params["model"]}
        if api_base:
            upstream["base_url"] = str(api_base)
    key = params.get("api_key")
    if isinstance(key, str) and key:
        upstream["api_key"] = _env(key)
        if not _ENV.fullmatch(key.strip()):
            warnings.append(
                f"{where}.litellm_params.api_key: a key written in the file; consider ${{VARIABLE}}"
            )
    headers = params.get("extra_headers")
    if isinstance(headers, Mapping) and headers:
        upstream["headers"] = {str(k): str(v) for k, v in headers.items()}
    for share in ("weight", "rpm", "tpm"):
        value = params.get(share)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            upstream["weight"] = value
            break
    dropped = sorted(k for k in params if k not in _USED and k not in _DROPPED_QUIETLY)
    if dropped:
        warnings.append(
            f"{where}.litellm_params: not converted: {', '.join(dropped)} (request defaults "
            "and provider options are the client's or litellm's environment's here)"
        )
    return upstream


def _env(value: Any) -> Any:
    """LiteLLM's `os.environ/X` as this config's `${X}`."""
    if isinstance(value, str) and (found := _ENV.fullmatch(value.strip())):
        return "${" + found.group(1) + "}"
    return value


def _limits(info: Any, where: str, warnings: list[str]) -> dict[str, Any]:
    if not isinstance(info, Mapping):
        return {}
    out: dict[str, Any] = {}
    window = info.get("max_input_tokens")
    output = info.get("max_output_tokens") or info.get("max_tokens")
    if isinstance(window, int) and window > 0:
        out["context_window"] = window
    if isinstance(output, int) and output > 0:
        if "context_window" in out and output >= out["context_window"]:
            warnings.append(f"{where}.model_info: max_output_tokens not below the window; dropped")
        else:
            out["max_output_tokens"] = output
    return out


def _retry(litellm: Mapping[str, Any], warnings: list[str]) -> dict[str, Any]:
    retry: dict[str, Any] = {}
    for section in ("litellm_settings", "router_settings"):
        settings = litellm.get(section)
        if not isinstance(settings, Mapping):
            continue
        retries = settings.get("num_retries")
        if isinstance(retries, int) and not isinstance(retries, bool) and retries >= 0:
            retry["max_attempts"] = min(10, retries + 1)
        cooldown = settings.get("cooldown_time")
        if isinstance(cooldown, int | float) and not isinstance(cooldown, bool) and cooldown >= 0:
            retry["cooldown_seconds"] = cooldown
    return retry
