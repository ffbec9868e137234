"""
The kvrelay package under --tenants (docs/tenancy.md): each adapter passes the token it is given,
so what it writes lands in that token's namespace, and an adapter given another namespace's
token reads none of it (a miss, never an error).

One server with two namespaces, team-a (TOK_A) and team-b (TOK_B), and an admin token. For
each adapter, driven as its engine drives it (the drivers and stand-ins of the adapter tests
next to this file): blocks written with A's token through the adapter are read back over plain
HTTP with A's token and are 404 with B's (and with the admin's, whose data namespace is
`default`); the same adapter configured with B's token misses every one of them, and what it
writes itself is B's alone.

  plain client          kvrelay.Client(token=...), and KVRELAY_TOKEN without token=
  LMCache L2            KvrelayL2Adapter(adapter_params={"token": ...})   (test_lmcache_l2.py)
  LMCache remote        kvrelay://...?token=... in both interface generations
                        (test_lmcache_generations.py)
  SGLang HiCache        extra_config {"token": ...}: v1 (test_sglang.py) and v2 pools
                        (test_sglang_v2.py)
"""

import types
import urllib.parse

import pytest

from .conftest import KiB, pattern
from .engines import engine
from .test_lmcache_generations import Key, create_connector, fill, lmcache_config, newer_metadata, run
from .test_lmcache_l2 import NativePluginDriver, lmcache_key
from .test_lmcache_l2 import config as l2_config
from .test_sglang import HostPool
from .test_sglang import make_backend as make_sglang_v1
from .test_sglang_v2 import FlatPool, Indices
from .test_sglang_v2 import make_backend as make_sglang_v2

from conftest import SLOW, kv_path, module_server  # noqa: E402  (tests/e2e/conftest.py)

TOK_A, TOK_B, TOK_ADMIN = "tok-a-6d0f21", "tok-b-93ce4a", "tok-admin-17b5e8"
TOK_A64 = "tok+a/64="  # a second token of team-a, with the characters of base64
OTHER = {TOK_A: TOK_B, TOK_B: TOK_A}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = tmp_path_factory.mktemp("tenant-tokens-file") / "tenants"
    path.write_text(f"team-a {TOK_A}\nteam-a {TOK_A64}\nteam-b {TOK_B}\n")
    s = module_server(tmp_path_factory, "tenant-tokens",
                      args=("--memory", "128M", "--workers", "2", "--tenants", str(path),
                            "--admin-token", TOK_ADMIN))
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _no_token_from_env(monkeypatch):
    """An adapter that dropped its token must not be rescued by a token in the environment."""
    for prefix in ("KVRELAY_", "EPISTEMIC_GRAPH_KVCACHE_"):
        monkeypatch.delenv(prefix + "TOKEN", raising=False)


def assert_owned_by(srv, keys, owner, bodies=None):
    """Every key reads back over HTTP with the owner's token (the exact bytes when given), and
    is 404 for the other namespace and for the admin (whose data namespace is `default`)."""
    for i, k in enumerate(keys):
        r = srv.get(k, token=owner)
        assert r.status == 200, (k, r)
        if bodies is not None:
            assert r.body == bodies[i], k
        assert srv.get(k, token=OTHER[owner]).status == 404, k
        assert srv.request("HEAD", kv_path(k), token=OTHER[owner]).status == 404, k
        assert srv.get(k, token=TOK_ADMIN).status == 404, k


def test_plain_client_token_and_env(srv, monkeypatch):
    from kvrelay import Client

    keys = [f"tenant-tokens/plain/{i}" for i in range(4)]
    vals = [bytes(pattern(4 * KiB + i, k)) for i, k in enumerate(keys)]
    a = Client(url=srv.base_url, token=TOK_A, timeout_s=5.0 * SLOW)
    b = Client(url=srv.base_url, token=TOK_B, timeout_s=5.0 * SLOW)
    try:
        assert all(a.put(k, v) for k, v in zip(keys, vals))
        assert_owned_by(srv, keys, TOK_A, vals)
        assert [a.get(k) for k in keys] == vals and a.exists_many(keys) == [True] * 4
        # B: misses on every surface, not errors
        assert [b.get(k) for k in keys] == [None] * 4
        assert b.exists_many(keys) == [False] * 4 and not b.exists(keys[0]) and not b.contains(keys[0])
        assert b.get_many_into(keys[:2], [bytearray(len(v)) for v in vals[:2]]) == [False, False]
        assert b.errors == 0
        # what B writes under the same key is B's own block
        mine = b"b" * 1000
        assert b.put(keys[0], mine)
        assert srv.get(keys[0], token=TOK_B).body == mine and a.get(keys[0]) == vals[0]
        # without token=, KVRELAY_TOKEN
        monkeypatch.setenv("KVRELAY_TOKEN", TOK_A)
        e = Client(url=srv.base_url, timeout_s=5.0 * SLOW)
        try:
            assert e.token == TOK_A and e.get(keys[1]) == vals[1]
        finally:
            e.close()
        # and with no token at all, a tenants server stores nothing (the token is what counts)
        monkeypatch.delenv("KVRELAY_TOKEN")
        n = Client(url=srv.base_url, timeout_s=5.0 * SLOW)
        try:
            assert not n.put("tenant-tokens/plain/none", b"x") and n.get(keys[1]) is None
        finally:
            n.close()
    finally:
        a.close()
        b.close()


