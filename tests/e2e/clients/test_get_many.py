"""
kvrelay.Client.get_many_into (POST /batch/get, docs/http-contract.md "Batches") against the
real server: one request for many keys, each block received into its caller's buffer; a miss in
the middle and a block of another length are per-key False with the buffer untouched; past the
server's limits (128 keys, found bytes over --max-block-size) the client splits or falls back to
one GET per key and stays exact; a dead server is all False, never an exception. And the engine
adapters use it: the LMCache L2 adapter's submit_batch_get (driver of test_lmcache_l2.py) and
SGLang's batch_get_v1 (driver of test_sglang.py) load through /batch/get, counted in /metrics.
"""

import re

from .conftest import MiB, kill_server, pattern

from kvrelay import Client  # noqa: E402
from kvrelay.cluster import Cluster  # noqa: E402

KiB = 1 << 10


def requests(srv):
    """{(method, status): count} from /metrics (POST is method "other")."""
    out = {}
    for m, st, v in re.findall(r'kvrelay_http_requests_total\{method="(\w+)",status="(\w+)"\} (\d+)',
                               srv.metrics_text()):
        out[(m, st)] = int(v)
    return out


def delta(before, after):
    return {k: after.get(k, 0) - before.get(k, 0) for k in set(after) | set(before)
            if after.get(k, 0) != before.get(k, 0)}


def test_one_request_miss_in_the_middle_and_a_size_mismatch(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "1")
    data = {f"m/{i}": bytes(pattern(256 * KiB + 512 * i, f"m{i}")) for i in range(12)}
    with Client(url=srv.base_url, max_connections=2) as c:
        for k, v in data.items():
            assert c.put(k, v)
        keys = list(data)
        keys.insert(5, "absent")  # a miss in the middle
        bufs = [bytearray(len(data[k]) if k in data else 4096) for k in keys]
        bufs[2] = bytearray(len(data[keys[2]]) - 1)  # shorter than the block
        bufs[8] = bytearray(len(data[keys[8]]) + 4096)  # longer than the block
        for b in bufs:
            b[:8] = b"untouchd"
        before = requests(srv)
        got = c.get_many_into(keys, bufs)
        d = delta(before, requests(srv))
        want = [k in data for k in keys]
        want[2] = want[8] = False
        assert got == want
        for k, b, ok in zip(keys, bufs, got):
            if ok:
                assert b == data[k], k
            else:
                assert bytes(b[:8]) == b"untouchd", k
        # one POST for the 13 keys; the only GET is the first /metrics
        assert d == {("other", "200"): 1, ("GET", "200"): 1}, d
        # the connection stays usable after the dropped bytes of the mismatches
        assert c.get_many_into([keys[0]], [bytearray(len(data[keys[0]]))]) == [True]
        assert c.errors == 0
    srv.assert_consistent()


def test_past_the_limits_split_and_fall_back(kvrelay):
    srv = kvrelay("--memory", "128M", "--workers", "1", "--max-block-size", "4M")
    with Client(url=srv.base_url, max_connections=2) as c:
        # 300 keys: 128 + 128 + 44 in three requests
        small = {f"s/{i}": f"v{i}".encode() * 3 for i in range(300)}
        for k, v in small.items():
            assert c.put(k, v)
        keys = list(small)
        bufs = [bytearray(len(small[k])) for k in keys]
        before = requests(srv)
        assert c.get_many_into(keys, bufs) == [True] * 300
        assert [bytes(b) for b in bufs] == [small[k] for k in keys]
        assert delta(before, requests(srv)) == {("other", "200"): 3, ("GET", "200"): 1}

        # 3 x 2 MiB found is over the server's 4 MiB bound: 413, then one GET per key
        big = {f"b/{i}": bytes(pattern(2 * MiB, f"b{i}")) for i in range(3)}
        for k, v in big.items():
            assert c.put(k, v)
        bufs = [bytearray(2 * MiB) for _ in big]
        before = requests(srv)
        assert c.get_many_into(list(big), bufs) == [True] * 3
        assert [bytes(b) for b in bufs] == list(big.values())
        assert delta(before, requests(srv)) == {("other", "413"): 1, ("GET", "200"): 4}

        # the client's own byte bound: keys over it alone go one by one, the rest batch
        views = [[memoryview(bytearray(2 * MiB))] for _ in big] + [[memoryview(bytearray(len(small[k])))]
                                                                   for k in ("s/0", "s/1")]
        before = requests(srv)
        n = c.fetch_many_into(list(big) + ["s/0", "s/1"], views, max_bytes=MiB)
        assert n == [2 * MiB] * 3 + [len(small["s/0"]), len(small["s/1"])]
        assert delta(before, requests(srv)) == {("other", "200"): 1, ("GET", "200"): 4}
        # a batch of one is a plain GET
        before = requests(srv)
        assert c.get_many_into(["s/2"], [bytearray(len(small["s/2"]))]) == [True]
        assert delta(before, requests(srv)) == {("GET", "200"): 2}
        assert c.errors == 0
    srv.assert_consistent()


