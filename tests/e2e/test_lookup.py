"""
POST /batch/lookup (docs/kv-lookup.md) against the real server: per canonical sequence hash, in
order, whether the caller's pool holds a resident block with that hash, and the held prefix.
Blocks are PUT with X-KV-Sequence-Hash (or hashed from their key); the answers follow DELETE and
eviction, two keys of one hash, model pools (a lookup never makes a pool) and namespaces under
--tenants, and every limit is pushed past: 4,096 hashes, the 90,112-byte body, a malformed line,
an empty body, a chunked body, other methods.
"""

import http.client
import json
import subprocess

import pytest

from conftest import SLOW, quote_key, wait_until

MAX_HASHES = 4096
MAX_BODY = 4096 * 22  # 4,096 lines of at most 20 characters, each with CRLF


def _body(hashes, sep="\n"):
    return sep.join(h if isinstance(h, str) else str(h) for h in hashes).encode()


def lookup(srv, hashes, headers=None, token=None, sep="\n", conn=None):
    kw = {} if token is None else {"token": token}
    r = srv.request("POST", "/batch/lookup", body=_body(hashes, sep), headers=headers, conn=conn, **kw)
    assert r.status == 200, (r.status, r.body[:300])
    got = r.json()
    assert got["count"] == len(hashes) == len(got["held"]), got
    assert got["prefix"] == next((i for i, h in enumerate(got["held"]) if not h), len(got["held"])), got
    return got


def put(srv, key, h, data=b"v", headers=None, token=None, expect=201):
    hd = dict(headers or {})
    if h is not None:
        hd["X-KV-Sequence-Hash"] = str(h)
    kw = {} if token is None else {"token": token}
    r = srv.put(key, data, headers=hd, **kw)
    assert r.status == expect, (key, r.status, r.body[:200])


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from conftest import module_server
    s = module_server(tmp_path_factory, "lookup",
                      args=("--memory", "64M", "--workers", "2", "--grpc-bind", "127.0.0.1:0"))
    yield s
    s.stop()


def test_4096_hashes_in_one_request_held_in_order_with_the_prefix(srv):
    # 300 blocks: hashes 1_000_000 + i for i < 200 (a held prefix of 200), then every third of
    # the next 300 hashes
    held = set(range(200)) | {i for i in range(200, 500) if i % 3 == 0}
    conn = srv.connection()
    try:
        for i in sorted(held):
            r = srv.request("PUT", f"/kv/{quote_key(f'big/{i}')}", body=b"x" * 64,
                            headers={"X-KV-Sequence-Hash": str(1_000_000 + i)}, conn=conn)
            assert r.status == 201, r
        got = lookup(srv, [1_000_000 + i for i in range(MAX_HASHES)], conn=conn)
    finally:
        conn.close()
    assert got["held"] == [i in held for i in range(MAX_HASHES)]
    assert got["prefix"] == 200
    # the same hashes as hex, with CRLF: the same answer
    got2 = lookup(srv, [hex(1_000_000 + i) for i in range(MAX_HASHES)], sep="\r\n")
    assert got2 == got
    # a prefix that stops at the first hash: 0
    got3 = lookup(srv, [999_999, 1_000_000])
    assert got3 == {"count": 2, "held": [False, True], "prefix": 0}


@pytest.mark.parametrize("mode", ["py", "h2c"])
def test_answer_over_http1_and_h2c(srv, mode):
    put(srv, f"mode-{mode}", 0xABC0 + len(mode))
    body = _body([0xABC0 + len(mode), 7])
    if mode == "py":
        r = srv.request("POST", "/batch/lookup", body=body)
        status, got = r.status, r.json()
    else:
        out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-X", "POST", "--data-binary", "@-",
                              "-w", "\n%{http_code}", f"http://127.0.0.1:{srv.port}/batch/lookup"],
                             input=body, capture_output=True, timeout=20)
        text, _, code = out.stdout.rpartition(b"\n")
        status, got = int(code), json.loads(text)
    assert status == 200
    assert got == {"count": 2, "held": [True, False], "prefix": 1}


