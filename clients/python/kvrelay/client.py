"""
kvrelay.Client — one kvrelay node over HTTP/1.1 keep-alive, behaving like the reference
``RemoteKVConnector`` (docs: README "Using it"):

    get(key) -> bytes | None                 GET /kv/<key>; 404 and every failure -> None
    get_into(key, buffer) -> int | None      GET straight into a writable buffer; the number
                                             of bytes, or None (miss, error, other length).
                                             Only what arrives with the response head (at
                                             most 8 KiB) is copied; the rest is received in
                                             place (recv_into, MSG_WAITALL)
    put(key, value) -> bool                  PUT from any bytes-like (a memoryview is sent
                                             as it is, never copied); True on 200 / 201
    contains(key) -> bool                    HEAD
    exists(key) -> bool                      GET /kv/<key>/exists, reads "exists"
    exists_many(keys) -> list[bool]          many existence checks in one request (POST /batch/exists)
    get_many_into(keys, buffers) -> list[bool]
                                             many GETs in one request (POST /batch/get), each
                                             block received straight into its buffer; a miss
                                             or a block of another length is False for its key
    delete(key) -> int | None                DELETE: references left, or None
    stats() -> KvCacheStats | None           GET /kv/stats

Connections are kept alive in a pool and checked before each reuse: one the server closed
(--idle-timeout, a restart, room made at --max-connections) is dropped, never handed out, and a
request whose connection closed before any byte of the answer is sent again on a new one.

Nothing raises on the inference path: every transport or protocol error degrades to a miss
(None / False) and is counted in ``errors``. The ``fetch_into`` / ``store`` / ``probe_many`` /
``remove`` methods are the raising layer under them, for the engine adapters and the
cluster router, which must tell a miss from a dead node.

Configuration comes from arguments or the environment (KVRELAY_* first, then the reference
driver's EPISTEMIC_GRAPH_KVCACHE_* names):

    KVRELAY_URL              http://host:port or https://host:port
    KVRELAY_ADDR             host:port, a bare port, or 1/true/yes/on (127.0.0.1:9130)
    KVRELAY_TOKEN            bearer token
    KVRELAY_MODEL            the model a PUT names (X-KV-Model): the server's relay pool for
                             it; unset: the namespace's model= or the server's --model
    KVRELAY_TIMEOUT_S        per socket operation, default 2.0
    KVRELAY_MAX_CONNECTIONS  pool size, default 32
    KVRELAY_IDLE_S           a pooled connection idle longer is not reused, default 30
                             (keep it below the server's --idle-timeout, 60 s by default)
    KVRELAY_TLS_VERIFY       0/false/no/off disables certificate verification (https)
    KVRELAY_TLS_CA           CA bundle for https
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
import ssl
import struct
import threading
import time
import urllib.parse
from typing import List, Optional, Sequence

from ._http import Connection, ProtocolError

log = logging.getLogger("kvrelay")

DEFAULT_ADDR = "127.0.0.1:9130"
ENV_PREFIXES = ("KVRELAY_", "EPISTEMIC_GRAPH_KVCACHE_")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

# The server's batch limits (POST /batch/exists): longer key lists travel in several requests.
BATCH_MAX_KEYS = 4096
BATCH_MAX_BODY = 1 << 20
# A body that does not fit the caller's buffer is read and dropped up to this size (the
# connection stays usable); a longer one closes the connection instead.
_DISCARD_LIMIT = 64 * 1024

# POST /batch/get (docs/http-contract.md, "Batches"): keys per request, and the found bytes per
# response this client asks for at most (the server's bound is its --max-block-size, 256 MiB
# by default; a smaller one answers 413 and the keys are fetched one by one instead).
BATCH_GET_MAX_KEYS = 128
BATCH_GET_MAX_BYTES = 256 << 20
_BATCH_MAGIC = b"KVRB"
_BATCH_REC = struct.Struct("<B7xQ")  # status (1 found), length
# Bytes of a block that does not fit its key's buffer are received here and dropped.
_SCRATCH = 1 << 20

MISS = -1  # fetch_into: 404
WRONG_LENGTH = -2  # fetch_into: the value exists with another length


@dataclasses.dataclass
class KvCacheStats:
    unique_blocks: int = 0
    total_refs: int = 0
    resident_bytes: int = 0
    logical_bytes: int = 0
    dedup_savings_bytes: int = 0
    dedup_hits: int = 0
    get_hits: int = 0
    get_misses: int = 0
    extra: dict = dataclasses.field(default_factory=dict)  # kvrelay's additive fields

    @classmethod
    def from_json(cls, obj: dict) -> "KvCacheStats":
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: int(obj.get(k, 0)) for k in names}
        return cls(**known, extra={k: v for k, v in obj.items() if k not in names})


def env_value(name: str, environ=None) -> Optional[str]:
    environ = os.environ if environ is None else environ
    for prefix in ENV_PREFIXES:
        v = environ.get(prefix + name)
        if v is not None and v != "":
            return v
    return None


def addr_to_url(addr: str) -> str:
    a = addr.strip()
    if a.lower() in _TRUE:
        a = DEFAULT_ADDR
    elif a.isdigit():
        a = f"127.0.0.1:{a}"
    return a if "://" in a else "http://" + a


_SAFE = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_QUOTE_TABLE = {c: f"%{c:02X}" for c in range(128) if chr(c) not in _SAFE}


@functools.lru_cache(maxsize=16384)  # bound: 16,384 recent keys (a few MiB)
def _quote_str(s: str) -> str:
    if s.isascii():
        return s.translate(_QUOTE_TABLE)
    return urllib.parse.quote(s, safe="")


def quote_key(key) -> str:
    """urllib.parse.quote(str(key), safe="") — the reference driver's encoding. Engines ask
    for the same keys again and again (every lookup re-checks a prompt's prefix), so the
    encodings of recent keys are remembered."""
    return _quote_str(str(key))


def byte_view(value) -> memoryview:
    """A flat unsigned-byte view of any bytes-like, without copying when it is contiguous."""
    mv = value if isinstance(value, memoryview) else memoryview(value)
    if mv.ndim == 1 and mv.format == "B":
        return mv
    if mv.contiguous:
        return mv.cast("B") if mv.c_contiguous else memoryview(mv.tobytes())
    return memoryview(mv.tobytes())


def writable_view(buffer) -> memoryview:
    """A flat unsigned-byte view over a writable, C-contiguous buffer (never a copy)."""
    mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    if mv.readonly:
        raise TypeError("a writable buffer is needed")
    if not mv.c_contiguous:
        raise TypeError("a C-contiguous buffer is needed")
    return mv if (mv.ndim == 1 and mv.format == "B") else mv.cast("B")


class _Pool:
    """LIFO stack of idle keep-alive connections, at most `size` connections in use.

    A pooled connection is handed out again only when it passes Connection.dropped() (the
    server may close an idle connection at any time: its --idle-timeout, a restart, or to make
    room at --max-connections or out of descriptors) and has been idle for at most idle_s
    seconds (0: no limit); the others are closed on the way and counted in `retired`. A
    caller that must not reuse anything asks for a fresh connection."""

    def __init__(self, factory, size: int, idle_s: float = 0.0):
        self._factory = factory
        self._idle = collections.deque()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False
        self.idle_s = float(idle_s)
        self.opened = 0  # connections created (for observability and tests)
        self.retired = 0  # pooled connections found closed or idle too long, never reused

    def _pop_reusable(self):
        now = time.monotonic()
        while True:
            with self._lock:
                # the oldest sit at the left: those idle too long go without a system call
                while self.idle_s > 0 and self._idle and now - self._idle[0].idle_since > self.idle_s:
                    stale = self._idle.popleft()
                    self.retired += 1
                    stale.close()
                if not self._idle:
                    return None
                conn = self._idle.pop()
            if conn.dropped():
                with self._lock:
                    self.retired += 1
                conn.close()
                continue
            return conn

    def acquire(self, timeout: float, fresh: bool = False):
        if not self._slots.acquire(timeout=timeout):
            raise TimeoutError("connection pool exhausted")
        try:
            if not fresh:
                conn = self._pop_reusable()
                if conn is not None:
                    return conn, True
            with self._lock:
                self.opened += 1
            return self._factory(), False
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn, reusable: bool):
        try:
            with self._lock:
                if reusable and not self._closed:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                conn.close()
        finally:
            self._slots.release()

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
        for c in idle:
            c.close()


# Errors that mean "the connection was closed under us": the server closed it (idle, restart,
# making room) before it answered. When not one byte of a response has arrived, the request is
# sent again on a new connection: a GET, HEAD, DELETE or batch query is idempotent, and so is a
# PUT here (the same block under the same key is a dedup hit; another length a 409).
_STALE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, ssl.SSLEOFError,
          ssl.SSLZeroReturnError)
# Sends of one request: the first, then at most this many on new connections.
MAX_RESENDS = 2
# A pooled connection idle longer than this is not reused (KVRELAY_IDLE_S; 0: no limit). Below
# the server's --idle-timeout (60 s by default): a connection the server is about to close is
# not worth the race. Servers run with a shorter --idle-timeout want a shorter idle_s.
DEFAULT_IDLE_S = 30.0


def model_valid(model: str) -> bool:
    """What the server takes in X-KV-Model: 1 to 128 bytes of printable ASCII, no space."""
    return 0 < len(model) <= 128 and all(0x20 < ord(c) < 0x7F for c in model)


class Client:
    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_connections: Optional[int] = None,
        tls_verify: Optional[bool] = None,
        tls_ca: Optional[str] = None,
        environ=None,
        idle_s: Optional[float] = None,
        model: Optional[str] = None,
    ):
        if url is None:
            url = env_value("URL", environ)
        if url is None:
            addr = env_value("ADDR", environ)
            url = addr_to_url(addr if addr is not None else DEFAULT_ADDR)
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        self.scheme = u.scheme or "http"
        if self.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme {self.scheme!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.scheme == "https" else 80)
        self.base_path = u.path.rstrip("/")
        self.url = f"{self.scheme}://{self.host}:{self.port}{self.base_path}"
        self.token = token if token is not None else env_value("TOKEN", environ)
        self.model = model if model is not None else env_value("MODEL", environ)
        if self.model is not None and not model_valid(self.model):
            raise ValueError(f"model {self.model!r}: 1 to 128 printable ASCII bytes without spaces")
        self.timeout_s = float(timeout_s if timeout_s is not None else env_value("TIMEOUT_S", environ) or 2.0)
        self.max_connections = int(
            max_connections if max_connections is not None else env_value("MAX_CONNECTIONS", environ) or 32
        )
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self.idle_s = float(idle_s if idle_s is not None else env_value("IDLE_S", environ) or DEFAULT_IDLE_S)
        if self.idle_s < 0:
            raise ValueError("idle_s must be >= 0")
        if tls_verify is None:
            v = env_value("TLS_VERIFY", environ)
            tls_verify = not (v is not None and v.strip().lower() in _FALSE)
        self._ssl = None
        if self.scheme == "https":
            ctx = ssl.create_default_context(cafile=tls_ca or env_value("TLS_CA", environ))
            if not tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        host_hdr = self.host if ":" not in self.host else f"[{self.host}]"
        self._fixed_headers = f"Host: {host_hdr}:{self.port}\r\n"
        if self.token:
            self._fixed_headers += f"Authorization: Bearer {self.token}\r\n"
        self._put_headers = f"X-KV-Model: {self.model}\r\n" if self.model else ""
        self._pool = _Pool(self._new_connection, self.max_connections, self.idle_s)
        self.errors = 0  # degraded operations (observability)
        self.resends = 0  # requests sent again on a new connection (observability)

    # -- plumbing ---------------------------------------------------------------------------

    def _new_connection(self) -> Connection:
        return Connection(self.host, self.port, self.timeout_s, self._ssl)

    @property
    def connections_opened(self) -> int:
        return self._pool.opened

    @property
    def connections_retired(self) -> int:
        """Pooled connections found closed by the server, or idle past idle_s, and dropped
        instead of reused."""
        return self._pool.retired

    def path(self, key) -> str:
        return self.base_path + "/kv/" + quote_key(key)

    def _head(self, method: str, path: str, length: Optional[int] = None, extra: str = "") -> bytes:
        h = f"{method} {path} HTTP/1.1\r\n{self._fixed_headers}{extra}"
        if length is not None:
            h += f"Content-Length: {length}\r\nContent-Type: application/octet-stream\r\n"
        return (h + "\r\n").encode("latin-1")

    def _exchange(self, head: bytes, body: Sequence, on_response, head_request: bool = False):
        """Sends one request and hands (connection, response) to on_response, which reads the
        body and returns (result, reusable).

        A pooled connection is checked before it is reused (_Pool). Should it still turn out
        closed — the server closed it in the instant between the check and the request —
        before a single byte of the response arrived, the request goes again, on a NEW
        connection (never another pooled one, which the same event may have closed too), at
        most MAX_RESENDS times. A request that got part of an answer, or timed out, is not
        sent again."""
        fresh = False
        for attempt in range(MAX_RESENDS + 1):
            conn, reused = self._pool.acquire(self.timeout_s, fresh=fresh)
            ok = False
            seen = conn.bytes_in
            try:
                conn.send(head, body)
                resp = conn.read_head(head_request)
                result, ok = on_response(conn, resp)
                ok = ok and not resp.will_close
                return result
            except _STALE as e:
                if attempt < MAX_RESENDS and conn.bytes_in == seen:
                    log.debug("kvrelay: %s connection closed before an answer (%s: %s); sending again "
                              "on a new connection", "pooled" if reused else "new", type(e).__name__, e)
                    self.resends += 1
                    fresh = True
                    continue
                raise
            finally:
                self._pool.release(conn, ok)
        raise ConnectionError("unreachable")  # pragma: no cover

    def _simple(self, method: str, path: str, body: Sequence = (), length: Optional[int] = None,
                extra: str = "", head_request: bool = False, max_body: int = 1 << 20):
        """(status, body bytes) of a request whose answer is small (bounded by max_body)."""
        def on_response(conn, resp):
            if resp.length > max_body:
                raise ProtocolError(f"answer of {resp.length} bytes to {method}, over {max_body}")
            return (resp.status, conn.read_body(resp.length)), True

        return self._exchange(self._head(method, path, length, extra), body, on_response, head_request)

    def _degrade(self, op: str, key, exc: BaseException, default):
        self.errors += 1
        log.debug("kvrelay %s %r degraded to a miss: %s: %s", op, key, type(exc).__name__, exc)
        return default

    # -- the raising layer (adapters, cluster) -----------------------------------------------

    def fetch(self, key) -> Optional[bytes]:
        """The value, or None on 404. Raises on transport and protocol errors."""
        def on_response(conn, resp):
            if resp.status == 200:
                return conn.read_body(resp.length), True
            if resp.length <= _DISCARD_LIMIT:
                conn.discard(resp.length)
                if resp.status != 404:
                    log.debug("kvrelay get %r: HTTP %d", key, resp.status)
                return None, True
            return None, False

        return self._exchange(self._head("GET", self.path(key)), (), on_response)

    def fetch_into(self, key, views: Sequence[memoryview]) -> int:
        """Receives the value straight into the views, filled in order: the byte count on a
        hit, MISS on 404 (or another status), WRONG_LENGTH when the value's length is not the
        views' total (nothing is written then). Raises on transport and protocol errors."""
        want = sum(v.nbytes for v in views)

        def on_response(conn, resp):
            if resp.status == 200 and resp.length == want:
                return conn.read_into(views), True
            code = WRONG_LENGTH if resp.status == 200 else MISS
            if resp.status not in (200, 404):
                log.debug("kvrelay get %r: HTTP %d", key, resp.status)
            if resp.length <= _DISCARD_LIMIT:
                conn.discard(resp.length)
                return code, True
            return code, False  # do not receive megabytes only to drop them: close instead

        return self._exchange(self._head("GET", self.path(key)), (), on_response)

    def fetch_with(self, key, reader):
        """GET whose 200 body is consumed by reader(conn, length) -> result (reader must read
        exactly length bytes, or raise); None on 404 or another status. Raises on transport
        and protocol errors. For values whose destination depends on their first bytes."""
        def on_response(conn, resp):
            if resp.status == 200:
                return reader(conn, resp.length), True
            if resp.length <= _DISCARD_LIMIT:
                conn.discard(resp.length)
                return None, True
            return None, False

        return self._exchange(self._head("GET", self.path(key)), (), on_response)

    def store(self, key, parts: Sequence, sequence_hash: Optional[int] = None) -> int:
        """PUTs the concatenation of parts (bytes-likes, sent without copying); the status.
        Raises on transport and protocol errors."""
        views = [byte_view(p) for p in parts]
        extra = self._put_headers
        if sequence_hash is not None:
            extra += f"X-KV-Sequence-Hash: {int(sequence_hash) & 0xFFFFFFFFFFFFFFFF}\r\n"
        length = sum(v.nbytes for v in views)
        status, _ = self._simple("PUT", self.path(key), views, length=length, extra=extra)
        if status not in (200, 201):
            log.debug("kvrelay put %r: HTTP %d", key, status)
        return status

    def probe(self, key) -> bool:
        status, _ = self._simple("HEAD", self.path(key), head_request=True)
        return status == 200

    def remove(self, key) -> Optional[int]:
        status, data = self._simple("DELETE", self.path(key))
        if status != 200:
            return None
        return int(json.loads(data)["refs"])

    def probe_many(self, keys: Sequence) -> List[bool]:
        """Existence of every key, in order, in as few round trips as the server's batch route
        allows: POST /batch/exists with one percent-encoded key per line, at most
        BATCH_MAX_KEYS keys and BATCH_MAX_BODY bytes per request (docs/http-contract.md).
        Raises on transport and protocol errors."""
        lines = [quote_key(k).encode("ascii") for k in keys]
        out: List[bool] = []
        i = 0
        while i < len(lines):
            n, size = 0, 0
            while i + n < len(lines) and n < BATCH_MAX_KEYS and size + len(lines[i + n]) + 1 <= BATCH_MAX_BODY:
                size += len(lines[i + n]) + 1
                n += 1
            body = b"\n".join(lines[i:i + n])
            status, data = self._simple("POST", self.base_path + "/batch/exists", [body], length=len(body),
                                        max_body=256 + 8 * n)
            if status != 200:
                raise ProtocolError(f"batch exists: HTTP {status}")
            found = json.loads(data)["exists"]
            if len(found) != n:
                raise ProtocolError(f"batch exists: {len(found)} answers for {n} keys")
            out.extend(bool(x) for x in found)
            i += n
        return out

    def fetch_many_into(self, keys: Sequence, views: Sequence[Sequence[memoryview]],
                        max_bytes: int = BATCH_GET_MAX_BYTES) -> List[int]:
        """fetch_into for many keys: per key the byte count, MISS or WRONG_LENGTH (nothing
        usable written then), in order. Keys travel in POST /batch/get requests of at most
        BATCH_GET_MAX_KEYS keys and max_bytes of buffers; a key whose buffers alone exceed
        max_bytes, and every key of a request the server refuses (a limit, an older server
        without the route), is fetched on its own. Raises on transport and protocol errors."""
        keys = list(keys)
        if len(keys) != len(views):
            raise ValueError("keys and buffers size mismatch")
        wants = [sum(v.nbytes for v in vs) for vs in views]
        out = [MISS] * len(keys)
        group: List[int] = []
        size = 0

        def flush():
            if len(group) == 1:  # a batch of one is a plain GET
                out[group[0]] = self.fetch_into(keys[group[0]], views[group[0]])
            elif group and not self._batch_get(keys, views, wants, group, out):
                for i in group:
                    out[i] = self.fetch_into(keys[i], views[i])
            group.clear()

        for i in range(len(keys)):
            if wants[i] > max_bytes:
                out[i] = self.fetch_into(keys[i], views[i])
                continue
            if len(group) == BATCH_GET_MAX_KEYS or size + wants[i] > max_bytes:
                flush()
                size = 0
            group.append(i)
            size += wants[i]
        flush()
        return out

    def _batch_get(self, keys, views, wants, idx: List[int], out: List[int]) -> bool:
        """One POST /batch/get for keys[idx]; fills out[idx]. False when the server refused
        the request as a whole (its keys are then to be fetched one by one)."""
        body = b"\n".join(quote_key(keys[i]).encode("ascii") for i in idx)

        def on_response(conn, resp):
            if resp.status != 200:
                log.debug("kvrelay batch get of %d keys: HTTP %d", len(idx), resp.status)
                if resp.length <= _DISCARD_LIMIT:
                    conn.discard(resp.length)
                    return False, True
                return False, False
            left = resp.length - 8 - 16 * len(idx)
            if left < 0:
                raise ProtocolError(f"batch get: {resp.length} bytes for {len(idx)} keys")
            pre = conn.read_body(8)
            if pre[:4] != _BATCH_MAGIC or int.from_bytes(pre[4:], "little") != len(idx):
                raise ProtocolError(f"batch get: bad preamble {pre!r}")
            scratch = None
            for i in idx:
                found, length = _BATCH_REC.unpack(conn.read_body(16))
                if found > 1 or (not found and length) or length > left:
                    raise ProtocolError(f"batch get: bad record ({found}, {length}), {left} bytes left")
                left -= length
                if not found:
                    out[i] = MISS
                elif length == wants[i]:
                    conn.read_into(views[i])
                    out[i] = length
                else:  # another length: a miss for this key; its bytes are dropped
                    if scratch is None:
                        scratch = memoryview(bytearray(min(_SCRATCH, max(length, 1))))
                    while length:
                        k = min(length, scratch.nbytes)
                        conn.read_into([scratch[:k]])
                        length -= k
                    out[i] = WRONG_LENGTH
            if left:
                raise ProtocolError(f"batch get: {left} bytes after the last record")
            return True, True

        return self._exchange(self._head("POST", self.base_path + "/batch/get", len(body)), [body], on_response)

    # -- the connector API (never raises) ----------------------------------------------------

    def get(self, key) -> Optional[bytes]:
        try:
            return self.fetch(key)
        except Exception as e:
            return self._degrade("get", key, e, None)

    def get_into(self, key, buffer) -> Optional[int]:
        try:
            n = self.fetch_into(key, [writable_view(buffer)])
            return n if n >= 0 else None
        except Exception as e:
            return self._degrade("get_into", key, e, None)

    def get_many_into(self, keys: Sequence, buffers: Sequence) -> List[bool]:
        """Every key's block received straight into its buffer (writable, C-contiguous), in
        as few requests as the batch limits allow; True per key that was filled, False for a
        miss, a block of another length or an error."""
        keys = list(keys)
        try:
            views = [[writable_view(b)] for b in buffers]
            return [n >= 0 for n in self.fetch_many_into(keys, views)]
        except Exception as e:
            return self._degrade("get_many_into", len(keys), e, [False] * len(keys))

    def put(self, key, value, sequence_hash: Optional[int] = None) -> bool:
        try:
            return self.store(key, [value], sequence_hash) in (200, 201)
        except Exception as e:
            return self._degrade("put", key, e, False)

    def contains(self, key) -> bool:
        try:
            return self.probe(key)
        except Exception as e:
            return self._degrade("contains", key, e, False)

    def exists(self, key) -> bool:
        try:
            status, data = self._simple("GET", self.path(key) + "/exists")
            if status != 200:
                return False
            return json.loads(data).get("exists") is True
        except Exception as e:
            return self._degrade("exists", key, e, False)

    def exists_many(self, keys: Sequence) -> List[bool]:
        keys = list(keys)
        try:
            return self.probe_many(keys)
        except Exception as e:
            return self._degrade("exists_many", len(keys), e, [False] * len(keys))

    def delete(self, key) -> Optional[int]:
        try:
            return self.remove(key)
        except Exception as e:
            return self._degrade("delete", key, e, None)

    def stats(self) -> Optional[KvCacheStats]:
        try:
            status, data = self._simple("GET", self.base_path + "/kv/stats")
            if status != 200:
                return None
            return KvCacheStats.from_json(json.loads(data))
        except Exception as e:
            return self._degrade("stats", None, e, None)

    def healthy(self) -> bool:
        """GET /healthz answered 200 (the cluster's re-probe)."""
        try:
            status, _ = self._simple("GET", self.base_path + "/healthz")
            return status == 200
        except Exception:
            return False

    def close(self) -> None:
        try:
            self._pool.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return f"kvrelay.Client({self.url!r})"


# The reference driver's names.
KvRelayClient = Client
RemoteKVConnector = Client


def from_env(environ=None) -> Client:
    return Client(environ=environ)
