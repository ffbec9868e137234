"""
Tenants (docs/tenancy.md): --tenants FILE maps bearer tokens to namespaces, and every surface
of the HTTP API answers from the caller's namespace alone. Two namespaces A and B, a second
token A2 for A, and an admin token; the real server on a loopback port, driven with
http.client.
"""

import hashlib
import http.client
import os
import re
import signal
import statistics
import time
import uuid
from pathlib import Path

import pytest

from conftest import MiB, SLOW, kv_path, make_block, quote_key
from harness import wait_log, wait_until

TOK_A, TOK_A2, TOK_B, TOK_ADMIN = "tok-a-1f3e", "tok-a2-77c0", "tok-b-90d2", "tok-admin-5b1a"


def tenants_text(b_token=TOK_B, extra=""):
    sha_a2 = hashlib.sha256(TOK_A2.encode()).hexdigest()
    return (
        "# namespace token [memory=SIZE]\n"
        f"team-a {TOK_A}\n"
        f"team-a\tsha256:{sha_a2}   # the same namespace, stored as a digest\n"
        + (f"team-b {b_token}\n" if b_token else "")
        + extra
    )


@pytest.fixture
def tenants(kvrelay, tmp_path):
    path = tmp_path / "tenants"
    path.write_text(tenants_text())
    srv = kvrelay("--memory", "256M", "--workers", "2", "--tenants", str(path), "--admin-token", TOK_ADMIN,
                  token=TOK_A)
    srv.tenants_path = path
    return srv


def _post(srv, path, keys, token):
    body = "\n".join(quote_key(k) for k in keys).encode()
    return srv.request("POST", path, body=body, token=token)


def test_a_key_of_one_namespace_is_invisible_to_another(tenants):
    srv = tenants
    a_bytes, b_bytes = make_block(64 * 1024, "a's K"), make_block(1000, "b's K")
    assert srv.put("K", a_bytes, token=TOK_A).status == 201
    assert srv.put("K", a_bytes, token=TOK_A2).status == 200, "A2 is A: a dedup hit"
    # B learns nothing of A's K, through any surface
    assert srv.get("K", token=TOK_B).status == 404
    assert srv.request("HEAD", kv_path("K"), token=TOK_B).status == 404
    r = srv.request("GET", kv_path("K") + "/exists", token=TOK_B)
    assert r.status == 200 and r.json()["exists"] is False, r.body
    r = _post(srv, "/batch/exists", ["K"], TOK_B)
    assert r.status == 200 and r.json()["exists"] == [False], r.body
    r = _post(srv, "/batch/get", ["K"], TOK_B)
    assert r.status == 200 and r.body[4:8] == (1).to_bytes(4, "little") and r.body[8] == 0, r.body[:32]
    assert srv.delete("K", token=TOK_B).status == 404
    r = _post(srv, "/batch/delete", ["K"], TOK_B)
    assert r.status == 200 and r.json()["refs"] == [None], r.body
    # B's PUT of the same key with other bytes (another length) is B's own block: 201
    assert srv.put("K", b_bytes, token=TOK_B).status == 201
    assert srv.get("K", token=TOK_A).body == a_bytes
    assert srv.get("K", token=TOK_A2).body == a_bytes
    assert srv.get("K", token=TOK_B).body == b_bytes
    # A's refs were untouched by B's deletes: two references, then one, then gone
    r = srv.delete("K", token=TOK_A)
    assert r.status == 200 and r.json()["refs"] == 1, r.body
    assert srv.get("K", token=TOK_B).body == b_bytes
    # the default namespace (no token in the file) does not exist here: no token, no access
    assert srv.get("K", token=None).status == 401
    assert srv.get("K", token="not-a-token").status == 401


