"""
Relay faults against the real server (docs/relay-contract.md):
a subscriber that stops reading is cut with SUBSCRIBER_LAGGED while another keeps receiving in
order; SIGKILL of the publisher ends the generation's streams and a resubscription converges to
the new generation; SIGKILL of a worker ends only the streams it served; a stalled snapshot hits
SNAPSHOT_PROGRESS_TIMEOUT; 64 streams of a type are admitted and the 65th refused.
"""

import os
import signal
import time

import pytest

from .conftest import (
    SLOW,
    STREAM_DEADLINE,
    assert_rpc_error,
    describe_end,
    hex_hash,
    rpc_status,
)
from .kvrelay_consumer import (
    CONTRACT_MARKER,
    KIND_SNAPSHOT_CHUNK,
    PoolReplica,
    bucket_count_for,
    check_envelope,
    occupied_slots,
    producer_key,
)
from .test_relay_contract import converge, drain_replica
from harness import client_ports, peer_ports, tcp_sockets, wait_until  # noqa: E402  (tests/e2e/harness.py)

# A client that buffers as little as possible: no BDP probing (which grows the HTTP/2 window to
# megabytes) and 1 KiB of stream look-ahead, so a reader that stops stalls the server's sends
# after a few frames.
SMALL_WINDOW = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 1024)]


def wait_for(cond, limit, what, step=0.05):
    return wait_until(cond, limit * SLOW, interval=step, what=what)


def put_blocks(r, hashes, prefix, size=256, conn=None):
    own = conn is None
    conn = conn or r.srv.connection()
    try:
        for i, h in enumerate(hashes):
            resp = r.put(f"{prefix}-{i}", b"b" * size, seqhash=hex_hash(h), conn=conn)
            assert resp.status in (200, 201), f"PUT {prefix}-{i}: {resp!r}"
    finally:
        if own:
            conn.close()


def subscribe_replica(r, producer, name, inc=None, stub=None, limit=10.0):
    rep = PoolReplica(producer, inc, name=name)
    rd = r.reader(r.subscribe(producer, name, stub=stub or r.new_stub()), name)
    drain_replica(rd, rep, lambda x: x.ready, limit, f"{name} snapshot")
    return rep, rd


# ---------------------------------------------------------------------------------------------


