"""
The relay's wire contract against the real server (docs/relay-contract.md,
§1.5-§1.8, §2, §3, §6.1): GetRelayInfo and health, the catalog, a pool stream replicated by the
fail-closed consumer while PUT/DELETE/eviction traffic runs, heartbeats, the load and readiness
streams, and every request validation error of §2.5 with its status and reason trailer.
"""

import random
import statistics
import threading
import time

import pytest

from .conftest import (
    SERVICE,
    SLOW,
    STREAM_DEADLINE,
    assert_rpc_error,
    describe_end,
    hex_hash,
    wait_until,
)
from .kvrelay_consumer import (
    CONTRACT_MARKER,
    DATA_STATUS_UNAVAILABLE,
    DEFAULT_SEED,
    KIND_HEARTBEAT,
    WORKER_ROLE_LEGACY,
    LoadWindowChecker,
    PoolReplica,
    bucket_count_for,
    check_descriptor,
    check_envelope,
    occupied_slots,
    producer_key,
)

PATH = "/" + SERVICE + "/"
STREAMING = ["WatchKvPoolCatalog", "SubscribeKvPool", "SubscribeServingReadiness",
             "SubscribeKvPoolLoad", "SubscribeServingLoad"]


# ---------------------------------------------------------------------------------------------
# GetRelayInfo and health


def test_relay_info_and_health(relay):
    r = relay("--workers", "2")
    info = r.relay_info()
    inc = check_envelope(info, what="RelayInfo")
    dbg = r.debug_relay()
    assert inc == dbg["incarnation"], f"RelayInfo incarnation {inc:#x} != /debug/relay {dbg}"
    for _ in range(4):  # new connections may land on either worker: one incarnation
        check_envelope(r.relay_info(r.new_stub()), inc, what="RelayInfo (new connection)")

    hpb, hrpc = r.s.hpb, r.s.hrpc
    health = hrpc.HealthStub(r.default_channel)
    for svc in ("", SERVICE):
        resp = health.Check(hpb.HealthCheckRequest(service=svc), timeout=10)
        assert resp.status == hpb.HealthCheckResponse.SERVING, f"Health/Check({svc!r}): {resp}"
    import grpc

    try:
        resp = health.Check(hpb.HealthCheckRequest(service="no.such.Service"), timeout=10)
        pytest.fail(f"Health/Check of an unknown service answered {resp}, expected NOT_FOUND")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, f"unknown service: {e.code()} {e.details()}"


# ---------------------------------------------------------------------------------------------
# Catalog


IDENTITY_CASES = {
    # model, block size, hash format, endpoint, dc -> cache digest, routing digest, dc_id (§2.9)
    "standard-dc-a": (
        ["--model", "meta/llama", "--kv-block-size", "512", "--hash-format", "standard",
         "--endpoint", "prod/router/generate", "--dc-id", "dc-a"],
        "7d31eb9019357572470605f4a8be687e", "18270d3ba03effaec8d167ba02c7752d",
        0x04F110C98B1BFC48, 1,
    ),
    "eagle-us-west": (
        ["--model", "meta/llama", "--kv-block-size", "512", "--hash-format", "eagle",
         "--endpoint", "prod/router/generate", "--dc-id", "us-west"],
        "deae03cf69f6e4a47cbec26ceba95354", "18270d3ba03effaec8d167ba02c7752d",
        0xDCCAA7BFA0F30F77, 2,
    ),
}