def test_stats_debug_and_metrics_are_scoped(tenants):
    srv = tenants
    for i in range(3):
        assert srv.put(f"a{i}", make_block(4096, f"a{i}"), token=TOK_A).status == 201
    assert srv.put("b0", make_block(8192, "b0"), token=TOK_B).status == 201
    assert srv.get("nope", token=TOK_B).status == 404
    a = srv.request("GET", "/kv/stats", token=TOK_A2).json()
    b = srv.request("GET", "/kv/stats", token=TOK_B).json()
    assert (a["unique_blocks"], a["resident_bytes"], a["put_new"]) == (3, 3 * 4096, 3), a
    assert (b["unique_blocks"], b["resident_bytes"], b["get_misses"]) == (1, 8192, 1), b
    assert a["namespace"] == "team-a" and b["namespace"] == "team-b"
    # /debug/* and /metrics belong to the admin token
    for path in ("/debug/store", "/debug/relay", "/metrics"):
        r = srv.request("GET", path, token=TOK_A)
        assert r.status == 403 and r.json()["error"] == "Forbidden", (path, r.status, r.body[:200])
    assert srv.request("GET", "/debug/store", token=TOK_ADMIN).json()["ok"] is True
    text = srv.request("GET", "/metrics", token=TOK_ADMIN).body.decode()
    assert 'kvrelay_namespace_resident_bytes{namespace="team-a"} 12288' in text, text[:2000]
    assert 'kvrelay_namespace_blocks{namespace="team-b"} 1' in text
    assert 'kvrelay_namespace_get_misses_total{namespace="team-b"} 1' in text


def test_head_takes_the_same_time_whether_another_namespace_holds_the_key(tenants):
    """1,000 HEADs by B of keys A holds against 1,000 of keys nobody holds, interleaved on one
    keep-alive connection: the medians and the p99s agree within the stated noise."""
    srv = tenants
    n = 1000
    conn = srv.connection()
    hdr = {"Authorization": f"Bearer {TOK_A}"}
    for i in range(n):
        conn.request("PUT", kv_path(f"held-{i}"), body=b"x" * 256, headers=hdr)
        r = conn.getresponse()
        r.read()
        assert r.status == 201
    hdr = {"Authorization": f"Bearer {TOK_B}"}
    times = {"held": [], "absent": []}
    for rnd in range(2):  # the first round warms the connection and the caches, the second counts
        for i in range(n):
            for kind in ("held", "absent") if i % 2 else ("absent", "held"):
                t0 = time.perf_counter_ns()
                conn.request("HEAD", kv_path(f"{kind}-{i}"), headers=hdr)
                r = conn.getresponse()
                r.read()
                dt = time.perf_counter_ns() - t0
                assert r.status == 404
                if rnd == 1:
                    times[kind].append(dt)
    conn.close()
    med = {k: statistics.median(v) / 1000 for k, v in times.items()}
    p99 = {k: sorted(v)[int(len(v) * 0.99)] / 1000 for k, v in times.items()}
    print(f"HEAD by B, us: median held {med['held']:.1f} absent {med['absent']:.1f}; "
          f"p99 held {p99['held']:.1f} absent {p99['absent']:.1f}")
    # noise stated: the medians within 10 % (or 15 us); the p99s, the tenth-slowest of 1,000
    # probes and so at the mercy of whatever else the machine runs, within a factor of 2 (or
    # 200 us). A lookup that short-circuited on another namespace's key would move the median.
    assert abs(med["held"] - med["absent"]) <= max(0.10 * med["absent"], 15), med
    assert abs(p99["held"] - p99["absent"]) <= max(1.0 * min(p99.values()), 200), p99


