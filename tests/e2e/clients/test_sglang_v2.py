"""
kvrelay.sglang.KvrelayHiCacheStorage's v2 calls, as SGLang HiCache drives them for hybrid
(Mamba, SWA) and DSA models, inside the stand-in of SGLang's hicache_storage.py @001067ff
(tests/e2e/clients/upstream/sglang/, loaded as sglang.srt.mem_cache.hicache_storage before the
adapter is imported), against the real server.

SGLang's side (hicache_storage.py @001067ff): every host pool is registered with
register_mem_host_pool_v2(host_pool, PoolName); batch_set_v2 / batch_get_v2 take one
PoolTransfer per pool (name, host_indices — page_size indices per page —, keys) and answer
{pool name: [bool per page]}; batch_exists_v2(keys, pool_transfers) answers a
PoolTransferResult whose kv_hit_pages is the usable prefix under each pool's hit policy.
"""

import ctypes
import hashlib
import importlib
import json

from .conftest import KiB, kill_server
from .engines import engine
from .test_sglang import HostPool

from conftest import SLOW  # noqa: E402


class Indices(list):
    """Host indices as SGLang passes them (a tensor: numel(), tolist(), iteration)."""

    def numel(self):
        return len(self)

    def tolist(self):
        return list(self)


class FlatPool:
    """A host pool of `per_page` buffers of the given sizes per page (a DSA indexer pool, a
    Mamba state pool), with get_page_buffer_meta over real memory."""

    def __init__(self, pages, page_size, sizes):
        self.page_size, self.sizes = page_size, list(sizes)
        self.stride = sum(self.sizes)
        self.buf = (ctypes.c_ubyte * (pages * self.stride))()
        self.base = ctypes.addressof(self.buf)
        self.calls = 0

    def get_page_buffer_meta(self, indices):
        self.calls += 1
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            off = self.base + (indices[i] // self.page_size) * self.stride
            for s in self.sizes:
                ptrs.append(off)
                sizes.append(s)
                off += s
        return ptrs, sizes

    def fill(self, page, seed):
        data = hashlib.blake2b(seed.encode(), digest_size=64).digest() * (self.stride // 64 + 1)
        memoryview(self.buf).cast("B")[page * self.stride:(page + 1) * self.stride] = data[:self.stride]

    def page_bytes(self, page):
        return bytes(memoryview(self.buf).cast("B")[page * self.stride:(page + 1) * self.stride])

    def indices(self, first, count):
        return Indices(range(first * self.page_size, (first + count) * self.page_size))


def make_backend(hs, srv, **extra):
    extra_config = {"backend_name": "kvrelay", "module_path": "kvrelay.sglang",
                    "class_name": "KvrelayHiCacheStorage", "interface_v1": 1,
                    "url": srv.base_url, "timeout_s": 5.0 * SLOW}
    extra_config.update(extra)
    extra_config = json.loads(json.dumps(extra_config))
    cfg = hs.HiCacheStorageConfig(tp_rank=1, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                  is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                                  model_name="Qwen/Qwen3-Next-80B-A3B", extra_config=extra_config)
    cls = getattr(importlib.import_module(extra_config["module_path"]), extra_config["class_name"])
    backend = cls(cfg, {})
    assert isinstance(backend, hs.HiCacheStorage)
    # the inherited defaults raise NotImplementedError: each v2 call must be the adapter's own
    for m in ("batch_exists_v2", "batch_get_v2", "batch_set_v2"):
        assert getattr(type(backend), m) is not getattr(hs.HiCacheStorage, m), m
    return backend


def test_sglang_v2_zero_copy_round_trips_and_prefix_counts(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "2")
    with engine("sglang") as (mod, imp):
        hs = imp("sglang.srt.mem_cache.hicache_storage")
        PN, PT, HP = hs.PoolName, hs.PoolTransfer, hs.PoolHitPolicy
        kv = HostPool(pages=32, page_size=64, half=8 * KiB)
        kv.indices = lambda first, count, _f=kv.indices: Indices(_f(first, count))
        idx_pool = FlatPool(pages=32, page_size=64, sizes=[3 * KiB])          # DSA indexer: every page
        mamba = FlatPool(pages=8, page_size=1, sizes=[5000, 1234])             # states: the tail
        backend = make_backend(hs, srv)
        try:
            backend.register_mem_pool_host(kv)
            backend.register_mem_host_pool_v2(kv, PN.KV)
            backend.register_mem_host_pool_v2(idx_pool, PN.INDEXER)
            backend.register_mem_host_pool_v2(mamba, PN.MAMBA)
            keys = [f"{0xabc000 + i:064x}" for i in range(8)]
            for p in range(8):
                kv.fill(p, f"kv{p}")
                idx_pool.fill(p, f"ix{p}")
            mamba.fill(0, "m6")
            mamba.fill(1, "m7")
            calls = (kv.calls, idx_pool.calls, mamba.calls)
            res = backend.batch_set_v2([
                PT(PN.KV, host_indices=kv.indices(0, 8), keys=keys),
                PT(PN.INDEXER, host_indices=idx_pool.indices(0, 8), keys=keys),
                PT(PN.MAMBA, host_indices=mamba.indices(0, 2), keys=keys[6:], hit_policy=HP.TRAILING_PAGES)])
            assert res == {PN.KV: [True] * 8, PN.INDEXER: [True] * 8, PN.MAMBA: [True, True]}, res
            # straight from the pools' memory (get_page_buffer_meta), exact bytes on the server
            assert (kv.calls, idx_pool.calls, mamba.calls) == tuple(c + 1 for c in calls)
            sfx = "@Qwen-Qwen3-Next-80B-A3B@tp1of2"
            assert srv.get(keys[3] + sfx).body == kv.page_bytes(3)
            assert srv.get(keys[3] + ".indexer" + sfx).body == idx_pool.page_bytes(3)
            assert srv.get(keys[7] + ".mamba" + sfx).body == mamba.page_bytes(1)
            # a KV page is the v1 page: v1 reads what v2 wrote
            assert backend.batch_get_v1(keys[:2], kv.indices(20, 2)) == [True, True]
            assert kv.page_bytes(20) == kv.page_bytes(0) and kv.page_bytes(21) == kv.page_bytes(1)

            # read back into other pages of each pool: byte-exact
            res = backend.batch_get_v2([
                PT(PN.KV, host_indices=kv.indices(10, 8), keys=keys),
                PT(PN.INDEXER, host_indices=idx_pool.indices(10, 8), keys=keys),
                PT(PN.MAMBA, host_indices=mamba.indices(4, 2), keys=keys[6:])])
            assert res == {PN.KV: [True] * 8, PN.INDEXER: [True] * 8, PN.MAMBA: [True, True]}, res
            for p in range(8):
                assert kv.page_bytes(10 + p) == kv.page_bytes(p) and idx_pool.page_bytes(10 + p) == idx_pool.page_bytes(p)
            assert mamba.page_bytes(4) == mamba.page_bytes(0) and mamba.page_bytes(5) == mamba.page_bytes(1)

            # prefix counts under the hit policies
            ix = PT(PN.INDEXER, keys=keys)
            tail = PT(PN.MAMBA, keys=keys[-1:], hit_policy=HP.TRAILING_PAGES)
            r = backend.batch_exists_v2(keys, [ix, tail])
            assert isinstance(r, hs.PoolTransferResult)
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (8, {PN.KV: 8, PN.INDEXER: 8, PN.MAMBA: 8})
            assert backend.batch_exists_v2(keys).kv_hit_pages == 8
            assert srv.delete(keys[5] + ".indexer" + sfx).status == 200
            r = backend.batch_exists_v2(keys, [ix, tail])
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (5, {PN.KV: 8, PN.INDEXER: 5, PN.MAMBA: 8})
            # one KV page more, without its state: the trailing state decides (the prefix ends at 8)
            kv.fill(8, "kv8")
            assert backend.batch_set_v1([f"{0xabc008:064x}"], kv.indices(8, 1)) == [True]
            keys9 = keys + [f"{0xabc008:064x}"]
            r = backend.batch_exists_v2(keys9, [PT(PN.MAMBA, keys=keys9[-1:], hit_policy=HP.TRAILING_PAGES)])
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (8, {PN.KV: 9, PN.MAMBA: 8})
            # a KV miss at page 3: no state inside the prefix, nothing usable
            gap = keys[:3] + ["f" * 64] + keys[4:]
            r = backend.batch_exists_v2(gap, [tail])
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {PN.KV: 3})
            r = backend.batch_exists_v2(["e" * 64] + keys, [ix])
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {})

            # per-page bools exact under a miss; a pool's bad transfer fails that pool only
            res = backend.batch_get_v2([
                PT(PN.KV, host_indices=kv.indices(10, 3), keys=[keys[0], "f" * 64, keys[2]]),
                PT(PN.INDEXER, host_indices=idx_pool.indices(10, 1), keys=keys[:2]),   # 1 page of indices for 2
                PT(PN.SWA, host_indices=Indices(range(64)), keys=keys[:1])])           # never registered
            assert res == {PN.KV: [True, False, True], PN.INDEXER: [False, False], PN.SWA: [False]}, res
        finally:
            backend.close()
    srv.assert_consistent()


def test_sglang_v2_dead_server_answers_misses(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with engine("sglang") as (mod, imp):
        hs = imp("sglang.srt.mem_cache.hicache_storage")
        kv = HostPool(pages=4, page_size=16, half=KiB)
        backend = make_backend(hs, srv, timeout_s=1.0 * SLOW)
        try:
            backend.register_mem_host_pool_v2(kv, hs.PoolName.KV)
            keys = ["a" * 64, "b" * 64]
            t = hs.PoolTransfer(hs.PoolName.KV, host_indices=Indices(kv.indices(0, 2)), keys=keys)
            assert backend.batch_set_v2([t]) == {hs.PoolName.KV: [True, True]}
            kill_server(srv)
            assert backend.batch_get_v2([t]) == {hs.PoolName.KV: [False, False]}
            assert backend.batch_set_v2([t]) == {hs.PoolName.KV: [False, False]}
            r = backend.batch_exists_v2(keys)
            assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {})
        finally:
            backend.close()