@pytest.mark.parametrize("case", sorted(IDENTITY_CASES))
def test_catalog_complete_immediate_golden_identity(relay, case):
    args, cache_hex, route_hex, dc_id, hash_format = IDENTITY_CASES[case]
    r = relay("--workers", "1", "--expected-unique-blocks", "1000", *args)
    inc = check_envelope(r.relay_info(), what="RelayInfo")
    dbg = r.debug_relay()

    t0 = time.monotonic()
    call = r.watch_catalog(sid="pylon")
    rd = r.reader(call, "catalog")
    first = rd.next_msg(3.0 * SLOW, "the first catalog snapshot")
    took = time.monotonic() - t0
    assert took < 2.0 * SLOW, f"first catalog message took {took:.2f}s: must be immediate"
    check_envelope(first, inc, what="KvPoolCatalogUpdate")
    assert first.revision == dbg["catalog_revision"], (first.revision, dbg)
    pools = first.snapshot.pools
    assert len(pools) == 1, f"one pool per kvrelay: {first}"
    d = pools[0]
    check_descriptor(d)
    p = d.producer
    dom = p.pool_id.indexer_domain
    assert p.pool_id.identity_version == 1
    assert dom.cache_semantics.digest.hex() == cache_hex, f"cache_semantics digest: {d}"
    assert dom.routing_scope.digest.hex() == route_hex, f"routing_scope digest: {d}"
    assert dom.cache_semantics.source == 1 and dom.routing_scope.source == 1, d
    assert p.pool_id.dc_id == dc_id == dbg["dc_id"], (hex(p.pool_id.dc_id), dbg)
    assert p.producer_incarnation == inc, "producer_incarnation must equal relay_incarnation"
    assert p.layout_generation == dbg["generation"] == 1, (p.layout_generation, dbg)
    f = p.ckf_format
    assert (f.format_version, f.seed, f.bucket_count, f.fingerprint_bits, f.slots_per_bucket) == (
        1, DEFAULT_SEED, bucket_count_for(1000), 16, 4), f
    assert f.bucket_count == dbg["bucket_count"], dbg
    ep = d.serving_endpoint
    assert (ep.namespace, ep.component, ep.endpoint) == ("prod", "router", "generate"), ep
    assert len(d.registrations) == 1, d.registrations
    reg = d.registrations[0]
    assert reg.target.WhichOneof("target") == "base", reg
    assert reg.target.base.base_model == "meta/llama", reg
    assert reg.canonical_model_id == "meta/llama", reg
    assert d.query_semantics.kv_block_size == 512 and d.query_semantics.hash_format == hash_format
    assert list(d.pool_roles) == [WORKER_ROLE_LEGACY], d.pool_roles

    # A second watcher sees the same complete catalog; nothing changes while idle: any repeat
    # carries the same revision and snapshot.
    second = r.reader(r.watch_catalog(r.new_stub(), sid="pylon-2"), "catalog-2").next_msg(
        3.0 * SLOW, "the second watcher's catalog")
    assert second.revision == first.revision and second.snapshot == first.snapshot
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        ev = rd.get(0.1)
        if ev is None:
            continue
        assert ev[0] == "msg", f"catalog stream ended: {describe_end(ev)}"
        assert ev[2].revision == first.revision and ev[2].snapshot == first.snapshot, ev[2]


# ---------------------------------------------------------------------------------------------
# The pool stream under traffic


class Traffic:
    """HTTP threads doing PUT (canonical hash chosen by X-KV-Sequence-Hash), DELETE and
    shared-hash PUTs, bounded in count and time. Records every key -> hash it ever PUT."""

    def __init__(self, r, threads=3, ops=300, seconds=20.0, sizes=(16 << 10, 48 << 10, 96 << 10)):
        self.r = r
        self.nthreads = threads
        self.ops = ops
        self.seconds = seconds * SLOW
        self.sizes = sizes
        self.lock = threading.Lock()
        self.key_hash = {}
        self.errors = []
        self.counts = {"put": 0, "delete": 0, "shared": 0}
        self.threads = []
        self.payload = random.Random(7).randbytes(max(sizes))

    def start(self):
        self.deadline = time.monotonic() + self.seconds
        for t in range(self.nthreads):
            th = threading.Thread(target=self._run, args=(t,), daemon=True)
            th.start()
            self.threads.append(th)
        return self

    def join(self):
        for th in self.threads:
            th.join(self.seconds + 30)
            assert not th.is_alive(), "traffic thread did not finish"
        assert not self.errors, f"HTTP errors during traffic: {self.errors[:5]}"

    def _run(self, tid):
        rng = random.Random(1000 + tid)
        conn = self.r.srv.connection(timeout=20)
        mine = []
        try:
            for i in range(self.ops):
                if time.monotonic() > self.deadline:
                    break
                x = rng.random()
                if x < 0.15 and mine:
                    key = mine.pop(rng.randrange(len(mine)))
                    resp = self.r.delete(key, conn=conn)
                    if resp.status not in (200, 204, 404):  # 404: evicted meanwhile
                        self.errors.append(("DELETE", key, resp))
                    with self.lock:
                        self.counts["delete"] += 1
                    continue
                key = f"t{tid}-{i}-{rng.getrandbits(32):08x}"
                if x < 0.22 and mine:
                    # a second block with the canonical hash of an existing one (owner count)
                    h = self.key_hash[rng.choice(mine)]
                    with self.lock:
                        self.counts["shared"] += 1
                else:
                    h = rng.getrandbits(64) or 1
                size = rng.choice(self.sizes)
                with self.lock:
                    self.key_hash[key] = h
                resp = self.r.put(key, self.payload[:size], seqhash=h if rng.random() < 0.5
                                  else hex_hash(h), conn=conn)
                if resp.status not in (200, 201):
                    self.errors.append(("PUT", key, resp))
                mine.append(key)
                with self.lock:
                    self.counts["put"] += 1
        finally:
            conn.close()


