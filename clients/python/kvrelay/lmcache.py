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
   ``can_parse(remote_url)``, then calls ``create_connector(context)`` with a context carrying
   url, loop, local_cpu_backend, config and metadata). The connector follows
   ``base_connector.py``'s ``RemoteConnector`` and the value layout of ``lmcache/v1/protocol.py``'s
   ``RemoteMetadata`` in both of their generations, detected at import (``INTERFACE``; the
   comment above ``KvrelayRemoteConnector`` says what differs):

     older  base_connector.py @01712fbd, protocol.py @c1a02cc8 (LMCache/LMCache)
     newer  base_connector.py @2f0c2f22 (a mirror of LMCache's dev branch, 2026: the
            qiuziyan1998/LMCache repository), protocol.py as in licheng165/LMCache @d19a2027
            and the dev branch of 2026 (the grouped RemoteMetadata; its shape encoding differs
            between those commits, which is why the installed class writes the header)

   Configuration::

       remote_url: "kvrelay://127.0.0.1:9130"          # or kvrelay://h1:9130,h2:9130?replication=2
       remote_serde: "naive"
       remote_storage_plugins: ["kvrelay"]
       extra_config:
         remote_storage_plugin.kvrelay.module_path: kvrelay.lmcache
         remote_storage_plugin.kvrelay.class_name: KvrelayConnectorAdapter
         save_chunk_meta: true                         # the default; false stores bare chunks

   With ``save_chunk_meta`` on (the default) each value is LMCache's ``RemoteMetadata`` header
   (28 bytes in the older generation, 8 + 20 per KV group in the newer) followed by the
   chunk's bytes, as the fs connector stores them, so that a get can allocate the right memory
   object before receiving the bytes straight into it. With it off the value is the chunk
   alone, allocated by the engine's full-chunk layout and cut down by the base class's
   ``reshape_partial_chunk`` when shorter. ``batched_contains`` returns what the installed base
   class declares: the number of hits from the first key (newer), or a bool per key (older).
   A put never raises into LMCache, which does not wait for puts: a failed one is counted in
   ``put_failures`` and logged (a warning at most every 10 s, with the count).