def test_reload_on_sighup_and_on_change(tenants):
    srv = tenants
    assert srv.put("r", b"1234", token=TOK_B).status == 201
    # B's token removed, SIGHUP: B is refused within a second, A is not
    srv.tenants_path.write_text(tenants_text(b_token=None))
    t0 = time.monotonic()
    os.kill(srv.pid, signal.SIGHUP)
    wait_until(lambda: srv.get("r", token=TOK_B).status == 401, 1.0 * SLOW, interval=0.02,
               what="B's removed token to be refused")
    print(f"B refused {time.monotonic() - t0:.3f} s after SIGHUP")
    assert srv.put("r2", b"abcd", token=TOK_A).status == 201
    # a malformed file is refused with its line named, and the previous table stays
    srv.tenants_path.write_text(tenants_text(b_token=None, extra="team c bad-line\n"))
    os.kill(srv.pid, signal.SIGHUP)
    wait_log(srv.log_text, "reload refused: line 4", 5 * SLOW)
    assert srv.get("r2", token=TOK_A).status == 200
    assert srv.get("r", token=TOK_B).status == 401
    # B comes back with a new token, without a signal: the file's change is noticed; B's block is
    # still in its namespace
    srv.tenants_path.write_text(tenants_text(b_token="tok-b-rotated"))
    wait_until(lambda: srv.get("r", token="tok-b-rotated").status == 200, 3.0 * SLOW, interval=0.05,
               what="the changed file to be loaded")
    assert srv.get("r", token="tok-b-rotated").body == b"1234"
    assert srv.get("r", token=TOK_B).status == 401


def test_a_warm_restart_keeps_every_block_in_its_namespace(kvrelay, tmp_path):
    """The namespaces' ids live in the segment: after a restart on the same --segment-path, with
    the file's lines in another order and a namespace added before the others, every block is
    back in its own namespace."""
    seg = Path("/dev/shm") / f"kvrelay-e2e-tenants-{uuid.uuid4().hex[:12]}.seg"
    path = tmp_path / "tenants"
    path.write_text(tenants_text())
    args = ("--memory", "64M", "--workers", "2", "--segment-path", str(seg), "--tenants", str(path))
    try:
        srv = kvrelay(*args, token=TOK_A)
        a, b = make_block(10000, "warm-a"), make_block(20000, "warm-b")
        assert srv.put("K", a, token=TOK_A).status == 201
        assert srv.put("K", b, token=TOK_B).status == 201
        assert srv.put("only-a", a, token=TOK_A).status == 201
        srv.stop()
        path.write_text(f"team-new tok-new-1\nteam-b {TOK_B}\n" + tenants_text(b_token=None))
        srv = kvrelay(*args, token=TOK_A)
        assert srv.get("K", token=TOK_A).body == a
        assert srv.get("K", token=TOK_A2).body == a
        assert srv.get("K", token=TOK_B).body == b
        assert srv.get("only-a", token=TOK_B).status == 404
        assert srv.get("K", token="tok-new-1").status == 404, "a new namespace starts empty"
        assert srv.request("GET", "/kv/stats", token=TOK_A).json()["unique_blocks"] == 2
    finally:
        seg.unlink(missing_ok=True)


def _ns_metric(srv, name, ns):
    text = srv.request("GET", "/metrics", token=TOK_ADMIN).body.decode()
    m = re.search(rf'^kvrelay_namespace_{name}{{namespace="{ns}"}} (\d+)$', text, re.M)
    assert m, f"kvrelay_namespace_{name} for {ns} missing"
    return int(m.group(1))


