"""
kvrelay.lmcache.KvrelayRemoteConnector inside both generations of LMCache's remote-connector
interface (stand-ins in tests/e2e/clients/upstream/, loaded under LMCache's module names before
the adapter is imported, as inside LMCache), against the real server.

The driver plays LMCache's ConnectorManager (lmcache/v1/storage_backend/connector/__init__.py:
the adapter named in extra_config is instantiated with no arguments and create_connector gets
a ConnectorContext of url, loop, local_cpu_backend, config, metadata) and the RemoteBackend
calls: put (never awaited for a result), get, exists, batched_contains, batched_get.
"""

import asyncio
import importlib
import logging
import struct
import types

import pytest

from .conftest import KiB, MiB, kill_server
from .engines import engine

from conftest import SLOW  # noqa: E402

SIZES = [1, 7, 4 * KiB, 64 * KiB + 3, MiB, 4 * MiB]


class Key:
    def __init__(self, i, tag="gen"):
        self.i, self.tag = i, tag

    def to_string(self):
        return f"vllm@meta-llama/Llama-3.1-8B@1@0@{self.i:016x}@{self.tag}"


def fill(obj, seed):
    raw = obj.byte_array
    block = bytes(((seed * 131 + j * 7) & 0xFF) for j in range(251))
    n = raw.nbytes
    raw[:] = (block * (n // 251 + 1))[:n]


def create_connector(imp, url, loop, backend, config, metadata):
    conn_mod = imp("lmcache.v1.storage_backend.connector")
    extra = config.extra_config
    adapter = getattr(importlib.import_module(extra["remote_storage_plugin.kvrelay.module_path"]),
                      extra["remote_storage_plugin.kvrelay.class_name"])()
    assert adapter.can_parse(url)
    return adapter.create_connector(conn_mod.ConnectorContext(url, loop, backend, config, metadata))


def lmcache_config(**extra):
    e = {"remote_storage_plugin.kvrelay.module_path": "kvrelay.lmcache",
         "remote_storage_plugin.kvrelay.class_name": "KvrelayConnectorAdapter"}
    e.update(extra)
    return types.SimpleNamespace(remote_storage_plugins=["kvrelay"], extra_config=e, use_layerwise=False)


def run(coro):
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(asyncio.wait_for(coro(loop), 120 * SLOW))
    finally:
        loop.close()


def newer_metadata(imp, groups=1, tokens=16):
    mm = imp("lmcache.v1.memory_management")
    shapes = [(2, 4, tokens, 32 * (g + 1)) for g in range(groups)]
    return imp("lmcache.v1.metadata").LMCacheMetadata(shapes, [mm.bfloat16] * groups, tokens)


def test_newer_interface_round_trips_1b_to_4mib(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "2")
    with engine("lmcache_newer") as (mod, imp):
        assert mod.INTERFACE["base_init"] and mod.INTERFACE["grouped_metadata"]
        assert mod.INTERFACE["contains_returns_int"]
        mm, proto = imp("lmcache.v1.memory_management"), imp("lmcache.v1.protocol")
        metadata = newer_metadata(imp)
        config = lmcache_config()
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(config, metadata)

        async def scenario(loop):
            conn = create_connector(imp, f"kvrelay://127.0.0.1:{srv.port}?timeout_s={10 * SLOW}", loop,
                                    backend, config, metadata)
            assert conn.save_chunk_meta is True and conn.header_bytes == 8 + 20 == conn.remote_metadata_bytes
            keys = [Key(i, "newer") for i in range(len(SIZES))]
            objs = []
            for i, n in enumerate(SIZES):
                o = mm.MemoryObj([(n, 1, 1, 1)], [mm.uint8], mm.MemoryFormat.KV_2LTD)
                fill(o, i)
                objs.append(o)
            await conn.batched_put(keys[:3], objs[:3])
            for k, o in zip(keys[3:], objs[3:]):
                await conn.put(k, o)
            assert conn.put_failures == 0 and conn.puts_stored == len(SIZES)
            # the stored value: the header the installed RemoteMetadata writes, then the chunk
            for k, o in zip(keys, objs):
                body = srv.get(k.to_string()).body
                hdr = proto.RemoteMetadata(o.get_size(), o.get_shapes(), o.get_dtypes(), o.get_memory_format())
                assert body[:28] == hdr.serialize() and body[28:] == bytes(o.byte_array)
            for k, o in zip(keys, objs):
                assert await conn.exists(k) and conn.exists_sync(k)
                got = await conn.get(k)
                assert got is not None and bytes(got.byte_array) == bytes(o.byte_array), o.get_size()
                assert got.get_shapes() == o.get_shapes() and got.get_dtypes() == [mm.uint8]
            missing = Key(999, "newer")
            assert await conn.get(missing) is None and not await conn.exists(missing)
            # batched_contains: an int, the hits from the first key (RemoteBackend slices with it)
            hits = conn.batched_contains(keys)
            assert isinstance(hits, int) and hits == len(SIZES)
            assert conn.batched_contains(keys[:2] + [missing] + keys[2:]) == 2
            assert conn.batched_contains([missing] + keys) == 0
            assert await conn.batched_async_contains("l1", keys[:3] + [missing]) == 3
            back = await conn.batched_get(keys + [missing])
            assert [b is not None for b in back] == [True] * len(SIZES) + [False]
            await conn.close()

        run(scenario)


def test_newer_interface_two_groups_and_save_chunk_meta_off(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with engine("lmcache_newer") as (mod, imp):
        mm = imp("lmcache.v1.memory_management")
        # two KV groups: the header grows to 8 + 2 * 20 bytes
        md2 = newer_metadata(imp, groups=2)
        cfg = lmcache_config()
        b2 = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg, md2)
        # save_chunk_meta false: bare chunks, allocated by the engine's full-chunk layout
        md1 = newer_metadata(imp, groups=1, tokens=16)
        cfg_off = lmcache_config(save_chunk_meta=False)
        b1 = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg_off, md1)

        async def scenario(loop):
            url = f"kvrelay://127.0.0.1:{srv.port}?timeout_s={10 * SLOW}"
            # the context without config/metadata: taken from the CPU backend, as LMCache's fs
            # connector does
            c2 = create_connector(imp, url, loop, b2, cfg, None)
            assert c2.header_bytes == 48
            o = mm.MemoryObj(md2.get_shapes(), md2.get_dtypes(), mm.MemoryFormat.KV_2LTD)
            fill(o, 5)
            await c2.put(Key(1, "g2"), o)
            assert len(srv.get(Key(1, "g2").to_string()).body) == 48 + o.get_size()
            got = await c2.get(Key(1, "g2"))
            assert got is not None and got.get_shapes() == md2.get_shapes() and bytes(got.byte_array) == bytes(o.byte_array)
            assert c2.batched_contains([Key(1, "g2"), Key(2, "g2")]) == 1
            await c2.close()

            c1 = create_connector(imp, url, loop, b1, cfg_off, md1)
            assert c1.save_chunk_meta is False
            full = mm.MemoryObj(md1.get_shapes(), md1.get_dtypes(), mm.MemoryFormat.KV_2LTD)
            fill(full, 9)
            await c1.put(Key(1, "off"), full)
            assert srv.get(Key(1, "off").to_string()).body == bytes(full.byte_array)  # no header
            got = await c1.get(Key(1, "off"))
            assert got is not None and got.meta.shape == (2, 4, 16, 32) and bytes(got.byte_array) == bytes(full.byte_array)
            # the last chunk of a prompt: 5 of 16 tokens
            tok = c1.single_token_size
            part = mm.MemoryObj([(2, 4, 5, 32)], md1.get_dtypes(), mm.MemoryFormat.KV_2LTD)
            fill(part, 3)
            assert part.get_size() == 5 * tok
            await c1.put(Key(2, "off"), part)
            got = await c1.get(Key(2, "off"))
            assert got is not None and got.meta.shape == (2, 4, 5, 32) and bytes(got.byte_array) == bytes(part.byte_array)
            # a value no chunk can have (not whole tokens): a miss, its memory given back
            assert srv.put(Key(3, "off").to_string(), b"x" * (tok + 1)).status == 201
            before = len(b1.allocated)
            assert await c1.get(Key(3, "off")) is None
            assert [o.refs for o in b1.allocated[before:]] == [0]
            await c1.close()

        run(scenario)


def test_newer_interface_failed_puts_are_counted_never_raised(kvrelay, caplog):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with engine("lmcache_newer") as (mod, imp):
        mm = imp("lmcache.v1.memory_management")
        md = newer_metadata(imp)
        cfg = lmcache_config()
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg, md)

        async def scenario(loop):
            conn = create_connector(imp, f"kvrelay://127.0.0.1:{srv.port}?timeout_s={2 * SLOW}", loop,
                                    backend, cfg, md)
            o = mm.MemoryObj(md.get_shapes(), md.get_dtypes(), mm.MemoryFormat.KV_2LTD)
            await conn.put(Key(1, "fail"), o)
            assert conn.puts_stored == 1
            kill_server(srv)
            with caplog.at_level(logging.WARNING, logger="kvrelay.lmcache"):
                await conn.put(Key(2, "fail"), o)  # fire and forget: must not raise
                await conn.batched_put([Key(3, "fail"), Key(4, "fail")], [o, o])
            assert conn.put_failures == 3 and conn.puts_stored == 1
            assert any("stored nothing" in r.getMessage() for r in caplog.records)
            assert conn.batched_contains([Key(1, "fail")]) == 0  # unreachable: no hits, no raise
            await conn.close()
            await conn.put(Key(5, "fail"), o)  # after close: counted, not raised
            assert conn.put_failures == 4

        run(scenario)