LMCache is imported only when present; without it these classes are duck-typed (the test
drivers in tests/e2e/clients/ play LMCache's calls).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import inspect
import logging
import os
import struct
import threading
import time
import urllib.parse
from typing import Any, List, Optional, Sequence

from .client import byte_view, model_valid, writable_view
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
    for name in ("token", "model", "timeout_s", "idle_s", "max_connections", "tls_verify", "tls_ca"):
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
#
# LMCache's remote-connector interface exists in two generations; which one is installed is
# told at import from the shape of its classes (feature detection, never a version string):
#
#   older  base_connector.py @01712fbd: RemoteConnector has no __init__ of its own; a connector
#          calls init_chunk_meta(config, metadata), which clears save_chunk_meta when the
#          config's extra_config says so and then sets meta_shape / meta_dtype / meta_fmt;
#          protocol.py's RemoteMetadata(length, shape, dtype, fmt) packs 7 native ints (28
#          bytes); batched_contains(keys, stop_after_first_not_exits=True) -> List[bool].
#   newer  base_connector.py @2f0c2f22 (the dev branch, 2026): RemoteConnector.__init__(config,
#          metadata) resolves save_chunk_meta from extra_config, sets meta_shapes /
#          meta_dtypes / meta_fmt, full_chunk_size_bytes and single_token_size, sizes the
#          protocol for the model's KV groups (protocol.init_remote_metadata_info) and sets
#          remote_metadata_bytes; RemoteMetadata(length, shapes, dtypes, fmt) packs 2 + 5 x
#          groups native ints; MemoryObj has get_shapes() / get_dtypes() and
#          LocalCPUBackend.allocate takes the lists; batched_contains(keys) -> int, the number
#          of hits from the first key (RemoteBackend slices keys[:hit_chunks] with it).
#
# The header bytes are always made and read by the installed RemoteMetadata (its shape
# encoding has changed between dev commits); the connector only knows their size.

try:  # pragma: no cover - the real LMCache is not installable in this repository's tests
    from lmcache.v1.storage_backend.connector import ConnectorAdapter as _AdapterBase
except Exception:
    _AdapterBase = object
try:  # pragma: no cover
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector as _ConnectorBase
except Exception:  # duck-typed: the same methods, no LMCache base class
    _ConnectorBase = object
try:  # pragma: no cover
    from lmcache.v1.protocol import RemoteMetadata as _RemoteMetadata
except Exception:
    _RemoteMetadata = None


def _params(fn) -> List[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []


def _detect_interface() -> dict:
    base = _ConnectorBase if _ConnectorBase is not object else None
    init = getattr(base, "__init__", object.__init__) if base else object.__init__
    base_init = init is not object.__init__ and {"config", "metadata"} <= set(_params(init))
    grouped = False
    if _RemoteMetadata is not None:
        try:
            names = [f.name for f in dataclasses.fields(_RemoteMetadata)]
        except TypeError:
            names = _params(_RemoteMetadata)
        grouped = "shapes" in names
    contains_int = False
    fn = getattr(base, "batched_contains", None) if base else None
    if fn is not None:
        try:
            ann = inspect.signature(fn).return_annotation
        except (TypeError, ValueError):
            ann = None
        contains_int = ann is int or ann == "int"
    return {
        "lmcache": base is not None,
        "base_init": base_init,  # RemoteConnector.__init__(config, metadata)
        "init_chunk_meta": bool(base) and callable(getattr(base, "init_chunk_meta", None)),
        "grouped_metadata": grouped,  # RemoteMetadata(length, shapes, dtypes, fmt)
        "contains_returns_int": contains_int,
    }


INTERFACE = _detect_interface()

# The older RemoteMetadata layout (lmcache/v1/protocol.py @01712fbd): seven native ints —
# length, memory format, dtype code, shape[0..3]. Written directly only when LMCache is absent
# (the dtype and format are then whatever the caller's objects carry as ints).
_META = struct.Struct("iiiiiii")
META_BYTES = _META.size  # 28

# A put that failed is logged at warning level at most this often (with the running count).
_PUT_WARN_INTERVAL_S = 10.0


def _key_str(key) -> str:
    return key.to_string() if hasattr(key, "to_string") else str(key)


def parse_kvrelay_url(url: str) -> dict:
    """kvrelay://host:port[,host:port...][/][?replication=R&token=T&model=M&dns=1&tls=1&timeout_s=S&idle_s=I]
    -> make_store() arguments. With dns=1 the single host is a DNS name of the fleet."""
    if not url.startswith("kvrelay://"):
        raise ValueError(f"not a kvrelay:// URL: {url!r}")
    rest = url[len("kvrelay://"):]
    hosts, _, query = rest.partition("?")
    hosts = hosts.rstrip("/")
    q = {k: v[-1] for k, v in urllib.parse.parse_qs(query).items()}
    scheme = "https" if q.get("tls", "0").lower() in ("1", "true", "yes", "on") else "http"
    kw: dict = {"replication": int(q.get("replication", 1))}
    for name in ("token", "model"):
        if name in q:
            kw[name] = q[name]
    for name in ("timeout_s", "idle_s"):
        if name in q:
            kw[name] = float(q[name])
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
    """LMCache RemoteConnector on kvrelay (module docs, mode 2; both interface generations)."""

    def __init__(self, url: str, loop=None, local_cpu_backend=None, config=None, metadata=None,
                 num_workers: int = DEFAULT_NUM_WORKERS):
        # LMCache's own connectors take the config and metadata from the CPU backend when the
        # context does not carry them.
        if config is None:
            config = getattr(local_cpu_backend, "config", None)
        if metadata is None:
            metadata = getattr(local_cpu_backend, "metadata", None)
        if INTERFACE["base_init"]:
            if config is None or metadata is None:
                raise ValueError("kvrelay: this LMCache's RemoteConnector needs the engine config and "
                                 "metadata, and the connector context carried neither")
            super().__init__(config, metadata)
        elif INTERFACE["init_chunk_meta"]:
            self.init_chunk_meta(config, metadata)
        else:
            self.save_chunk_meta = True  # no LMCache: no layout to allocate by
        self.url = url
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        kw = parse_kvrelay_url(url)
        if "model" not in kw:  # the engine's model: its blocks land in that model's relay pool
            name = getattr(metadata, "model_name", None)
            if isinstance(name, str) and model_valid(name):
                kw["model"] = name
        self.store = make_store(**kw)
        self._executor = concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="kvrelay-lmc")
        self._closed = False
        self._count_lock = threading.Lock()
        self.puts_stored = 0
        self.put_failures = 0  # puts that stored nothing (LMCache does not wait for puts)
        self._last_put_warning = 0.0

    # -- the chunk header -------------------------------------------------------------------

    @property
    def header_bytes(self) -> int:
        if INTERFACE["grouped_metadata"]:
            return int(self.remote_metadata_bytes)
        return META_BYTES

    def _encode_meta(self, memory_obj, nbytes: int) -> bytes:
        fmt = memory_obj.get_memory_format()
        if INTERFACE["grouped_metadata"]:
            return _RemoteMetadata(nbytes, list(memory_obj.get_shapes()), list(memory_obj.get_dtypes()),
                                   fmt).serialize()
        if _RemoteMetadata is not None:
            return _RemoteMetadata(nbytes, memory_obj.get_shape(), memory_obj.get_dtype(), fmt).serialize()
        shape = list(memory_obj.get_shape())
        dims = shape + [0] * (4 - len(shape))
        return _META.pack(nbytes, int(getattr(fmt, "value", fmt)), int(memory_obj.get_dtype()), *dims[:4])

    @staticmethod
    def _decode_meta(buf: bytes):
        """(length, the arguments of local_cpu_backend.allocate)."""
        if INTERFACE["grouped_metadata"]:
            m = _RemoteMetadata.deserialize(buf)
            return m.length, (m.shapes, m.dtypes, m.fmt)
        if _RemoteMetadata is not None:
            m = _RemoteMetadata.deserialize(buf)
            return m.length, (m.shape, m.dtype, m.fmt)
        length, fmt, dtype, s0, s1, s2, s3 = _META.unpack_from(buf)
        return length, ((s0, s1, s2, s3), dtype, fmt)

    def _chunk_layout(self):
        """allocate() arguments of a full chunk, when no header is stored (save_chunk_meta off)."""
        if INTERFACE["grouped_metadata"] or hasattr(self, "meta_shapes"):
            return self.meta_shapes, self.meta_dtypes, self.meta_fmt
        return self.meta_shape, self.meta_dtype, self.meta_fmt

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
        with_meta = bool(getattr(self, "save_chunk_meta", True))

        def reader(conn, length):
            if with_meta:
                hb = self.header_bytes
                if length < hb:
                    raise ValueError(f"value of {length} bytes has no {hb}-byte metadata header")
                n, alloc = self._decode_meta(conn.read_body(hb))
                if n != length - hb:
                    raise ValueError(f"metadata says {n} bytes, the value holds {length - hb}")
            else:  # the value is the chunk alone, full or partial (the last one of a prompt)
                n, alloc = length, self._chunk_layout()
            obj = backend.allocate(*alloc)
            if obj is None:
                raise MemoryError("local_cpu_backend.allocate returned None")
            holder.append(obj)
            view = writable_view(obj.byte_array)
            if view.nbytes < n:
                raise ValueError(f"allocated {view.nbytes} bytes for a {n}-byte chunk")
            conn.read_into([view[:n]])
            if not with_meta:
                obj = self.reshape_partial_chunk(obj, n)  # raises on a length no chunk has
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
        """Stores one chunk; never raises (LMCache does not wait for puts, so an exception would
        vanish with its task): a failure is counted in put_failures and logged."""
        try:
            data = byte_view(memory_obj.byte_array)
            parts = [data]
            if getattr(self, "save_chunk_meta", True):
                parts.insert(0, self._encode_meta(memory_obj, data.nbytes))
            status = self.store.store(_key_str(key), parts)
            if status in (200, 201):
                with self._count_lock:
                    self.puts_stored += 1
                return True
            self._put_failed(key, f"HTTP {status}")
        except Exception as e:
            self._put_failed(key, f"{type(e).__name__}: {e}")
        return False

    def _put_failed(self, key, why: str) -> None:
        now = time.monotonic()
        with self._count_lock:
            self.put_failures += 1
            count = self.put_failures
            loud = count == 1 or now - self._last_put_warning >= _PUT_WARN_INTERVAL_S
            if loud:
                self._last_put_warning = now
        if loud:
            log.warning("kvrelay put %s stored nothing (%s); %d failed puts so far", _key_str(key), why, count)
        else:
            log.debug("kvrelay put %s stored nothing (%s)", _key_str(key), why)

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
        try:
            await self._run(self._put, key, memory_obj)
        except Exception as e:  # the executor is gone (closed): still never raised
            self._put_failed(key, f"{type(e).__name__}: {e}")

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

    def batched_contains(self, keys, stop_after_first_not_exits: bool = True):
        """What the installed RemoteConnector declares: the number of hits from the first key
        where it returns int (newer LMCache), else one bool per key, False from the first miss
        on unless stop_after_first_not_exits is False."""
        res = self._exists_many(list(keys))
        hits = res.index(False) if False in res else len(res)
        if INTERFACE["contains_returns_int"]:
            return hits
        if stop_after_first_not_exits:
            res = res[:hits] + [False] * (len(res) - hits)
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


__all__ = ["KvrelayL2Adapter", "KvrelayRemoteConnector", "KvrelayConnectorAdapter", "parse_kvrelay_url",
           "INTERFACE"]
