"""
kvrelay — the Python client of kvrelay, the shared KV-cache block store.

    kvrelay.Client                       one node (the reference RemoteKVConnector's API)
    kvrelay.Cluster                      several nodes, rendezvous-hashed (kvrelay.cluster)
    kvrelay.lmcache.KvrelayL2Adapter     LMCache multi-process mode, native_plugin L2 store
    kvrelay.lmcache.KvrelayRemoteConnector / KvrelayConnectorAdapter
                                         LMCache in-process mode, remote_url kvrelay://
    kvrelay.sglang.KvrelayHiCacheStorage SGLang HiCache dynamic L3 backend
    kvrelay.events.Subscriber            the KV event stream (vLLM's ZMQ format): the hashes
                                         each relay pool holds, gaps replayed

Standard library only; the engine modules import their engine lazily and work duck-typed
when it is absent, and kvrelay.events imports pyzmq and msgpack (the `events` extra) at first
use. Configuration: README "Engines: LMCache and SGLang".
"""

from .client import (  # noqa: F401
    DEFAULT_ADDR,
    Client,
    KvCacheStats,
    KvRelayClient,
    RemoteKVConnector,
    from_env,
)
from .cluster import Cluster, make_store  # noqa: F401

__version__ = "0.2.0"

__all__ = ["Client", "Cluster", "KvCacheStats", "KvRelayClient", "RemoteKVConnector", "from_env",
           "make_store", "__version__"]