def test_lmcache_l2_adapter_params_token(srv):
    keys = [lmcache_key(i, salt="tenant-tokens") for i in range(4)]
    src = [bytes(pattern(8 * KiB, f"l2-{i}")) for i in range(4)]
    a = NativePluginDriver(l2_config(srv, token=TOK_A, num_workers=2))
    b = NativePluginDriver(l2_config(srv, token=TOK_B, num_workers=2))
    try:
        ok, err, bools = a.run("set", keys, [memoryview(s) for s in src])
        assert ok and bools == [True] * 4, (ok, err, bools)
        assert_owned_by(srv, keys, TOK_A, src)
        dst = [bytearray(8 * KiB) for _ in keys]
        ok, err, bools = a.run("get", keys, [memoryview(d) for d in dst])
        assert ok and bools == [True] * 4 and [bytes(d) for d in dst] == src, (ok, err, bools)
        # B: every key a miss, the batch itself fine
        ok, err, bools = b.run("exists", keys)
        assert ok and bools == [False] * 4, (ok, err, bools)
        dst = [bytearray(8 * KiB) for _ in keys]
        ok, err, bools = b.run("get", keys, [memoryview(d) for d in dst])
        assert ok and bools == [False] * 4 and dst == [bytearray(8 * KiB)] * 4, (ok, err, bools)
        mine = [bytes(pattern(8 * KiB, "l2-b"))]
        bkey = [lmcache_key(100, salt="tenant-tokens")]
        ok, err, bools = b.run("set", bkey, [memoryview(mine[0])])
        assert ok and bools == [True], (ok, err, bools)
        assert_owned_by(srv, bkey, TOK_B, mine)
    finally:
        a.close()
        b.close()


def _url(srv, token):
    return f"kvrelay://127.0.0.1:{srv.port}?token={token}&timeout_s={10 * SLOW}"


def test_lmcache_remote_newer_url_token(srv):
    with engine("lmcache_newer") as (mod, imp):
        mm = imp("lmcache.v1.memory_management")
        md = newer_metadata(imp)
        cfg = lmcache_config()
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg, md)

        async def scenario(loop):
            ca = create_connector(imp, _url(srv, TOK_A), loop, backend, cfg, md)
            cb = create_connector(imp, _url(srv, TOK_B), loop, backend, cfg, md)
            keys = [Key(i, "tenant-newer") for i in range(3)]
            objs = []
            for i in range(3):
                o = mm.MemoryObj(md.get_shapes(), md.get_dtypes(), mm.MemoryFormat.KV_2LTD)
                fill(o, i)
                objs.append(o)
            await ca.batched_put(keys[:2], objs[:2])
            await ca.put(keys[2], objs[2])
            assert ca.put_failures == 0 and ca.puts_stored == 3
            assert_owned_by(srv, [k.to_string() for k in keys], TOK_A)
            got = await ca.get(keys[1])
            assert got is not None and bytes(got.byte_array) == bytes(objs[1].byte_array)
            assert ca.batched_contains(keys) == 3
            # B: misses, not errors
            assert await cb.get(keys[0]) is None and not await cb.exists(keys[0])
            assert not cb.exists_sync(keys[1]) and cb.batched_contains(keys) == 0
            assert await cb.batched_async_contains("tenant-b", keys) == 0
            assert await cb.batched_get(keys) == [None] * 3
            # a token is a query value: percent-encoded it arrives whole; a bare "+" is a space
            c64 = create_connector(imp, _url(srv, urllib.parse.quote(TOK_A64, safe="")), loop, backend, cfg, md)
            got = await c64.get(keys[0])
            assert got is not None and bytes(got.byte_array) == bytes(objs[0].byte_array)
            await c64.close()
            bare = create_connector(imp, _url(srv, TOK_A64), loop, backend, cfg, md)
            assert await bare.get(keys[0]) is None
            await bare.close()
            await cb.put(Key(9, "tenant-newer-b"), objs[0])
            assert cb.put_failures == 0 and cb.puts_stored == 1
            assert_owned_by(srv, [Key(9, "tenant-newer-b").to_string()], TOK_B)
            await ca.close()
            await cb.close()

        run(scenario)