def drain_replica(rd, replica, until, limit, what, each=None):
    """Applies frames from reader rd to replica until until(replica) holds; each(replica), when
    given, is checked after every frame applied once the replica is installed."""
    deadline = time.monotonic() + limit * SLOW
    while not until(replica):
        left = deadline - time.monotonic()
        assert left > 0, (f"{what}: condition not reached within {limit}s (ready {replica.ready}, "
                          f"seq {replica.seq}, deltas {replica.deltas})")
        ev = rd.get(min(left, 0.5))
        if ev is None:
            continue
        assert ev[0] == "msg", f"{what}: stream ended: {describe_end(ev)}"
        replica.apply(ev[2])
        if each is not None and replica.ready:
            each(replica)


def converge(r, replica, rd, what, limit=15.0):
    """Quiesces the publisher and drains the replica to the published sequence; returns
    /debug/relay. The replica must then equal /debug/filter bucket for bucket."""
    d = r.quiesce()
    drain_replica(rd, replica, lambda rep: rep.ready and rep.seq >= d["published_seq"], limit, what)
    assert replica.seq == d["published_seq"], f"{what}: replica at {replica.seq}, published {d}"
    words = r.debug_filter()
    assert len(words) == replica.bucket_count == d["bucket_count"], (len(words), d)
    if words != replica.words:
        diff = [i for i in range(len(words)) if words[i] != replica.words[i]]
        raise AssertionError(
            f"{what}: replica differs from /debug/filter in {len(diff)} buckets, e.g. "
            + ", ".join(f"[{i}] replica {replica.words[i]:#x} filter {words[i]:#x}"
                        for i in diff[:5]))
    return d


