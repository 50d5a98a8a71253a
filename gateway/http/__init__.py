"""The HTTP doors: one thin handler per wire API, the other endpoints (models, passthrough, plan,
probes, admin, the Responses WebSocket), access (keys, tenants, CORS, the admin gate, limits)
and the dispatch that puts them together."""
