"""
kvrelay.lmcache.KvrelayRemoteConnector driven as LMCache's in-process mode drives a remote
connector plugin, against the real server.

The driver follows LMCache (dev branch, 2026):
  - lmcache/v1/storage_backend/connector/__init__.py, ConnectorManager: for each name in
    config.remote_storage_plugins it reads extra_config["remote_storage_plugin.<name>.module_path"]
    and ".class_name", imports and instantiates the adapter with no arguments, and creates the
    connector of the first adapter whose can_parse(remote_url) is true, passing a
    ConnectorContext (url, loop, local_cpu_backend, config, metadata);
  - lmcache/v1/storage_backend/connector/base_connector.py, RemoteConnector: async
    exists/get/put/list/close, exists_sync, and the optional batched variants;
  - lmcache/v1/memory_management.py: a MemoryObj exposes byte_array, get_shape, get_dtype,
    get_memory_format and ref_count_down; LocalCPUBackend.allocate(shape, dtype, fmt).
"""

import asyncio
import importlib
import types

from conftest import SLOW  # noqa: E402

UINT8 = 6  # LMCache's DTYPE_TO_INT code of torch.uint8 (lmcache/v1/protocol.py)
KV_2LTD = 1  # a MemoryFormat value


class MemoryObj:
    def __init__(self, shape, dtype=UINT8, fmt=KV_2LTD):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.fmt = fmt
        n = 1
        for d in shape:
            n *= d
        self.raw = bytearray(n)
        self.refs = 1

    @property
    def byte_array(self):
        return memoryview(self.raw)

    def get_shape(self):
        return self.shape

    def get_dtype(self):
        return self.dtype

    def get_memory_format(self):
        return self.fmt

    def ref_count_down(self):
        self.refs -= 1


class LocalCPUBackend:
    def __init__(self):
        self.allocated = []

    def allocate(self, shape, dtype, fmt):
        obj = MemoryObj(shape, dtype, fmt)
        self.allocated.append(obj)
        return obj


class Key:
    def __init__(self, i):
        self.i = i

    def to_string(self):
        return f"vllm@meta-llama/Llama-3.1-8B@1@0@{self.i:016x}@bfloat16"


def create_connector(url, loop, backend):
    config = types.SimpleNamespace(
        remote_storage_plugins=["kvrelay"],
        extra_config={"remote_storage_plugin.kvrelay.module_path": "kvrelay.lmcache",
                      "remote_storage_plugin.kvrelay.class_name": "KvrelayConnectorAdapter"})
    adapters = []
    for name in config.remote_storage_plugins:
        mod = importlib.import_module(config.extra_config[f"remote_storage_plugin.{name}.module_path"])
        adapters.append(getattr(mod, config.extra_config[f"remote_storage_plugin.{name}.class_name"])())
    ctx = types.SimpleNamespace(url=url, loop=loop, local_cpu_backend=backend, config=None, metadata=None)
    for a in adapters:
        if a.can_parse(url):
            return a.create_connector(ctx)
    raise ValueError(f"No adapter found for URL: {url}")


def test_lmcache_remote_connector(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "2")
    backend = LocalCPUBackend()

    async def scenario(loop):
        conn = create_connector(f"kvrelay://127.0.0.1:{srv.port}?timeout_s={5 * SLOW}", loop, backend)
        keys = [Key(i) for i in range(6)]
        objs = []
        for i in range(6):
            o = MemoryObj((2, 4, 256, 64 + i))  # distinct sizes
            o.raw[:] = bytes((i * 7 + j) & 0xFF for j in range(256)) * (len(o.raw) // 256)
            objs.append(o)
        for k, o in zip(keys[:4], objs[:4]):
            await conn.put(k, o)
        assert await conn.exists(keys[0]) and not await conn.exists(keys[5])
        assert conn.exists_sync(keys[3]) and not conn.exists_sync(keys[4])
        got = await conn.get(keys[2])
        assert got is not None and got.get_shape() == objs[2].shape and got.raw == objs[2].raw
        assert await conn.get(keys[5]) is None
        # batched variants
        await conn.batched_put(keys[4:5], objs[4:5])
        assert conn.batched_contains(keys) == [True] * 5 + [False]
        assert conn.batched_contains([keys[0], keys[5], keys[1]]) == [True, False, False]
        assert conn.batched_contains([keys[0], keys[5], keys[1]], False) == [True, False, True]
        assert await conn.batched_async_contains("lookup-1", keys) == 5
        assert await conn.batched_async_contains("lookup-2", [keys[5]] + keys) == 0
        objs_back = await conn.batched_get(keys)
        assert [o is not None for o in objs_back] == [True] * 5 + [False]
        assert all(a.raw == b.raw for a, b in zip(objs_back[:5], objs[:5]))
        prefix = await conn.batched_get_non_blocking("lookup-3", [keys[0], keys[1], keys[5], keys[2]])
        assert len(prefix) == 2 and prefix[1].raw == objs[1].raw
        # the object loaded after the miss was released (allocations run in parallel)
        last3 = backend.allocated[-3:]
        assert [o.refs for o in last3 if o.raw == objs[2].raw] == [0], [o.refs for o in last3]
        assert await conn.list() == []
        assert await conn.ping() == 0
        assert conn.remove_sync(keys[0]) is True and conn.remove_sync(keys[0]) is False
        # a value that is not ours (no metadata header) is a miss, not a crash
        assert srv.put(Key(99).to_string(), b"short").status == 201
        assert await conn.get(Key(99)) is None
        await conn.close()
        await conn.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(asyncio.wait_for(scenario(loop), 60 * SLOW))
    finally:
        loop.close()


def test_lmcache_remote_url_parsing():
    from kvrelay.lmcache import parse_kvrelay_url

    assert parse_kvrelay_url("kvrelay://h:1") == {"replication": 1, "url": "http://h:1"}
    assert parse_kvrelay_url("kvrelay://a:1,b:2/?replication=2&token=t") == {
        "replication": 2, "token": "t", "nodes": ["http://a:1", "http://b:2"]}
    assert parse_kvrelay_url("kvrelay://kv.svc:9130?dns=1&tls=1") == {"replication": 1, "dns": "dnss://kv.svc:9130"}
    for bad in ("redis://h:1", "kvrelay://", "kvrelay://?x=1"):
        try:
            parse_kvrelay_url(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} accepted")
