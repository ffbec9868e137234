"""
The HTTP contract (docs/http-contract.md) against the real server, over every
transport: Python's http.client (cleartext and TLS) and curl (HTTP/1.1, h2c prior knowledge,
TLS with ALPN http/1.1 and h2).
"""

import json
import os
import re
import socket
import subprocess
import time

import pytest

from conftest import (
    MiB,
    SLOW,
    _DEFAULT,
    assert_error,
    curl_multi,
    free_port,
    kv_path,
    make_block,
    module_server,
    parse_kv_lines,
    parse_raw_response,
    quote_key,
    raw_connect,
    read_one_response,
    run_binary,
    send_while_reading,
    unique_key,
)
from harness import wait_until

TRANSPORTS = ["py", "py-tls", "curl-h1", "curl-h2c", "curl-tls-h1", "curl-tls-h2"]
FEW_TRANSPORTS = ["py", "curl-h2c", "curl-tls-h2"]

STATS_FIELDS = (
    "unique_blocks", "total_refs", "resident_bytes", "logical_bytes", "dedup_savings_bytes",
    "dedup_hits", "get_hits", "get_misses",
)
STATS_EXTRA = ("capacity_bytes", "evictions", "evicted_bytes", "put_new", "put_conflicts", "deletes", "max_block_size")


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    srv = module_server(tmp_path_factory, "plain", args=["--memory", "512M", "--workers", "2"])
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def tls_srv(tmp_path_factory, tls_cert):
    srv = module_server(tmp_path_factory, "tls", args=["--memory", "256M", "--workers", "2"], tls=tls_cert)
    yield srv
    srv.stop()


class Tx:
    """One transport bound to one server: tx(method, path, body=, headers=, token=)."""

    def __init__(self, server, mode):
        self.server = server
        self.mode = mode

    def __call__(self, method, path, body=None, headers=None, token=_DEFAULT, timeout=20.0):
        if self.mode.startswith("py"):
            return self.server.request(method, path, body=body, headers=headers, token=token, timeout=timeout)
        return self.server.curl(self.mode, method, path, body=body, headers=headers, token=token, timeout=timeout)

    def __repr__(self):
        return f"Tx({self.mode})"


def _tx_for(request, mode, plain_srv, tls_server):
    srv = tls_server if "tls" in mode else plain_srv
    return Tx(srv, mode)


@pytest.fixture(params=TRANSPORTS)
def tx(request, plain, tls_srv):
    return _tx_for(request, request.param, plain, tls_srv)


@pytest.fixture(params=FEW_TRANSPORTS)
def tx_few(request, plain, tls_srv):
    return _tx_for(request, request.param, plain, tls_srv)


def assert_block(resp, data):
    assert resp.status == 200, resp
    assert resp.body == data, f"block bytes differ (got {len(resp.body)} bytes, want {len(data)})"
    assert resp.header("content-type", "").startswith("application/octet-stream"), resp
    if resp.header("content-length") is not None:
        assert int(resp.header("content-length")) == len(data), resp


def assert_exists(resp, key, expected):
    assert resp.status == 200, resp
    assert "json" in resp.header("content-type", ""), resp
    j = resp.json()
    assert j.get("exists") is expected, resp
    assert j.get("hash") in (key, quote_key(key)), f"exists.hash should name the key {key!r}: {resp!r}"


def assert_no_body(resp):
    assert resp.body == b"", f"HEAD must not carry a body: {resp!r}"


# ---------------------------------------------------------------------------------------------
# §1 surface


def test_block_lifecycle(tx):
    key = unique_key("life")
    p = kv_path(key)
    a = make_block(1000, key + "a")
    b = make_block(1000, key + "b")

    assert_error(tx("GET", p), 404, "NoSuchBlock")
    r = tx("HEAD", p)
    assert r.status == 404, r
    assert_no_body(r)
    assert_exists(tx("GET", p + "/exists"), key, False)

    assert tx("PUT", p, body=a).status == 201
    assert_block(tx("GET", p), a)
    r = tx("HEAD", p)
    assert r.status == 200, r
    assert_no_body(r)
    if r.header("content-length") is not None:
        assert int(r.header("content-length")) == len(a), f"HEAD Content-Length must be the block's: {r!r}"
    assert_exists(tx("GET", p + "/exists"), key, True)

    # Dedup hits: same bytes, then same length with other bytes: 200, first writer's bytes stay.
    assert tx("PUT", p, body=a).status == 200
    assert tx("PUT", p, body=b).status == 200
    assert_block(tx("GET", p), a)

    for left in (2, 1, 0):
        r = tx("DELETE", p)
        assert r.status == 200, r
        assert "json" in r.header("content-type", ""), r
        j = r.json()
        assert j.get("refs") == left, r
        assert j.get("hash") in (key, quote_key(key)), r

    assert_error(tx("GET", p), 404, "NoSuchBlock")
    r = tx("HEAD", p)
    assert r.status == 404 and r.body == b"", r
    assert_exists(tx("GET", p + "/exists"), key, False)
    assert_error(tx("DELETE", p), 404, "NoSuchBlock")


def test_stats_shape(tx):
    r = tx("GET", "/kv/stats")
    assert r.status == 200, r
    assert "json" in r.header("content-type", ""), r
    s = r.json()
    for f in STATS_FIELDS + STATS_EXTRA:
        assert isinstance(s.get(f), int) and not isinstance(s.get(f), bool) and s[f] >= 0, f"{f}: {s}"
    assert s["dedup_savings_bytes"] == s["logical_bytes"] - s["resident_bytes"], s
    assert s["total_refs"] >= s["unique_blocks"], s
    assert s["logical_bytes"] >= s["resident_bytes"], s
    assert 0 < s["capacity_bytes"] and s["resident_bytes"] <= s["capacity_bytes"], s


