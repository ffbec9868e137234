"""
kvrelay_client — a Python client for kvrelay's KV-cache HTTP surface that behaves like the
reference ``RemoteKVConnector`` (spec/kvcache-http.md §2):

    get(key) -> bytes | None         GET /kv/<key>; 404 and every failure -> None
    put(key, value) -> bool          PUT; True on 200 (dedup hit) or 201 (created)
    contains(key) -> bool            HEAD
    exists(key) -> bool              GET /kv/<key>/exists, reads "exists"
    stats() -> KvCacheStats | None   GET /kv/stats
    delete(key) -> int | None        DELETE (kvrelay extension): references left, or None

Nothing raises on the inference path: every transport or protocol error degrades to a miss
(None / False) and is logged at debug level. The path is "/kv/" + quote(str(key), safe='').

Connections are kept alive in a thread-safe pool (stdlib http.client only). Configuration
comes from arguments or the environment (KVRELAY_* first, then the reference driver's
EPISTEMIC_GRAPH_KVCACHE_* names):

    KVRELAY_URL              http://host:port or https://host:port
    KVRELAY_ADDR             host:port, a bare port, or 1/true/yes/on (127.0.0.1:9130)
    KVRELAY_TOKEN            bearer token
    KVRELAY_TIMEOUT_S        per socket operation, default 2.0
    KVRELAY_MAX_CONNECTIONS  pool size, default 32
    KVRELAY_TLS_VERIFY       0/false/no/off disables certificate verification (https)
    KVRELAY_TLS_CA           CA bundle for https
"""

from __future__ import annotations

import collections
import dataclasses
import http.client
import json
import logging
import os
import socket
import ssl
import threading
import urllib.parse
from typing import Optional

__all__ = ["KvRelayClient", "KvCacheStats", "RemoteKVConnector", "from_env"]

log = logging.getLogger("kvrelay_client")

DEFAULT_ADDR = "127.0.0.1:9130"
ENV_PREFIXES = ("KVRELAY_", "EPISTEMIC_GRAPH_KVCACHE_")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


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


def _env(name: str, environ=None) -> Optional[str]:
    environ = os.environ if environ is None else environ
    for prefix in ENV_PREFIXES:
        v = environ.get(prefix + name)
        if v is not None and v != "":
            return v
    return None


def _addr_to_url(addr: str) -> str:
    a = addr.strip()
    if a.lower() in _TRUE:
        a = DEFAULT_ADDR
    elif a.isdigit():
        a = f"127.0.0.1:{a}"
    return a if "://" in a else "http://" + a


class _Pool:
    """LIFO stack of idle keep-alive connections, at most `size` connections in use."""

    def __init__(self, factory, size: int):
        self._factory = factory
        self._idle = collections.deque()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self._closed = False
        self.opened = 0  # connections created (for observability and tests)

    def acquire(self, timeout: float):
        if not self._slots.acquire(timeout=timeout):
            raise TimeoutError("connection pool exhausted")
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
            self.opened += 1
        try:
            return self._factory(), False
        except BaseException:
            self._slots.release()
            raise

    def release(self, conn, reusable: bool):
        try:
            with self._lock:
                if reusable and not self._closed:
                    self._idle.append(conn)
                    conn = None
            if conn is not None:
                _close_quietly(conn)
        finally:
            self._slots.release()

    def close(self):
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), collections.deque()
        for c in idle:
            _close_quietly(c)


def _close_quietly(conn):
    try:
        conn.close()
    except Exception:
        pass