def test_pool_stream_replica_under_traffic(relay):
    # 8 MiB arena of up to 96 KiB blocks, 1024 index entries: the traffic below evicts.
    r = relay("--workers", "2", "--memory", "8M", "--max-blocks", "1024",
              "--expected-unique-blocks", "1024")
    inc = check_envelope(r.relay_info())
    cat = r.catalog()
    producer = cat.snapshot.pools[0].producer
    bc = producer.ckf_format.bucket_count
    assert bc == bucket_count_for(1024)
    d0 = r.quiesce()

    rep1 = PoolReplica(producer, inc, name="sub-1")
    rd1 = r.reader(r.subscribe(producer, "sub-1"), "sub-1")
    drain_replica(rd1, rep1, lambda rep: rep.ready, 5.0, "sub-1 snapshot")
    assert rep1.snapshot_seq == d0["published_seq"], (rep1.snapshot_seq, d0)
    assert rep1.chunks == 1 and occupied_slots(rep1.words) == 0

    tr = Traffic(r, ops=400).start()
    # a second subscriber joins mid-traffic: its snapshot is taken at some sequence N > 0
    wait_until(lambda: r.debug_relay()["published_seq"] >= 20, 10 * SLOW, what="20 publications of the traffic")
    rep2 = PoolReplica(producer, inc, name="sub-2")
    rd2 = r.reader(r.subscribe(producer, "sub-2", stub=r.new_stub()), "sub-2")
    # sub-1 is drained continuously while the traffic runs
    while any(t.is_alive() for t in tr.threads):
        ev = rd1.get(0.2)
        if ev is not None:
            assert ev[0] == "msg", f"sub-1 ended during traffic: {describe_end(ev)}"
            rep1.apply(ev[2])
    tr.join()
    assert tr.counts["put"] > 300 and tr.counts["delete"] > 20 and tr.counts["shared"] > 10, tr.counts

    d = converge(r, rep1, rd1, "sub-1")
    converge(r, rep2, rd2, "sub-2")
    assert rep2.snapshot_seq > 0, "sub-2 should have joined after some deltas"
    assert rep1.deltas == d["published_seq"] - d0["published_seq"], (rep1.deltas, d)
    stats = r.stats()
    assert stats["evictions"] > 0, f"the traffic was meant to evict: {stats}"

    # Residency by HEAD; every resident block's canonical hash is in the replica, and the
    # filter holds exactly one fingerprint per distinct resident hash (owner counting §4.5).
    conn = r.srv.connection()
    resident = {}
    try:
        for key, h in sorted(tr.key_hash.items()):
            st = r.head(key, conn=conn).status
            assert st in (200, 404), f"HEAD {key}: {st}"
            if st == 200:
                resident[key] = h
    finally:
        conn.close()
    assert 20 < len(resident) < len(tr.key_hash), (len(resident), len(tr.key_hash))
    assert stats["unique_blocks"] == len(resident), (stats, len(resident))
    missing = [(k, hex_hash(h)) for k, h in resident.items() if not rep1.contains(h)]
    assert not missing, f"{len(missing)} resident blocks' hashes are not in the replica: {missing[:5]}"
    distinct = set(resident.values())
    assert len(distinct) < len(resident), "the traffic was meant to share hashes between blocks"
    assert occupied_slots(rep1.words) == len(distinct), (
        f"filter holds {occupied_slots(rep1.words)} fingerprints for {len(distinct)} distinct "
        f"resident canonical hashes")
    assert r.debug_relay()["published_seq"] == rep1.seq
    print(f"traffic {tr.counts}, sub-1 {rep1.deltas} deltas {rep1.images} images, sub-2 snapshot at {rep2.snapshot_seq}, resident {len(resident)} of {len(tr.key_hash)} keys, {len(distinct)} distinct hashes, {stats['evictions']} evictions")


def test_owner_counting_one_fingerprint_per_canonical_hash(relay):
    """§4.5 / profile: the first resident block with a canonical hash inserts one fingerprint,
    the last one to leave removes it; blocks with other hashes are untouched."""
    r = relay("--workers", "2", "--max-blocks", "1024")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    r.quiesce()
    rep = PoolReplica(producer, inc, name="owners")
    rd = r.reader(r.subscribe(producer, "owners"), "owners")
    drain_replica(rd, rep, lambda x: x.ready, 5.0, "snapshot")
    h, other = 0x0123456789ABCDEF, 0xFEDCBA9876543210

    def step(what, expect_slots, expect_h):
        converge(r, rep, rd, what)
        assert occupied_slots(rep.words) == expect_slots, f"{what}: {occupied_slots(rep.words)} fingerprints"
        if expect_h:
            assert rep.contains(h), f"{what}: hash {h:#x} missing"

    assert r.put("owner-a", b"a" * 100, seqhash=hex_hash(h)).status in (200, 201)
    assert r.put("owner-o", b"o" * 100, seqhash=str(other)).status in (200, 201)
    step("first owner", 2, True)
    assert r.put("owner-b", b"b" * 100, seqhash=str(h)).status in (200, 201)
    step("second owner of the same hash", 2, True)
    assert r.delete("owner-a").status in (200, 204)
    step("one owner left", 2, True)
    assert r.delete("owner-b").status in (200, 204)
    step("last owner gone", 1, False)
    assert rep.contains(other)
    # the 16-hex-digit key is its own canonical hash when no header is sent
    assert r.put("00000000deadbeef", b"k" * 100).status in (200, 201)
    step("hex key", 2, False)
    assert rep.contains(0xDEADBEEF)