def test_a_hash_from_the_key_when_the_put_names_none(srv):
    # docs/http-contract.md §3.2: a key of exactly 16 hex digits is that number
    put(srv, "00000000deadbeef", None)
    assert lookup(srv, ["0xdeadbeef", str(0xDEADBEEF)])["held"] == [True, True]


def test_delete_makes_it_false_and_two_keys_share_one_hash(srv):
    put(srv, "twin-a", 555_001)
    put(srv, "twin-b", 555_001)
    put(srv, "twin-b", 555_001, expect=200)  # a dedup hit: two references of twin-b
    assert lookup(srv, [555_001])["held"] == [True]
    assert srv.delete("twin-a").status == 200
    assert lookup(srv, [555_001])["held"] == [True], "twin-b still holds the hash"
    assert srv.delete("twin-b").json()["refs"] == 1
    assert lookup(srv, [555_001])["held"] == [True], "one reference of twin-b left"
    assert srv.delete("twin-b").json()["refs"] == 0
    assert lookup(srv, [555_001])["held"] == [False], "the last key gone"
    srv.assert_consistent()


def test_eviction_makes_it_false(kvrelay):
    s = kvrelay("--memory", "4M")
    blob = b"y" * (1 << 20)
    for i in range(8):  # 8 MiB through a 4 MiB arena: the first ones are evicted
        put(s, f"ev{i}", 777_000 + i, blob)
    got = lookup(s, [777_000 + i for i in range(8)])["held"]
    assert got[0] is False and got[-1] is True, got
    for i, h in enumerate(got):
        assert h == (s.get(f"ev{i}").status == 200), (i, got)
    s.assert_consistent()


def _pools(srv):
    r = srv.request("GET", "/debug/relay")
    assert r.status == 200, r
    return r.json()["pools"]


def _wait_pools(srv, n):
    """The publisher takes a new pool on at its next turn, not within the PUT: wait for it."""
    return wait_until(lambda: _pools(srv) >= n and _pools(srv), 10 * SLOW, what=f"{n} pools on /debug/relay")


def test_model_pools_and_a_lookup_never_makes_a_pool(srv):
    put(srv, "m2-block", 888_001, headers={"X-KV-Model": "model-two"})
    put(srv, "m1-block", 888_002)
    hashes = [888_001, 888_002]
    assert lookup(srv, hashes)["held"] == [False, True], "no model: the default model's pool"
    assert lookup(srv, hashes, headers={"X-KV-Model": "model-two"})["held"] == [True, False]
    assert lookup(srv, hashes, headers={"X-KV-Model": "kvrelay"})["held"] == [False, True], "--model by name"
    before = _wait_pools(srv, 2)  # (default, kvrelay) and (default, model-two)
    assert before == 2
    got = lookup(srv, hashes, headers={"X-KV-Model": "never-stored"})
    assert got["held"] == [False, False] and got["prefix"] == 0
    assert "never-stored" not in srv.log_text()
    # A PUT of a new model makes the next pool: index 2 had the lookup made none (the worker
    # logs the index when it makes a pool), and the publisher's count then reaches 3, not more.
    put(srv, "m3-block", 888_003, headers={"X-KV-Model": "model-three"})
    assert 'pool 2 is namespace "default", model "model-three"' in srv.log_text(), "a lookup made a pool"
    assert _wait_pools(srv, before + 1) == before + 1, "a lookup made a pool"
    assert "never-stored" not in srv.log_text()
    r = srv.request("POST", "/batch/lookup", body=b"1", headers={"X-KV-Model": "has space"})
    assert r.status == 400 and "X-KV-Model" in r.json()["message"], r.body