def test_probes(tx):
    for p in ("/healthz", "/readyz"):
        r = tx("GET", p)
        assert r.status == 200, (p, r)


def test_unknown_path_is_404(tx_few):
    assert tx_few("GET", "/nope").status == 404
    assert tx_few("GET", "/kvx/abc").status == 404


KEYS = [
    "a/b/c",
    "a+b",
    "a=b==",
    "with space",
    "user@host",
    "meta-llama/Llama-3@000000ff@0@00010203",
    "meta-llama/Llama-3@01000100@0@9f86d081884c7d65@alice",
    "0123456789abcdef",
    "q?x=1&y=2#frag",
    "%41 a literal percent",
    "\u00fcn\u00efc\u00f8d\u00e9/\u6f22\u5b57",
    "/leading/and/trailing/",
    "exists",
]


@pytest.mark.parametrize("key", KEYS, ids=[f"key{i}" for i in range(len(KEYS))])
def test_keys_percent_encoded(tx, key):
    """Keys reach the server as quote(key, safe='') like the reference driver sends them."""
    tag = unique_key("enc")
    key = f"{tag}/{key}"
    p = kv_path(key)
    data = make_block(333, key)
    assert tx("PUT", p, body=data).status == 201
    assert_block(tx("GET", p), data)
    assert tx("HEAD", p).status == 200
    assert_exists(tx("GET", p + "/exists"), key, True)
    r = tx("DELETE", p)
    assert r.status == 200 and r.json().get("refs") == 0, r
    assert tx("GET", p).status == 404


def test_plus_is_not_space(tx_few):
    tag = unique_key("plus")
    data = make_block(100, tag)
    assert tx_few("PUT", kv_path(f"{tag}+x"), body=data).status == 201
    assert tx_few("GET", kv_path(f"{tag} x")).status == 404
    # raw '+' in the path is a literal plus too
    assert_block(tx_few("GET", f"/kv/{tag}+x"), data)
    assert tx_few("DELETE", f"/kv/{tag}%2Bx").status == 200


def test_raw_and_encoded_forms_are_one_key(tx_few):
    """A raw '/' (and '@') in the path is part of the key: the raw and the percent-encoded
    spellings of an LMCache key address the same block."""
    tag = unique_key("raw")
    key = f"meta-llama/Llama-3@000000ff@0@00010203-{tag}"
    data = make_block(4096, key)
    assert tx_few("PUT", "/kv/" + key, body=data).status == 201
    assert_block(tx_few("GET", kv_path(key)), data)
    assert tx_few("PUT", kv_path(key), body=data).status == 200  # dedup on the same key
    assert_exists(tx_few("GET", "/kv/" + key + "/exists"), key, True)
    assert_exists(tx_few("GET", kv_path(key) + "/exists"), key, True)
    # a partially encoded spelling decodes to the same key
    mixed = "/kv/meta-llama%2FLlama-3%40000000ff@0@00010203-" + tag
    assert_block(tx_few("GET", mixed), data)
    assert tx_few("DELETE", "/kv/" + key).json().get("refs") == 1
    assert tx_few("DELETE", kv_path(key)).json().get("refs") == 0


def test_routing_is_on_the_raw_path(tx_few):
    """'/exists' and 'stats' are routes only in their raw spelling; encoded they are key bytes."""
    tag = unique_key("route")
    k1 = f"{tag}/exists"  # sent as ...%2Fexists: a block key, not a probe
    d1 = make_block(200, k1)
    assert tx_few("PUT", kv_path(k1), body=d1).status == 201
    assert_block(tx_few("GET", kv_path(k1)), d1)
    # the probe route for the key k1 itself
    assert_exists(tx_few("GET", kv_path(k1) + "/exists"), k1, True)
    # the probe of the key `tag` (absent) — raw "/exists" suffix
    assert_exists(tx_few("GET", kv_path(tag) + "/exists"), tag, False)
    # the key "stats" spelled %73tats is a block; /kv/stats is still the stats route
    d2 = make_block(50, tag + "stats")
    r = tx_few("PUT", "/kv/%73tats", body=d2)
    assert r.status in (200, 201), r
    got = tx_few("GET", "/kv/%73tats")
    assert got.status == 200 and got.header("content-type", "").startswith("application/octet-stream"), got
    s = tx_few("GET", "/kv/stats")
    assert s.status == 200 and "unique_blocks" in s.json(), s
    tx_few("DELETE", "/kv/%73tats")
    tx_few("DELETE", kv_path(k1))


def test_key_length_limits(tx_few):
    tag = unique_key("len")
    k1024 = (tag + "a" * 1024)[:1024]
    d = make_block(64, k1024)
    assert tx_few("PUT", kv_path(k1024), body=d).status == 201
    assert_block(tx_few("GET", kv_path(k1024)), d)
    assert_exists(tx_few("GET", kv_path(k1024) + "/exists"), k1024, True)
    assert tx_few("DELETE", kv_path(k1024)).status == 200

    k1025 = k1024 + "b"
    for method, body in (("GET", None), ("PUT", d), ("DELETE", None)):
        assert_error(tx_few(method, kv_path(k1025), body=body), 400, "InvalidRequest")
    assert_error(tx_few("GET", kv_path(k1025) + "/exists"), 400, "InvalidRequest")
    r = tx_few("HEAD", kv_path(k1025))
    assert r.status == 400 and r.body == b"", r

    # The limit is on the decoded key: 1024 encoded slashes (3072 path bytes) are fine...
    slashes = "/" * 1023 + tag[-1]
    assert tx_few("PUT", kv_path(slashes), body=d).status in (200, 201)
    assert tx_few("DELETE", kv_path(slashes)).status == 200
    # ...and 512 two-byte UTF-8 characters are 1024 bytes; one more byte is too long.
    utf = "\u00e9" * 512
    assert tx_few("PUT", kv_path(utf), body=d).status in (200, 201)
    assert tx_few("DELETE", kv_path(utf)).status == 200
    assert_error(tx_few("PUT", kv_path(utf + "x"), body=d), 400, "InvalidRequest")


