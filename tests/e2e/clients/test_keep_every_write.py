"""
No write is lost to a pooled connection the server closed: after a server restart on the same
port, and after --idle-timeout 1s plus 2.5 s of quiet, a stream of batch writes through every
adapter — the plain Client, SGLang v1 and v2, LMCache's remote connector of both interface
generations — stores 100 of 100 blocks, the first write after each event included. Each
adapter is driven as its engine drives it (the drivers and stand-ins of the other test
modules); before each event every adapter's pool holds several kept-alive connections.

Then the pool's rules one by one against scripted servers: a connection closed while idle is
never handed out, one idle past idle_s is retired, a request whose connection closed before
any byte of an answer goes again on a new connection (at most MAX_RESENDS times), and one that
got part of an answer is not sent again.
"""

import asyncio
import concurrent.futures
import hashlib
import socket
import threading
import time

import pytest

from .conftest import KiB
from .engines import engine
from .test_lmcache_generations import Key, create_connector, lmcache_config, newer_metadata
from .test_sglang import HostPool, make_backend as make_v1_backend
from .test_sglang_v2 import Indices, make_backend as make_v2_backend

from conftest import SLOW, free_port  # noqa: E402
from harness import tcp_sockets, wait_until  # noqa: E402

from kvrelay import Client  # noqa: E402
from kvrelay import client as client_mod  # noqa: E402

BATCH = 4
WRITES = 100
VALUE = 2 * KiB


