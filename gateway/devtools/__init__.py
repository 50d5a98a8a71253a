"""Tools for people setting up or trying the gateway, not part of the request path: today
`compactgate setup` (setup.py)."""
