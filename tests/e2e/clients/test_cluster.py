"""
kvrelay.cluster against a fleet of real kvrelay-supervisor nodes on loopback: rendezvous
hashing spreads keys evenly, a fourth node moves few keys, replication survives a killed node,
and without replication the dead node's keys are misses (never exceptions).
"""

import socket
import time

from .conftest import kill_server

from conftest import SLOW  # noqa: E402
from harness import wait_until  # noqa: E402

import kvrelay  # noqa: E402
from kvrelay.cluster import Cluster, hrw_score, make_store, rank_nodes  # noqa: E402

N_KEYS = 3000
N_REPL = 600


def start_nodes(kvrelay_fixture, n):
    return [kvrelay_fixture("--memory", "64M", "--workers", "1", name=f"node{i}") for i in range(n)]


def node_specs(servers):
    # stable names, as a StatefulSet gives them: kv-0, kv-1, ...
    return [f"kv-{i}={s.base_url}" for i, s in enumerate(servers)]


def test_cluster_fleet(kvrelay):
    servers = start_nodes(kvrelay, 3)
    specs = node_specs(servers)
    c1 = Cluster(nodes=specs, timeout_s=2.0 * SLOW)
    c2 = Cluster(nodes=specs, replication=2, timeout_s=2.0 * SLOW)
    try:
        keys = [f"meta-llama/Llama-3.1-8B@000000ff@0@{i:064x}" for i in range(N_KEYS)]
        for k in keys:
            assert c1.put(k, k.encode()[-16:])
        # spread: each node within +-15 % of an even share
        counts = [s.stats()["unique_blocks"] for s in servers]
        assert sum(counts) == N_KEYS, counts
        for n in counts:
            assert abs(n - N_KEYS / 3) <= 0.15 * N_KEYS / 3, counts
        owner = {k: c1.owner(k).name for k in keys}
        assert [sum(1 for k in keys if owner[k] == f"kv-{i}") for i in range(3)] == counts

        # replication 2: every key on its two owners
        rkeys = [f"r2-{i:08x}" for i in range(N_REPL)]
        for k in rkeys:
            assert c2.put(k, b"r" + k.encode())
        counts2 = [s.stats()["unique_blocks"] for s in servers]
        assert sum(counts2) - sum(counts) == 2 * N_REPL, (counts, counts2)

        # a fourth node moves at most 30 % of the keys, all of them to the new node
        s4 = kvrelay("--memory", "64M", "--workers", "1", name="node3")
        c4 = Cluster(nodes=specs + [f"kv-3={s4.base_url}"], timeout_s=2.0 * SLOW)
        try:
            moved = [k for k in keys if c4.owner(k).name != owner[k]]
            assert len(moved) <= 0.30 * N_KEYS, len(moved)
            assert all(c4.owner(k).name == "kv-3" for k in moved)
            hits = c4.exists_many(keys)
            moved_set = set(moved)
            assert [not h for h in hits] == [k in moved_set for k in keys]  # moved keys are not on kv-3 yet
        finally:
            c4.close()

        # kill kv-0 (SIGKILL, every process)
        kill_server(servers[0])
        t0 = time.monotonic()
        # replication 2: no miss
        for k in rkeys:
            assert c2.get(k) == b"r" + k.encode(), k
        assert all(c2.exists_many(rkeys))
        # replication 1: misses exactly for kv-0's keys, no exception
        got = [c1.get(k) for k in keys]
        for k, v in zip(keys, got):
            if owner[k] == "kv-0":
                assert v is None, k
            else:
                assert v == k.encode()[-16:], k
        ex = c1.exists_many(keys)
        assert ex == [owner[k] != "kv-0" for k in keys]
        buf = bytearray(16)
        dead_key = next(k for k in keys if owner[k] == "kv-0")
        live_key = next(k for k in keys if owner[k] != "kv-0")
        assert c1.get_into(dead_key, buf) is None and c1.get_into(live_key, buf) == 16
        assert c1.put(dead_key, b"x") is False and c1.delete(dead_key) is None
        took = time.monotonic() - t0
        # the dead node is skipped, not waited for: thousands of operations in seconds
        assert took < 20 * SLOW, took
        dead = [n for n in c1.nodes if n.name == "kv-0"][0]
        assert dead.failures >= 1 and dead.failures < 40, dead.failures
    finally:
        c1.close()
        c2.close()