def test_dead_server_is_all_false(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    with Client(url=srv.base_url, timeout_s=2.0) as c:
        assert c.put("k", b"v")
        assert c.get_many_into(["k", "x"], [bytearray(1), bytearray(1)]) == [True, False]
        kill_server(srv)
        assert c.get_many_into(["k", "x"], [bytearray(1), bytearray(1)]) == [False, False]
        assert c.errors == 1


def test_cluster_routes_batches_per_node(kvrelay):
    nodes = [kvrelay("--memory", "64M", "--workers", "1", name=f"n{i}") for i in range(3)]
    specs = [f"n{i}={s.base_url}" for i, s in enumerate(nodes)]
    with Cluster(nodes=specs, timeout_s=2.0) as cl:
        data = {f"c/{i}": f"value-{i}".encode() for i in range(60)}
        for k, v in data.items():
            assert cl.put(k, v)
        keys = list(data) + ["c/absent"]
        bufs = [bytearray(len(data.get(k, b"?"))) for k in keys]
        before = [requests(s) for s in nodes]
        assert cl.get_many_into(keys, bufs) == [True] * 60 + [False]
        assert [bytes(b) for b in bufs[:60]] == list(data.values())
        for s, b in zip(nodes, before):  # one batch request per node, no single GET
            assert delta(b, requests(s)) == {("other", "200"): 1, ("GET", "200"): 1}


def test_lmcache_l2_get_uses_batch_requests(kvrelay):
    from .test_lmcache_l2 import NativePluginDriver, config, lmcache_key

    srv = kvrelay("--memory", "256M", "--workers", "1")
    d = NativePluginDriver(config(srv, num_workers=2))
    try:
        keys = [lmcache_key(i) for i in range(8)]
        src = [bytes(pattern(4 * MiB, f"l{i}")) for i in range(8)]
        ok, err, bools = d.run("set", keys, [memoryview(s) for s in src])
        assert ok and bools == [True] * 8, (ok, err, bools)
        dst = [bytearray(4 * MiB) for _ in range(9)]
        dst[6] = bytearray(4 * MiB - 1)  # a size mismatch: a per-key miss
        probe = keys[:3] + [lmcache_key(99)] + keys[3:]
        before = requests(srv)
        ok, err, bools = d.run("get", probe, [memoryview(b) for b in dst])
        after = requests(srv)
        assert ok, err
        assert bools == [True, True, True, False, True, True, False, True, True], bools
        for i, k in enumerate(probe):
            if bools[i]:
                assert dst[i] == src[keys.index(k)]
        # two tiles (num_workers=2): two batch requests, no single GET
        assert delta(before, after) == {("other", "200"): 2, ("GET", "200"): 1}
    finally:
        d.close()
    srv.assert_consistent()


def test_sglang_batch_get_v1_uses_batch_requests(kvrelay):
    from .test_sglang import HostPool, make_backend

    srv = kvrelay("--memory", "256M", "--workers", "1")
    pool = HostPool(pages=40)
    backend = make_backend(srv, pool, num_workers=4)
    try:
        hashes = [f"sg{i:04d}" for i in range(16)]
        for p in range(16):
            pool.fill(p, hashes[p])
        assert backend.batch_set_v1(hashes, pool.indices(0, 16)) == [True] * 16
        want = [pool.page_bytes(p) for p in range(16)]
        probe = hashes[:7] + ["sg-missing"] + hashes[7:]
        before = requests(srv)
        got = backend.batch_get_v1(probe, pool.indices(20, 17))
        after = requests(srv)
        assert got == [True] * 7 + [False] + [True] * 9
        for i, ok in enumerate(got):
            if ok:
                assert pool.page_bytes(20 + i) == want[hashes.index(probe[i])]
        assert delta(before, after) == {("other", "200"): 4, ("GET", "200"): 1}
    finally:
        backend.close()