BAD_KEY_PATHS = {
    "pct-zz": "/kv/%zz",
    "pct-trailing": "/kv/abc%",
    "pct-one-digit": "/kv/abc%4",
    "pct-G": "/kv/%G1abc",
    "nul": "/kv/a%00b",
    "nul-only": "/kv/%00",
    "empty": "/kv/",
    "empty-exists": "/kv//exists",
    "nul-exists": "/kv/a%00/exists",
}


BAD_KEY_CASES = [
    (case, method)
    for case in sorted(BAD_KEY_PATHS)
    for method in (["GET"] if BAD_KEY_PATHS[case].endswith("/exists") else ["GET", "PUT", "DELETE", "HEAD"])
]


@pytest.mark.parametrize("case,method", BAD_KEY_CASES, ids=[f"{c}-{m}" for c, m in BAD_KEY_CASES])
def test_bad_keys_are_400(tx_few, case, method):
    path = BAD_KEY_PATHS[case]
    body = b"x" * 10 if method == "PUT" else None
    r = tx_few(method, path, body=body)
    if method == "HEAD":
        assert r.status == 400 and r.body == b"", r
    else:
        assert_error(r, 400, "InvalidRequest")


METHOD_NOT_ALLOWED = [
    ("POST", "/kv/x405", {"GET", "PUT", "HEAD", "DELETE"}),
    ("PATCH", "/kv/x405", {"GET", "PUT", "HEAD", "DELETE"}),
    ("PUT", "/kv/stats", {"GET"}),
    ("DELETE", "/kv/stats", {"GET"}),
    ("POST", "/kv/stats", {"GET"}),
    ("PUT", "/kv/x405/exists", {"GET"}),
    ("DELETE", "/kv/x405/exists", {"GET"}),
]


@pytest.mark.parametrize("method,path,allow", METHOD_NOT_ALLOWED, ids=[f"{m} {p}" for m, p, _ in METHOD_NOT_ALLOWED])
def test_405_with_allow(tx_few, method, path, allow):
    body = b"abc" if method in ("POST", "PUT", "PATCH") else None
    r = tx_few(method, path, body=body)
    assert_error(r, 405, "MethodNotAllowed")
    hdr = r.header("allow")
    assert hdr, f"405 needs an Allow header: {r!r}"
    got = {m.strip().upper() for m in hdr.split(",")}
    assert allow <= got, f"Allow {hdr!r} should list {sorted(allow)}"
    if path == "/kv/stats":
        assert not ({"PUT", "DELETE", "POST"} & got), f"Allow {hdr!r} lists methods stats refuses"
    if path == "/kv/x405":
        assert tx_few("GET", path).status == 404, "a refused method must not have stored anything"


def test_conflict_409(tx):
    key = unique_key("conf")
    p = kv_path(key)
    a = make_block(100, key)
    assert tx("PUT", p, body=a).status == 201
    for n in (101, 99):
        assert_error(tx("PUT", p, body=make_block(n, key + str(n))), 409, "Conflict")
    assert_block(tx("GET", p), a)
    r = tx("DELETE", p)
    assert r.status == 200 and r.json()["refs"] == 0, f"conflicting PUTs must not add references: {r!r}"


SEQ_OK = ["0", "12345", "18446744073709551615", "0x0", "0xdeadbeef", "0xFFFFFFFFFFFFFFFF", "0x00000000000000ff"]
SEQ_BAD = ["abc", "0x", "-1", "18446744073709551616", "0x10000000000000000", "12 34", "1.5", "0xg1", "1e3", "0x-1"]


@pytest.mark.parametrize("value", SEQ_OK)
def test_sequence_hash_accepted(tx_few, value):
    key = unique_key("seq")
    d = make_block(128, key)
    assert tx_few("PUT", kv_path(key), body=d, headers={"X-KV-Sequence-Hash": value}).status == 201
    assert_block(tx_few("GET", kv_path(key)), d)
    assert tx_few("DELETE", kv_path(key)).status == 200


@pytest.mark.parametrize("value", SEQ_BAD)
def test_sequence_hash_malformed_is_400(tx_few, value):
    key = unique_key("seqbad")
    r = tx_few("PUT", kv_path(key), body=b"abcdef", headers={"X-KV-Sequence-Hash": value})
    assert_error(r, 400, "InvalidRequest")
    assert tx_few("GET", kv_path(key)).status == 404, "a refused PUT must store nothing"


@pytest.mark.parametrize("size", [1, 32 * MiB + 1, 40 * MiB])
def test_block_sizes_roundtrip(tx, size):
    """Bodies above h2o's 32 MB spill threshold, and a 1-byte body."""
    key = unique_key(f"size{size}")
    d = make_block(size, key)
    r = tx("PUT", kv_path(key), body=d, timeout=60)
    assert r.status == 201, r
    assert_block(tx("GET", kv_path(key), timeout=60), d)
    assert tx("DELETE", kv_path(key)).status == 200


def test_80mib_chunk_of_a_70b_model(plain):
    """The reference's 64 MiB cap is a gap: an 80 MiB chunk must work (default cap 256M)."""
    key = unique_key("70b")
    d = make_block(80 * MiB, key)
    assert plain.put(key, d, timeout=60).status == 201
    r = plain.get(key, timeout=60)
    assert r.status == 200 and r.body == d, "80 MiB block did not round-trip"
    assert plain.delete(key).status == 200


