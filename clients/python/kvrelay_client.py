"""
kvrelay_client — the old single-file client's name, kept for code that imports it.

The client now lives in the ``kvrelay`` package (clients/python/kvrelay, installable with
``pip install ./clients/python``); this module re-exports it unchanged.
"""

from kvrelay.client import (  # noqa: F401
    DEFAULT_ADDR,
    ENV_PREFIXES,
    Client,
    KvCacheStats,
    KvRelayClient,
    RemoteKVConnector,
    from_env,
)

__all__ = ["KvRelayClient", "KvCacheStats", "RemoteKVConnector", "from_env", "Client"]
