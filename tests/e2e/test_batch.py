"""
Batch routes (POST /batch/exists, POST /batch/delete) against the real server, over the
io_uring HTTP/1.1 path and over h2c (h2o): answers per key in order, the consecutive-hit
prefix, and each limit pushed past (4,096 keys, 1 MiB body, empty or bad keys, a body of
unknown length, other methods).
"""

import json
import subprocess

import pytest

from conftest import MiB, quote_key


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    from conftest import module_server
    s = module_server(tmp_path_factory, "batch", args=("--memory", "64M", "--workers", "2"))
    for k in ("a", "b/c", "d"):
        assert s.put(k, b"v-" + k.encode()).status == 201
    yield s
    s.stop()


def _post(srv, path, body, mode="py", headers=None):
    if mode == "py":
        return srv.request("POST", path, body=body, headers=headers)
    out = subprocess.run(["curl", "-s", "--http2-prior-knowledge", "-X", "POST", "--data-binary", "@-",
                          "-w", "\n%{http_code}", f"http://127.0.0.1:{srv.port}{path}"],
                         input=body, capture_output=True, timeout=20)
    text, _, code = out.stdout.rpartition(b"\n")

    class R:
        status = int(code)
        body_ = text

        def json(self):
            return json.loads(self.body_)
    return R()


def _lines(keys):
    return "\n".join(quote_key(k) for k in keys).encode()


@pytest.mark.parametrize("mode", ["py", "h2c"])
def test_exists_answers_in_order_with_the_prefix(srv, mode):
    r = _post(srv, "/batch/exists", _lines(["a", "b/c", "zz", "d", "a"]), mode)
    assert r.status == 200
    assert r.json() == {"count": 5, "exists": [True, True, False, True, True], "prefix": 2}
    r = _post(srv, "/batch/exists", _lines(["zz", "a"]), mode)
    assert r.json() == {"count": 2, "exists": [False, True], "prefix": 0}


def test_crlf_lines_and_a_trailing_newline(srv):
    r = srv.request("POST", "/batch/exists", body=b"a\r\nd\r\n")
    assert r.status == 200 and r.json()["exists"] == [True, True]


def test_delete_many(kvrelay):
    s = kvrelay("--memory", "64M")
    assert s.put("x", b"1").status == 201 and s.put("x", b"1").status == 200 and s.put("y", b"2").status == 201
    r = s.request("POST", "/batch/delete", body=_lines(["x", "y", "nope", "y"]))
    assert r.status == 200 and r.json() == {"count": 4, "refs": [1, 0, None, None]}
    assert s.get("x").status == 200 and s.get("y").status == 404


def test_limits(srv):
    ok = srv.request("POST", "/batch/exists", body=_lines([f"k{i}" for i in range(4096)]))
    assert ok.status == 200 and ok.json()["count"] == 4096
    r = srv.request("POST", "/batch/exists", body=_lines([f"k{i}" for i in range(4097)]))
    assert r.status == 413 and r.json()["error"] == "EntityTooLarge"
    r = srv.request("POST", "/batch/exists", body=b"k" * (MiB + 1))
    assert r.status == 413
    r = srv.request("POST", "/batch/exists", body=b"a\n\nd")
    assert r.status == 400 and "line 2" in r.json()["message"]
    r = srv.request("POST", "/batch/exists", body=b"a\n%zz")
    assert r.status == 400 and "line 2" in r.json()["message"]
    r = srv.request("POST", "/batch/exists", body=b"a\n" + b"k" * 1025)
    assert r.status == 400
    r = srv.request("GET", "/batch/exists")
    assert r.status == 405 and r.header("allow") == "POST"
    # a key named like the route is still a key: GET /kv/batch/exists is the probe of "batch"
    assert srv.request("GET", "/kv/batch/exists").json() == {"hash": "batch", "exists": False}


def test_chunked_batch_is_411(srv):
    import socket
    from conftest import raw_connect, read_one_response
    s = raw_connect(srv)
    try:
        s.sendall(b"POST /batch/exists HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n\r\n")
        r = read_one_response(s, 5)
        assert r.status == 411, r
    finally:
        s.close()


def test_exists_is_truthful_after_delete_and_eviction(kvrelay):
    s = kvrelay("--memory", "4M")
    assert s.put("gone", b"x" * 1000).status == 201
    assert s.delete("gone").status == 200
    blob = b"y" * (1 << 20)
    for i in range(8):  # 8 MiB through a 4 MiB arena: the first ones are evicted
        assert s.put(f"ev{i}", blob).status == 201
    r = s.request("POST", "/batch/exists", body=_lines(["gone"] + [f"ev{i}" for i in range(8)]))
    got = r.json()["exists"]
    assert got[0] is False and got[-1] is True
    for i, e in enumerate(got[1:]):
        assert e == (s.get(f"ev{i}").status == 200)