def test_keepalive_http_client(plain):
    """Many requests, successes and errors mixed, on one http.client connection: the server
    never closes it."""
    conn = plain.connection()
    try:
        conn.connect()
        sock = conn.sock
        tag = unique_key("ka")
        n = 0
        for i in range(60):
            key = f"{tag}-{i % 7}"
            d = make_block(512 + (i % 7), key)
            steps = [
                ("PUT", kv_path(key), d, (200, 201)),
                ("GET", kv_path(key), None, (200,)),
                ("HEAD", kv_path(key), None, (200,)),
                ("GET", kv_path(key) + "/exists", None, (200,)),
                ("GET", kv_path(tag + "-missing"), None, (404,)),
                ("HEAD", kv_path(tag + "-missing"), None, (404,)),
                ("GET", "/kv/%zz", None, (400,)),
                ("POST", kv_path(key), b"x", (405,)),
                ("PUT", kv_path(key), d + b"!", (409,)),
                ("GET", "/kv/stats", None, (200,)),
            ]
            for method, path, body, ok in steps:
                conn.request(method, path, body=body)
                r = conn.getresponse()
                data = r.read()
                n += 1
                assert r.status in ok, (method, path, r.status, data[:200])
                assert not r.will_close, f"server closed keep-alive after {method} {path} -> {r.status}"
                assert conn.sock is sock, "the connection was replaced"
                if method == "GET" and r.status == 200 and "exists" not in path and "stats" not in path:
                    assert data == d
        assert n == 600
    finally:
        conn.close()


@pytest.mark.parametrize("mode", ["curl-h1", "curl-tls-h1", "curl-tls-h2"])
def test_keepalive_curl(plain, tls_srv, mode):
    srv = tls_srv if "tls" in mode else plain
    paths = ["/kv/stats", "/healthz", kv_path(unique_key("miss"))] * 8
    rows = curl_multi(srv.base_url, mode, paths)
    assert [c for c, _ in rows] == [200, 200, 404] * 8, rows
    assert sum(n for _, n in rows) == 1, f"curl needed {sum(n for _, n in rows)} connections: {rows}"


def h2load_sequential(srv, prefix, size):
    """PUTs a block, then GETs it 200 times one after another on one h2c connection (h2load);
    returns h2load's report."""
    key = unique_key(prefix)
    assert srv.put(key, make_block(size, key)).status == 201
    p = subprocess.run(
        ["h2load", "-n", "200", "-c", "1", "-m", "1", srv.base_url + kv_path(key)],
        capture_output=True, timeout=60 * SLOW,
    )
    out = p.stdout.decode()
    assert p.returncode == 0, out + p.stderr.decode()
    return out


def test_keepalive_h2c(plain):
    """200 sequential requests on one h2c (prior knowledge) connection, with h2load (curl
    7.88 cannot reuse a prior-knowledge connection: curl/curl#10634)."""
    out = h2load_sequential(plain, "h2ka", 10000)
    assert "requests: 200 total, 200 started, 200 done, 200 succeeded, 0 failed" in out, out
    assert "status codes: 200 2xx" in out, out


def test_h2o_requests_do_not_wait_for_the_tick(plain):
    """The worker's loop waits in its io_uring ring and polls h2o's epoll descriptor through it
    (docs/dataplane.md "One wait per turn"): an h2c request is served when it arrives, not at
    the loop's next 50 ms tick. 200 sequential requests on one connection; were h2o run only at
    the tick, a request would wait for it: 50 ms on average, measured with the poll left out."""
    log = plain.log_text()
    if "io engine: epoll" in log:
        pytest.skip("io_uring is denied here: the loop waits in h2o")
    assert log.count("the loop waits in the io_uring ring") == len(plain.worker_pids()), plain.log_tail(30)
    out = h2load_sequential(plain, "h2tick", 1000)
    assert "200 succeeded" in out, out
    m = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    assert m, out
    mean = m.group(3)
    mean_ms = float(mean[:-2]) if mean.endswith("ms") else float(mean[:-2]) / 1000 if mean.endswith("us") else float(mean[:-1]) * 1000
    assert mean_ms < 10 * min(SLOW, 2), f"h2c requests took {mean} on average: {out}"


def test_an_idle_worker_sleeps(plain):
    """Waiting in the ring must not turn into a busy loop (a poll of h2o's descriptor that keeps
    firing, h2o said to have work when it has none): with an idle HTTP/1.1 keep-alive
    connection and an idle h2c connection open (h2o's side: its sockets and timers), no worker
    uses more than a tenth of a core over 2 s. A worker that spun would use all of it."""
    from h1_raw import _cpu_s

    h1 = raw_connect(plain)
    h2 = raw_connect(plain)
    try:
        h1.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in h1.recv(4096)
        h2.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        assert h2.recv(4096)[3:4] == b"\x04"  # the server's SETTINGS: h2o holds the connection
        time.sleep(0.5)
        pids = plain.worker_pids()
        before = {p: _cpu_s(p) for p in pids}
        time.sleep(2)
        used = {p: _cpu_s(p) - before[p] for p in pids}
        assert all(u < 0.2 * SLOW for u in used.values()), f"worker CPU seconds in 2 s idle: {used}"
    finally:
        h1.close()
        h2.close()


def test_plain_port_of_tls_server_refuses_cleartext(tls_srv):
    """The TLS listener speaks TLS: a cleartext request never gets a 2xx."""
    s = raw_connect(tls_srv)
    try:
        s.sendall(b"GET /kv/stats HTTP/1.1\r\nHost: x\r\n\r\n")
        r = read_one_response(s, 5.0)
        assert not (200 <= r.status < 300), r
    finally:
        s.close()


def test_store_consistent_after_contract_traffic(plain, tls_srv):
    plain.assert_consistent()
    tls_srv.assert_consistent()


# ---------------------------------------------------------------------------------------------
# Exact accounting, capacity and eviction: each on a fresh server.


