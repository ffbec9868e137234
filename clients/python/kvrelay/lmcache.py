"""
kvrelay for LMCache, both modes.

1. Multi-process mode: ``KvrelayL2Adapter``, an L2 store loaded through the ``native_plugin``
   L2 adapter type::

       --l2-adapter '{"type": "native_plugin", "module_path": "kvrelay.lmcache",
                      "class_name": "KvrelayL2Adapter",
                      "adapter_params": {"url": "http://127.0.0.1:9130", "num_workers": 8}}'

   The contract followed (LMCache's GitHub dev branch, 2026 — the files at the commits read:
   ``lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py`` @68c638a6, the factory
   that calls ``connector_cls(**adapter_params)`` and checks the method names;
   ``lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py`` @0b43a455, the bridge
   that calls them; ``csrc/storage_backends/connector_interface.h`` @8a72c30f,
   ``connector_base.h`` @0b8d0c02 and ``connector_pybind_utils.h`` @a4ef094e, the semantics
   of the native clients):

     event_fd() -> int                      one eventfd, readable when completions wait
     submit_batch_get(keys, memoryviews)    -> future id; fills each view with its key's value
     submit_batch_set(keys, memoryviews)    -> future id; stores each view under its key
     submit_batch_exists(keys)              -> future id
     submit_batch_delete(keys)              -> future id
     drain_completions() -> [(future_id, ok, error, per_key_bools_or_None)], clearing the
                            eventfd; called by the bridge's demux thread after poll()
     close()                                idempotent

   Submissions never block on the network: they queue the batch for a pool of worker
   threads (``num_workers``, each keeping its keep-alive connections) and return. A batch is
   cut into at most ``num_workers`` tiles, like the native ``ConnectorBase``. Results:

     get     per key True when its value filled the view; a 404 or a value of another length
             is a per-key False with ok=True (the bridge loads only the True keys); ok=False
             when some key's node could not be reached
     set     per key True on 200/201; ok is all(per key)
     exists  one batch request per node (Client.probe_many); ok=False when unreachable
     delete  per key True when a node deleted it

   A key-count or buffer-list mismatch raises ValueError at submission, as the native
   binding raises; nothing else raises. Bound: at most ``max_pending_keys`` keys in flight;
   a batch past it completes at once with ok=False.

2. In-process mode: ``KvrelayRemoteConnector``, loaded by URL scheme through
   ``remote_storage_plugins`` (LMCache ``lmcache/v1/storage_backend/connector/__init__.py``
   @0109660c, ``ConnectorManager._remote_adapters_plugin_launcher``, which instantiates the
   named ``ConnectorAdapter`` class with no arguments and picks it when
   ``can_parse(remote_url)``; the connector follows ``base_connector.py`` @01712fbd's
   ``RemoteConnector``, the value layout ``lmcache/v1/protocol.py``'s ``RemoteMetadata``).
   Configuration::

       remote_url: "kvrelay://127.0.0.1:9130"          # or kvrelay://h1:9130,h2:9130?replication=2
       remote_serde: "naive"
       remote_storage_plugins: ["kvrelay"]
       extra_config:
         remote_storage_plugin.kvrelay.module_path: kvrelay.lmcache
         remote_storage_plugin.kvrelay.class_name: KvrelayConnectorAdapter

   Each value is stored as LMCache's 28-byte ``RemoteMetadata`` header followed by the
   chunk's bytes (as the fs connector does), so that a get can allocate the right memory
   object before receiving the bytes straight into it.

LMCache is imported only when present; without it these classes are duck-typed (the test
drivers in tests/e2e/clients/ play LMCache's calls).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import os
import struct
import threading
import urllib.parse
from typing import Any, List, Optional, Sequence

from .client import byte_view, writable_view
from .cluster import make_store

log = logging.getLogger("kvrelay.lmcache")

DEFAULT_NUM_WORKERS = 8
DEFAULT_MAX_PENDING_KEYS = 65536


class _Batch:
    __slots__ = ("fid", "op", "keys", "views", "results", "errors", "tiles_left", "lock")

    def __init__(self, fid, op, keys, views, tiles):
        self.fid = fid
        self.op = op
        self.keys = keys
        self.views = views
        self.results = [False] * len(keys)
        self.errors: List[str] = []
        self.tiles_left = tiles
        self.lock = threading.Lock()


def _store_kwargs(params: dict) -> dict:
    """The store's connection arguments out of adapter_params (unknown ones are logged)."""
    url = params.pop("url", None)
    host = params.pop("host", None)
    port = params.pop("port", None)
    if url is None and host is not None:
        url = f"http://{host}:{int(port or 9130)}"
    kw = {"url": url, "nodes": params.pop("nodes", None), "dns": params.pop("dns", None),
          "replication": int(params.pop("replication", 1))}
    for name in ("token", "timeout_s", "max_connections", "tls_verify", "tls_ca"):
        if name in params:
            kw[name] = params.pop(name)
    return kw