def data(seed, n=VALUE):
    d = hashlib.blake2b(seed.encode(), digest_size=64).digest()
    return (d * (n // 64 + 1))[:n]


class PlainWriter:
    name = "client"

    def __init__(self, url):
        self.c = Client(url=url, timeout_s=5.0 * SLOW, max_connections=8)
        self.store = self.c
        self.pool = concurrent.futures.ThreadPoolExecutor(8)

    def warm(self, tag):
        keys = [f"plain-{tag}-w{i}" for i in range(8)]
        assert all(self.pool.map(lambda k: self.c.put(k, data(k)), keys))

    def write(self, tag, b):
        keys = [f"plain-{tag}-{b}-{j}" for j in range(BATCH)]
        return keys, [self.c.put(k, data(k)) for k in keys]

    def close(self):
        self.pool.shutdown()
        self.c.close()


class SGLangV1Writer:
    name = "sglang-v1"
    SFX = "@Qwen-Qwen3-8B@tp0of2"

    def __init__(self, srv):
        self.hp = HostPool(pages=8, page_size=16, half=VALUE // 2)
        self.b = make_v1_backend(srv, self.hp, num_workers=8, max_connections=8)
        self.store = self.b.store

    def _set(self, hashes):
        for p, h in enumerate(hashes):
            self.hp.fill(p, h)
        return self.b.batch_set_v1(hashes, self.hp.indices(0, len(hashes)))

    def warm(self, tag):
        assert self._set([hashlib.sha256(f"v1-{tag}-w{i}".encode()).hexdigest() for i in range(8)]) == [True] * 8

    def write(self, tag, b):
        hashes = [hashlib.sha256(f"v1-{tag}-{b}-{j}".encode()).hexdigest() for j in range(BATCH)]
        return [h + self.SFX for h in hashes], self._set(hashes)

    def close(self):
        self.b.close()


class SGLangV2Writer:
    name = "sglang-v2"
    SFX = "@Qwen-Qwen3-Next-80B-A3B@tp1of2"

    def __init__(self, srv):
        with engine("sglang") as (_, imp):
            self.hs = imp("sglang.srt.mem_cache.hicache_storage")
            self.hp = HostPool(pages=8, page_size=16, half=VALUE // 2)
            self.b = make_v2_backend(self.hs, srv, num_workers=8, max_connections=8)
        self.b.register_mem_host_pool_v2(self.hp, self.hs.PoolName.KV)
        self.store = self.b.store

    def _set(self, hashes):
        for p, h in enumerate(hashes):
            self.hp.fill(p, h)
        t = self.hs.PoolTransfer(self.hs.PoolName.KV, host_indices=Indices(self.hp.indices(0, len(hashes))),
                                 keys=hashes)
        return self.b.batch_set_v2([t])[self.hs.PoolName.KV]

    def warm(self, tag):
        assert self._set([hashlib.sha256(f"v2-{tag}-w{i}".encode()).hexdigest() for i in range(8)]) == [True] * 8

    def write(self, tag, b):
        hashes = [hashlib.sha256(f"v2-{tag}-{b}-{j}".encode()).hexdigest() for j in range(BATCH)]
        return [h + self.SFX for h in hashes], self._set(hashes)

    def close(self):
        self.b.close()


class LMCacheWriter:
    """LMCache's RemoteBackend: batched_put, never awaited for a result; success is what the
    server holds (and the connector's put_failures)."""

    def __init__(self, srv, generation):
        self.name = generation
        self.loop = asyncio.new_event_loop()
        url = f"kvrelay://127.0.0.1:{srv.port}?timeout_s={5 * SLOW}&max_connections=8"
        with engine(generation) as (_, imp):
            mm = imp("lmcache.v1.memory_management")
            if generation == "lmcache_newer":
                md = newer_metadata(imp)
                cfg = lmcache_config()
                backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg, md)
                self.obj = lambda: mm.MemoryObj([(VALUE, 1, 1, 1)], [mm.uint8], mm.MemoryFormat.KV_2LTD)
            else:
                md = None
                cfg = lmcache_config()
                backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend()
                self.obj = lambda: mm.MemoryObj((VALUE, 1, 1, 1), mm.uint8, mm.MemoryFormat.KV_2LTD)
            self.conn = create_connector(imp, url, self.loop, backend, cfg, md)
        self.store = self.conn.store

    def _put(self, keys):
        objs = []
        for k in keys:
            o = self.obj()
            o.byte_array[:] = data(k.to_string())
            objs.append(o)
        before = self.conn.put_failures
        self.loop.run_until_complete(self.conn.batched_put(keys, objs))
        return self.conn.put_failures - before

    def warm(self, tag):
        assert self._put([Key(i, f"{self.name}-{tag}-w") for i in range(8)]) == 0

    def write(self, tag, b):
        keys = [Key(b * BATCH + j, f"{self.name}-{tag}") for j in range(BATCH)]
        failed = self._put(keys)
        # per key: stored (the server is asked below); the count must agree
        return [k.to_string() for k in keys], [failed == 0] * BATCH

    def close(self):
        self.loop.run_until_complete(self.conn.close())
        self.loop.close()


def stream(writers, tag):
    """25 batches of 4 per writer, interleaved: (writer name -> keys, oks)."""
    out = {w.name: ([], []) for w in writers}
    for b in range(WRITES // BATCH):
        for w in writers:
            keys, oks = w.write(tag, b)
            out[w.name][0].extend(keys)
            out[w.name][1].extend(oks)
    return out


def assert_all_stored(srv, results, event):
    with Client(url=srv.base_url, timeout_s=5.0 * SLOW) as probe:
        for name, (keys, oks) in results.items():
            assert len(keys) == WRITES
            there = probe.exists_many(keys)
            lost = [i for i in range(WRITES) if not (oks[i] and there[i])]
            assert not lost, f"{name} after {event}: writes {lost[:8]}... of {WRITES} lost (first write #{lost[0]})"


def test_restart_and_idle_timeout_lose_no_write(kvrelay):
    port = free_port()
    args = ("--memory", "128M", "--workers", "2", "--idle-timeout", "1s")
    srv = kvrelay(*args, http_bind=f"127.0.0.1:{port}")
    writers = [PlainWriter(srv.base_url), SGLangV1Writer(srv), SGLangV2Writer(srv),
               LMCacheWriter(srv, "lmcache_newer"), LMCacheWriter(srv, "lmcache_older")]
    try:
        # every pool holds kept-alive connections (several when its 8 warm-up writes overlap; one
        # is enough for what follows, and a busy machine may run them one after another), then
        # quiet: the server's --idle-timeout 1s closes them all
        for w in writers:
            w.warm("idle")
        assert all(w.store.connections_opened >= 1 for w in writers), [w.store.connections_opened for w in writers]
        retired = [w.store.connections_retired for w in writers]
        # quiet until the server's --idle-timeout has closed every kept-alive connection
        wait_until(lambda: not any(r["local"][1] == srv.port and r["state"] == "ESTABLISHED"
                                   for r in tcp_sockets(srv.port)),
                   10 * SLOW, what="the server to close every idle kept-alive connection")
        assert_all_stored(srv, stream(writers, "idle"), "2.5 s of quiet past --idle-timeout 1s")
        after = [w.store.connections_retired for w in writers]
        assert all(a > r for a, r in zip(after, retired)), (retired, after)

        # a restart on the same port: every pooled connection is dead
        srv.stop()
        srv2 = kvrelay(*args, http_bind=f"127.0.0.1:{port}")
        assert srv2.port == port
        assert_all_stored(srv2, stream(writers, "restart"), "a server restart")
        assert all(w.store.connections_retired > a for w, a in zip(writers, after))
        assert all(w.store.errors == 0 for w in writers if hasattr(w.store, "errors"))
    finally:
        for w in writers:
            w.close()


# ---------------------------------------------------------------------------------------------
# The pool's rules against scripted servers

OK_REPLY = b"HTTP/1.1 201 Created\r\nContent-Length: 0\r\n\r\n"


class Scripted:
    """Accepts connections one after another; connection i is handed to script(i, sock)."""

    def __init__(self, script):
        self.script = script
        self.s = socket.socket()
        self.s.bind(("127.0.0.1", 0))
        self.s.listen(16)
        self.port = self.s.getsockname()[1]
        self.accepted = 0
        self.stop = threading.Event()
        self.threads = []
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    def _serve(self):
        self.s.settimeout(0.05)
        while not self.stop.is_set():
            try:
                conn, _ = self.s.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            i = self.accepted
            self.accepted += 1
            t = threading.Thread(target=self._run, args=(i, conn), daemon=True)
            t.start()
            self.threads.append(t)

    def _run(self, i, conn):
        try:
            conn.settimeout(5.0)
            self.script(i, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stop.set()
        self.t.join(5)
        for t in self.threads:
            t.join(5)
        self.s.close()


def read_request(conn):
    """Reads one request head and its Content-Length body; None on EOF."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = conn.recv(65536)
        if not d:
            return None
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    n = 0
    for line in head.split(b"\r\n")[1:]:
        if line.lower().startswith(b"content-length:"):
            n = int(line.split(b":", 1)[1])
    while len(rest) < n:
        rest += conn.recv(65536)
    return head


def test_a_connection_closed_while_idle_is_never_handed_out():
    def script(i, conn):  # answers one request, then closes, as a server's idle timeout does
        if read_request(conn):
            conn.sendall(OK_REPLY)
        time.sleep(0.05)  # the scripted server's behaviour: a short pause, then the close

    srv = Scripted(script)
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            for i in range(5):
                assert c.put(f"k{i}", b"v") is True
                time.sleep(0.15)  # the close has arrived
            assert c.errors == 0 and c.resends == 0, (c.errors, c.resends)
            assert c.connections_opened == 5 and c.connections_retired == 4
    finally:
        srv.close()


def test_a_connection_idle_past_idle_s_is_retired(kvrelay):
    srv = kvrelay("--memory", "32M", "--workers", "1")
    with Client(url=srv.base_url, timeout_s=2.0 * SLOW, idle_s=0.2) as c:
        assert c.put("a", b"1") and c.get("a") == b"1"
        assert c.connections_opened == 1 and c.connections_retired == 0
        time.sleep(0.35)  # the client's own clock: past idle_s (0.2 s), no other party involved
        assert c.get("a") == b"1"
        assert c.connections_opened == 2 and c.connections_retired == 1
    with pytest.raises(ValueError):
        Client(url=srv.base_url, idle_s=-1)
    assert Client(url=srv.base_url, environ={"KVRELAY_IDLE_S": "7.5"}).idle_s == 7.5
    assert Client(url=srv.base_url, environ={}).idle_s == client_mod.DEFAULT_IDLE_S < 60


@pytest.mark.parametrize("method", ["GET", "PUT"])
def test_closed_before_any_answer_goes_again_on_a_new_connection(method):
    heads = []

    def script(i, conn):
        head = read_request(conn)
        heads.append((i, head.split(b" ", 1)[0] if head else None))
        if i == 0:
            return  # the server closed the connection under the request: no byte of an answer
        if method == "GET":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello")
        else:
            conn.sendall(OK_REPLY)
        time.sleep(0.2)  # the scripted server's behaviour: it lingers before closing

    srv = Scripted(script)
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            if method == "GET":
                assert c.get("k") == b"hello"
            else:
                assert c.put("k", memoryview(b"x" * 70000)) is True
            assert c.resends == 1 and c.errors == 0 and c.connections_opened == 2
            assert [h for _, h in sorted(heads)] == [method.encode()] * 2
    finally:
        srv.close()


def test_resends_are_bounded_and_a_partial_answer_is_not_resent():
    def never(i, conn):  # every connection closes under its request
        read_request(conn)

    srv = Scripted(never)
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            assert c.put("k", b"v") is False
            assert c.resends == client_mod.MAX_RESENDS and c.errors == 1
            wait_until(lambda: srv.accepted >= client_mod.MAX_RESENDS + 1, 5 * SLOW,
                       what="the scripted server to count the client's connections")
            assert srv.accepted == client_mod.MAX_RESENDS + 1
    finally:
        srv.close()

    def partial(i, conn):  # part of an answer, then the close: the request may have been served
        read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Len")

    srv = Scripted(partial)
    try:
        with Client(url=f"http://127.0.0.1:{srv.port}", timeout_s=2.0 * SLOW) as c:
            assert c.get("k") is None
            assert c.resends == 0 and c.errors == 1
            wait_until(lambda: srv.accepted >= 1, 5 * SLOW, what="the scripted server to count the connection")
            assert srv.accepted == 1
    finally:
        srv.close()