def test_lmcache_remote_older_url_token(srv):
    with engine("lmcache_older") as (mod, imp):
        mm = imp("lmcache.v1.memory_management")
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend()
        meta_old = types.SimpleNamespace(kv_shape=(4, 2, 16, 2, 16), kv_dtype=mm.bfloat16, use_mla=False)

        async def scenario(loop):
            ca = create_connector(imp, _url(srv, TOK_A), loop, backend, lmcache_config(), meta_old)
            cb = create_connector(imp, _url(srv, TOK_B), loop, backend, lmcache_config(), meta_old)
            keys = [Key(i, "tenant-older") for i in range(3)]
            objs = []
            for i in range(3):
                o = mm.MemoryObj((4 * KiB + i, 1, 1, 1), mm.uint8, mm.MemoryFormat.KV_2LTD)
                fill(o, 10 + i)
                objs.append(o)
            await ca.batched_put(keys, objs)
            assert_owned_by(srv, [k.to_string() for k in keys], TOK_A)
            got = await ca.get(keys[2])
            assert got is not None and bytes(got.byte_array) == bytes(objs[2].byte_array)
            assert ca.batched_contains(keys) == [True] * 3
            # B: misses, not errors
            assert await cb.get(keys[0]) is None and not await cb.exists(keys[0])
            assert cb.batched_contains(keys, False) == [False] * 3
            await cb.put(Key(9, "tenant-older-b"), objs[0])
            assert_owned_by(srv, [Key(9, "tenant-older-b").to_string()], TOK_B)
            await ca.close()
            await cb.close()

        run(scenario)


def test_sglang_v1_extra_config_token(srv):
    sfx = "@Qwen-Qwen3-8B@tp0of2"  # test_sglang.make_backend's model and TP rank
    pool = HostPool(pages=12, page_size=16, half=2 * KiB)
    a = make_sglang_v1(srv, pool, token=TOK_A)
    b = make_sglang_v1(srv, pool, token=TOK_B)
    try:
        hashes = [f"{0x7e4a47000 + i:064x}" for i in range(4)]
        for p in range(4):
            pool.fill(p, f"tenant-page-{p}")
        assert a.batch_set_v1(hashes, pool.indices(0, 4)) == [True] * 4
        assert_owned_by(srv, [h + sfx for h in hashes], TOK_A, [pool.page_bytes(p) for p in range(4)])
        assert a.batch_get_v1(hashes, pool.indices(4, 4)) == [True] * 4
        assert [pool.page_bytes(4 + p) for p in range(4)] == [pool.page_bytes(p) for p in range(4)]
        assert a.batch_exists(hashes) == 4
        # B: misses, and the pages it would have loaded into are left as they were
        before = [pool.page_bytes(8 + p) for p in range(4)]
        assert b.batch_get_v1(hashes, pool.indices(8, 4)) == [False] * 4
        assert [pool.page_bytes(8 + p) for p in range(4)] == before
        assert b.batch_exists(hashes) == 0 and b.exists(hashes[0]) is False and b.get(hashes[0]) is None
        assert b.set("tenant-flat-b", b"y" * 300) is True
        assert_owned_by(srv, ["tenant-flat-b" + sfx], TOK_B, [b"y" * 300])
    finally:
        a.close()
        b.close()


def test_sglang_v2_extra_config_token(srv):
    sfx = "@Qwen-Qwen3-Next-80B-A3B@tp1of2"  # test_sglang_v2.make_backend's model and TP rank
    with engine("sglang") as (mod, imp):
        hs = imp("sglang.srt.mem_cache.hicache_storage")
        PN, PT = hs.PoolName, hs.PoolTransfer
        kv = HostPool(pages=8, page_size=16, half=KiB)
        ix = FlatPool(pages=8, page_size=16, sizes=[700])
        a = make_sglang_v2(hs, srv, token=TOK_A)
        b = make_sglang_v2(hs, srv, token=TOK_B)
        try:
            for be in (a, b):
                be.register_mem_host_pool_v2(kv, PN.KV)
                be.register_mem_host_pool_v2(ix, PN.INDEXER)
            keys = [f"{0x7e4a48000 + i:064x}" for i in range(3)]
            for p in range(3):
                kv.fill(p, f"tenant-kv{p}")
                ix.fill(p, f"tenant-ix{p}")

            def transfers(first):
                return [PT(PN.KV, host_indices=Indices(kv.indices(first, 3)), keys=keys),
                        PT(PN.INDEXER, host_indices=ix.indices(first, 3), keys=keys)]

            assert a.batch_set_v2(transfers(0)) == {PN.KV: [True] * 3, PN.INDEXER: [True] * 3}
            assert_owned_by(srv, [k + sfx for k in keys], TOK_A, [kv.page_bytes(p) for p in range(3)])
            assert_owned_by(srv, [k + ".indexer" + sfx for k in keys], TOK_A, [ix.page_bytes(p) for p in range(3)])
            assert a.batch_get_v2(transfers(4)) == {PN.KV: [True] * 3, PN.INDEXER: [True] * 3}
            assert kv.page_bytes(5) == kv.page_bytes(1) and ix.page_bytes(6) == ix.page_bytes(2)
            assert a.batch_exists_v2(keys, [PT(PN.INDEXER, keys=keys)]).kv_hit_pages == 3
            # B: misses, not errors
            assert b.batch_get_v2(transfers(4)) == {PN.KV: [False] * 3, PN.INDEXER: [False] * 3}
            r = b.batch_exists_v2(keys, [PT(PN.INDEXER, keys=keys)])
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {}), r
        finally:
            a.close()
            b.close()
