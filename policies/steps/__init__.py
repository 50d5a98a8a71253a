"""One module per step type; `policies/registry.py` lists them."""
