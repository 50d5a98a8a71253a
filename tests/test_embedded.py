"""The engine embedded in another program (`gateway.integrations`, design D19.6), in-process.

`Embedded` compacts with the configured model's window, leaves a model the config does not
serve alone, and after an upstream's context refusal compacts the client's original again
against a tighter window; the LiteLLM hook, called as LiteLLM's proxy calls it, reads its
models from `COMPACTGATE_CONFIG`. The real proxy is tests/test_litellm_callback.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import parse_config
from gateway.integrations.embedded import Embedded, ModelInfo
from gateway.ops.metrics import Metrics
from gateway.wire.context_errors import ContextError
from tests.test_compress import MODEL, WINDOW, chat_agent, chat_pairs_intact, count

CONFIG = {"models": [{**MODEL, "upstream": {"base_url": "http://127.0.0.1:9/v1"}}]}


async def test_compacts_with_the_configured_window_and_leaves_other_models() -> None:
    embedded = await Embedded.start(parse_config(CONFIG), Metrics())
    try:
        original = chat_agent(60)
        done = await embedded.compact("m", original, "t")
        assert done is not None and done.changed
        assert count(done.messages) <= WINDOW - MODEL["max_output_tokens"]
        assert done.messages[-1] == original[-1] and chat_pairs_intact(done.messages)
        assert await embedded.compact("other", original, "t") is None
        small = await embedded.compact("m", chat_agent(1), "t")
        assert small is not None and not small.changed
    finally:
        await embedded.close()


async def test_a_refusal_is_compacted_again_from_the_original() -> None:
    embedded = await Embedded.start(parse_config(CONFIG), Metrics())
    try:
        original = chat_agent(60)
        first = await embedded.compact("m", original, "t")
        assert first is not None
        refusal = ContextError("openai", limit=2000, requested=first.tokens_after)
        again = await embedded.recompact(list(first.messages), refusal)  # a copy: by its bytes
        assert again is not None and again.changed
        assert again.tokens_after < first.tokens_after
        assert again.tokens_before == first.tokens_before  # from the client's original
        assert again.messages[-1] == original[-1] and chat_pairs_intact(again.messages)
        assert await embedded.recompact(original, refusal) is None  # not a list it handed out
    finally:
        await embedded.close()


async def test_without_models_the_programs_window_is_used() -> None:
    embedded = await Embedded.start(parse_config({}), Metrics())
    try:
        info = ModelInfo("gpt-4o-mini", context_window=WINDOW, max_output_tokens=1024)
        done = await embedded.compact("any-group", chat_agent(60), "t", info=info)
        assert done is not None and count(done.messages) <= WINDOW - 1024
    finally:
        await embedded.close()


async def test_the_litellm_hook_reads_compactgate_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.integrations.litellm import CompactGateHook

    path = tmp_path / "gateway.json"
    path.write_text(json.dumps(CONFIG))
    monkeypatch.setenv("COMPACTGATE_CONFIG", str(path))
    hook = CompactGateHook()
    original = chat_agent(60)
    data = {"model": "m", "messages": original, "max_tokens": 500}
    out = await hook.async_pre_call_hook(None, None, dict(data), "acompletion")
    assert count(out["messages"]) <= WINDOW - 500
    assert out["messages"][-1] == original[-1]
    other = await hook.async_pre_call_hook(None, None, {**data, "model": "x"}, "acompletion")
    assert other["messages"] is original  # a model the config does not serve: left alone
    assert hook.embedded is not None
    await hook.embedded.close()
