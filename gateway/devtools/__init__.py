"""Developer tools, off the serving path: the demo and its echo model, the local llama.cpp model,
`compactgate plan`, `compactgate setup` (setup.py, agent_settings.py), the LiteLLM-import
command, and the gateway's parts built without HTTP (parts.py)."""
