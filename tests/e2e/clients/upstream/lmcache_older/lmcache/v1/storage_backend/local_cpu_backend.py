"""Stand-in of LMCache's LocalCPUBackend as the older remote connectors call it:
allocate(shape, dtype, fmt) -> MemoryObj (None when out of memory). Keeps what it allocated."""

from lmcache.v1.memory_management import MemoryObj


class LocalCPUBackend:
    def __init__(self, config=None, metadata=None):
        self.config = config
        self.metadata = metadata
        self.allocated = []

    def allocate(self, shape, dtype, fmt):
        obj = MemoryObj(shape, dtype, fmt)
        self.allocated.append(obj)
        return obj