def test_heartbeats_when_idle(relay):
    r = relay("--workers", "1", "--pool-heartbeat-interval", "300ms")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    rep = PoolReplica(producer, inc, name="hb")
    rd = r.reader(r.subscribe(producer, "hb"), "hb")
    drain_replica(rd, rep, lambda x: x.ready, 5.0, "snapshot")
    stamps = []  # the producer's send_ts_us: the server's own timing, not our scheduling
    for i in range(5):
        m = rd.next_msg(2.0 * SLOW, f"heartbeat {i}")
        assert rep.apply(m) == KIND_HEARTBEAT, f"idle stream sent kind {m.kind}"
        stamps.append(m.send_ts_us)
    now_us = time.time() * 1e6
    assert all(abs(now_us - t) < 60e6 for t in stamps), f"send_ts_us {stamps} vs now {now_us:.0f}"
    gaps = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:])]
    assert all(0.25 <= g <= 1.0 * SLOW for g in gaps), f"heartbeat gaps {gaps} for a 300 ms interval"
    assert rep.seq == rep.snapshot_seq

    # A delta moves the sequence; heartbeats then carry the new one.
    resp = r.put("hb-block", b"x" * 100, seqhash=0xABCDEF)
    assert resp.status in (200, 201), resp
    drain_replica(rd, rep, lambda x: x.deltas >= 1, 5.0, "delta after PUT")
    assert rep.contains(0xABCDEF)
    for i in range(2):
        m = rd.next_msg(2.0 * SLOW, f"heartbeat after delta {i}")
        assert rep.apply(m) == KIND_HEARTBEAT and m.sequence == rep.seq == rep.snapshot_seq + 1


# ---------------------------------------------------------------------------------------------
# Load and readiness streams


def _collect(rd, n, limit, what):
    out = []
    deadline = time.monotonic() + limit * SLOW
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"{what}: only {len(out)} of {n} messages in {limit}s"
        ev = rd.get(min(left, 0.5))
        if ev is None:
            continue
        assert ev[0] == "msg", f"{what}: stream ended: {describe_end(ev)}"
        out.append((ev[1], ev[2]))
    return out


def _median_gap(msgs):
    return statistics.median(b[0] - a[0] for a, b in zip(msgs, msgs[1:]))