def test_lagging_subscriber_cut_other_in_order(relay):
    r = relay("--workers", "2", "--publication-threshold", "1", "--publication-delay", "1ms",
              "--max-blocks", "65536", "--memory", "64M")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    r.quiesce()

    # the reader: applies every frame as it arrives (violations recorded by the reader thread)
    good = PoolReplica(producer, inc, name="reader")
    good_rd = r.reader(r.subscribe(producer, "reader", stub=r.new_stub()), "reader",
                       on_msg=good.apply)
    # the laggard: reads its snapshot, then stops reading
    lag = PoolReplica(producer, inc, name="laggard")
    lag_call = r.subscribe(producer, "laggard", stub=r.new_stub(SMALL_WINDOW))
    lag_it = iter(lag_call)
    while not lag.ready:
        lag.apply(next(lag_it))
    wait_for(lambda: good.ready, 5, "reader snapshot")
    wait_for(lambda: r.debug_relay()["live_pool_subscribers"] == 2, 5, "two live subscribers")

    # Each PUT of a new canonical hash is one delta (threshold 1). Generate until the relay
    # drops the laggard (bounded in count and time), paced so that the worker serving the
    # reader is never starved of a chance to drain its 16 frames.
    conn = r.srv.connection()
    n = 0
    deadline = time.monotonic() + 60 * SLOW
    try:
        while n < 5000 and time.monotonic() < deadline:
            resp = r.put(f"lag-{n}", b"z" * 64, seqhash=0x1000000 + n, conn=conn)
            assert resp.status in (200, 201), resp
            n += 1
            time.sleep(0.003)  # pacing of the deltas, so the reader can keep up while the laggard cannot
            if n % 10 == 0 and r.debug_relay()["live_pool_subscribers"] < 2:
                break
    finally:
        conn.close()
    live = r.debug_relay()["live_pool_subscribers"]
    assert live == 1, f"the laggard was never dropped after {n} deltas (live subscribers {live})"
    assert n > 16, f"cut after only {n} deltas: the queue bound is 16 frames"
    # a few more deltas after the cut: the reader still gets them all
    for i in range(20):
        put_blocks(r, [0x2000000 + i], f"after-cut-{i}")
        time.sleep(0.003)  # pacing of the deltas, as above

    # The laggard now reads: deltas in order from its snapshot, then the lag error.
    got = 0
    try:
        for m in lag_it:
            lag.apply(m)  # contiguous deltas of the same producer, then the error
            got += 1
            assert got <= n + 40, "the laggard keeps receiving after it was dropped"
        pytest.fail(f"the laggard's stream ended cleanly after {got} frames; expected "
                    f"RESOURCE_EXHAUSTED/SUBSCRIBER_LAGGED")
    except Exception as e:
        import grpc

        if not isinstance(e, grpc.RpcError):
            raise
        code, reason, details = rpc_status(e)
        assert (code, reason) == ("RESOURCE_EXHAUSTED", "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED"), (
            f"laggard ended with {code}/{reason} ({details!r}) after {got} frames")
    assert lag.seq < n + 20, "the laggard cannot have received every delta"

    # The reader received every delta, contiguously, and equals the published filter.
    d = r.quiesce()
    wait_for(lambda: good.seq == d["published_seq"] or good_rd.callback_error or good_rd.end,
             10, "reader catches up")
    assert good_rd.callback_error is None, f"reader saw a violation: {good_rd.callback_error}"
    assert good_rd.end is None, f"reader's stream ended: {describe_end(good_rd.end)}"
    assert good.seq == d["published_seq"], (good.seq, d)
    assert good.deltas == good.seq - good.snapshot_seq, (good.deltas, good.snapshot_seq, good.seq)
    words = r.debug_filter()
    assert words == good.words, "the reader's replica differs from /debug/filter"
    assert all(good.contains(0x1000000 + i) for i in range(n))
    assert all(good.contains(0x2000000 + i) for i in range(20))
    assert occupied_slots(good.words) == n + 20