def test_dedup_accounting_exact(kvrelay):
    """The §1 example, with requests spread over both workers (fresh connection each)."""
    srv = kvrelay("--memory", "64M", "--workers", "2")
    d = make_block(100, "dup")
    assert srv.put("dup", d).status == 201
    assert srv.put("dup", d).status == 200
    s = srv.stats()
    want = dict(unique_blocks=1, total_refs=2, resident_bytes=100, logical_bytes=200,
                dedup_savings_bytes=100, dedup_hits=1, get_hits=0, get_misses=0,
                put_new=1, put_conflicts=0, deletes=0, evictions=0, evicted_bytes=0)
    assert {k: s.get(k) for k in want} == want

    assert srv.get("dup").body == d
    assert srv.get("nope").status == 404
    assert srv.put("dup", d + b"x").status == 409
    s = srv.stats()
    assert (s["get_hits"], s["get_misses"], s["put_conflicts"]) == (1, 1, 1), s
    srv.assert_consistent()

    r = srv.delete("dup")
    assert r.status == 200 and r.json()["refs"] == 1, r
    s = srv.stats()
    assert (s["unique_blocks"], s["total_refs"], s["resident_bytes"], s["logical_bytes"],
            s["dedup_savings_bytes"], s["deletes"]) == (1, 1, 100, 100, 0, 1), s
    r = srv.delete("dup")
    assert r.status == 200 and r.json()["refs"] == 0, r
    s = srv.stats()
    assert (s["unique_blocks"], s["total_refs"], s["resident_bytes"], s["logical_bytes"],
            s["deletes"]) == (0, 0, 0, 0, 2), s
    assert srv.get("dup").status == 404
    assert srv.delete("dup").status == 404
    assert srv.stats()["dedup_hits"] == 1
    d2, _ = srv.assert_consistent()
    assert d2["unique_blocks"] == 0 and d2["resident_bytes"] == 0, d2


