"""
kvrelay as SGLang HiCache's L3 storage backend, loaded dynamically::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvrelay",
        "module_path": "kvrelay.sglang", "class_name": "KvrelayHiCacheStorage",
        "interface_v1": 1, "url": "http://127.0.0.1:9130"}'

The contract followed (SGLang's GitHub main branch, 2026, at commit 001067ff — checked for the
v1 and the v2 calls):
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

The v2 calls (hybrid models — Mamba, SWA — and DSA models, whose pages live in several host
pools), as ``hicache_storage.py`` @001067ff defines them:
``register_mem_host_pool_v2(host_pool, host_pool_name)`` registers each pool by name;
``batch_get_v2(transfers)`` / ``batch_set_v2(transfers)`` take ``PoolTransfer``s (name, keys,
host_indices, hit_policy) and answer ``{pool name: [bool per page]}``, zero-copy through each
pool's ``get_page_buffer_meta`` as v1 is; ``batch_exists_v2(keys, pool_transfers)`` answers a
``PoolTransferResult(kv_hit_pages, extra_pool_hit_pages)``: the KV prefix present from the first
key, cut down by each extra pool's hit policy (``all_pages``: the pool's page for every page of
the prefix; ``trailing_pages``: only for the last ``len(transfer.keys)`` pages), from one batch
existence request. A KV page is stored under the same key by v1 and v2; another pool's page of
hash h is ``h.<pool name>`` (the naming of SGLang's file backend).

Keys: SGLang's page hash, suffixed with what makes the page's bytes differ across workers —
the model, and the TP rank unless the model is MLA (rank-replicated), the PP rank with PP,
the attention-CP rank with CP: ``<hash>@<model>@tp<rank>of<size>``.

Options (extra_config or kwargs): url | nodes | dns, replication, token, model (the relay pool's
model: default the storage config's model_name), timeout_s, idle_s, max_connections,
num_workers (parallel page transfers, default 16), key_prefix.

Every method returns its documented type whatever happens; errors are misses. SGLang is
imported only when present (the base class); without it the class is duck-typed.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import logging
from typing import Any, List, Optional, Sequence

from .client import byte_view, model_valid, writable_view
from .cluster import make_store

log = logging.getLogger("kvrelay.sglang")

try:  # pragma: no cover - SGLang is not installable in this repository's test environment
    from sglang.srt.mem_cache import hicache_storage as _hs
    _Base = _hs.HiCacheStorage
except Exception:
    _hs = None
    _Base = object


@dataclasses.dataclass
class PoolTransferResult:
    """Stand-in of SGLang's PoolTransferResult (hicache_storage.py), used when SGLang is absent
    or predates it: the usable KV prefix and, per pool, the pages found."""

    kv_hit_pages: int
    extra_pool_hit_pages: dict


_PoolTransferResult = getattr(_hs, "PoolTransferResult", None) or PoolTransferResult
# PoolName.KV where SGLang has it: a str enum, equal to (and hashing as) "kv"
KV_POOL = getattr(getattr(_hs, "PoolName", None), "KV", "kv")

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
        store_kw = {k: opts.pop(k) for k in ("url", "nodes", "dns", "replication", "token", "model", "timeout_s",
                                              "idle_s", "max_connections", "tls_verify", "tls_ca") if k in opts}
        if opts:
            log.warning("kvrelay HiCache: ignoring unknown options %s", sorted(opts))
        store_kw.setdefault("max_connections", max(32, self.num_workers))
        name = getattr(storage_config, "model_name", None)
        if "model" not in store_kw and isinstance(name, str) and model_valid(name):
            store_kw["model"] = name  # its blocks land in that model's relay pool
        self.store = make_store(**store_kw)
        self.suffix = self._suffix(storage_config)
        self.mem_pool_host = None
        self.registered_pools = {}  # v2: host pools by pool name
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

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        if _Base is not object and hasattr(_Base, "register_mem_host_pool_v2"):  # pragma: no cover
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
        if not isinstance(getattr(self, "registered_pools", None), dict):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    # -- zero-copy v1 -----------------------------------------------------------------------

    def _page_views(self, keys: Sequence[str], host_indices, host_pool=None) -> List[List[memoryview]]:
        pool = self.mem_pool_host if host_pool is None else host_pool
        ptrs, sizes = pool.get_page_buffer_meta(host_indices)
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
            return self._set_pages(list(keys), self._page_views(keys, host_indices))
        except Exception as e:
            log.warning("kvrelay HiCache batch_set_v1 of %d pages failed: %s", n, e)
            return [False] * n

    def _set_pages(self, keys: List[str], views) -> List[bool]:
        """Writes the pages that are not stored yet (one batch existence request first)."""
        present = self._exists_list(keys)
        out = list(present)
        todo = [i for i in range(len(keys)) if not present[i]]
        if todo:
            done = self._parallel(self._set_page, [keys[i] for i in todo], [views[i] for i in todo])
            for i, ok in zip(todo, done):
                out[i] = ok
        return out

    # -- zero-copy v2 (hybrid and DSA models: several host pools) ------------------------------

    @staticmethod
    def component_key(key: str, pool_name) -> str:
        """A page's key in one pool: the KV pool's page is the v1 page (the same key, so v1 and
        v2 share pages); another pool's is <hash>.<pool name>, as SGLang's file backend names it."""
        name = str(getattr(pool_name, "value", pool_name))
        return key if name == "kv" else f"{key}.{name}"

    def _host_pool(self, name):
        pool = (getattr(self, "registered_pools", None) or {}).get(name)
        if pool is None and str(getattr(name, "value", name)) == "kv":
            pool = self.mem_pool_host
        return pool

    def _transfer_views(self, transfer):
        """(keys, page views) of one PoolTransfer: keys as the engine names the pages, views over
        the host pool's memory (get_page_buffer_meta: no copy)."""
        keys = list(transfer.keys or [])
        pool = self._host_pool(transfer.name)
        if pool is None:
            raise ValueError(f"no host pool registered as {transfer.name!r}")
        idx = transfer.host_indices
        if idx is None:
            raise ValueError(f"no host indices for pool {transfer.name!r}")
        count = int(idx.numel()) if callable(getattr(idx, "numel", None)) else len(idx)
        page_size = int(getattr(pool, "page_size", 1) or 1)
        if count != len(keys) * page_size:
            raise ValueError(f"pool {transfer.name!r}: {count} host indices for {len(keys)} pages of {page_size}")
        if len(keys) > MAX_PAGES_PER_CALL:
            raise ValueError(f"{len(keys)} pages in one call, over {MAX_PAGES_PER_CALL}")
        return keys, self._page_views(keys, idx, pool) if keys else []

    def _batch_io_v2(self, transfers, write: bool) -> dict:
        results = {}
        for transfer in transfers or []:
            n = len(transfer.keys or [])
            try:
                keys, views = self._transfer_views(transfer)
                names = [self.component_key(k, transfer.name) for k in keys]
                if not names:
                    results[transfer.name] = []
                elif write:
                    results[transfer.name] = self._set_pages(names, views)
                else:
                    results[transfer.name] = self._get_pages(names, views)
            except Exception as e:
                log.warning("kvrelay HiCache batch_%s_v2 of %d pages of pool %s failed: %s",
                            "set" if write else "get", n, transfer.name, e)
                results[transfer.name] = [False] * n
        return results

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        """Each PoolTransfer's pages received straight into its host pool: {pool name: [bool per
        page]}."""
        return self._batch_io_v2(transfers, write=False)

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        """Each PoolTransfer's pages sent straight from its host pool (pages already stored are
        not sent again): {pool name: [bool per page]}."""
        return self._batch_io_v2(transfers, write=True)

    def batch_exists_v2(self, keys: List[str], pool_transfers=None, extra_info=None):
        """SGLang's longest-prefix rule across pools, from one batch existence request:
        kv_hit_pages is the KV pages present from the first key, cut down by every extra pool —
        "all_pages": the pool's page must be there for each page of that prefix (DSA indexer);
        "trailing_pages": only the last len(transfer.keys) pages of the prefix need it (Mamba,
        SWA states; the longest prefix whose tail has them). extra_pool_hit_pages holds the
        pages found per pool (KV included), pools with none left out."""
        keys = list(keys)
        transfers = list(pool_transfers or [])
        try:
            names = [self.component_key(k, KV_POOL) for k in keys]
            for t in transfers:
                names += [self.component_key(k, t.name) for k in keys]
            found = self._exists_list(names)
            n = len(keys)
            kv = found[:n]
            kv_pages = kv.index(False) if False in kv else n
            hits = {KV_POOL: kv_pages} if kv_pages else {}
            final = kv_pages
            for j, t in enumerate(transfers):
                if final == 0:
                    break
                have = found[n * (j + 1):n * (j + 2)]
                policy = str(getattr(t.hit_policy, "value", t.hit_policy)) if hasattr(t, "hit_policy") else "all_pages"
                if policy == "trailing_pages":
                    tail = max(1, len(t.keys) if t.keys else 1)
                    boundary = 0
                    for end in range(kv_pages, 0, -1):
                        if all(have[max(0, end - tail):end]):
                            boundary = end
                            break
                else:
                    head = have[:kv_pages]
                    boundary = head.index(False) if False in head else kv_pages
                if boundary:
                    hits[t.name] = boundary
                final = min(final, boundary)
            return _PoolTransferResult(final, hits)
        except Exception as e:
            log.warning("kvrelay HiCache batch_exists_v2 of %d pages failed: %s", len(keys), e)
            return _PoolTransferResult(0, {})

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


__all__ = ["KvrelayHiCacheStorage", "PoolTransferResult", "pointer_view"]