def test_laggard_cut_once_16_frames_are_queued(relay):
    """§1.7: a pool subscriber's queue holds 16 frames (16 MiB); a delta that cannot be
    enqueued cuts it with SUBSCRIBER_LAGGED. A subscriber that stopped reading after its
    snapshot can therefore hold at most 16 frames plus what HTTP/2 flow control let through.
    Allowance for the transport: a whole default HTTP/2 window (65535 bytes) of frames
    (~310), although this client announces only ~1 KiB of look-ahead. 400 deltas, paced at
    5 ms, must have cut it (the pacing makes the outcome independent of scheduling)."""
    MAX_DELTAS = 400
    r = relay("--workers", "1", "--publication-threshold", "1", "--max-blocks", "65536")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    r.quiesce()
    lag = PoolReplica(producer, inc, name="laggard")
    call = r.subscribe(producer, "laggard", stub=r.new_stub(SMALL_WINDOW))
    it = iter(call)
    while not lag.ready:
        lag.apply(next(it))
    conn = r.srv.connection()
    n = 0
    cut = False
    try:
        while n < MAX_DELTAS:
            resp = r.put(f"q-{n}", b"q" * 64, seqhash=0x4000000 + n, conn=conn)
            assert resp.status in (200, 201), resp
            n += 1
            time.sleep(0.005)  # pacing of the deltas until the queue bound cuts the laggard
            if n % 10 == 0 and r.debug_relay()["live_pool_subscribers"] == 0:
                cut = True
                break
    finally:
        conn.close()

    got, min_size, end = 0, None, None
    reader = r.reader(call, "laggard-resumed")
    deadline = time.monotonic() + 5 * SLOW
    while end is None and time.monotonic() < deadline:
        ev = reader.get(0.2)
        if ev is None:
            if not cut:
                break  # everything held for it has arrived
            continue
        if ev[0] == "msg":
            lag.apply(ev[2])
            got += 1
            size = ev[2].ByteSize() + 5 + 9  # gRPC message prefix, HTTP/2 DATA frame header
            min_size = size if min_size is None else min(min_size, size)
        else:
            end = ev
    bound = 16 + -(-65535 // (min_size or 200))
    assert cut, (
        f"a subscriber that stopped reading after its snapshot was not cut after {n} deltas "
        f"(paced 5 ms); once it read again it received {got} of them: the relay held them for it "
        f"beyond the 16-frame queue (at most {bound} expected: 16 frames + a 64 KiB HTTP/2 "
        f"window of {min_size}-byte frames)")
    assert end is not None and end[0] == "err", f"laggard: {describe_end(end)}"
    code, reason, details = rpc_status(end[2])
    assert (code, reason) == ("RESOURCE_EXHAUSTED", "RELAY_ERROR_REASON_SUBSCRIBER_LAGGED"), (
        code, reason, details)
    assert got <= bound, (
        f"the laggard received {got} frames after it resumed reading (of {n} published) before "
        f"SUBSCRIBER_LAGGED: more than 16 frames + a 64 KiB window ({bound})")


def test_publication_threshold_one_is_one_delta_per_event(relay):
    """§4.5: a publication boundary is pending_events >= threshold; with threshold 1 every
    event (a PUT of a new canonical hash) is its own delta N -> N+1, however fast the events
    come (concurrent writers here). Counted on published_seq: no subscriber runs during the
    burst, since a Python reader starved of the GIL by the writers would be (rightly) cut as
    lagging. A snapshot afterwards holds every fingerprint."""
    import threading

    WRITERS, EVENTS = 4, 800
    r = relay("--workers", "2", "--publication-threshold", "1", "--max-blocks", "8192")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    base_seq = r.quiesce()["published_seq"]

    def writer(t):
        put_blocks(r, [0x3000000 + 1000 * t + i for i in range(EVENTS // WRITERS)], f"pe{t}",
                   size=32)

    ths = [threading.Thread(target=writer, args=(t,), daemon=True) for t in range(WRITERS)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(60 * SLOW)
        assert not th.is_alive(), "writer did not finish"
    d = r.quiesce()
    assert d["published_seq"] - base_seq == EVENTS, (
        f"{EVENTS} PUTs of new canonical hashes with --publication-threshold 1 advanced "
        f"published_seq by {d['published_seq'] - base_seq}: events were batched into deltas")
    rep, rd = subscribe_replica(r, producer, "after-burst", inc)
    assert rep.snapshot_seq == d["published_seq"]
    assert occupied_slots(rep.words) == EVENTS
    converge(r, rep, rd, "after-burst")


# ---------------------------------------------------------------------------------------------


def test_publisher_sigkill_new_generation(relay):
    r = relay("--workers", "2", "--max-blocks", "4096", "--pool-heartbeat-interval", "500ms",
              "--load-window", "200ms")
    srv = r.srv
    srv.kills_expected = True
    inc = check_envelope(r.relay_info())
    pb = r.s.pb
    load_rd = r.reader(r.new_stub().SubscribeKvPoolLoad(pb.SubscribeKvPoolLoadRequest(
        subscriber_id="load", contract_marker=CONTRACT_MARKER), timeout=STREAM_DEADLINE), "load")
    hashes = [0x5000 + 7 * i for i in range(200)]
    put_blocks(r, hashes, "pub")
    d0 = r.quiesce()
    assert d0["generation"] == 1

    cat_rd = r.reader(r.watch_catalog(r.new_stub(), sid="cat"), "catalog")
    cat0 = cat_rd.next_msg(5 * SLOW, "catalog")
    check_envelope(cat0, inc)
    old = cat0.snapshot.pools[0].producer
    assert old.layout_generation == 1
    streams = [subscribe_replica(r, old, f"gen1-{i}", inc) for i in range(3)]
    for rep, _rd in streams:
        assert all(rep.contains(h) for h in hashes)

    pub = d0["publisher_pid"]
    assert pub in srv.children(), f"publisher pid {pub} is not a child of the supervisor"
    os.kill(pub, signal.SIGKILL)

    # every stream of generation 1 ends with UNAVAILABLE / PUBLICATION_UNAVAILABLE
    for rep, rd in streams:
        deadline = time.monotonic() + 10 * SLOW
        while True:
            ev = rd.get(max(0.01, deadline - time.monotonic()))
            assert ev is not None, f"{rep.name}: still open 10s after the publisher died"
            if ev[0] == "msg":
                rep.apply(ev[2])  # frames of generation 1 until the end, still contiguous
                continue
            assert ev[0] == "err", f"{rep.name}: {describe_end(ev)}"
            code, reason, details = rpc_status(ev[2])
            assert (code, reason) == ("UNAVAILABLE", "RELAY_ERROR_REASON_PUBLICATION_UNAVAILABLE"), (
                f"{rep.name} ended with {code}/{reason} ({details!r})")
            break

    # the catalog moves to a new revision carrying layout_generation 2 (same pool, same format)
    new = None
    last_rev = cat0.revision
    deadline = time.monotonic() + 15 * SLOW
    while new is None:
        m = cat_rd.next_msg(max(0.1, deadline - time.monotonic()), "a catalog with generation 2")
        check_envelope(m, inc)
        assert m.revision >= last_rev, f"catalog revision went back {last_rev} -> {m.revision}"
        assert len(m.snapshot.pools) <= 1, m
        last_rev = m.revision
        if m.snapshot.pools and m.snapshot.pools[0].producer.layout_generation != 1:
            assert m.revision > cat0.revision, "a new generation must change the catalog revision"
            new = m.snapshot.pools[0].producer
    assert new.layout_generation == 2, new
    assert new.producer_incarnation == inc == old.producer_incarnation
    assert new.pool_id == old.pool_id and new.ckf_format == old.ckf_format
    d1 = r.debug_relay()
    assert (d1["generation"], d1["incarnation"]) == (2, inc), d1
    assert d1["publisher_pid"] != pub and d1["publisher_pid"] in srv.children(), d1
    assert check_envelope(r.relay_info()) == inc, "relay_incarnation must not change"

    # the load stream goes on (its own plane) and lists the pool under the new producer
    deadline = time.monotonic() + 5 * SLOW
    while True:
        m = load_rd.next_msg(2 * SLOW, "a load window")
        check_envelope(m, inc)
        if m.pools and producer_key(m.pools[0].producer) == producer_key(new):
            assert m.pools[0].kv_used_blocks == len(hashes), m
            break
        assert time.monotonic() < deadline, f"load windows never showed generation 2: {m}"

    # the old producer is refused, the new one converges to the whole resident set
    assert_rpc_error(lambda: next(iter(r.subscribe(old, "stale", timeout=10))),
                     "FAILED_PRECONDITION", "RELAY_ERROR_REASON_PRODUCER_CHANGED",
                     "SubscribeKvPool with the generation-1 producer")
    rep, rd = subscribe_replica(r, new, "gen2", inc)
    more = [0x9000 + i for i in range(30)]
    put_blocks(r, more, "pub-after")
    converge(r, rep, rd, "gen2")
    missing = [hex_hash(h) for h in hashes + more if not rep.contains(h)]
    assert not missing, f"resident hashes missing from generation 2: {missing[:5]}"
    assert occupied_slots(rep.words) == len(hashes) + len(more)


# ---------------------------------------------------------------------------------------------


def test_worker_sigkill_ends_only_its_streams(relay):
    r = relay("--workers", "2", "--max-blocks", "4096", "--pool-heartbeat-interval", "500ms")
    srv = r.srv
    srv.kills_expected = True
    inc = check_envelope(r.relay_info())
    put_blocks(r, [0x7000 + i for i in range(50)], "w")
    r.quiesce()
    producer = r.producer()
    gen = r.debug_relay()["generation"]
    pub = r.debug_relay()["publisher_pid"]

    # every stream has a connection of its own (r.new_stub()); the connections open before the
    # first stream are the relay client's default channel, which carries no stream
    grpc_port = int(srv.grpc.rpartition(":")[2])
    baseline = client_ports(grpc_port)
    streams = []
    victims, survivors = [], []
    for attempt in range(3):
        for i in range(8):
            streams.append(subscribe_replica(r, producer, f"s{attempt}-{i}", inc))
        workers = r.worker_pids()
        assert len(workers) == 2, f"workers {workers}"
        victim = workers[attempt % 2]
        on_victim = peer_ports(victim, grpc_port) - baseline
        os.kill(victim, signal.SIGKILL)
        # streams of the dead worker end at once (connection gone): one per connection it had
        wait_until(lambda: sum(rd.end is not None for _, rd in streams) >= len(on_victim), 10 * SLOW,
                   what=lambda: (f"the {len(on_victim)} streams of the killed worker {victim} to end: "
                                 f"{sum(rd.end is not None for _, rd in streams)} of {len(streams)} ended; "
                                 f"client ends {[(r['local'][1], r['state']) for r in tcp_sockets(grpc_port) if r['local'][1] in on_victim]}"))
        victims = [(rep, rd) for rep, rd in streams if rd.end is not None]
        survivors = [(rep, rd) for rep, rd in streams if rd.end is None]
        srv.wait_workers(2, exclude=[victim])
        if victims and survivors:
            break
        streams = survivors
    assert victims and survivors, (
        f"after 3 rounds the streams never split between two workers "
        f"({len(victims)} ended, {len(survivors)} alive)")

    for rep, rd in victims:
        assert rd.end[0] == "err", f"{rep.name}: {describe_end(rd.end)}"
        assert rpc_status(rd.end[2])[0] == "UNAVAILABLE", f"{rep.name}: {describe_end(rd.end)}"

    d = r.debug_relay()
    assert (d["generation"], d["publisher_pid"], d["incarnation"]) == (gen, pub, inc), (
        f"a worker's death must not touch the publisher or the generation: {d}")
    # the dead worker's subscriber slots are released
    wait_for(lambda: r.debug_relay()["live_pool_subscribers"] == len(survivors), 10,
             f"live_pool_subscribers == {len(survivors)} survivors")

    # the survivors keep receiving, in order, and converge
    more = [0xA000 + i for i in range(40)]
    put_blocks(r, more, "w-after")
    for rep, rd in survivors:
        converge(r, rep, rd, rep.name)
        assert all(rep.contains(h) for h in more)
    # and a new subscription is served
    rep, rd = subscribe_replica(r, producer, "after-kill", inc)
    converge(r, rep, rd, "after-kill")


# ---------------------------------------------------------------------------------------------


def test_stalled_snapshot_times_out(relay):
    expected = 4194304
    bc = bucket_count_for(expected)  # 2097152 buckets: a 16 MiB snapshot in 4 chunks
    r = relay("--workers", "1", "--expected-unique-blocks", str(expected),
              "--snapshot-progress-timeout", "1s", "--max-blocks", "4096")
    inc = check_envelope(r.relay_info())
    put_blocks(r, [0xB000 + i for i in range(100)], "snap")
    d0 = r.quiesce()
    producer = r.producer()
    assert producer.ckf_format.bucket_count == bc == d0["bucket_count"]

    stalled = PoolReplica(producer, inc, name="stalled")
    call = r.subscribe(producer, "stalled", stub=r.new_stub(SMALL_WINDOW))
    time.sleep(3.0)  # opened, never read
    got = 0
    import grpc

    try:
        for m in call:
            stalled.apply(m)
            got += 1
            assert not stalled.ready, (
                f"the stalled subscriber received the whole snapshot ({got} chunks): it was "
                f"never cut after 3 s without reading (timeout 1 s)")
        pytest.fail(f"stalled snapshot ended cleanly after {got} chunks")
    except grpc.RpcError as e:
        code, reason, details = rpc_status(e)
        assert (code, reason) == ("RESOURCE_EXHAUSTED",
                                  "RELAY_ERROR_REASON_SNAPSHOT_PROGRESS_TIMEOUT"), (
            f"stalled snapshot ended with {code}/{reason} ({details!r}) after {got} chunks")

    # the generation is not fenced; a subscriber that reads gets the whole snapshot
    d1 = r.debug_relay()
    assert d1["generation"] == d0["generation"], f"a stalled snapshot must not fence: {d1}"
    rep, rd = subscribe_replica(r, producer, "reading", inc, limit=30)
    assert rep.chunks == 4
    converge(r, rep, rd, "reading", limit=30)
    wait_for(lambda: r.debug_relay()["live_pool_subscribers"] == 1, 5, "one live subscriber")


# ---------------------------------------------------------------------------------------------


def _open_many(r, kind, n, channels, producer):
    pb = r.s.pb
    readers = []
    for i in range(n):
        stub = r.stub_for(channels[i % len(channels)])
        readers.append(r.reader(_start(stub, pb, kind, f"{kind}-{i}", producer), f"{kind}-{i}"))
    for rd in readers:
        rd.next_msg(10 * SLOW, f"first message of {rd.name}")
    return readers


def _start(stub, pb, kind, sid, producer, timeout=STREAM_DEADLINE):
    m = CONTRACT_MARKER
    if kind == "pool":
        req = pb.SubscribeKvPoolRequest(subscriber_id=sid, contract_marker=m)
        req.expected_producer.CopyFrom(producer)
        return stub.SubscribeKvPool(req, timeout=timeout)
    if kind == "catalog":
        return stub.WatchKvPoolCatalog(
            pb.WatchKvPoolCatalogRequest(subscriber_id=sid, contract_marker=m), timeout=timeout)
    if kind == "readiness":
        return stub.SubscribeServingReadiness(
            pb.SubscribeServingReadinessRequest(subscriber_id=sid, contract_marker=m),
            timeout=timeout)
    if kind == "kvload":
        return stub.SubscribeKvPoolLoad(
            pb.SubscribeKvPoolLoadRequest(subscriber_id=sid, contract_marker=m), timeout=timeout)
    if kind == "servingload":
        return stub.SubscribeServingLoad(
            pb.SubscribeServingLoadRequest(subscriber_id=sid, contract_marker=m), timeout=timeout)
    raise ValueError(kind)


def test_admission_limit_64_per_stream_type(relay):
    r = relay("--workers", "2", "--max-blocks", "4096")
    producer = r.producer()
    pb = r.s.pb
    channels = [r.channel() for _ in range(8)]
    extra = r.new_stub()
    limit = "RELAY_ERROR_REASON_RESOURCE_LIMIT"

    pool = _open_many(r, "pool", 64, channels, producer)
    assert r.debug_relay()["live_pool_subscribers"] == 64
    assert_rpc_error(lambda: next(iter(_start(extra, pb, "pool", "pool-65", producer, 10))),
                     "RESOURCE_EXHAUSTED", limit, "the 65th SubscribeKvPool")
    # validation comes before admission, admission before the pool lookup (§2.5 order)
    bad = type(producer)()
    bad.CopyFrom(producer)
    bad.layout_generation = 0
    assert_rpc_error(lambda: next(iter(_start(extra, pb, "pool", "bad-65", bad, 10))),
                     "INVALID_ARGUMENT", "RELAY_ERROR_REASON_INVALID_REQUEST",
                     "a malformed SubscribeKvPool while the limit is reached")
    other = type(producer)()
    other.CopyFrom(producer)
    other.pool_id.dc_id ^= 1
    assert_rpc_error(lambda: next(iter(_start(extra, pb, "pool", "other-65", other, 10))),
                     "RESOURCE_EXHAUSTED", limit, "an unknown pool while the limit is reached")
    # closing one stream frees one permit
    pool[0].cancel()

    def admitted():
        import grpc

        call = _start(extra, pb, "pool", "pool-again", producer, 10)
        try:
            m = next(iter(call))
            assert m.kind == KIND_SNAPSHOT_CHUNK
            return call
        except grpc.RpcError as e:
            code, reason, _ = rpc_status(e)
            assert (code, reason) == ("RESOURCE_EXHAUSTED", limit), (code, reason)
            return None

    again = wait_for(admitted, 5, "a pool stream admitted after one was closed", step=0.1)
    again.cancel()

    # every other stream type has its own limit of 64, independent of the 63 pool streams
    for kind in ("catalog", "readiness", "kvload", "servingload"):
        readers = _open_many(r, kind, 64, channels, producer)
        assert_rpc_error(lambda: next(iter(_start(extra, pb, kind, f"{kind}-65", producer, 10))),
                         "RESOURCE_EXHAUSTED", limit, f"the 65th {kind} stream")
        for rd in readers:
            rd.cancel()
            assert rd.end is not None and rd.end[0] == "err" and (
                rpc_status(rd.end[2])[0] == "CANCELLED"), f"{rd.name}: {describe_end(rd.end)}"
    for rd in pool[1:]:
        assert rd.end is None, f"{rd.name} ended: {describe_end(rd.end)}"
        rd.cancel()