def test_capacity_is_memory_flag(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    assert srv.stats()["capacity_bytes"] == 64 * MiB


def test_eviction_lru(kvrelay):
    """--memory 64M: PUT 110 x 1 MiB while one block stays hot. The least recently used
    blocks go, the hot one and the newest stay, and accounting adds up."""
    srv = kvrelay("--memory", "64M", "--workers", "2")
    conn = srv.connection()
    blocks = {}
    try:
        def put(i):
            d = make_block(MiB, f"ev{i}")
            blocks[i] = d
            r = srv.request("PUT", kv_path(f"ev{i}"), body=d, conn=conn)
            assert r.status == 201, (i, r)

        def touch_hot():
            r = srv.request("GET", kv_path("ev0"), conn=conn)
            assert r.status == 200 and r.body == blocks[0], f"hot block evicted: {r!r}"

        for i in range(110):
            put(i)
            if i % 8 == 0:
                touch_hot()
    finally:
        conn.close()

    s = srv.stats()
    assert s["evictions"] > 0, s
    assert s["evicted_bytes"] == s["evictions"] * MiB, s
    assert s["unique_blocks"] + s["evictions"] == 110, s
    assert s["resident_bytes"] <= 64 * MiB, s
    assert s["unique_blocks"] >= 56, f"64M should hold ~64 blocks of 1 MiB: {s}"

    present = {}
    for i in range(110):
        r = srv.get(f"ev{i}")
        assert r.status in (200, 404), r
        if r.status == 200:
            assert r.body == blocks[i], f"block ev{i} corrupted"
        else:
            assert_error(r, 404, "NoSuchBlock")
        present[i] = r.status == 200
    assert present[0], "the recently used block was evicted"
    assert not any(present[i] for i in range(1, 11)), "the oldest blocks should be evicted first"
    assert all(present[i] for i in range(80, 110)), "the newest blocks should stay"
    # strict LRU: the survivors among 1..109 are a suffix
    first = min(i for i in range(1, 110) if present[i])
    assert all(present[i] for i in range(first, 110)), f"eviction not in LRU order: {present}"
    srv.assert_consistent()


def test_insufficient_storage_no_evict(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2", "--no-evict")
    stored = {}
    status = None
    for i in range(80):
        d = make_block(MiB, f"ne{i}")
        r = srv.put(f"ne{i}", d)
        if r.status == 507:
            status = r
            break
        assert r.status == 201, r
        stored[i] = d
    assert status is not None, "PUT never got 507 with --no-evict after 80 MiB into 64M"
    assert_error(status, 507, "InsufficientStorage")
    assert len(stored) >= 56, f"only {len(stored)} MiB fit into 64M"
    for i, d in stored.items():
        r = srv.get(f"ne{i}")
        assert r.status == 200 and r.body == d, f"ne{i} damaged after 507"
    s = srv.stats()
    assert s["evictions"] == 0 and s["unique_blocks"] == len(stored), s
    assert srv.get(f"ne{len(stored)}").status == 404
    # space freed by DELETE is reusable
    assert srv.delete("ne0").status == 200
    assert srv.put("ne-after", make_block(MiB, "after")).status == 201
    srv.assert_consistent()


def test_block_larger_than_memory_is_413(kvrelay):
    """A block the arena could never hold is over the effective --max-block-size (clamped to
    the arena at start): 413 from its head, not a 507 after its body (test_effective_max_block_size)."""
    srv = kvrelay("--memory", "64M", "--workers", "1")
    small = make_block(4096, "small")
    assert srv.put("small", small).status == 201
    r = srv.put("huge", make_block(65 * MiB, "huge"), timeout=60)
    assert_error(r, 413, "EntityTooLarge")
    assert srv.get("huge").status == 404
    assert srv.put("small2", small).status == 201
    srv.assert_consistent()


def _stalled_get(srv, key):
    """Starts a GET of key on a raw socket with a tiny receive buffer and reads only the
    first bytes: the server is left holding the block (a pin) while it cannot send."""
    s = raw_connect(srv, rcvbuf=65536, timeout=30)
    s.sendall(f"GET {kv_path(key)} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    head = s.recv(1024)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s, head


def _drain(sock, limit_s):
    buf = bytearray()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            c = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not c:
            break
        buf += c
    return bytes(buf)


def test_pinned_blocks_507_and_deferred_free(kvrelay):
    """Blocks being sent are pinned: never evicted (507 instead), and a DELETE of a block in
    flight frees it only when the GET has sent every byte."""
    # --min-body-rate 0 turns the rate check off (src/io/h1_deadline.c): the stalled GETs
    # must stay pinned however long a loaded machine takes, not be cut as slow readers.
    srv = kvrelay("--memory", "64M", "--workers", "2", "--io-timeout", "60s", "--min-body-rate", "0")
    a, b = make_block(30 * MiB, "pa"), make_block(30 * MiB, "pb")
    assert srv.put("pa", a).status == 201
    assert srv.put("pb", b).status == 201
    sa, ha = _stalled_get(srv, "pa")
    sb, hb = _stalled_get(srv, "pb")
    try:
        def two_pinned():
            d = srv.debug_store()
            return d if d["pinned_blocks"] == 2 else None

        wait_until(two_pinned, 10 * SLOW, what="two GETs in flight to pin two blocks")
        r = srv.put("pc", make_block(30 * MiB, "pc"))
        assert_error(r, 507, "InsufficientStorage")

        r = srv.delete("pa")
        assert r.status == 200 and r.json()["refs"] == 0, r
        assert srv.get("pa").status == 404, "a deleted block must leave the index at once"
        d = srv.debug_store()
        assert d["zombie_blocks"] == 1 and d["unique_blocks"] == 1, d

        # the in-flight GET still receives the complete, untouched bytes
        for sock, head, want in ((sa, ha, a), (sb, hb, b)):
            sock.settimeout(10 * SLOW)
            rest = _drain_response(sock, head, len(want))
            assert rest == want, "in-flight GET received damaged bytes"
    finally:
        sa.close()
        sb.close()
    srv.assert_consistent()
    assert srv.put("pc", make_block(30 * MiB, "pc")).status == 201, "deferred free never happened"
    assert srv.get("pb").body == b
    srv.assert_consistent()


def _drain_response(sock, head, length):
    buf = bytearray(head)
    deadline = time.monotonic() + 30 * SLOW
    while time.monotonic() < deadline:
        h, sep, body = bytes(buf).partition(b"\r\n\r\n")
        if sep and len(body) >= length:
            return body[:length]
        try:
            c = sock.recv(1 << 20)
        except socket.timeout:
            continue
        if not c:
            break
        buf += c
    h, sep, body = bytes(buf).partition(b"\r\n\r\n")
    return body


# ---------------------------------------------------------------------------------------------
# Body cap


@pytest.fixture(scope="module")
def capped(tmp_path_factory):
    srv = module_server(tmp_path_factory, "capped", args=["--memory", "64M", "--workers", "1", "--max-block-size", "1M"])
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["raw-h1", "curl-h1", "curl-h2c"])
def test_max_block_size_413(capped, mode):
    key = unique_key("cap")
    exact = make_block(MiB, key)
    key2 = unique_key("cap")
    over = make_block(MiB + 1, key2)
    if mode == "raw-h1":
        # A reader thread collects the early 413 while the body is still being sent (h2o
        # closes right after answering; a client that only reads after sending everything,
        # like http.client, can lose the answer to the resulting reset).
        assert capped.put(key, exact).status == 201
        head = f"PUT {kv_path(key2)} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(over)}\r\n\r\n".encode()
        got = send_while_reading(capped, head, [over[i:i + 65536] for i in range(0, len(over), 65536)])
        status = parse_raw_response(got)[0]
        assert status == 413, got[:300]
    else:
        tx = Tx(capped, mode)
        assert tx("PUT", kv_path(key), body=exact).status == 201
        r = tx("PUT", kv_path(key2), body=over)
        if mode == "curl-h2c" and r.status == 0:
            # h2o refuses an oversized HTTP/2 request stream (REFUSED_STREAM) rather than 413;
            # curl retries a refused stream and gives up with rc 56 (or reports 92/16)
            assert any(f"rc={n}:" in (r.error or "") for n in (56, 92, 16)), r
        else:
            assert r.status == 413, r
    assert capped.get(key2).status == 404
    assert capped.get(key).body == exact


def _head_answer(srv, head):
    """Sends a PUT head only and reads the answer: a server that waited for the body would
    let this time out."""
    s = raw_connect(srv)
    try:
        s.sendall(head)
        r = read_one_response(s, 5 * SLOW)
        rest = b""
        if r.status:
            try:
                rest = s.recv(4096)
            except OSError:
                pass
        return r, rest
    finally:
        s.close()


@pytest.fixture(scope="module")
def small_arena(tmp_path_factory):
    """--memory 64M with the default --max-block-size (256M): clamped at start."""
    srv = module_server(tmp_path_factory, "smallarena", args=["--memory", "64M", "--workers", "1"])
    yield srv
    srv.stop()


def test_effective_max_block_size_is_logged_and_in_stats(small_arena):
    eff = 64 * MiB - 1024  # the arena less the longest key: fits an empty store under any key
    assert small_arena.stats()["max_block_size"] == eff
    assert re.search(rf"INFO max block size {eff} bytes: --max-block-size {256 * MiB} ", small_arena.log_text()), \
        small_arena.log_tail(40)


@pytest.mark.parametrize("expect", [False, True])
def test_block_over_effective_max_is_413_from_its_head(small_arena, expect):
    """Content-Length one byte over the effective maximum: 413 without any body sent; with
    Expect: 100-continue no 100 comes first. The connection closes after it."""
    eff = small_arena.stats()["max_block_size"]
    key = unique_key("over")
    head = (f"PUT {kv_path(key)} HTTP/1.1\r\nHost: x\r\nContent-Length: {eff + 1}\r\n"
            + ("Expect: 100-continue\r\n" if expect else "") + "\r\n").encode()
    r, rest = _head_answer(small_arena, head)
    assert_error(r, 413, "EntityTooLarge")
    assert r.header("connection") == "close", r
    assert rest == b"", rest
    assert small_arena.get(key).status == 404


def test_block_at_effective_max_is_stored(small_arena):
    """Exactly the effective maximum under the longest key fills the empty arena: 100 Continue,
    201, and the bytes come back whole."""
    eff = small_arena.stats()["max_block_size"]
    key = "m" * 1024
    data = make_block(eff, "effmax")
    s = raw_connect(small_arena, timeout=60)
    try:
        s.sendall(f"PUT {kv_path(key)} HTTP/1.1\r\nHost: x\r\nContent-Length: {eff}\r\n"
                  "Expect: 100-continue\r\n\r\n".encode())
        assert read_one_response(s, 5 * SLOW).status == 100
        s.sendall(data)
        r = read_one_response(s, 60 * SLOW)
        assert r.status == 201, r
    finally:
        s.close()
    g = small_arena.get(key, timeout=60)
    assert g.status == 200 and g.body == data
    assert small_arena.delete(key).status == 200
    small_arena.assert_consistent()


# ---------------------------------------------------------------------------------------------
# Auth

TOKEN = "s3cret-T0ken"
AUTH_ROUTES = [
    ("GET", "/kv/authkey"),
    ("PUT", "/kv/authkey"),
    ("HEAD", "/kv/authkey"),
    ("DELETE", "/kv/authkey"),
    ("GET", "/kv/authkey/exists"),
    ("GET", "/kv/stats"),
    ("GET", "/metrics"),
    ("GET", "/debug/store"),
]
BAD_AUTH = {
    "missing": None,
    "wrong": "Bearer nope",
    "prefix": f"Bearer {TOKEN[:-1]}",
    "longer": f"Bearer {TOKEN}X",
    "empty": "Bearer ",
    "no-scheme": TOKEN,
    "basic": "Basic czNjcmV0LVQwa2VuOg==",
}


@pytest.fixture(scope="module")
def auth_srv(tmp_path_factory):
    srv = module_server(tmp_path_factory, "auth", args=["--memory", "64M", "--workers", "2", "--token", TOKEN], token=TOKEN)
    yield srv
    srv.stop()


@pytest.mark.parametrize("mode", ["py", "curl-h2c"])
@pytest.mark.parametrize("bad", sorted(BAD_AUTH))
def test_auth_refused(auth_srv, mode, bad):
    tx = Tx(auth_srv, mode)
    hdr = BAD_AUTH[bad]
    headers = {"Authorization": hdr} if hdr is not None else None
    for method, path in AUTH_ROUTES:
        body = b"data" if method == "PUT" else None
        r = tx(method, path, body=body, headers=headers, token=None)
        if method == "HEAD":
            assert r.status == 401 and r.body == b"", (method, path, r)
        else:
            assert_error(r, 401, "Unauthorized")
    # nothing was stored by the refused PUT; the right token works
    assert tx("GET", "/kv/authkey").status == 404
    for p in ("/healthz", "/readyz"):
        r = tx("GET", p, headers=headers, token=None)
        assert r.status == 200, (p, r)


def test_auth_accepted(auth_srv):
    d = make_block(64, "authok")
    k = unique_key("auth")
    assert auth_srv.put(k, d).status == 201
    assert auth_srv.get(k).body == d
    assert auth_srv.request("GET", "/metrics").status == 200
    assert auth_srv.request("GET", "/debug/store").status == 200
    assert auth_srv.delete(k).status == 200


def _assert_token_guard(srv, good, bad=None):
    assert srv.request("GET", "/kv/stats", token=None).status == 401
    assert srv.request("GET", "/kv/stats", token=good).status == 200
    if bad is not None:
        assert srv.request("GET", "/kv/stats", token=bad).status == 401
    assert srv.request("GET", "/healthz", token=None).status == 200


def test_token_file(kvrelay, tmp_path):
    tf = tmp_path / "token"
    tf.write_text("file-token-123")
    os.chmod(tf, 0o600)
    srv = kvrelay("--memory", "64M", "--workers", "1", "--token-file", str(tf))
    _assert_token_guard(srv, "file-token-123", "file-token-12")


@pytest.mark.parametrize("var", ["KVRELAY_TOKEN", "EPISTEMIC_GRAPH_KVCACHE_TOKEN"])
def test_token_from_env(kvrelay, var):
    srv = kvrelay("--memory", "64M", "--workers", "1", env={var: "env-token"})
    _assert_token_guard(srv, "env-token", "wrong")


def test_token_precedence(kvrelay):
    """flag > KVRELAY_TOKEN > EPISTEMIC_GRAPH_KVCACHE_TOKEN."""
    srv = kvrelay("--memory", "64M", "--workers", "1",
                  env={"KVRELAY_TOKEN": "kv", "EPISTEMIC_GRAPH_KVCACHE_TOKEN": "eg"})
    _assert_token_guard(srv, "kv", "eg")
    srv2 = kvrelay("--memory", "64M", "--workers", "1", "--token", "flag", env={"KVRELAY_TOKEN": "kv"})
    _assert_token_guard(srv2, "flag", "kv")


# ---------------------------------------------------------------------------------------------
# Command line and configuration


def test_help():
    p = run_binary(["--help"])
    assert p.returncode == 0, p
    text = (p.stdout + p.stderr).decode()
    for flag in ("--http-bind", "--grpc-bind", "--memory", "--workers", "--no-evict", "--max-block-size",
                 "--token", "--token-file", "--tls-cert", "--tls-key", "--shutdown-grace",
                 "--io-timeout", "--idle-timeout", "--log-level", "--port-file", "--print-config"):
        assert flag in text, f"--help does not mention {flag}"


@pytest.mark.parametrize("args", [["--no-such-flag"], ["--memory", "lots"], ["--workers", "-3"],
                                  ["--http-bind", "nohostport"], ["--shutdown-grace", "soon"],
                                  ["--log-level", "chatty"], ["--max-block-size", "0x"]])
def test_bad_command_line_exits_nonzero(args):
    p = run_binary(args + ["--print-config"])
    assert p.returncode != 0, f"{args} was accepted: {p.stdout!r}"
    assert p.stderr.strip(), "a refused command line must say why on stderr"


def print_config(args=(), env=None):
    p = run_binary(["--print-config", *args], env=env)
    assert p.returncode == 0, p
    return parse_kv_lines(p.stdout.decode())


def test_print_config_defaults():
    c = print_config()
    assert c.get("http-bind") == "127.0.0.1:9130", c
    assert c.get("grpc-bind") == "127.0.0.1:5561", c


EPISTEMIC_ADDR = [
    ("1", "127.0.0.1:9130"),
    ("true", "127.0.0.1:9130"),
    ("yes", "127.0.0.1:9130"),
    ("on", "127.0.0.1:9130"),
    ("7001", "127.0.0.1:7001"),
    ("0.0.0.0:7002", "0.0.0.0:7002"),
    ("10.1.2.3:7003", "10.1.2.3:7003"),
]


@pytest.mark.parametrize("value,bind", EPISTEMIC_ADDR)
def test_epistemic_addr_compat(value, bind):
    assert print_config(env={"EPISTEMIC_GRAPH_KVCACHE_ADDR": value}).get("http-bind") == bind


def test_config_precedence():
    env = {"EPISTEMIC_GRAPH_KVCACHE_ADDR": "7001", "KVRELAY_HTTP_BIND": "127.0.0.1:7100"}
    assert print_config(env=env)["http-bind"] == "127.0.0.1:7100"
    assert print_config(["--http-bind", "127.0.0.1:7200"], env=env)["http-bind"] == "127.0.0.1:7200"


def test_print_config_token_redacted_and_env_twins():
    base = print_config()
    c = print_config(env={"EPISTEMIC_GRAPH_KVCACHE_TOKEN": "sekrit-value"})
    assert c.get("token") != base.get("token"), f"token not picked up: {c}"
    assert "sekrit-value" not in json.dumps(c), "--print-config must not print the secret"
    c = print_config(env={"KVRELAY_TOKEN": "sekrit-value"})
    assert c.get("token") != base.get("token") and "sekrit-value" not in json.dumps(c), c
    # every flag has a KVRELAY_* twin
    twins = {
        "KVRELAY_MEMORY": ("memory", "64M"),
        "KVRELAY_WORKERS": ("workers", "3"),
        "KVRELAY_MAX_BLOCK_SIZE": ("max-block-size", "8M"),
        "KVRELAY_SHUTDOWN_GRACE": ("shutdown-grace", "7s"),
        "KVRELAY_LOG_LEVEL": ("log-level", "debug"),
        "KVRELAY_GRPC_BIND": ("grpc-bind", "127.0.0.1:5999"),
        "KVRELAY_NO_EVICT": ("no-evict", "1"),
        "KVRELAY_IO_TIMEOUT": ("io-timeout", "3s"),
        "KVRELAY_IDLE_TIMEOUT": ("idle-timeout", "4s"),
    }
    for var, (name, value) in twins.items():
        c = print_config(env={var: value})
        assert c.get(name) != base.get(name), f"{var}={value} did not change {name} ({base.get(name)!r})"
        flag = print_config([f"--{name}", value] if name != "no-evict" else ["--no-evict"])
        assert c.get(name) == flag.get(name), f"{var}={value} and --{name} disagree: {c.get(name)!r} vs {flag.get(name)!r}"


def test_default_workers_one_per_core(kvrelay):
    srv = kvrelay("--memory", "64M")
    assert len(srv.worker_pids()) == len(os.sched_getaffinity(0)), srv.worker_pids()


LOG_LINE = re.compile(r"\b(supervisor|worker|publisher)\b[^\[\]\n]*\[(\d+)\]")


def test_log_lines_carry_role_and_pid(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2", "--log-level", "debug")
    pids = {srv.pid, *srv.children()}
    for i in range(5):
        srv.put(f"log{i}", b"x")
        srv.get(f"nolog{i}")
    srv.stop()
    lines = [ln for ln in srv.log_text().splitlines() if ln.strip()]
    assert len(lines) >= 4, lines
    roles = set()
    for ln in lines:
        m = LOG_LINE.search(ln)
        assert m, f"log line without role and pid: {ln!r}"
        roles.add(m.group(1))
        assert int(m.group(2)) in pids, f"log line with an unknown pid: {ln!r} (pids {pids})"
    assert {"supervisor", "worker"} <= roles, roles


def test_log_level_warn_is_quiet(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1", "--log-level", "warn")
    srv.put("q", b"x")
    srv.stop()
    noisy = [ln for ln in srv.log_text().splitlines() if re.search(r"\b(INFO|DEBUG)\b", ln)]
    assert not noisy, noisy[:5]


def test_epistemic_addr_binds(kvrelay):
    """The compat variable really binds: a bare port means 127.0.0.1:<port>."""
    port = free_port()
    srv = kvrelay("--memory", "64M", "--workers", "1", http_bind=None,
                  env={"EPISTEMIC_GRAPH_KVCACHE_ADDR": str(port)})
    assert srv.port == port
    assert srv.request("GET", "/kv/stats").status == 200