def test_cluster_dead_node_is_reprobed(kvrelay):
    servers = start_nodes(kvrelay, 2)
    port = servers[1].port
    c = Cluster(nodes=node_specs(servers), probe_backoff_s=0.5, max_backoff_s=1.0, timeout_s=1.0 * SLOW)
    try:
        keys = [f"p-{i}" for i in range(200)]
        k1 = [k for k in keys if c.owner(k).name == "kv-1"]
        assert len(k1) >= 2
        node = c.nodes[1]
        kill_server(servers[1])
        assert c.get(k1[0]) is None and node.failures == 1 and node.dead
        # while it backs off (0.5 s) the node is skipped: no second failure
        assert c.get(k1[1]) is None and node.failures == 1

        def wait_usable():
            wait_until(node.usable, 2.0, interval=0.02, what="the node's back-off to end")  # max_backoff_s is 1.0

        # once the back-off is over the next request probes it (refused: back off again)
        wait_usable()
        assert c.get(k1[0]) is None and node.failures == 2 and node.dead
        # the node comes back on the same port: after its back-off it is used again
        s = kvrelay("--memory", "64M", "--workers", "1", name="node1b", http_bind=f"127.0.0.1:{port}")
        assert s.port == port
        wait_usable()
        assert c.put(k1[0], b"back") and c.get(k1[0]) == b"back" and not node.dead
    finally:
        c.close()


def test_cluster_dns_membership(kvrelay):
    """A DNS name resolving to several addresses (a headless Service). The resolver is
    injected: loopback has one address, so the fleet's addresses are played by a table."""
    srv = kvrelay("--memory", "64M", "--workers", "1")
    table = {"kv.default.svc": ["127.0.0.1"]}
    calls = []

    def resolver(host, port, type=0):
        calls.append(host)
        if host not in table:
            raise socket.gaierror("no such name")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in table[host]]

    c = Cluster(dns=f"dns://kv.default.svc:{srv.port}", resolver=resolver, dns_refresh_s=0.1,
                timeout_s=1.0 * SLOW)
    try:
        assert [n.name for n in c.nodes] == [f"127.0.0.1:{srv.port}"]
        assert c.put("dns-key", b"v") and c.get("dns-key") == b"v"
        table["kv.default.svc"] = ["127.0.0.1", "10.255.255.1", "10.255.255.2"]
        # the client's own clock: past dns_refresh_s (0.1 s) its next call re-resolves (no other party)
        time.sleep(0.15)
        c.owners("x")  # re-resolves
        assert sorted(n.name for n in c.nodes) == sorted(f"{a}:{srv.port}" for a in table["kv.default.svc"])
        # a failing resolution keeps the members
        del table["kv.default.svc"]
        time.sleep(0.15)  # past dns_refresh_s again, as above
        c.owners("x")
        assert len(c.nodes) == 3
        # ...and so does an empty answer
        table["kv.default.svc"] = []
        time.sleep(0.15)  # past dns_refresh_s again, as above
        c.owners("x")
        assert len(c.nodes) == 3
    finally:
        c.close()


def test_hrw_properties():
    names = [f"kv-{i}" for i in range(5)]
    assert rank_nodes(names, "k", 5) == sorted(range(5), key=lambda i: -hrw_score(names[i], "k"))
    # the boundary between name and key is not ambiguous
    assert hrw_score("ab", "c") != hrw_score("a", "bc")
    # removing a node moves only its keys
    keys = [f"key-{i}" for i in range(2000)]
    before = {k: names[rank_nodes(names, k, 1)[0]] for k in keys}
    rest = names[:2] + names[3:]
    after = {k: rest[rank_nodes(rest, k, 1)[0]] for k in keys}
    assert all(before[k] == after[k] for k in keys if before[k] != "kv-2")
    # the stated bound on membership, pushed past
    from kvrelay.cluster import MAX_NODES
    try:
        Cluster(nodes=[f"http://127.0.0.1:{1 + i}" for i in range(MAX_NODES + 1)])
    except ValueError:
        pass
    else:
        raise AssertionError("more than MAX_NODES nodes accepted")
    # one node: a plain Client; several: a Cluster
    assert isinstance(make_store(url="http://127.0.0.1:1"), kvrelay.Client)
    assert isinstance(make_store(url="http://127.0.0.1:1,http://127.0.0.1:2"), Cluster)