def test_limits(srv):
    r = srv.request("POST", "/batch/lookup", body=_body(range(MAX_HASHES + 1)))
    assert r.status == 413 and r.json()["error"] == "EntityTooLarge", r.body
    assert "4096 hashes" in r.json()["message"], r.body
    # the longest valid lines, exactly the body bound: accepted
    longest = [str(18446744073709551615 - i) for i in range(MAX_HASHES)]
    body = ("\r\n".join(longest) + "\r\n").encode()
    assert len(body) == MAX_BODY
    r = srv.request("POST", "/batch/lookup", body=body)
    assert r.status == 200 and r.json()["count"] == MAX_HASHES, r.body[:200]
    # one byte more: refused from the head
    r = srv.request("POST", "/batch/lookup", body=body + b"1")
    assert r.status == 413 and "90112 bytes" in r.json()["message"], r.body
    # a malformed hash: 400 naming the line
    for bad, line in ((b"1\n2\nxyz\n4", 3), (b"1\n\n2", 2), (b"18446744073709551616", 1), (b"1\n-2", 2),
                      (b"1\n 2", 2), (b"0x10000000000000000", 1)):
        r = srv.request("POST", "/batch/lookup", body=bad)
        assert r.status == 400 and r.json()["error"] == "InvalidRequest", (bad, r.body)
        assert r.json()["message"].startswith(f"line {line}: "), (bad, r.body)
    # an empty body: 200, nothing to answer
    r = srv.request("POST", "/batch/lookup", body=b"")
    assert r.status == 200 and r.json() == {"count": 0, "held": [], "prefix": 0}, r.body
    r = srv.request("GET", "/batch/lookup")
    assert r.status == 405 and r.header("allow") == "POST"
    # a key named like the route is still a key
    assert srv.request("GET", "/kv/batch/lookup").status == 404


def test_chunked_lookup_is_411(srv):
    from conftest import raw_connect, read_one_response
    s = raw_connect(srv)
    try:
        s.sendall(b"POST /batch/lookup HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n1\r\n0\r\n\r\n")
        r = read_one_response(s, 5)
        assert r.status == 411, r
    finally:
        s.close()


TOK_A, TOK_B = "tok-lookup-a-19c2", "tok-lookup-b-7d01"


def test_tenants_never_see_another_namespaces_blocks(kvrelay, tmp_path):
    path = tmp_path / "tenants"
    path.write_text(f"team-a {TOK_A}\nteam-b {TOK_B} model=b-model\n")
    s = kvrelay("--memory", "64M", "--workers", "2", "--tenants", str(path), token=TOK_A)
    put(s, "K", 4242, token=TOK_A)
    put(s, "other", 4343, token=TOK_A)
    assert lookup(s, [4242, 4343], token=TOK_A)["held"] == [True, True]
    assert lookup(s, [4242, 4343], token=TOK_B)["held"] == [False, False], "B sees nothing of A's"
    # nor by naming A's model (--model): B's pool of that model does not exist
    assert lookup(s, [4242], token=TOK_B, headers={"X-KV-Model": "kvrelay"})["held"] == [False]
    # B's own block of the same hash, in B's default model (model= of the tenants file)
    put(s, "K", 4242, data=b"bb", token=TOK_B)
    assert lookup(s, [4242], token=TOK_B)["held"] == [True]
    assert lookup(s, [4242], token=TOK_B, headers={"X-KV-Model": "b-model"})["held"] == [True]
    assert s.delete("K", token=TOK_A).status == 200
    assert lookup(s, [4242, 4343], token=TOK_A)["held"] == [False, True], "A's gone, B's stays apart"
    assert lookup(s, [4242], token=TOK_B)["held"] == [True]
    r = s.request("POST", "/batch/lookup", body=b"4242", token=None)
    assert r.status == 401
    r = s.request("POST", "/batch/lookup", body=b"4242", token="not-a-token")
    assert r.status == 401
