"""Stand-in of LMCache's lmcache/v1/storage_backend/connector/base_connector.py @01712fbd
(LMCache/LMCache): the RemoteConnector a plugin connector subclasses, in the generation
before RemoteConnector.__init__(config, metadata).

What a subclass meets: no __init__ of the base's own; class attributes save_chunk_meta (True),
meta_shape / meta_dtype / meta_fmt / full_chunk_size / single_token_size (None);
init_chunk_meta(config, metadata), which changes nothing unless config.extra_config has
save_chunk_meta false (and config.use_layerwise is off), and then sets the full chunk's layout
from metadata.kv_shape = (layers, 2, chunk tokens, kv heads, head size):
meta_shape = (2, layers, tokens, heads * head size); reshape_partial_chunk(obj, bytes_read);
the abstract async exists/get/put/list/close and exists_sync; the optional batched calls, with
batched_contains(keys, stop_after_first_not_exits=True) -> List[bool]."""

import abc
from typing import List

from lmcache.v1.memory_management import MemoryFormat


class RemoteConnector(metaclass=abc.ABCMeta):
    save_chunk_meta = True
    meta_shape = None
    meta_dtype = None
    meta_fmt = None
    full_chunk_size = None
    single_token_size = None

    def init_chunk_meta(self, config, metadata) -> None:
        if (config is None or metadata is None or config.extra_config is None
                or config.extra_config.get("save_chunk_meta", True) or config.use_layerwise):
            return
        layers, two, tokens, heads, head_size = metadata.kv_shape
        self.save_chunk_meta = False
        self.meta_shape = (two, layers, tokens, heads * head_size)
        self.meta_dtype = metadata.kv_dtype
        self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
        self.full_chunk_size = metadata.kv_dtype.itemsize * layers * two * tokens * heads * head_size
        self.single_token_size = self.full_chunk_size // tokens

    def reshape_partial_chunk(self, memory_obj, bytes_read: int):
        if bytes_read % self.single_token_size != 0 or bytes_read > self.full_chunk_size:
            raise ValueError(f"bytes_read: {bytes_read} is illegal")
        if bytes_read == self.full_chunk_size:
            return memory_obj
        shape = list(memory_obj.meta.shape)
        shape[2] = bytes_read // self.single_token_size
        memory_obj.raw_data = memory_obj.raw_data[:bytes_read]
        memory_obj.meta.shape = tuple(shape)
        return memory_obj

    def post_init(self):
        pass

    @abc.abstractmethod
    async def exists(self, key) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    def exists_sync(self, key) -> bool:
        raise NotImplementedError

    @abc.abstractmethod
    async def get(self, key):
        raise NotImplementedError

    @abc.abstractmethod
    async def put(self, key, memory_obj):
        raise NotImplementedError

    @abc.abstractmethod
    async def list(self) -> List[str]:
        raise NotImplementedError

    @abc.abstractmethod
    async def close(self):
        raise NotImplementedError

    def support_ping(self) -> bool:
        return False

    async def ping(self) -> int:
        raise NotImplementedError

    def support_batched_get(self) -> bool:
        return False

    async def batched_get(self, keys):
        raise NotImplementedError

    def support_batched_put(self) -> bool:
        return False

    async def batched_put(self, keys, memory_objs):
        raise NotImplementedError

    def support_batched_async_contains(self) -> bool:
        return False

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        raise NotImplementedError

    def support_batched_get_non_blocking(self) -> bool:
        return False

    async def batched_get_non_blocking(self, lookup_id: str, keys):
        raise NotImplementedError

    def remove_sync(self, key) -> bool:
        raise NotImplementedError

    def batched_contains(self, keys, stop_after_first_not_exits: bool = True) -> List[bool]:
        raise NotImplementedError

    def support_batched_contains(self) -> bool:
        return False