class KvrelayL2Adapter:
    """LMCache multi-process L2 store on kvrelay (the native_plugin contract; module docs)."""

    def __init__(self, num_workers: int = DEFAULT_NUM_WORKERS,
                 max_pending_keys: int = DEFAULT_MAX_PENDING_KEYS, key_prefix: str = "",
                 **adapter_params: Any):
        params = dict(adapter_params)
        store_kw = _store_kwargs(params)
        if params:
            log.warning("kvrelay L2 adapter: ignoring unknown adapter_params %s", sorted(params))
        self.num_workers = int(num_workers)
        if self.num_workers < 1:
            raise ValueError("num_workers must be > 0")
        self.max_pending_keys = int(max_pending_keys)
        self.key_prefix = str(key_prefix)
        store_kw.setdefault("max_connections", max(32, 2 * self.num_workers))
        self.store = make_store(**store_kw)
        self._efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._efd_open = True
        self._lock = threading.Lock()
        self._next_fid = 1
        self._completions = collections.deque()
        self._pending_keys = 0
        self._tiles = collections.deque()
        self._tiles_cv = threading.Condition(self._lock)
        self._closed = False
        self._workers = [threading.Thread(target=self._worker, name=f"kvrelay-l2-{i}", daemon=True)
                         for i in range(self.num_workers)]
        for t in self._workers:
            t.start()

    # -- the contract -----------------------------------------------------------------------

    def event_fd(self) -> int:
        return self._efd

    def submit_batch_get(self, keys: Sequence[str], memoryviews: Sequence) -> int:
        return self._submit("get", keys, self._views(keys, memoryviews, writable=True))

    def submit_batch_set(self, keys: Sequence[str], memoryviews: Sequence) -> int:
        return self._submit("set", keys, self._views(keys, memoryviews, writable=False))

    def submit_batch_exists(self, keys: Sequence[str]) -> int:
        return self._submit("exists", keys, None)

    def submit_batch_delete(self, keys: Sequence[str]) -> int:
        return self._submit("delete", keys, None)

    def drain_completions(self):
        out = []
        with self._lock:  # also keeps close() from closing the fd under the read
            if not self._efd_open:
                return []
            # Read the eventfd before popping: a completion queued after the pop has its own
            # write still to come, so no wake-up is lost (a spurious one drains nothing).
            try:
                os.eventfd_read(self._efd)  # one read resets the counter to zero
            except (BlockingIOError, OSError):
                pass
            while self._completions:
                out.append(self._completions.popleft())
        return out

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._tiles_cv.notify_all()
        for t in self._workers:
            t.join(self.store_timeout() * 2 + 5.0)
        try:
            self.store.close()
        except Exception:
            pass
        with self._lock:
            # a worker that outlived the join must never write into a reused fd number
            self._efd_open = False
            self._completions.clear()
            try:
                os.close(self._efd)
            except OSError:
                pass

    # -- submission -------------------------------------------------------------------------

    def store_timeout(self) -> float:
        return float(getattr(self.store, "timeout_s", None) or 2.0)

    @staticmethod
    def _views(keys, memoryviews, writable: bool):
        if len(keys) != len(memoryviews):
            raise ValueError("keys and memviews size mismatch")
        return [writable_view(m) if writable else byte_view(m) for m in memoryviews]

    def _submit(self, op: str, keys: Sequence[str], views) -> int:
        keys = [self.key_prefix + str(k) for k in keys]
        if not keys:
            raise ValueError("keys list is empty")
        with self._lock:
            fid = self._next_fid
            self._next_fid += 1
            if self._closed:
                return fid  # after close() nothing completes: the eventfd is gone
            if self._pending_keys + len(keys) > self.max_pending_keys:
                self._push_locked((fid, False, f"kvrelay: more than {self.max_pending_keys} keys in flight",
                                   [False] * len(keys)))
                return fid
            # exists travels as one batch request per node; the rest is tiled
            tiles = 1 if op == "exists" else min(self.num_workers, len(keys))
            batch = _Batch(fid, op, keys, views, tiles)
            self._pending_keys += len(keys)
            size = (len(keys) + tiles - 1) // tiles
            for t in range(tiles):
                self._tiles.append((batch, t * size, min(len(keys), (t + 1) * size)))
            self._tiles_cv.notify(tiles)
        return fid

    def _push_locked(self, completion) -> None:
        if not self._efd_open:
            return
        self._completions.append(completion)
        try:
            os.eventfd_write(self._efd, 1)
        except OSError:
            pass

    # -- the workers ------------------------------------------------------------------------

    def _worker(self) -> None:
        while True:
            with self._lock:
                while not self._tiles and not self._closed:
                    self._tiles_cv.wait()
                if self._closed and not self._tiles:
                    return
                batch, lo, hi = self._tiles.popleft()
            try:
                if self._closed:
                    batch.errors.append("kvrelay: adapter closed")
                else:
                    getattr(self, "_do_" + batch.op)(batch, lo, hi)
            except Exception as e:  # a bug must still complete the batch
                log.exception("kvrelay L2 %s tile failed", batch.op)
                with batch.lock:
                    batch.errors.append(f"{type(e).__name__}: {e}")
            self._tile_done(batch)

    def _tile_done(self, batch: _Batch) -> None:
        with batch.lock:
            batch.tiles_left -= 1
            last = batch.tiles_left == 0
        if not last:
            return
        if batch.op == "set":
            ok = not batch.errors and all(batch.results)
        else:
            ok = not batch.errors
        err = "" if ok else (batch.errors[0] if batch.errors else "kvrelay: some keys were not stored")
        with self._lock:
            self._pending_keys -= len(batch.keys)
            self._push_locked((batch.fid, ok, err, list(batch.results)))

    def _fail(self, batch: _Batch, i: int, e: BaseException) -> None:
        with batch.lock:
            batch.errors.append(f"{batch.keys[i]}: {type(e).__name__}: {e}")

    def _do_get(self, batch: _Batch, lo: int, hi: int) -> None:
        # The tile's keys in as few POST /batch/get requests as the limits allow, each block
        # received into its buffer; the store falls back to one GET per key where it must.
        many = getattr(self.store, "fetch_many_into", None)
        if many is not None and hi - lo > 1:
            try:
                got = many(batch.keys[lo:hi], [[v] for v in batch.views[lo:hi]])
                batch.results[lo:hi] = [n >= 0 for n in got]
            except Exception as e:
                with batch.lock:
                    batch.errors.append(f"{type(e).__name__}: {e}")
            return
        for i in range(lo, hi):
            if self._closed:
                batch.errors.append("kvrelay: adapter closed")
                return
            try:
                n = self.store.fetch_into(batch.keys[i], [batch.views[i]])
                batch.results[i] = n >= 0
            except Exception as e:
                self._fail(batch, i, e)

    def _do_set(self, batch: _Batch, lo: int, hi: int) -> None:
        for i in range(lo, hi):
            if self._closed:
                batch.errors.append("kvrelay: adapter closed")
                return
            try:
                status = self.store.store(batch.keys[i], [batch.views[i]])
                batch.results[i] = status in (200, 201)
            except Exception as e:
                self._fail(batch, i, e)

    def _do_exists(self, batch: _Batch, lo: int, hi: int) -> None:
        try:
            batch.results[lo:hi] = self.store.probe_many(batch.keys[lo:hi])
        except Exception as e:
            with batch.lock:
                batch.errors.append(f"{type(e).__name__}: {e}")

    def _do_delete(self, batch: _Batch, lo: int, hi: int) -> None:
        for i in range(lo, hi):
            try:
                batch.results[i] = self.store.remove(batch.keys[i]) is not None
            except Exception as e:
                self._fail(batch, i, e)


