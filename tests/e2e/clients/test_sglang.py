"""
kvrelay.sglang.KvrelayHiCacheStorage driven as SGLang HiCache drives a dynamic L3 backend,
against the real server.

The driver follows SGLang (main, 2026):
  - python/sglang/srt/mem_cache/storage/backend_factory.py, _create_dynamic_backend: the
    extra config names backend_name / module_path / class_name; the class is imported and
    constructed as cls(storage_config, kwargs);
  - python/sglang/srt/managers/cache_controller.py, attach_storage_backend: then
    register_mem_pool_host(host_pool); with "interface_v1": 1 the page I/O is
    _page_get_zero_copy / _page_set_zero_copy -> batch_get_v1 / batch_set_v1(keys,
    host_indices) in batches of STORAGE_BATCH_SIZE = 128 pages, host_indices being the pages'
    token indices (page_size per page); the result is indexed per page;
  - python/sglang/srt/mem_cache/hicache_storage.py: HiCacheStorageConfig's fields and
    batch_exists(keys) -> the number of consecutive hits from the first key;
  - python/sglang/srt/mem_cache/memory_pool_host.py, get_page_buffer_meta(indices): one
    (pointer, size) per page buffer — K then V of each page for MHA.
"""

import ctypes
import dataclasses
import importlib
import json
import time
from typing import Optional

from .conftest import KiB, kill_server

from conftest import SLOW  # noqa: E402

STORAGE_BATCH_SIZE = 128


@dataclasses.dataclass
class HiCacheStorageConfig:  # the fields of SGLang's dataclass
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


class HostPool:
    """A page_first MHA host pool over real memory: page p holds K then V, each half bytes."""

    def __init__(self, pages, page_size=64, half=16 * KiB):
        self.page_size = page_size
        self.half = half
        self.pages = pages
        self.buf = (ctypes.c_ubyte * (pages * 2 * half))()
        self.base = ctypes.addressof(self.buf)
        self.layout = "page_first"
        self.calls = 0

    def get_page_buffer_meta(self, indices):
        self.calls += 1
        indices = list(indices)
        assert len(indices) % self.page_size == 0
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            page = indices[i] // self.page_size
            assert indices[i:i + self.page_size] == list(range(indices[i], indices[i] + self.page_size))
            k = self.base + page * 2 * self.half
            ptrs += [k, k + self.half]
            sizes += [self.half, self.half]
        return ptrs, sizes

    def page_bytes(self, page):
        off = page * 2 * self.half
        return bytes(memoryview(self.buf)[off:off + 2 * self.half])

    def fill(self, page, seed):
        import hashlib
        data = hashlib.blake2b(seed.encode(), digest_size=64).digest() * (2 * self.half // 64)
        off = page * 2 * self.half
        memoryview(self.buf).cast("B")[off:off + len(data)] = data

    def indices(self, first_page, count):
        return list(range(first_page * self.page_size, (first_page + count) * self.page_size))


def make_backend(srv, host_pool, **extra):
    extra_config = {"backend_name": "kvrelay", "module_path": "kvrelay.sglang",
                    "class_name": "KvrelayHiCacheStorage", "interface_v1": 1,
                    "url": srv.base_url, "timeout_s": 5.0 * SLOW}
    extra_config.update(extra)
    extra_config = json.loads(json.dumps(extra_config))  # as --hicache-storage-backend-extra-config
    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0,
                               attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                               is_page_first_layout=True, model_name="Qwen/Qwen3-8B",
                               extra_config=extra_config)
    cls = getattr(importlib.import_module(extra_config["module_path"]), extra_config["class_name"])
    backend = cls(cfg, {})
    backend.register_mem_pool_host(host_pool)
    for m in ("get", "set", "exists", "batch_get", "batch_set", "batch_exists", "batch_get_v1",
              "batch_set_v1"):
        assert callable(getattr(backend, m, None)), m
    return backend


def page_get_zero_copy(backend, hashes, host_indices):
    """cache_controller._page_get_zero_copy: the count of leading successes."""
    results = backend.batch_get_v1(hashes, host_indices, None)
    inc = 0
    for i in range(len(hashes)):
        if not results[i]:
            break
        inc += 1
    return inc