def test_load_and_readiness_streams(relay):
    r = relay("--workers", "1", "--load-window", "200ms", "--max-blocks", "1024",
              "--readiness-heartbeat-interval", "300ms")
    pb = r.s.pb
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    key = producer_key(producer)

    t0 = time.monotonic()
    kv = r.reader(r.stub.SubscribeKvPoolLoad(pb.SubscribeKvPoolLoadRequest(
        subscriber_id="load", contract_marker=CONTRACT_MARKER), timeout=STREAM_DEADLINE), "kvload")
    sv = r.reader(r.new_stub().SubscribeServingLoad(pb.SubscribeServingLoadRequest(
        subscriber_id="sload", contract_marker=CONTRACT_MARKER), timeout=STREAM_DEADLINE), "sload")
    rr = r.reader(r.new_stub().SubscribeServingReadiness(pb.SubscribeServingReadinessRequest(
        subscriber_id="ready", contract_marker=CONTRACT_MARKER), timeout=STREAM_DEADLINE), "ready")

    kvc = LoadWindowChecker("KvPoolLoadUpdate")
    svc = LoadWindowChecker("ServingLoadUpdate", serving=True)

    first = kv.next_msg(2.0 * SLOW, "the initial kv load window")
    assert time.monotonic() - t0 < 1.0 * SLOW, "the initial load window must be immediate"
    kvc.apply(first)
    assert first.window_ms == 200, first
    for t, m in _collect(kv, 6, 5.0, "kv load windows"):
        kvc.apply(m)
        assert check_envelope(m) == inc
        assert m.window_ms == 200 and len(m.pools) == 1, m
        e = m.pools[0]
        assert producer_key(e.producer) == key, "load entry producer != catalog producer"
        assert (e.total_kv_blocks, e.kv_observed_ranks, e.kv_expected_ranks) == (1024, 1, 1), e
        assert e.kv_used_blocks == 0, f"no block stored yet: {e}"

    # kv_used_blocks follows the resident blocks
    for i in range(5):
        assert r.put(f"load-{i}", b"y" * 1000, seqhash=1000 + i).status in (200, 201)
    r.put("load-0", b"y" * 1000, seqhash=1000)  # dedup: still 5 resident blocks
    assert r.stats()["unique_blocks"] == 5
    deadline = time.monotonic() + 5 * SLOW
    while True:
        m = kv.next_msg(2.0 * SLOW, "kv load window")
        kvc.apply(m)
        if m.pools[0].kv_used_blocks == 5:
            break
        assert m.pools[0].kv_used_blocks <= 5, m
        assert time.monotonic() < deadline, f"kv_used_blocks never became 5: {m}"
    msgs = _collect(kv, 8, 5.0, "kv load windows")
    for _t, m in msgs:
        kvc.apply(m)
        assert m.pools[0].kv_used_blocks == 5, m
    g = _median_gap(msgs)
    assert 0.1 <= g <= 0.4 * SLOW, f"kv load windows every {g:.3f}s for a 200 ms window"

    # serving load: the pool listed as UNAVAILABLE with its gauges unset, no models
    msgs = _collect(sv, 8, 5.0, "serving load windows")
    for _t, m in msgs:
        svc.apply(m)
        assert check_envelope(m) == inc
        assert m.window_ms == 200 and len(m.pools) == 1 and len(m.models) == 0, m
        pl = m.pools[0]
        assert producer_key(pl.producer) == key, "serving-load pool producer != catalog producer"
        assert pl.load.status == DATA_STATUS_UNAVAILABLE, pl
    g = _median_gap(msgs)
    assert 0.1 <= g <= 0.4 * SLOW, f"serving load windows every {g:.3f}s for a 200 ms window"

    # readiness: complete, empty topology, repeated at the same revision
    msgs = _collect(rr, 4, 5.0, "readiness snapshots")
    rev = msgs[0][1].revision
    for _t, m in msgs:
        assert check_envelope(m) == inc
        assert len(m.entries) == 0, f"kvrelay serves no models: {m}"
        assert m.revision == rev, f"readiness revision moved while nothing changed: {m.revision} vs {rev}"
    g = _median_gap(msgs)
    assert 0.15 <= g <= 0.6 * SLOW, f"readiness repeats every {g:.3f}s for a 300 ms interval"


# ---------------------------------------------------------------------------------------------
# Request validation (§2.5, §2.6)


def _varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def raw_request(sid_bytes, marker=CONTRACT_MARKER, producer=None):
    """A streaming request hand-encoded: field 1 subscriber_id (raw bytes, so that invalid
    UTF-8 can be sent), field 2 expected_producer, field 127 the marker (fixed32)."""
    out = bytearray()
    if sid_bytes is not None:
        out += b"\x0a" + _varint(len(sid_bytes)) + sid_bytes
    if producer is not None:
        pb = producer.SerializeToString()
        out += b"\x12" + _varint(len(pb)) + pb
    if marker is not None:
        out += b"\xfd\x07" + marker.to_bytes(4, "little")
    return bytes(out)


def call_raw(r, method, body, stub_channel=None):
    """First response message of a raw call (bytes), raising grpc.RpcError on an error."""
    ch = stub_channel or r.default_channel
    if method == "GetRelayInfo":
        fn = ch.unary_unary(PATH + method, request_serializer=None, response_deserializer=None)
        return fn(body, timeout=10 * SLOW)
    fn = ch.unary_stream(PATH + method, request_serializer=None, response_deserializer=None)
    call = fn(body, timeout=10 * SLOW)
    try:
        return next(iter(call))
    finally:
        call.cancel()


def _needs_producer(method, producer):
    return producer if method == "SubscribeKvPool" else None


BAD_SIDS = {
    "empty": b"",
    "129-bytes": b"s" * 129,
    "65-two-byte-chars": "é".encode() * 65,  # 130 bytes
    "C0-control": b"pool\x01sub",
    "newline": b"pool\nsub",
    "DEL": b"pool\x7fsub",
    "C1-control": "pool\u0085sub".encode(),
    "invalid-utf8": b"pool\xffsub",
    "truncated-utf8": b"pool\xc3",
    "overlong-utf8": b"pool\xc0\xafsub",
    "surrogate-utf8": b"pool\xed\xa0\x80sub",
}
GOOD_SIDS = {"128-bytes": b"s" * 128, "64-two-byte-chars": "é".encode() * 64,
             "unicode": "pylon-東京".encode(), "single": b"x"}