# ---------------------------------------------------------------------------------------------
# In-process mode: the remote connector and its adapter

try:  # pragma: no cover - LMCache is not installable in this repository's test environment
    from lmcache.v1.storage_backend.connector import ConnectorAdapter as _AdapterBase
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _ConnectorBase
    from lmcache.v1.protocol import RemoteMetadata as _RemoteMetadata
except Exception:  # duck-typed: the same methods, no LMCache base classes
    _AdapterBase = object
    _ConnectorBase = object
    _RemoteMetadata = None

# LMCache's RemoteMetadata layout (lmcache/v1/protocol.py): seven native ints — length,
# memory format, dtype code, shape[0..3]. Used directly when LMCache is absent (the dtype and
# format are then whatever the caller's objects carry as ints).
_META = struct.Struct("iiiiiii")
META_BYTES = _META.size  # 28


def _encode_meta(length: int, shape, dtype, fmt) -> bytes:
    if _RemoteMetadata is not None:  # pragma: no cover
        return _RemoteMetadata(length, shape, dtype, fmt).serialize()
    dims = list(shape) + [0] * (4 - len(shape))
    return _META.pack(length, int(getattr(fmt, "value", fmt)), int(dtype), *dims[:4])


def _decode_meta(buf: bytes):
    """(length, shape, dtype, fmt)."""
    if _RemoteMetadata is not None:  # pragma: no cover
        m = _RemoteMetadata.deserialize(buf)
        return m.length, m.shape, m.dtype, m.fmt
    length, fmt, dtype, s0, s1, s2, s3 = _META.unpack_from(buf)
    return length, (s0, s1, s2, s3), dtype, fmt