def test_sglang_v1_128_pages_round_trip(kvrelay):
    srv = kvrelay("--memory", "256M", "--workers", "2")
    pool = HostPool(pages=2 * STORAGE_BATCH_SIZE + 8)
    backend = make_backend(srv, pool)
    try:
        hashes = [f"{i:064x}" for i in range(STORAGE_BATCH_SIZE)]
        for p in range(STORAGE_BATCH_SIZE):
            pool.fill(p, f"page-{p}")
        res = backend.batch_set_v1(hashes, pool.indices(0, STORAGE_BATCH_SIZE))
        assert res == [True] * STORAGE_BATCH_SIZE, res
        st = srv.stats()
        assert st["unique_blocks"] == STORAGE_BATCH_SIZE and st["resident_bytes"] == STORAGE_BATCH_SIZE * 2 * pool.half

        # the keys carry the model and the TP rank (an MHA page differs across ranks)
        assert srv.request("HEAD", "/kv/" + hashes[0] + "%40Qwen-Qwen3-8B%40tp0of2").status == 200

        # read back into other pages: byte-exact
        first = STORAGE_BATCH_SIZE + 8
        t0 = time.monotonic()
        assert page_get_zero_copy(backend, hashes, pool.indices(first, STORAGE_BATCH_SIZE)) == STORAGE_BATCH_SIZE
        took = time.monotonic() - t0
        for p in range(STORAGE_BATCH_SIZE):
            assert pool.page_bytes(first + p) == pool.page_bytes(p), f"page {p} differs"

        # batch_exists: the consecutive-hit prefix
        missing = [f"{0xdead0000 + i:064x}" for i in range(3)]
        assert backend.batch_exists(hashes) == STORAGE_BATCH_SIZE
        assert backend.batch_exists(hashes[:50] + missing + hashes[50:]) == 50
        assert backend.batch_exists(missing + hashes) == 0
        assert backend.exists(hashes[7]) is True and backend.exists(missing[0]) is False

        # a miss in the middle of a get batch: per-page bools exact, the prefix stops there
        res = backend.batch_get_v1(hashes[:4] + missing[:1] + hashes[4:8], pool.indices(first, 9))
        assert res == [True] * 4 + [False] + [True] * 4, res

        # a second set of the same pages sends nothing (they are known to be there)
        before = srv.stats()
        assert backend.batch_set_v1(hashes[:16], pool.indices(0, 16)) == [True] * 16
        after = srv.stats()
        assert after["dedup_hits"] == before["dedup_hits"] and after["put_new"] == before["put_new"]

        # the copying interface: get/set into a caller's buffer, batch_get/batch_set
        buf = bytearray(2 * pool.half)
        assert backend.get(hashes[3], memoryview(buf)) is not None and bytes(buf) == pool.page_bytes(3)
        assert backend.get(missing[0], bytearray(10)) is None
        assert backend.set("flat-0", b"x" * 1000) is True and backend.get("flat-0") == b"x" * 1000
        assert backend.batch_set(["flat-1", "flat-2"], [b"a" * 10, b"b" * 20]) is True
        got = backend.batch_get(["flat-1", "flat-2", "flat-none"])
        assert got == [b"a" * 10, b"b" * 20, None], got
        print(f"sglang v1 128 pages of {2 * pool.half // KiB} KiB: get {128 * 2 * pool.half / took / 2**20:.0f} MiB/s")
    finally:
        backend.close()
    srv.assert_consistent()


def test_sglang_never_returns_none(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    pool = HostPool(pages=16)
    backend = make_backend(srv, pool, timeout_s=1.0 * SLOW)
    try:
        hashes = [f"{i:064x}" for i in range(8)]
        assert backend.batch_set_v1(hashes, pool.indices(0, 8)) == [True] * 8
        kill_server(srv)
        assert backend.batch_get_v1(hashes, pool.indices(8, 8)) == [False] * 8
        assert backend.batch_set_v1(hashes, pool.indices(0, 8)) == [False] * 8
        assert backend.batch_exists(hashes) == 0
        assert backend.exists(hashes[0]) is False
        assert backend.get(hashes[0]) is None and backend.set("k", b"v") is False
        # a pool answering nonsense (buffers not a multiple of the keys) is a miss, not a raise
        pool.get_page_buffer_meta = lambda idx: ([1, 2, 3], [1, 1, 1])
        assert backend.batch_get_v1(hashes[:2], pool.indices(0, 2)) == [False, False]
        # the stated bound of one call's fan-out, pushed past: refused as misses
        from kvrelay.sglang import MAX_PAGES_PER_CALL
        n = MAX_PAGES_PER_CALL + 1
        assert backend.batch_get_v1(["k"] * n, []) == [False] * n
        assert backend.batch_set_v1(["k"] * n, []) == [False] * n
    finally:
        backend.close()
        backend.close()
