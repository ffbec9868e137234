"""Stand-in of LMCache's lmcache/v1/storage_backend/connector/base_connector.py of the dev
branch, 2026 (read at qiuziyan1998/LMCache @2f0c2f22, a mirror of that branch): the
RemoteConnector a plugin connector subclasses, in the generation with __init__(config,
metadata).

What a subclass meets: __init__(config, metadata) asserts metadata, resolves save_chunk_meta
(config.extra_config["save_chunk_meta"] when given, else True), sets meta_shapes /
meta_dtypes (metadata.get_shapes() / get_dtypes()), meta_fmt (KV_MLA_FMT with MLA, else
KV_2LTD), full_chunk_size_bytes and single_token_size (per token of metadata.chunk_size), sizes
the remote metadata for metadata.get_num_groups() groups (protocol.init_remote_metadata_info)
and sets remote_metadata_bytes; reshape_partial_chunk(obj, bytes_read) refuses 0, a length
not a whole number of tokens, or over a full chunk; the abstract async exists/get/put/list/
close and exists_sync; the optional batched calls, with batched_contains(keys) -> int, the
hits by prefix."""

import abc
from typing import List

from lmcache.v1.memory_management import MemoryFormat, nbytes_of
from lmcache.v1.protocol import get_remote_metadata_bytes, init_remote_metadata_info


class RemoteConnector(metaclass=abc.ABCMeta):
    def __init__(self, config, metadata):
        assert metadata is not None
        extra = config.extra_config
        self.save_chunk_meta = bool(extra["save_chunk_meta"]) if extra and "save_chunk_meta" in extra else True
        self.meta_shapes = metadata.get_shapes()
        self.meta_dtypes = metadata.get_dtypes()
        self.meta_fmt = MemoryFormat.KV_MLA_FMT if metadata.use_mla else MemoryFormat.KV_2LTD
        self.full_chunk_size_bytes = sum(nbytes_of(s, d) for s, d in zip(self.meta_shapes, self.meta_dtypes))
        assert self.full_chunk_size_bytes % metadata.chunk_size == 0
        self.single_token_size = self.full_chunk_size_bytes // metadata.chunk_size
        init_remote_metadata_info(metadata.get_num_groups())
        self.remote_metadata_bytes = get_remote_metadata_bytes()

    def reshape_partial_chunk(self, memory_obj, bytes_read: int):
        if (bytes_read == 0 or bytes_read % self.single_token_size != 0
                or bytes_read > self.full_chunk_size_bytes):
            raise ValueError(f"bytes_read: {bytes_read} is illegal")
        if bytes_read == self.full_chunk_size_bytes:
            return memory_obj
        shape = list(memory_obj.meta.shape)
        shape[2] = bytes_read // self.single_token_size
        memory_obj.raw_data = memory_obj.raw_data[:bytes_read]
        memory_obj.meta.shape = tuple(shape)
        if memory_obj.meta.shapes:
            memory_obj.meta.shapes = [tuple(shape)]
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

    def requires_put_completion(self) -> bool:
        return False

    async def batched_put(self, keys, memory_objs):
        raise NotImplementedError

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        raise NotImplementedError

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys):
        raise NotImplementedError

    def remove_sync(self, key) -> bool:
        raise NotImplementedError

    def batched_contains(self, keys) -> int:
        raise NotImplementedError

    def support_batched_contains(self) -> bool:
        return False