# Errors that mean "the server closed an idle keep-alive connection before reading our
# request": the request was never processed, so it is safe to send it once more.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class KvRelayClient:
    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        timeout_s: Optional[float] = None,
        max_connections: Optional[int] = None,
        tls_verify: Optional[bool] = None,
        tls_ca: Optional[str] = None,
        environ=None,
    ):
        if url is None:
            url = _env("URL", environ)
        if url is None:
            addr = _env("ADDR", environ)
            url = _addr_to_url(addr if addr is not None else DEFAULT_ADDR)
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        self.scheme = u.scheme or "http"
        if self.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme {self.scheme!r}")
        self.host = u.hostname or "127.0.0.1"
        self.port = u.port or (443 if self.scheme == "https" else 80)
        self.base_path = u.path.rstrip("/")
        self.token = token if token is not None else _env("TOKEN", environ)
        self.timeout_s = float(timeout_s if timeout_s is not None else _env("TIMEOUT_S", environ) or 2.0)
        self.max_connections = int(
            max_connections if max_connections is not None else _env("MAX_CONNECTIONS", environ) or 32
        )
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if tls_verify is None:
            v = _env("TLS_VERIFY", environ)
            tls_verify = not (v is not None and v.strip().lower() in _FALSE)
        self._ssl = None
        if self.scheme == "https":
            ctx = ssl.create_default_context(cafile=tls_ca or _env("TLS_CA", environ))
            if not tls_verify:
                ctx.check_hostname = False
                ctx.verify_mode = ssl.CERT_NONE
            ctx.set_alpn_protocols(["http/1.1"])
            self._ssl = ctx
        self._pool = _Pool(self._new_connection, self.max_connections)
        self.errors = 0  # degraded operations (observability)

    # -- plumbing ---------------------------------------------------------------------------

    def _new_connection(self):
        if self._ssl is not None:
            c = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self._ssl)
        else:
            c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        c.connect()
        try:
            c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        return c

    @property
    def connections_opened(self) -> int:
        return self._pool.opened

    def _path(self, key) -> str:
        return self.base_path + "/kv/" + urllib.parse.quote(str(key), safe="")

    def _request(self, method: str, path: str, body=None, headers=None):
        """Returns (status, body bytes). Raises on transport/protocol errors (callers catch)."""
        hdrs = {"Accept": "*/*"}
        if self.token:
            hdrs["Authorization"] = f"Bearer {self.token}"
        if body is not None:
            hdrs["Content-Type"] = "application/octet-stream"
        if headers:
            hdrs.update(headers)
        for attempt in (0, 1):
            conn, reused = self._pool.acquire(self.timeout_s)
            ok = False
            try:
                conn.request(method, path, body=body, headers=hdrs)
                resp = conn.getresponse()
                data = resp.read()
                ok = not resp.will_close
                return resp.status, data
            except _STALE:
                if reused and attempt == 0:
                    continue  # a keep-alive connection the server had closed: retry once
                raise
            finally:
                self._pool.release(conn, ok)
        raise ConnectionError("unreachable")  # pragma: no cover

    def _degrade(self, op: str, key, exc: BaseException, default):
        self.errors += 1
        log.debug("kvrelay %s %r degraded to a miss: %s: %s", op, key, type(exc).__name__, exc)
        return default

    # -- the connector API ------------------------------------------------------------------

    def get(self, key) -> Optional[bytes]:
        try:
            status, data = self._request("GET", self._path(key))
            if status == 200:
                return data
            if status != 404:
                log.debug("kvrelay get %r: HTTP %d", key, status)
            return None
        except Exception as e:
            return self._degrade("get", key, e, None)

    def put(self, key, value, sequence_hash: Optional[int] = None) -> bool:
        try:
            body = memoryview(value)
            if body.ndim != 1 or body.itemsize != 1 or not body.contiguous:
                body = body.cast("B") if body.contiguous else memoryview(bytes(body))
            headers = None
            if sequence_hash is not None:
                headers = {"X-KV-Sequence-Hash": str(int(sequence_hash) & 0xFFFFFFFFFFFFFFFF)}
            headers = dict(headers or {}, **{"Content-Length": str(body.nbytes)})
            status, _ = self._request("PUT", self._path(key), body=body, headers=headers)
            if status not in (200, 201):
                log.debug("kvrelay put %r: HTTP %d", key, status)
            return status in (200, 201)
        except Exception as e:
            return self._degrade("put", key, e, False)

    def contains(self, key) -> bool:
        try:
            status, _ = self._request("HEAD", self._path(key))
            return status == 200
        except Exception as e:
            return self._degrade("contains", key, e, False)

    def exists(self, key) -> bool:
        try:
            status, data = self._request("GET", self._path(key) + "/exists")
            if status != 200:
                return False
            return json.loads(data).get("exists") is True
        except Exception as e:
            return self._degrade("exists", key, e, False)

    def delete(self, key) -> Optional[int]:
        try:
            status, data = self._request("DELETE", self._path(key))
            if status != 200:
                return None
            return int(json.loads(data)["refs"])
        except Exception as e:
            return self._degrade("delete", key, e, None)

    def stats(self) -> Optional[KvCacheStats]:
        try:
            status, data = self._request("GET", self.base_path + "/kv/stats")
            if status != 200:
                return None
            return KvCacheStats.from_json(json.loads(data))
        except Exception as e:
            return self._degrade("stats", None, e, None)

    def close(self) -> None:
        try:
            self._pool.close()
        except Exception:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# The reference driver's name.
RemoteKVConnector = KvRelayClient


def from_env(environ=None) -> KvRelayClient:
    return KvRelayClient(environ=environ)
