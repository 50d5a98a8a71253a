"""`compactgate import-litellm`: a LiteLLM proxy config becomes a config this gateway serves."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from gateway.cli import main
from gateway.config import load_config
from tests.in_process import AppStarter, LocalUpstream

LITELLM = """
model_list:
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o-2024-08-06
      api_base: {first}
      api_key: os.environ/KEY_A
      rpm: 300
      temperature: 0.2
    model_info:
      max_input_tokens: 128000
      max_output_tokens: 16384
  - model_name: gpt-4o
    litellm_params:
      model: openai/gpt-4o-2024-08-06
      api_base: {second}
      api_key: os.environ/KEY_B
      rpm: 100
  - model_name: gpt-4o
    litellm_params:
      model: azure/my-deployment
      api_base: https://example.invalid
  - model_name: claude
    litellm_params:
      model: anthropic/claude-sonnet-4-5
      api_key: os.environ/ANTHROPIC_API_KEY
router_settings:
  num_retries: 2
  cooldown_time: 30
general_settings:
  master_key: sk-1234
"""


def dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def test_deployments_become_upstreams_and_what_is_dropped_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "litellm.yaml"
    source.write_text(LITELLM.format(first="http://10.0.0.1:8000/v1", second="http://10.0.0.2/v1"))
    target = tmp_path / "compactgate.yaml"
    assert main(["import-litellm", str(source), "-o", str(target)]) == 0
    warnings = capsys.readouterr().err
    assert "model_list[0].litellm_params: not converted: temperature" in warnings
    assert "model_list[2]: 'gpt-4o' here sends 'azure/my-deployment'" in warnings
    assert "general_settings.master_key: not converted" in warnings

    env = {"KEY_A": "a", "KEY_B": "b", "ANTHROPIC_API_KEY": "c"}
    config = load_config(target, environ=env)
    gpt, claude = config.models
    assert gpt.name == "gpt-4o" and gpt.context_window == 128000
    assert gpt.max_output_tokens == 16384
    assert [(u.base_url, u.model, u.api_key, u.weight) for u in gpt.targets] == [
        ("http://10.0.0.1:8000/v1", "gpt-4o-2024-08-06", "a", 300),
        ("http://10.0.0.2/v1", "gpt-4o-2024-08-06", "b", 100),
    ]
    assert gpt.retry.max_attempts == 3 and gpt.retry.cooldown_seconds == 30
    assert claude.upstream is not None and claude.upstream.provider == "litellm"
    assert claude.upstream.model == "anthropic/claude-sonnet-4-5"
    assert claude.upstream.api_key == "c"
    assert "${KEY_A}" in target.read_text()  # the key stays in the environment


def test_not_a_litellm_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "ours.yaml"
    source.write_text(yaml.safe_dump({"models": []}))
    assert main(["import-litellm", str(source)]) == 1
    assert "no model_list" in capsys.readouterr().err


async def test_the_converted_config_serves_and_fails_over(
    tmp_path: Path, start_app: AppStarter, local_upstream: LocalUpstream
) -> None:
    source = tmp_path / "litellm.yaml"
    litellm = yaml.safe_load(LITELLM.format(first=dead_url(), second=local_upstream.base_url))
    litellm["model_list"] = litellm["model_list"][:2]
    litellm["model_list"][0]["litellm_params"]["rpm"] = 1_000_000_000  # the dead one leads
    source.write_text(yaml.safe_dump(litellm))
    target = tmp_path / "compactgate.yaml"
    assert main(["import-litellm", str(source), "-o", str(target)]) == 0
    app = await start_app(yaml.safe_load(target.read_text()), env={"KEY_A": "a", "KEY_B": "b"})
    reply = await app.openai().chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
    )
    assert reply.choices[0].message.content
    [sent] = local_upstream.chat_requests()
    assert sent["json"]["model"] == "gpt-4o-2024-08-06"
    assert ("authorization", "Bearer b") in [(k.lower(), v) for k, v in sent["headers"]]