def _key_str(key) -> str:
    return key.to_string() if hasattr(key, "to_string") else str(key)


def parse_kvrelay_url(url: str) -> dict:
    """kvrelay://host:port[,host:port...][/][?replication=R&token=T&dns=1&tls=1&timeout_s=S]
    -> make_store() arguments. With dns=1 the single host is a DNS name of the fleet."""
    if not url.startswith("kvrelay://"):
        raise ValueError(f"not a kvrelay:// URL: {url!r}")
    rest = url[len("kvrelay://"):]
    hosts, _, query = rest.partition("?")
    hosts = hosts.rstrip("/")
    q = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
    scheme = "https" if q.get("tls", "0").lower() in ("1", "true", "yes", "on") else "http"
    kw: dict = {"replication": int(q.get("replication", 1))}
    if "token" in q:
        kw["token"] = q["token"]
    if "timeout_s" in q:
        kw["timeout_s"] = float(q["timeout_s"])
    if "max_connections" in q:
        kw["max_connections"] = int(q["max_connections"])
    members = [h for h in hosts.split(",") if h]
    if not members:
        raise ValueError(f"no host in {url!r}")
    if q.get("dns", "0").lower() in ("1", "true", "yes", "on"):
        kw["dns"] = ("dnss://" if scheme == "https" else "dns://") + members[0]
    elif len(members) == 1:
        kw["url"] = f"{scheme}://{members[0]}"
    else:
        kw["nodes"] = [f"{scheme}://{m}" for m in members]
    return kw