def test_older_interface_unchanged(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "2")
    with engine("lmcache_older") as (mod, imp):
        assert not mod.INTERFACE["base_init"] and mod.INTERFACE["init_chunk_meta"]
        assert not mod.INTERFACE["grouped_metadata"] and not mod.INTERFACE["contains_returns_int"]
        mm, proto = imp("lmcache.v1.memory_management"), imp("lmcache.v1.protocol")
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend()
        meta_old = types.SimpleNamespace(kv_shape=(4, 2, 16, 2, 16), kv_dtype=mm.bfloat16, use_mla=False)

        async def scenario(loop):
            url = f"kvrelay://127.0.0.1:{srv.port}?timeout_s={10 * SLOW}"
            conn = create_connector(imp, url, loop, backend, lmcache_config(), meta_old)
            assert conn.save_chunk_meta is True and conn.header_bytes == 28
            keys = [Key(i, "older") for i in range(len(SIZES))]
            objs = []
            for i, n in enumerate(SIZES):
                o = mm.MemoryObj((n, 1, 1, 1), mm.uint8, mm.MemoryFormat.KV_2LTD)
                fill(o, i)
                objs.append(o)
            await conn.batched_put(keys, objs)
            for k, o in zip(keys, objs):
                body = srv.get(k.to_string()).body
                assert body[:28] == struct.pack("iiiiiii", o.get_size(), 1, 6, o.get_size(), 1, 1, 1)
                assert body[:28] == proto.RemoteMetadata(o.get_size(), o.get_shape(), mm.uint8,
                                                         mm.MemoryFormat.KV_2LTD).serialize()
                got = await conn.get(k)
                assert got is not None and got.get_shape() == o.get_shape() and bytes(got.byte_array) == bytes(o.byte_array)
            missing = Key(999, "older")
            # List[bool], False from the first miss on unless told otherwise: as before
            assert conn.batched_contains(keys) == [True] * len(SIZES)
            assert conn.batched_contains([keys[0], missing, keys[1]]) == [True, False, False]
            assert conn.batched_contains([keys[0], missing, keys[1]], False) == [True, False, True]
            await conn.close()

            # save_chunk_meta false through the older init_chunk_meta: bare chunks
            off = create_connector(imp, url, loop, backend, lmcache_config(save_chunk_meta=False), meta_old)
            assert off.save_chunk_meta is False and off.meta_shape == (2, 4, 16, 32)
            full = mm.MemoryObj((2, 4, 16, 32), mm.bfloat16, mm.MemoryFormat.KV_2LTD)
            fill(full, 4)
            await off.put(Key(1, "older-off"), full)
            assert srv.get(Key(1, "older-off").to_string()).body == bytes(full.byte_array)
            part = mm.MemoryObj((2, 4, 3, 32), mm.bfloat16, mm.MemoryFormat.KV_2LTD)
            fill(part, 6)
            await off.put(Key(2, "older-off"), part)
            got = await off.get(Key(2, "older-off"))
            assert got is not None and got.get_shape() == (2, 4, 3, 32) and bytes(got.byte_array) == bytes(part.byte_array)
            await off.close()

        run(scenario)


@pytest.mark.parametrize("gen", ["lmcache_older", "lmcache_newer"])
def test_connector_is_a_real_subclass(gen):
    """Every abstract method of the installed RemoteConnector is implemented (an ABC refuses to
    instantiate otherwise), and the newer base's __init__ ran (it sized the protocol)."""
    with engine(gen) as (mod, imp):
        base = imp("lmcache.v1.storage_backend.connector.base_connector").RemoteConnector
        assert issubclass(mod.KvrelayRemoteConnector, base)
        assert not getattr(mod.KvrelayRemoteConnector, "__abstractmethods__", None)