def test_request_validation_marker_and_subscriber_id(relay):
    r = relay("--workers", "1")
    producer = r.producer()
    for method in ["GetRelayInfo"] + STREAMING:
        sid = None if method == "GetRelayInfo" else b"marker-test"
        for marker in (None, 0, 0x4B565232, 0x31525654):
            body = raw_request(sid, marker, _needs_producer(method, producer))
            assert_rpc_error(lambda: call_raw(r, method, body), "FAILED_PRECONDITION",
                             "RELAY_ERROR_REASON_CONTRACT_MISMATCH",
                             f"{method} with marker {marker}")
        # the marker is checked before anything else
        if method != "GetRelayInfo":
            body = raw_request(b"", 0)
            assert_rpc_error(lambda: call_raw(r, method, body), "FAILED_PRECONDITION",
                             "RELAY_ERROR_REASON_CONTRACT_MISMATCH",
                             f"{method} with bad marker, empty subscriber_id, no producer")
    assert call_raw(r, "GetRelayInfo", raw_request(None)), "a good GetRelayInfo"

    for method in STREAMING:
        for name, sid in BAD_SIDS.items():
            body = raw_request(sid, producer=_needs_producer(method, producer))
            assert_rpc_error(lambda: call_raw(r, method, body), "INVALID_ARGUMENT",
                             "RELAY_ERROR_REASON_INVALID_REQUEST",
                             f"{method} with subscriber_id {name} ({sid!r})")
        body = raw_request(None, producer=_needs_producer(method, producer))  # field absent
        assert_rpc_error(lambda: call_raw(r, method, body), "INVALID_ARGUMENT",
                         "RELAY_ERROR_REASON_INVALID_REQUEST", f"{method} without subscriber_id")
        for name, sid in GOOD_SIDS.items():
            body = raw_request(sid, producer=_needs_producer(method, producer))
            msg = call_raw(r, method, body)
            assert msg, f"{method} with subscriber_id {name}: no first message"


def _mutated(producer, fn):
    p = type(producer)()
    p.CopyFrom(producer)
    fn(p)
    return p


def _set(path, value):
    def fn(p):
        obj = p
        parts = path.split(".")
        for part in parts[:-1]:
            obj = getattr(obj, part)
        setattr(obj, parts[-1], value)
    return fn


def _clear(path):
    def fn(p):
        obj = p
        parts = path.split(".")
        for part in parts[:-1]:
            obj = getattr(obj, part)
        obj.ClearField(parts[-1])
    return fn


CS = "pool_id.indexer_domain.cache_semantics"
RS = "pool_id.indexer_domain.routing_scope"