class KvrelayRemoteConnector(_ConnectorBase):
    """LMCache RemoteConnector on kvrelay (module docs, mode 2)."""

    def __init__(self, url: str, loop=None, local_cpu_backend=None, config=None, metadata=None,
                 num_workers: int = DEFAULT_NUM_WORKERS):
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.store = make_store(**parse_kvrelay_url(url))
        self._executor = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="kvrelay-lmc")
        self._closed = False
        if hasattr(_ConnectorBase, "init_chunk_meta"):  # pragma: no cover
            self.init_chunk_meta(config, metadata)
        else:
            self.save_chunk_meta = True

    # -- helpers ----------------------------------------------------------------------------

    async def _run(self, fn, *args):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, *args)

    def _contains(self, key) -> bool:
        try:
            return bool(self.store.probe(_key_str(key)))
        except Exception as e:
            log.debug("kvrelay exists %s: %s", key, e)
            return False

    def _get(self, key):
        backend = self.local_cpu_backend
        holder = []

        def reader(conn, length):
            if getattr(self, "save_chunk_meta", True):
                if length < META_BYTES:
                    raise ValueError(f"value of {length} bytes has no metadata header")
                n, shape, dtype, fmt = _decode_meta(conn.read_body(META_BYTES))
                if n != length - META_BYTES:
                    raise ValueError(f"metadata says {n} bytes, the value holds {length - META_BYTES}")
                obj = backend.allocate(shape, dtype, fmt)
            else:  # pragma: no cover - the chunk-meta-less layout of LMCache's config
                n = length
                obj = backend.allocate(self.meta_shape, self.meta_dtype, self.meta_fmt)
            if obj is None:
                raise MemoryError("local_cpu_backend.allocate returned None")
            holder.append(obj)
            view = writable_view(obj.byte_array)
            if view.nbytes < n:
                raise ValueError(f"allocated {view.nbytes} bytes for a {n}-byte chunk")
            conn.read_into([view[:n]])
            if not getattr(self, "save_chunk_meta", True):  # pragma: no cover
                obj = self.reshape_partial_chunk(obj, n)
            return obj

        result = None
        try:
            result = self.store.fetch_with(_key_str(key), reader)
        except Exception as e:
            log.debug("kvrelay get %s: %s", key, e)
        # objects allocated for a transfer that failed (a replica may have served the retry)
        for obj in holder:
            if obj is not result:
                try:
                    obj.ref_count_down()
                except Exception:
                    pass
        return result

    def _put(self, key, memory_obj) -> bool:
        data = byte_view(memory_obj.byte_array)
        parts = [data]
        if getattr(self, "save_chunk_meta", True):
            parts.insert(0, _encode_meta(data.nbytes, memory_obj.get_shape(), memory_obj.get_dtype(),
                                         memory_obj.get_memory_format()))
        try:
            return self.store.store(_key_str(key), parts) in (200, 201)
        except Exception as e:
            log.debug("kvrelay put %s: %s", key, e)
            return False

    def _exists_many(self, keys) -> List[bool]:
        try:
            return self.store.probe_many([_key_str(k) for k in keys])
        except Exception as e:
            log.debug("kvrelay batched exists: %s", e)
            return [False] * len(keys)

    # -- RemoteConnector --------------------------------------------------------------------

    async def exists(self, key) -> bool:
        return await self._run(self._contains, key)

    def exists_sync(self, key) -> bool:
        return self._contains(key)

    async def get(self, key):
        return await self._run(self._get, key)

    async def put(self, key, memory_obj):
        await self._run(self._put, key, memory_obj)

    async def list(self) -> List[str]:
        # kvrelay has no listing route: a store of millions of blocks is not listed.
        return []

    async def close(self):
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        self.store.close()

    def support_ping(self) -> bool:
        return True

    async def ping(self) -> int:
        healthy = await self._run(self.store.healthy)
        return 0 if healthy else 1

    def support_batched_get(self) -> bool:
        return True

    async def batched_get(self, keys) -> List[Optional[Any]]:
        return list(await asyncio.gather(*(self.get(k) for k in keys)))

    def support_batched_put(self) -> bool:
        return True

    async def batched_put(self, keys, memory_objs):
        await asyncio.gather(*(self.put(k, o) for k, o in zip(keys, memory_objs)))

    def support_batched_contains(self) -> bool:
        return True

    def batched_contains(self, keys, stop_after_first_not_exits: bool = True) -> List[bool]:
        res = self._exists_many(list(keys))
        if stop_after_first_not_exits and False in res:
            first = res.index(False)
            res = res[:first] + [False] * (len(res) - first)
        return res

    def support_batched_async_contains(self) -> bool:
        return True

    async def batched_async_contains(self, lookup_id: str, keys, pin: bool = False) -> int:
        res = await self._run(self._exists_many, list(keys))
        return res.index(False) if False in res else len(res)

    def support_batched_get_non_blocking(self) -> bool:
        return True

    async def batched_get_non_blocking(self, lookup_id: str, keys) -> List[Any]:
        """The consecutive hits from the first key (objects after a miss are released)."""
        objs = await self.batched_get(keys)
        out = []
        for obj in objs:
            if obj is None:
                break
            out.append(obj)
        for obj in objs[len(out):]:
            if obj is not None:
                try:
                    obj.ref_count_down()
                except Exception:
                    pass
        return out

    def remove_sync(self, key) -> bool:
        try:
            return self.store.remove(_key_str(key)) is not None
        except Exception:
            return False

    def __repr__(self) -> str:
        return f"<KvrelayRemoteConnector {self.url}>"


class KvrelayConnectorAdapter(_AdapterBase):
    """What ``remote_storage_plugins`` instantiates: claims ``kvrelay://`` URLs."""

    def __init__(self) -> None:
        self.schema = "kvrelay://"

    def can_parse(self, url: str) -> bool:
        return url.startswith(self.schema)

    def create_connector(self, context):
        return KvrelayRemoteConnector(context.url, getattr(context, "loop", None),
                                      getattr(context, "local_cpu_backend", None),
                                      getattr(context, "config", None), getattr(context, "metadata", None))


__all__ = ["KvrelayL2Adapter", "KvrelayRemoteConnector", "KvrelayConnectorAdapter", "parse_kvrelay_url"]
