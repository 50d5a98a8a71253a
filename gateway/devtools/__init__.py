"""Tools for people setting up or trying the gateway, beside the request path: the demo and
its echo model, `compactgate plan`, and `compactgate setup` (setup.py, agent_settings.py)."""
