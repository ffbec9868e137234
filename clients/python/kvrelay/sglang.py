"""
kvrelay as SGLang HiCache's L3 storage backend, loaded dynamically::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvrelay",
        "module_path": "kvrelay.sglang", "class_name": "KvrelayHiCacheStorage",
        "interface_v1": 1, "url": "http://127.0.0.1:9130"}'

The contract followed (SGLang's GitHub main branch, 2026, at commit 001067ff):
``python/sglang/srt/mem_cache/storage/backend_factory.py`` (``_create_dynamic_backend``
constructs ``cls(storage_config, kwargs)`` and requires a ``HiCacheStorage`` subclass),
``python/sglang/srt/managers/cache_controller.py`` (``attach_storage_backend`` calls ``register_mem_pool_host(host_pool)``; with
``interface_v1`` set it drives ``batch_get_v1`` / ``batch_set_v1`` in batches of up to
``STORAGE_BATCH_SIZE`` = 128 pages, indexing the result list — a ``None`` return kills the
prefetch thread for good), and ``python/sglang/srt/mem_cache/hicache_storage.py`` (the base
class: ``get/set/exists``, ``batch_get/batch_set``, ``batch_exists -> int``, the number of
consecutive hits from the first key).

Zero copy: ``host_pool.get_page_buffer_meta(host_indices)`` gives a pointer and a size per
page buffer (one per page for MLA, K and V for MHA, or more). Each page is one kvrelay value,
the concatenation of its buffers: a set sends them gathered straight from the host pool, a
get receives the body straight into them (``ctypes`` views over the pointers). A page whose
stored length differs is a miss. ``batch_set_v1`` first asks which pages are already stored
(one batch request) and writes only the others.

Keys: SGLang's page hash, suffixed with what makes the page's bytes differ across workers —
the model, and the TP rank unless the model is MLA (rank-replicated), the PP rank with PP,
the attention-CP rank with CP: ``<hash>@<model>@tp<rank>of<size>``.

Options (extra_config or kwargs): url | nodes | dns, replication, token, timeout_s,
max_connections, num_workers (parallel page transfers, default 16), key_prefix.

Every method returns its documented type whatever happens; errors are misses. SGLang is
imported only when present (the base class); without it the class is duck-typed.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import logging
from typing import Any, List, Optional, Sequence

from .client import byte_view, writable_view
from .cluster import make_store

log = logging.getLogger("kvrelay.sglang")

try:  # pragma: no cover - SGLang is not installable in this repository's test environment
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:
    _Base = object

DEFAULT_NUM_WORKERS = 16
MAX_PAGES_PER_CALL = 4096  # a bound on one call's fan-out (SGLang sends at most 128)


@functools.lru_cache(maxsize=256)
def _ubyte_array(n: int):
    # ctypes builds a new type for every (c_ubyte * n) and never frees it: cache per size.
    return ctypes.c_ubyte * n


def pointer_view(ptr: int, size: int) -> memoryview:
    """A writable byte view of size bytes at address ptr (no copy; the caller keeps the
    memory alive — here the host pool owns it for the life of the process)."""
    if size <= 0:
        return memoryview(b"")
    return memoryview(_ubyte_array(int(size)).from_address(int(ptr))).cast("B")


def _tensor_view(obj) -> Optional[memoryview]:
    """A byte view of a torch-like CPU tensor (data_ptr/numel/element_size), else None."""
    if callable(getattr(obj, "data_ptr", None)) and callable(getattr(obj, "numel", None)):
        nbytes = int(obj.numel()) * int(obj.element_size())
        return pointer_view(obj.data_ptr(), nbytes)
    return None


def _target_views(target, sizes=None) -> List[memoryview]:
    if isinstance(target, int):
        return [pointer_view(target, int(sizes))]
    if isinstance(target, (list, tuple)) and target and isinstance(target[0], int):
        return [pointer_view(p, s) for p, s in zip(target, sizes)]
    v = _tensor_view(target)
    return [v] if v is not None else [writable_view(target)]


def _source_views(value, sizes=None) -> List[memoryview]:
    if isinstance(value, int):
        return [pointer_view(value, int(sizes))]
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], int):
        return [pointer_view(p, s) for p, s in zip(value, sizes)]
    v = _tensor_view(value)
    return [v] if v is not None else [byte_view(value)]


class KvrelayHiCacheStorage(_Base):
    """SGLang HiCache storage on kvrelay (module docs)."""

    def __init__(self, storage_config=None, kwargs=None):
        opts = dict(getattr(storage_config, "extra_config", None) or {})
        opts.update(kwargs or {})
        for k in ("backend_name", "module_path", "class_name", "interface_v1"):
            opts.pop(k, None)
        self.num_workers = int(opts.pop("num_workers", DEFAULT_NUM_WORKERS))
        self.key_prefix = str(opts.pop("key_prefix", ""))
        store_kw = {k: opts.pop(k) for k in ("url", "nodes", "dns", "replication", "token", "timeout_s",
                                              "max_connections", "tls_verify", "tls_ca") if k in opts}
        if opts:
            log.warning("kvrelay HiCache: ignoring unknown options %s", sorted(opts))
        store_kw.setdefault("max_connections", max(32, self.num_workers))
        self.store = make_store(**store_kw)
        self.suffix = self._suffix(storage_config)
        self.mem_pool_host = None
        self._pool = concurrent.futures.ThreadPoolExecutor(self.num_workers, thread_name_prefix="kvrelay-hicache")
        self._closed = False

    @staticmethod
    def _suffix(cfg) -> str:
        if cfg is None:
            return ""
        model = (getattr(cfg, "model_name", None) or "").replace("/", "-")
        parts = [model]
        if not getattr(cfg, "is_mla_model", False):
            parts.append(f"tp{getattr(cfg, 'tp_rank', 0)}of{getattr(cfg, 'tp_size', 1)}")
        if getattr(cfg, "pp_size", 1) > 1:
            parts.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
        if getattr(cfg, "attn_cp_size", 1) > 1:
            parts.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
        return "@" + "@".join(parts)

    def key(self, key: str) -> str:
        return f"{self.key_prefix}{key}{self.suffix}"

    def register_mem_pool_host(self, mem_pool_host) -> None:
        if _Base is not object:  # pragma: no cover
            super().register_mem_pool_host(mem_pool_host)
        self.mem_pool_host = mem_pool_host

    # -- zero-copy v1 -----------------------------------------------------------------------

    def _page_views(self, keys: Sequence[str], host_indices) -> List[List[memoryview]]:
        ptrs, sizes = self.mem_pool_host.get_page_buffer_meta(host_indices)
        ptrs, sizes = list(ptrs), list(sizes)
        n = len(keys)
        if ptrs and isinstance(ptrs[0], (list, tuple)):  # already grouped per page
            if len(ptrs) != n:
                raise ValueError(f"{len(ptrs)} page groups for {n} keys")
            return [[pointer_view(p, s) for p, s in zip(pp, ss)] for pp, ss in zip(ptrs, sizes)]
        if n == 0 or len(ptrs) % n or len(ptrs) != len(sizes):
            raise ValueError(f"{len(ptrs)} buffers / {len(sizes)} sizes for {n} keys")
        per = len(ptrs) // n
        return [[pointer_view(ptrs[i * per + j], sizes[i * per + j]) for j in range(per)] for i in range(n)]

    def _get_page(self, key: str, views) -> bool:
        try:
            return self.store.fetch_into(self.key(key), views) >= 0
        except Exception as e:
            log.debug("kvrelay HiCache get %s: %s", key, e)
            return False

    def _set_page(self, key: str, views) -> bool:
        try:
            return self.store.store(self.key(key), views) in (200, 201)
        except Exception as e:
            log.debug("kvrelay HiCache set %s: %s", key, e)
            return False

    def _get_tile(self, keys, views) -> List[bool]:
        try:
            return [n >= 0 for n in self.store.fetch_many_into([self.key(k) for k in keys], views)]
        except Exception as e:
            log.debug("kvrelay HiCache batch get of %d pages: %s", len(keys), e)
            return [False] * len(keys)

    def _get_pages(self, keys, views) -> List[bool]:
        """The pages in POST /batch/get requests (one GET per page where the store must), in
        one tile per worker so that the workers' connections run in parallel."""
        if len(keys) <= self.num_workers or getattr(self.store, "fetch_many_into", None) is None:
            # a page per worker: parallel GETs (a batch of one is a GET)
            return self._parallel(self._get_page, keys, views)
        tiles = min(self.num_workers, len(keys))
        step = (len(keys) + tiles - 1) // tiles
        parts = [(keys[i:i + step], views[i:i + step]) for i in range(0, len(keys), step)]
        out: List[bool] = []
        for r in self._pool.map(lambda kv: self._get_tile(*kv), parts):
            out.extend(r)
        return out

    def _parallel(self, fn, keys, views) -> List[bool]:
        if len(keys) == 1:
            return [fn(keys[0], views[0])]
        return list(self._pool.map(fn, keys, views))

    def batch_get_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        n = len(keys)
        try:
            if n > MAX_PAGES_PER_CALL:
                raise ValueError(f"{n} pages in one call, over {MAX_PAGES_PER_CALL}")
            views = self._page_views(keys, host_indices)
            return self._get_pages(list(keys), views)
        except Exception as e:
            log.warning("kvrelay HiCache batch_get_v1 of %d pages failed: %s", n, e)
            return [False] * n

    def batch_set_v1(self, keys: List[str], host_indices, extra_info=None) -> List[bool]:
        n = len(keys)
        try:
            if n > MAX_PAGES_PER_CALL:
                raise ValueError(f"{n} pages in one call, over {MAX_PAGES_PER_CALL}")
            views = self._page_views(keys, host_indices)
            present = self._exists_list(keys)
            out = list(present)
            todo = [i for i in range(n) if not present[i]]
            if todo:
                done = self._parallel(self._set_page, [keys[i] for i in todo], [views[i] for i in todo])
                for i, ok in zip(todo, done):
                    out[i] = ok
            return out
        except Exception as e:
            log.warning("kvrelay HiCache batch_set_v1 of %d pages failed: %s", n, e)
            return [False] * n

    # -- existence --------------------------------------------------------------------------

    def _exists_list(self, keys: Sequence[str]) -> List[bool]:
        try:
            return list(self.store.probe_many([self.key(k) for k in keys]))
        except Exception as e:
            log.debug("kvrelay HiCache exists: %s", e)
            return [False] * len(keys)

    def exists(self, key: str) -> bool:
        return self._exists_list([key])[0]

    def batch_exists(self, keys: List[str], extra_info=None) -> int:
        try:
            res = self._exists_list(keys)
            return res.index(False) if False in res else len(res)
        except Exception:
            return 0

    # -- the copying interface (SGLang's generic page path) ----------------------------------

    def get(self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None):
        try:
            if target_location is None:
                return self.store.fetch(self.key(key)) if hasattr(self.store, "fetch") else \
                    self.store.get(self.key(key))
            views = _target_views(target_location, target_sizes)
            return target_location if self.store.fetch_into(self.key(key), views) >= 0 else None
        except Exception as e:
            log.debug("kvrelay HiCache get %s: %s", key, e)
            return None

    def batch_get(self, keys: List[str], target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> List[Any]:
        try:
            targets = target_locations if target_locations is not None else [None] * len(keys)
            sizes = target_sizes if target_sizes is not None else [None] * len(keys)
            return list(self._pool.map(self.get, keys, targets, sizes))
        except Exception:
            return [None] * len(keys)

    def set(self, key: str, value: Optional[Any] = None, target_location: Optional[Any] = None,
            target_sizes: Optional[Any] = None) -> bool:
        try:
            src = value if value is not None else target_location
            if src is None:
                return False
            return self.store.store(self.key(key), _source_views(src, target_sizes)) in (200, 201)
        except Exception as e:
            log.debug("kvrelay HiCache set %s: %s", key, e)
            return False

    def batch_set(self, keys: List[str], values: Optional[Any] = None, target_locations: Optional[Any] = None,
                  target_sizes: Optional[Any] = None) -> bool:
        try:
            n = len(keys)
            vals = values if values is not None else [None] * n
            locs = target_locations if target_locations is not None else [None] * n
            sizes = target_sizes if target_sizes is not None else [None] * n
            return all(self._pool.map(self.set, keys, vals, locs, sizes))
        except Exception:
            return False

    def clear(self) -> None:
        # kvrelay is shared by the fleet: one engine does not empty it. Evicted by LRU.
        return None

    def get_stats(self):
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._pool.shutdown(wait=True)
        self.store.close()


__all__ = ["KvrelayHiCacheStorage", "pointer_view"]