def test_a_namespace_at_its_quota_evicts_its_own_blocks_only(kvrelay, tmp_path):
    """A with memory=64M writes 200 MiB into a 256 MiB arena that B shares: A never holds more
    than 64 MiB, every block of B is intact, and the counters say whose blocks went."""
    path = tmp_path / "tenants"
    path.write_text(f"team-a {TOK_A} memory=64M\nteam-b {TOK_B}\n")
    srv = kvrelay("--memory", "256M", "--workers", "2", "--tenants", str(path), "--admin-token", TOK_ADMIN,
                  token=TOK_A)
    b_blocks = {f"b{i}": make_block(MiB, f"b{i}") for i in range(40)}
    conn = srv.connection()
    for k, v in b_blocks.items():
        conn.request("PUT", kv_path(k), body=v, headers={"Authorization": f"Bearer {TOK_B}"})
        r = conn.getresponse()
        r.read()
        assert r.status == 201
    peak = 0
    chunk = make_block(4 * MiB, "a-chunk")
    for i in range(50):  # 200 MiB in 4 MiB blocks
        conn.request("PUT", kv_path(f"a{i}"), body=chunk[:-8] + i.to_bytes(8, "little"),
                     headers={"Authorization": f"Bearer {TOK_A}"})
        r = conn.getresponse()
        r.read()
        assert r.status == 201, (i, r.status)
        peak = max(peak, _ns_metric(srv, "resident_bytes", "team-a"))
    conn.close()
    a = srv.request("GET", "/kv/stats", token=TOK_A).json()
    print(f"quota: A peak {peak} bytes, now {a['resident_bytes']}, A evictions {a['evictions']}, "
          f"B evictions {_ns_metric(srv, 'evictions_total', 'team-b')}")
    assert peak <= 64 * MiB and a["resident_bytes"] <= 64 * MiB, (peak, a)
    assert a["resident_bytes"] == 16 * 4 * MiB, "A fills its quota exactly: 16 blocks of 4 MiB"
    assert a["capacity_bytes"] == 64 * MiB
    assert a["evictions"] == 50 - 16 and a["evicted_bytes"] == (50 - 16) * 4 * MiB, a
    assert _ns_metric(srv, "evictions_total", "team-b") == 0
    assert _ns_metric(srv, "quota_bytes", "team-a") == 64 * MiB
    for k, v in b_blocks.items():
        assert srv.get(k, token=TOK_B).body == v, k
    assert srv.get("a49", token=TOK_A).status == 200 and srv.get("a0", token=TOK_A).status == 404
    assert srv.request("GET", "/debug/store", token=TOK_ADMIN).json()["ok"] is True


def test_without_quotas_a_full_arena_takes_from_the_namespace_holding_more(kvrelay, tmp_path):
    """No quotas, equal shares: A fills the arena, then B writes; every block evicted is A's
    until the two hold the same, then each gives up its own oldest."""
    path = tmp_path / "tenants"
    path.write_text(f"team-a {TOK_A}\nteam-b {TOK_B}\n")
    srv = kvrelay("--memory", "64M", "--workers", "1", "--tenants", str(path), "--admin-token", TOK_ADMIN,
                  token=TOK_A)
    conn = srv.connection()

    def put(tok, key, n):
        conn.request("PUT", kv_path(key), body=make_block(MiB, key)[:-8] + n.to_bytes(8, "little"),
                     headers={"Authorization": f"Bearer {tok}"})
        r = conn.getresponse()
        r.read()
        assert r.status == 201, (key, r.status)

    for i in range(80):
        put(TOK_A, f"a{i}", i)
    held_a = _ns_metric(srv, "blocks", "team-a")
    assert 50 <= held_a < 64, held_a
    for i in range(16):
        put(TOK_B, f"b{i}", i)
    assert _ns_metric(srv, "evictions_total", "team-b") == 0, "B under its share loses nothing"
    for i in range(16, 80):
        put(TOK_B, f"b{i}", i)
    conn.close()
    a, b = _ns_metric(srv, "blocks", "team-a"), _ns_metric(srv, "blocks", "team-b")
    print(f"fair: A {a} blocks, B {b} blocks; evictions A {_ns_metric(srv, 'evictions_total', 'team-a')} "
          f"B {_ns_metric(srv, 'evictions_total', 'team-b')}")
    assert abs(a - b) <= 1, (a, b)
    assert _ns_metric(srv, "evictions_total", "team-b") > 0
    assert srv.get("b79", token=TOK_B).status == 200 and srv.get("b0", token=TOK_B).status == 404


def test_a_tenants_file_without_tokens_opens_nothing(kvrelay, tmp_path):
    """An empty tenants file (say, a Secret not filled in yet) is not open access: every request
    but the probes gets 401, until a token appears in it."""
    path = tmp_path / "tenants"
    path.write_text("# nothing yet\n")
    srv = kvrelay("--memory", "32M", "--workers", "1", "--tenants", str(path))
    assert srv.put("k", b"x", token=None).status == 401
    assert srv.request("GET", "/kv/stats", token=None).status == 401
    assert srv.request("GET", "/healthz", token=None).status == 200
    path.write_text(f"team-a {TOK_A}\n")
    wait_until(lambda: srv.put("k", b"x", token=TOK_A).status == 201, 3.0 * SLOW, interval=0.05,
               what="the first token to be loaded")
