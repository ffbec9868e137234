"""
Acceptance (issue 24, item 1): a storm of 20,000 operations on two relay pools — PUTs of new
blocks with X-KV-Sequence-Hash (some sharing a hash with a live block of their pool, some with
one of the other pool), DELETEs, and the evictions of an arena too small to hold it all —
followed over the real server's KV event stream by three subscribers in the test's thread:

- `paused`: the strict vLLM follower (vllm_kv_events.py + the replay protocol, follower.py),
  paused twice for 4,000 operations with a small --kv-events-hwm and a small SUB RCVHWM /
  SO_RCVBUF, so that ZMQ really drops its messages: each pause must show gaps, repaired by
  replays;
- `far`: the strict follower too, paused for most of the storm, longer than the server's
  --kv-events-buffer holds: its replay must come back as a resync;
- `client`: kvrelay.events.Subscriber (the package's consumer), paused twice as well.

Making a subscriber on this machine lose messages takes care. Over loopback TCP the server's
socket buffer absorbs a pause: Linux sizes it from the congestion window and the MSS (64 KiB on
loopback; BBR's window of ~400 segments), and measured here it held 0.2 to 1.7 MB per
subscriber, even through a relay with the minimum MSS of 88 bytes, more than a pause of a few
thousand operations sends. So the storm's PUB is bound on `ipc://` (a Unix socket: the buffer
is wmem_default, 208 KiB, never grown), the replay socket stays on `tcp://127.0.0.1:*` (its
port from the port file), and the topics are long (a 500-byte backend id, 128-byte models), so
that one pause is about a MiB of messages, several times what the socket, --kv-events-hwm 16
and the SUB's RCVHWM 8 hold. Every other test of this directory binds both on tcp.

At the end each one's set of hashes per pool must equal what the store holds, determined
independently: the test knows every key's hash and pool, asks POST /batch/exists which keys
are still there, and asks POST /batch/lookup (the exact per-pool index) the same of every hash
it used.

The operations go over keep-alive connections (http.client); every loop is bounded in count
and time.
"""

import random
import time

from .conftest import SLOW

OPS = 20_000
# Long names (topics are 3 + 500 + 1 + 128 bytes): see LONG_BACKEND
MODELS = ("m-storm-a-" + "a" * 118, "m-storm-b-" + "b" * 118)
BLOCK = 3000  # one 4 KiB arena page each: the 2 MiB arena holds ~500 blocks
# The replay buffer is bounded by bytes, not batches: how many batches 20,000 operations make
# depends on --kv-events-interval and the machine's speed, their payload bytes (~30 per event)
# do not. 320 KiB holds a 4,000-operation pause (~140 KiB) twice over, and half of what the far
# one missed (~600 KiB).
ARGS = ("--memory", "2M", "--max-blocks", "4096", "--kv-events-hwm", "16", "--kv-events-buffer", "100000",
        "--kv-events-buffer-bytes", "320K", "--workers", "1")
# (start, end) in operations
PAUSES = {"paused": ((2_000, 6_000), (11_000, 15_000)), "client": ((4_000, 8_000), (13_000, 17_000)),
          "far": ((1_500, 19_500),)}
SUB_SMALL = dict(rcvhwm=8, rcvbuf=4096)
# A long backend id and long model names (every message's topic carries both): see above
LONG_BACKEND = "storm-" + "b" * 494


def paused(name, op):
    return any(a <= op < b for a, b in PAUSES[name])


