"""
kvrelay-watch over a fleet: three kvrelay nodes on loopback, each publishing its own pool over
the relay; blocks PUT through the rendezvous client (kvrelay.cluster, replication 1) land on
their owner only; `kvrelay-watch --relay n0=... --relay n1=... --relay n2=... --lookup KEY`
subscribes to the three relays at once and must name, for every resident key, the node that
holds it — the router's view of a sharded pool. A deleted key is gone from every node, a node
that cannot be reached is reported (exit 1) while the others still answer, and the flag limits
are refused.

The filter is a Cuckoo filter: a "yes" on another node may be a false positive (about 1e-4 per
lookup and node), so the test allows at most two such extra names over all its lookups; the
owner's "yes" and a deleted key's "no" are exact.
"""

import subprocess

from .conftest import kill_server

from conftest import BINARY, SLOW, free_port  # noqa: E402

from kvrelay.cluster import Cluster  # noqa: E402

WATCH = str(BINARY.parent / "kvrelay-watch")


def watch(relays, lookups, timeout=30.0, extra=()):
    argv = [WATCH]
    for name, addr in relays:
        argv += ["--relay", f"{name}={addr}"]
    for lk in lookups:
        argv += ["--lookup", lk]
    p = subprocess.run(argv + list(extra), capture_output=True, timeout=timeout * SLOW, text=True)
    answers = []
    for line in p.stdout.splitlines():
        h, nodes, what = line.split(" ", 2)
        answers.append((int(h, 16), [] if nodes == "-" else nodes.split(","), what))
    return p.returncode, answers, p.stderr


def test_watch_over_three_relays_finds_every_key_on_its_node(kvrelay):
    nodes = [kvrelay("--memory", "64M", "--workers", "1", "--grpc-bind", "127.0.0.1:0", name=f"n{i}")
             for i in range(3)]
    relays = [(f"n{i}", s.grpc) for i, s in enumerate(nodes)]
    with Cluster(nodes=[f"n{i}={s.base_url}" for i, s in enumerate(nodes)], timeout_s=2.0) as cl:
        keys = [f"fleet/{i}" for i in range(90)]
        for k in keys:
            assert cl.put(k, k.encode())
        owner = {k: cl.owner(k).name for k in keys}
        # every node got some keys (rendezvous spreads them), and only its owner holds a key
        assert set(owner.values()) == {"n0", "n1", "n2"}
        for i, s in enumerate(nodes):
            assert s.stats()["unique_blocks"] == sum(1 for v in owner.values() if v == f"n{i}")

        rc, answers, err = watch(relays, keys + ["fleet/never-put"])
        assert rc == 0, err
        assert len(answers) == len(keys) + 1
        extra = 0
        for k, (_h, where, what) in zip(keys, answers):
            assert what == f"key={k}"
            assert owner[k] in where, (k, owner[k], where)
            extra += len(where) - 1
        assert answers[-1][2] == "key=fleet/never-put"
        extra += len(answers[-1][1])
        assert extra <= 2, f"{extra} filter false positives in {3 * len(keys) + 3} lookups"

        # the same hashes asked as hashes (the X-KV-Sequence-Hash a router computes)
        rc, by_hash, err = watch(relays, [hex(h) for h, _w, _ in answers[:10]])
        assert rc == 0, err
        assert [w for _h, w, _ in by_hash] == [w for _h, w, _ in answers[:10]]
        assert all(what == "hash" for _h, _w, what in by_hash)

        # a deleted key leaves its node's replica
        gone = keys[0]
        assert cl.delete(gone) == 0
        rc, after, err = watch(relays, [gone, keys[1]])
        assert rc == 0, err
        assert owner[gone] not in after[0][1] and owner[keys[1]] in after[1][1]

        # one node down: reported, exit 1, the two others still answer for their keys
        kill_server(nodes[2])
        rc, part, err = watch(relays, keys[1:40])
        assert rc == 1 and "n2" in err, (rc, err)
        for k, (_h, where, _w) in zip(keys[1:40], part):
            assert "n2" not in where
            if owner[k] != "n2":
                assert owner[k] in where, (k, where)


def test_watch_fleet_flag_limits(tmp_path):
    addr = f"127.0.0.1:{free_port()}"
    for bad in (["--relay", "noequals"], ["--relay", "=127.0.0.1:1"], ["--relay", "n="],
                ["--lookup", "k"],  # a lookup needs relays
                ["--relay", "x" * 64 + "=" + addr]):
        p = subprocess.run([WATCH, *bad], capture_output=True, timeout=10 * SLOW, text=True)
        assert p.returncode == 2, (bad, p.returncode, p.stderr)
    too_many = ",".join(f"n{i}={addr}" for i in range(33))
    p = subprocess.run([WATCH, "--relays", too_many, "--lookup", "k"], capture_output=True, timeout=10 * SLOW,
                       text=True)
    assert p.returncode == 2 and "at most 32 relays" in p.stderr
    lookups = []
    for i in range(257):
        lookups += ["--lookup", str(i)]
    p = subprocess.run([WATCH, "--relay", f"n={addr}", *lookups], capture_output=True, timeout=10 * SLOW, text=True)
    assert p.returncode == 2 and "at most 256 lookups" in p.stderr
    # nothing listens there: reported, exit 1, within the connect timeout
    p = subprocess.run([WATCH, "--relay", f"n={addr}", "--lookup", "k", "--duration", "2"], capture_output=True,
                       timeout=20 * SLOW, text=True)
    assert p.returncode == 1 and "n:" in p.stderr
