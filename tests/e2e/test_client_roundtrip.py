"""
clients/python/kvrelay_client.py against the real server: 1,000 blocks of mixed sizes up to
64 MiB over a keep-alive pool from several threads, every byte verified; and the reference
driver's promise that nothing raises: a dead, silent or rude server is a miss.
"""

import concurrent.futures
import random
import socket
import sys
import threading
import time

import pytest

from conftest import REPO, SLOW, MiB, KiB, free_port, kv_path, make_block
from harness import tcp_sockets, wait_until

sys.path.insert(0, str(REPO / "clients" / "python"))
import kvrelay_client  # noqa: E402
from kvrelay_client import KvCacheStats, KvRelayClient  # noqa: E402


def _sizes(rng):
    sizes = [64 * MiB, 48 * MiB, 32 * MiB + 1, 24 * MiB, 16 * MiB]
    sizes += [rng.randint(1 * MiB, 8 * MiB) for _ in range(25)]
    for _ in range(970):
        x = rng.random()
        if x < 0.6:
            sizes.append(rng.randint(1, 16 * KiB))
        elif x < 0.9:
            sizes.append(rng.randint(16 * KiB, 256 * KiB))
        else:
            sizes.append(rng.randint(256 * KiB, MiB))
    rng.shuffle(sizes)
    return sizes


def _key(i, rng):
    salt = rng.choice(["", "@alice", "@bob team", "@x+y=z"])
    return f"meta-llama/Llama-3.1-8B@{i % 4:08x}@0@{i:064x}{salt}"


def test_client_roundtrip_1000_blocks(kvrelay):
    srv = kvrelay("--memory", "1G", "--workers", "2")
    rng = random.Random(20261130)
    sizes = _sizes(rng)
    keys = [_key(i, rng) for i in range(1000)]
    assert len(set(keys)) == 1000
    blocks = [make_block(n, k) for n, k in zip(sizes, keys)]
    total = sum(sizes)
    assert total < 1 << 30

    client = KvRelayClient(environ={"KVRELAY_URL": srv.base_url, "KVRELAY_MAX_CONNECTIONS": "8",
                                    "KVRELAY_TIMEOUT_S": str(20 * SLOW)})
    assert client.max_connections == 8 and client.timeout_s == 20 * SLOW
    failures = []

    def put_get(i):
        if not client.put(keys[i], blocks[i]):
            failures.append(("put", i, sizes[i]))
            return
        got = client.get(keys[i])
        if got != blocks[i]:
            failures.append(("get", i, sizes[i], None if got is None else len(got)))

    t0 = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(put_get, range(1000)))
        assert not failures, failures[:20]

        # second pass in another order: every block still intact
        def verify(i):
            got = client.get(keys[i])
            if got != blocks[i]:
                failures.append(("reget", i, sizes[i], None if got is None else len(got)))
            if not client.contains(keys[i]) or not client.exists(keys[i]):
                failures.append(("probe", i))

        order = list(range(1000))
        rng.shuffle(order)
        with concurrent.futures.ThreadPoolExecutor(8) as ex:
            list(ex.map(verify, order))
        assert not failures, failures[:20]
        elapsed = time.monotonic() - t0

        st = client.stats()
        assert isinstance(st, KvCacheStats), st
        assert (st.unique_blocks, st.total_refs, st.resident_bytes, st.logical_bytes) == (1000, 1000, total, total), st
        assert st.get_hits >= 2000 and st.dedup_hits == 0, st
        assert st.extra.get("capacity_bytes") == 1 << 30, st

        # dedup hits through the client
        for i in range(0, 1000, 50):
            assert client.put(keys[i], blocks[i]) is True
        st = client.stats()
        assert st.dedup_hits == 20 and st.total_refs == 1020 and st.unique_blocks == 1000, st
        assert client.delete(keys[0]) == 1
        assert client.delete(keys[1]) == 0
        assert client.get(keys[1]) is None and client.contains(keys[1]) is False and client.exists(keys[1]) is False
        assert client.delete(keys[1]) is None

        # keep-alive: 5,000+ requests over at most max_connections connections
        assert client.connections_opened <= 8, f"{client.connections_opened} connections were opened"
        assert client.errors == 0
    finally:
        client.close()
    srv.assert_consistent()
    # Bound from the brief: well under a minute (generous under sanitizers).
    assert elapsed < 60 * SLOW, f"1,000-block round trip took {elapsed:.1f}s"