def test_storm_of_20000_ops_followed_exactly(events_server, follower, subscriber, tmp_path):
    es = events_server(*ARGS, backend=LONG_BACKEND, pub=f"ipc://{tmp_path}/kv-events.sock")
    topics = [es.topic(m) for m in MODELS]
    fols = {name: follower(es, name=name, topics=topics, **SUB_SMALL) for name in ("paused", "far")}
    client = subscriber(es, topics=topics, **SUB_SMALL)

    rnd = random.Random(24)
    keys = {}  # key -> (model, hash) of every key ever PUT
    live = {m: [] for m in MODELS}  # keys believed present (DELETE picks from here)
    next_hash = [1 << 40]
    counts = {"put": 0, "put_shared": 0, "put_cross": 0, "delete": 0, "delete_404": 0}

    def fresh():
        next_hash[0] += 1 + rnd.randrange(1 << 20)
        return next_hash[0]

    marks = {"paused": [], "client": []}  # gaps at each pause's start

    def gaps_of(name):
        return fols[name].total("gaps") if name in fols else sum(st.gaps for st in client.pools.values())

    t0 = time.monotonic()
    limit = 90 * SLOW
    for op in range(OPS):
        assert time.monotonic() - t0 < limit, f"the storm took over {limit:.0f}s at op {op}"
        model = MODELS[op % 2 if rnd.random() < 0.5 else rnd.randrange(2)]
        r = rnd.random()
        if r < 0.30 and live[model]:
            k = live[model].pop(rnd.randrange(len(live[model])))
            st = es.delete(k)
            counts["delete"] += 1
            counts["delete_404"] += st == 404  # evicted meanwhile
        else:
            if r < 0.40 and live[model]:
                h = keys[rnd.choice(live[model])][1]  # another key of this pool's hash
                counts["put_shared"] += 1
            elif r < 0.45 and live[MODELS[1 - MODELS.index(model)]]:
                h = keys[rnd.choice(live[MODELS[1 - MODELS.index(model)]])][1]  # the other pool's hash
                counts["put_cross"] += 1
            else:
                h = fresh()
            k = f"s/{op}"
            keys[k] = (model, h)
            es.put(k, h, model=model, size=BLOCK)
            live[model].append(k)
            counts["put"] += 1
            if len(live[model]) > 2000:  # long evicted: forget them, keep the DELETE picks useful
                live[model] = live[model][-1000:]
        for name in ("paused", "client"):
            if op in (PAUSES[name][0][0], PAUSES[name][1][0]):
                marks[name].append(gaps_of(name))
        if op % 4 == 0:
            for name, f in fols.items():
                if not paused(name, op):
                    f.pump()
            if not paused("client", op):
                client.poll(0)
    storm_s = time.monotonic() - t0

    # -- what the store holds, asked independently -------------------------------------------
    held = es.exists_many(list(keys))
    want = {es.topic(m): set() for m in MODELS}
    for k, (m, h) in keys.items():
        if held[k]:
            want[es.topic(m)].add(h)
    evicted = sum(1 for k in keys if not held[k]) - (counts["delete"] - counts["delete_404"])
    assert evicted > 1000, f"the arena was meant to evict: {evicted} evictions"
    for m in MODELS:  # the exact per-pool index agrees (POST /batch/lookup)
        used = sorted({h for k, (mm, h) in keys.items() if mm == m})
        got = set()
        for i in range(0, len(used), 4096):
            part = used[i:i + 4096]
            ans = es.lookup(part, model=m)
            got |= {h for h, yes in zip(part, ans["held"]) if yes}
        assert got == want[es.topic(m)], f"/batch/lookup and /batch/exists disagree on {m}"

    # -- every subscriber ends exact ----------------------------------------------------------
    deadline = time.monotonic() + 30 * SLOW
    for name, f in fols.items():
        while any(f.hashes(t) != want[t] for t in topics) and time.monotonic() < deadline:
            f.pump(0.02)
            f.catch_up(topics)
        for t in topics:
            missing, extra = want[t] - f.hashes(t), f.hashes(t) - want[t]
            assert not missing and not extra, (f"{name} on {t}: {len(missing)} missing, {len(extra)} extra; "
                                               f"{vars(f.views.get(t, object()))!r:.600}")
        assert not f.violations, f.violations
    client.catch_up(topics)

    def client_exact():
        return client.idle() and all(client.hashes(t) == want[t] for t in topics)

    while not client_exact() and time.monotonic() < deadline:
        client.poll(0.02)
    assert client_exact(), [(t, len(client.hashes(t)), len(want[t]), client.pools.get(t)) for t in topics]

    # -- and they got there the hard way -------------------------------------------------------
    p, far = fols["paused"], fols["far"]
    report = {
        "storm_s": round(storm_s, 1), **counts, "evicted": evicted,
        "held": {t: len(want[t]) for t in topics},
        "paused": {f: p.total(f) for f in ("batches", "gaps", "replays", "resyncs", "stale", "restarts", "late_joins")},
        "far": {f: far.total(f) for f in ("batches", "gaps", "replays", "resyncs", "stale", "restarts", "late_joins")},
        "client": {t: client.pools[t].counters() for t in topics},
        "server": {m: es.metric(f"kvrelay_kv_events_{m}_total") for m in ("replays", "resyncs", "batches")},
    }
    for name in marks:
        m = marks[name] + [gaps_of(name)]
        report[f"{name}_gaps_per_pause"] = (m[1] - m[0], m[2] - m[1])
    print("storm:", report)
    # each pause lost messages, and each loss was repaired by a replay
    for name in marks:
        assert min(report[f"{name}_gaps_per_pause"]) >= 1, report
    assert p.total("replays") >= p.total("gaps"), report
    assert far.total("resyncs") >= 1, report  # too far behind: the buffer no longer had its seq
    client_gaps = sum(client.pools[t].gaps for t in topics)
    assert sum(client.pools[t].replays for t in topics) >= client_gaps, report
    assert all(client.pools[t].anomalies == 0 for t in topics), report
    assert report["server"]["resyncs"] >= 1 and report["server"]["replays"] >= 2, report
    assert counts["put_shared"] > 500 and counts["put_cross"] > 200, counts
