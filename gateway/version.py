"""The version the gateway reports (`compactgate --version`, `compactgate_build_info`)."""

from __future__ import annotations


def version() -> str:
    """The installed distribution's version; the package's own `__version__` when running from
    a source tree that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("compactgate")
    except PackageNotFoundError:
        import gateway

        return str(getattr(gateway, "__version__", "unknown"))
