"""Stand-in of LMCache's LocalCPUBackend as the newer remote connectors call it (dev branch,
2026): allocate(shapes, dtypes, fmt) -> MemoryObj (None when out of memory); config and metadata
attributes (what the fs connector hands to RemoteConnector.__init__). Keeps what it allocated."""

from lmcache.v1.memory_management import MemoryObj


class LocalCPUBackend:
    def __init__(self, config=None, metadata=None):
        self.config = config
        self.metadata = metadata
        self.allocated = []

    def allocate(self, shapes, dtypes, fmt):
        obj = MemoryObj(shapes, dtypes, fmt)
        self.allocated.append(obj)
        return obj