def test_client_keys_are_percent_encoded(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with KvRelayClient(url=srv.base_url) as c:
        for key, raw_miss in (("sp ace", "/kv/sp+ace"), ("pl+us", "/kv/pl%20us"), ("x/y=z", "/kv/x/y%3Dz%20"),
                              ("meta-llama/Llama-3@000000ff@0@00010203", "/kv/meta-llama")):
            d = make_block(100, key)
            assert c.put(key, d)
            r = srv.request("GET", kv_path(key))
            assert r.status == 200 and r.body == d, r
            assert srv.request("GET", raw_miss).status == 404
        # integer keys go through str()
        assert c.put(12345, b"int-key") and srv.request("GET", "/kv/12345").body == b"int-key"
        assert c.get(12345) == b"int-key"


def test_client_sequence_hash_and_memoryview(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with KvRelayClient(url=srv.base_url) as c:
        buf = bytearray(make_block(4096, "mv"))
        assert c.put("mv", memoryview(buf), sequence_hash=(1 << 64) - 1)
        assert c.get("mv") == bytes(buf)
        import array
        arr = array.array("I", range(256))  # itemsize 4: the body is its 1024 bytes
        assert c.put("arr", arr)
        assert c.get("arr") == arr.tobytes()


def test_client_token_and_env_compat(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1", "--token", "tok-1")
    with KvRelayClient(url=srv.base_url) as anon:
        assert anon.put("t", b"x") is False
        assert anon.get("t") is None
        assert anon.stats() is None
        assert anon.errors == 0  # a 401 is an answer, not a transport error
    env = {"EPISTEMIC_GRAPH_KVCACHE_ADDR": str(srv.port), "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "tok-1"}
    with kvrelay_client.from_env(env) as c:
        assert (c.host, c.port, c.scheme) == ("127.0.0.1", srv.port, "http")
        assert c.put("t", b"x") is True and c.get("t") == b"x"
    # KVRELAY_* wins over the reference names
    env = {"KVRELAY_TOKEN": "nope", "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "tok-1", "KVRELAY_URL": srv.base_url}
    with kvrelay_client.from_env(env) as c:
        assert c.get("t") is None


@pytest.mark.parametrize("environ,url", [
    ({}, ("http", "127.0.0.1", 9130)),
    ({"KVRELAY_ADDR": "1"}, ("http", "127.0.0.1", 9130)),
    ({"KVRELAY_ADDR": "yes"}, ("http", "127.0.0.1", 9130)),
    ({"KVRELAY_ADDR": "7001"}, ("http", "127.0.0.1", 7001)),
    ({"KVRELAY_ADDR": "10.0.0.5:7002"}, ("http", "10.0.0.5", 7002)),
    ({"EPISTEMIC_GRAPH_KVCACHE_ADDR": "7003"}, ("http", "127.0.0.1", 7003)),
    ({"KVRELAY_ADDR": "7004", "EPISTEMIC_GRAPH_KVCACHE_ADDR": "7003"}, ("http", "127.0.0.1", 7004)),
    ({"KVRELAY_URL": "https://kv.example:8443", "KVRELAY_ADDR": "7004"}, ("https", "kv.example", 8443)),
])
def test_client_env_config(environ, url):
    c = KvRelayClient(environ=environ)
    assert (c.scheme, c.host, c.port) == url
    assert c.timeout_s == 2.0 and c.max_connections == 32
    c.close()


def _assert_all_miss(c, limit_s):
    t0 = time.monotonic()
    assert c.get("k") is None
    assert c.put("k", b"v") is False
    assert c.contains("k") is False
    assert c.exists("k") is False
    assert c.stats() is None
    assert c.delete("k") is None
    took = time.monotonic() - t0
    assert took < limit_s, f"misses took {took:.1f}s"
    assert c.errors == 6


def test_client_dead_server_is_a_miss():
    port = free_port()  # nothing listens: connection refused
    with KvRelayClient(url=f"http://127.0.0.1:{port}", timeout_s=1.0) as c:
        _assert_all_miss(c, 5.0)


def test_client_silent_server_times_out():
    """A listener that never accepts: every call returns a miss after about timeout_s."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    try:
        with KvRelayClient(url=f"http://127.0.0.1:{s.getsockname()[1]}", timeout_s=0.3) as c:
            _assert_all_miss(c, 6 * 0.3 + 4.0)
    finally:
        s.close()


def test_client_rude_server_is_a_miss():
    """A peer that accepts and hangs up, or answers garbage: misses, no exception."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    stop = threading.Event()
    replies = [b"", b"garbage\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"]

    def serve():
        n = 0
        s.settimeout(0.2)
        while not stop.is_set() and n < 200:
            try:
                conn, _ = s.accept()
            except socket.timeout:
                continue
            n += 1
            try:
                conn.settimeout(1.0)
                conn.recv(65536)
                conn.sendall(replies[n % len(replies)])
            except OSError:
                pass
            finally:
                conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with KvRelayClient(url=f"http://127.0.0.1:{s.getsockname()[1]}", timeout_s=1.0) as c:
            for _ in range(3):
                assert c.get("k") is None
                assert c.put("k", b"v") is False
                assert c.exists("k") is False
                assert c.stats() is None
    finally:
        stop.set()
        t.join(5)
        s.close()


def test_client_reconnects_after_idle_timeout(kvrelay):
    """The server closes idle keep-alive connections (--idle-timeout); the client notices the
    stale connection and retries once on a fresh one: no miss."""
    srv = kvrelay("--memory", "64M", "--workers", "1", "--idle-timeout", "500ms")
    with KvRelayClient(url=srv.base_url, max_connections=1) as c:
        assert c.put("idle", b"abc")
        # the server closes the idle connection after --idle-timeout: its end leaves ESTABLISHED
        wait_until(lambda: not any(r["local"][1] == srv.port and r["state"] == "ESTABLISHED"
                                   for r in tcp_sockets(srv.port)),
                   5 * SLOW, what="the server to close the idle keep-alive connection")
        assert c.get("idle") == b"abc"
        assert c.connections_opened == 2, "the idle connection should have been closed by the server"
        assert c.errors == 0


def test_client_pool_is_bounded_and_thread_safe(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2")
    with KvRelayClient(url=srv.base_url, max_connections=3) as c:
        def work(i):
            d = make_block(1000 + i, f"pool{i}")
            return c.put(f"pool{i}", d) and c.get(f"pool{i}") == d
        with concurrent.futures.ThreadPoolExecutor(16) as ex:
            assert all(ex.map(work, range(400)))
        assert c.connections_opened <= 3, c.connections_opened


def test_client_tls(kvrelay, tls_cert):
    cert, _key = tls_cert
    srv = kvrelay("--memory", "64M", "--workers", "1", tls=tls_cert)
    with KvRelayClient(environ={"KVRELAY_URL": srv.base_url, "KVRELAY_TLS_VERIFY": "0"}) as c:
        d = make_block(3 * MiB, "tls")
        assert c.put("tls/key", d)
        assert c.get("tls/key") == d
        assert c.stats().unique_blocks == 1
    # verification on by default: a self-signed certificate is refused (a miss, no raise)
    with KvRelayClient(url=srv.base_url) as c:
        assert c.get("tls/key") is None and c.errors == 1
    # ...and accepted with it as the CA
    with KvRelayClient(url=f"https://localhost:{srv.port}", tls_ca=str(cert)) as c:
        assert c.get("tls/key") == d
