"""The seam to upstreams: the rest of the gateway imports from here and never learns which
transport (aiohttp, litellm) carried a request.

- `client`: `UpstreamClient`, which sends each request on its provider's transport;
- `transport`: the `Transport` and `UpstreamResponse` protocols every transport keeps;
- `http`: OpenAI-compatible servers over one pooled aiohttp client;
- `litellm`: chat completions through litellm, imported on first use;
- `in_process`: HTTP to servers embedded in this process (the demo's model, the tests' fake);
- `headers`: what of the client's request (headers, passthrough path) goes upstream.
"""

from .client import UpstreamClient
from .headers import CLIENT_CREDENTIALS, HOP_BY_HOP, forward_headers, passthrough_path
from .in_process import ServerFactory
from .transport import Provider, Timeouts, Transport, UpstreamResponse, http_transport

__all__ = [
    "CLIENT_CREDENTIALS",
    "HOP_BY_HOP",
    "Provider",
    "ServerFactory",
    "Timeouts",
    "Transport",
    "UpstreamClient",
    "UpstreamResponse",
    "forward_headers",
    "http_transport",
    "passthrough_path",
]