PRODUCER_CASES = [
    # name, mutation, code, reason
    ("identity_version 2", _set("pool_id.identity_version", 2),
     "FAILED_PRECONDITION", "UNSUPPORTED_FEATURE"),
    ("identity_version 0", _set("pool_id.identity_version", 0),
     "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("layout_generation 0", _set("layout_generation", 0), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("digest 15 bytes", _set(CS + ".digest", b"\x01" * 15), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("digest 17 bytes", _set(RS + ".digest", b"\x01" * 17), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("digest empty", _set(CS + ".digest", b""), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("digest source UNSPECIFIED", _set(RS + ".source", 0), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("digest source 3", _set(CS + ".source", 3), "FAILED_PRECONDITION", "UNSUPPORTED_FEATURE"),
    ("cache_semantics absent", _clear(CS), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("indexer_domain absent", _clear("pool_id.indexer_domain"), "INVALID_ARGUMENT",
     "INVALID_REQUEST"),
    ("pool_id absent", _clear("pool_id"), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("ckf_format absent", _clear("ckf_format"), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("bucket_count 1000", _set("ckf_format.bucket_count", 1000), "INVALID_ARGUMENT",
     "INVALID_REQUEST"),
    ("bucket_count 0", _set("ckf_format.bucket_count", 0), "INVALID_ARGUMENT", "INVALID_REQUEST"),
    ("bucket_count 2^25", _set("ckf_format.bucket_count", 1 << 25), "FAILED_PRECONDITION",
     "UNSUPPORTED_FEATURE"),
    ("bucket_count 2^40", _set("ckf_format.bucket_count", 1 << 40), "FAILED_PRECONDITION",
     "UNSUPPORTED_FEATURE"),
    ("format_version 0", _set("ckf_format.format_version", 0), "INVALID_ARGUMENT",
     "INVALID_REQUEST"),
    ("format_version 2", _set("ckf_format.format_version", 2), "FAILED_PRECONDITION",
     "UNSUPPORTED_FEATURE"),
    ("fingerprint_bits 8", _set("ckf_format.fingerprint_bits", 8), "FAILED_PRECONDITION",
     "UNSUPPORTED_FEATURE"),
    ("slots_per_bucket 0", _set("ckf_format.slots_per_bucket", 0), "INVALID_ARGUMENT",
     "INVALID_REQUEST"),
    ("other dc_id", lambda p: setattr(p.pool_id, "dc_id", p.pool_id.dc_id ^ 1), "NOT_FOUND",
     "POOL_NOT_FOUND"),
    ("other routing scope", lambda p: setattr(p.pool_id.indexer_domain.routing_scope, "digest",
                                              bytes(16)), "NOT_FOUND", "POOL_NOT_FOUND"),
    ("other source", _set(CS + ".source", 2), "NOT_FOUND", "POOL_NOT_FOUND"),
    ("next generation", lambda p: setattr(p, "layout_generation", p.layout_generation + 1),
     "FAILED_PRECONDITION", "PRODUCER_CHANGED"),
    ("other incarnation", lambda p: setattr(p, "producer_incarnation",
                                            p.producer_incarnation ^ 1),
     "FAILED_PRECONDITION", "PRODUCER_CHANGED"),
    ("other seed", lambda p: setattr(p.ckf_format, "seed", p.ckf_format.seed ^ 1),
     "FAILED_PRECONDITION", "PRODUCER_CHANGED"),
    ("other bucket_count", lambda p: setattr(p.ckf_format, "bucket_count",
                                             p.ckf_format.bucket_count * 2),
     "FAILED_PRECONDITION", "PRODUCER_CHANGED"),
]


def test_request_validation_subscribe_kv_pool(relay):
    r = relay("--workers", "1")
    pb = r.s.pb
    producer = r.producer()
    assert producer.layout_generation == 1
    # missing producer
    req = pb.SubscribeKvPoolRequest(subscriber_id="no-producer", contract_marker=CONTRACT_MARKER)
    assert_rpc_error(lambda: next(iter(r.stub.SubscribeKvPool(req, timeout=10))),
                     "INVALID_ARGUMENT", "RELAY_ERROR_REASON_INVALID_REQUEST",
                     "SubscribeKvPool without expected_producer")
    # the subscriber_id is checked before the producer
    bad = _mutated(producer, _set("pool_id.identity_version", 2))
    assert_rpc_error(lambda: call_raw(r, "SubscribeKvPool", raw_request(b"", producer=bad)),
                     "INVALID_ARGUMENT", "RELAY_ERROR_REASON_INVALID_REQUEST",
                     "empty subscriber_id and an unsupported producer")
    for name, fn, code, reason in PRODUCER_CASES:
        p = _mutated(producer, fn)
        assert_rpc_error(lambda: next(iter(r.subscribe(p, f"case-{name}", timeout=10))),
                         code, "RELAY_ERROR_REASON_" + reason, f"SubscribeKvPool with {name}")
    # and the unmodified producer is admitted
    rep = PoolReplica(producer, name="valid")
    rd = r.reader(r.subscribe(producer, "valid"), "valid")
    drain_replica(rd, rep, lambda x: x.ready, 5.0, "valid subscription")
    # the failed attempts left no subscriber behind
    wait_until(lambda: r.debug_relay()["live_pool_subscribers"] == 1, 3 * SLOW,
               what="the failed attempts to leave no subscriber behind (live_pool_subscribers 1)")
