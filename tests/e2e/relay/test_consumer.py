"""
The test oracle itself, checked before it judges the server: CKF addressing against the §4.6
golden vectors, the CBI1 codec against the §3.8 frames, and every check of the decoder, the
snapshot assembly and PoolReplica shown to fire on a frame that breaks it (a checker that
cannot fail would prove nothing). No server is started here.
"""

import struct

import pytest

from .kvrelay_consumer import (
    CONTRACT_MARKER,
    DEFAULT_SEED,
    IMAGES_MAX_FRAME_BYTES,
    KIND_DELTA,
    KIND_HEARTBEAT,
    KIND_SNAPSHOT_CHUNK,
    MAX_DELTA_IMAGES,
    Cbi1Error,
    PoolReplica,
    ProtocolViolation,
    SnapshotAssembly,
    alt_bucket,
    bucket_count_for,
    cbi1_decode,
    cbi1_encode_chunk,
    cbi1_encode_delta,
    cbi1_seal,
    check_producer,
    filter_contains,
    prepare,
    producer_problems,
    slots,
    word_contains,
    xxh3_64,
)

TEST_SEED = 0x123456789ABCDEF0


def test_xxh3_vectors():
    assert xxh3_64(b"test data", 1337) == 13226331709069118873
    assert xxh3_64(b"", 0) == 0x2D06800538D394C2


@pytest.mark.parametrize(
    "h,fp,a,b",
    [(0, 7750, 587, 372), (1, 64153, 348, 36), (0x0123456789ABCDEF, 45802, 865, 909),
     (0xFFFFFFFFFFFFFFFF, 31767, 112, 217)],
)
def test_addressing_upstream_vectors(h, fp, a, b):
    assert prepare(h, 1024, TEST_SEED) == (fp, a, b)


DEFAULT_TABLE = [
    # h, fp, {bc: (a, b)}
    (0, 46238, {2: (0, 1), 1024: (94, 62), 524288: (394334, 337982),
                16777216: (11404382, 5580862)}),
    (1, 47807, {2: (1, 0), 1024: (639, 413), 524288: (129663, 522653),
                16777216: (11663999, 13105565)}),
    (0x0123456789ABCDEF, 32097, {2: (1, 0), 1024: (903, 693), 524288: (236423, 195253),
                                 16777216: (11770759, 1768117)}),
    (0xFFFFFFFFFFFFFFFF, 20490, {2: (1, 0), 1024: (585, 464), 524288: (117321, 453072),
                                 16777216: (1690185, 6744528)}),
]


@pytest.mark.parametrize("h,fp,per_bc", DEFAULT_TABLE)
def test_addressing_default_seed_vectors(h, fp, per_bc):
    for bc, (a, b) in per_bc.items():
        assert prepare(h, bc, DEFAULT_SEED) == (fp, a, b), (h, bc)


def test_addressing_probe_vectors_and_edge_rules():
    for h, want in [
        (0x7EE2CBEDC694AB46, (20428, 334572, 103746)),
        (0x83FB702F20E2AD65, (49069, 390773, 98785)),
        (0xEBE58E326790467B, (13896, 455793, 6396)),
        (0xE9036FCE74242BB5, (64610, 231844, 484928)),
    ]:
        assert prepare(h, 524288, DEFAULT_SEED) == want
    assert prepare(0x7EE2CBEDC694AB46, 1024, DEFAULT_SEED) == (20428, 748, 322)
    # zero-fingerprint rule
    assert xxh3_64(struct.pack("<Q", 37410), DEFAULT_SEED) == 0xE59574E0D1B20000
    assert prepare(37410, 1024, DEFAULT_SEED) == (1, 434, 233)
    assert xxh3_64(struct.pack("<Q", 32713), TEST_SEED) == 0xCBDA00E513CB0000
    assert prepare(32713, 1024, TEST_SEED) == (1, 971, 1013)
    # zero-delta rule
    for seed, fp in ((DEFAULT_SEED, 158), (TEST_SEED, 508)):
        assert alt_bucket(0, fp, 1024, seed) == 1
        assert alt_bucket(5, fp, 1024, seed) == 4


def test_addressing_properties():
    for h in range(10000):
        fp, a, b = prepare(h, 1024, TEST_SEED)
        assert fp != 0 and a != b and alt_bucket(b, fp, 1024, TEST_SEED) == a, h


def test_bucket_words_and_swar():
    w = struct.unpack("<Q", bytes.fromhex("34120000cdab0100"))[0]
    assert w == 0x0001ABCD00001234 and slots(w) == [0x1234, 0, 0xABCD, 1]
    word = 1 | (0x1234 << 16) | (0x8000 << 32) | (0xFFFF << 48)
    for fp in (1, 0x1234, 0x8000, 0xFFFF):
        assert word_contains(word, fp)
    for fp in (2, 0x1235, 0xFFFE):
        assert not word_contains(word, fp)


def test_bucket_count_vectors():
    for n, bc in [(1, 2), (16, 8), (32, 16), (64, 32), (256, 128), (1024, 512),
                  (65536, 32768), (1048576, 524288), (2097152, 1048576),
                  (53687091, 16777216), (53687092, 33554432)]:
        assert bucket_count_for(n) == bc, n


# ---------------------------------------------------------------------------------------------
# CBI1 golden frames (§3.8)

D1 = ("434249310100020010040100ed5e000000000000000400000000000007000000"
      "0000000005000000000000004ef6466104000000000000000200000003000000"
      "ddddccccbbbbaaaae80300002a00000000000000")
D2 = ("434249310100020010040100ed5e000000000000000400000000000007000000"
      "000000000100000000000000f0a4c269000000000000000000000000")
S1 = ("434249310100010010040100ed5e000000000000020000000000000009000000"
      "0000000006000000000000009dc0f23700000000010000000000000000000000"
      "34120000cdab01000000000000000000")
E1 = ("434249310100020010040100334ab5d166ceee5d000400000000000003000000"
      "000000000100000000000000c36fad0a000000000000000001000000ec020000"
      "cc4f000000000000")


def test_cbi1_golden_frames():
    d1 = cbi1_encode_delta(0x5EED, 1024, 7, 4, 5, [(3, 0xAAAABBBBCCCCDDDD), (1000, 42)])
    assert d1.hex() == D1
    f = cbi1_decode(d1, 0x5EED, 1024)
    assert (f.flags, f.dc_id, f.epoch, f.base_epoch, f.checksum) == (2, 7, 5, 4, 0x6146F64E)
    assert f.images == [(3, 0xAAAABBBBCCCCDDDD), (1000, 42)]
    d2 = cbi1_encode_delta(0x5EED, 1024, 7, 0, 1, [])
    assert d2.hex() == D2 and cbi1_decode(d2, 0x5EED, 1024).images == []
    s1 = cbi1_encode_chunk(0x5EED, 2, 9, 6, 0, 1, [0x0001ABCD00001234, 0])
    assert s1.hex() == S1
    f = cbi1_decode(s1, 0x5EED, 2)
    assert (f.chunk_index, f.chunk_count, f.bucket_offset, list(f.words)) == (
        0, 1, 0, [0x0001ABCD00001234, 0])
    e1 = cbi1_encode_delta(DEFAULT_SEED, 1024, 3, 0, 1, [(748, 0x4FCC)])
    assert e1.hex() == E1


def _patch(frame, off, fmt, value, reseal=True):
    b = bytearray(frame)
    struct.pack_into(fmt, b, off, value)
    return cbi1_seal(b) if reseal else bytes(b)


@pytest.mark.parametrize(
    "case,kind",
    [
        ("truncated", "Truncated"), ("too_large", "FrameTooLarge"), ("magic", "Magic"),
        ("wire_version", "WireVersion"), ("checksum", "Checksum"),
        ("checksum_before_format", "Checksum"), ("format_version", "Format"),
        ("fp_bits", "Format"), ("slots", "Format"), ("seed", "FormatMismatch"),
        ("bucket_count", "FormatMismatch"), ("flags3", "Flags"), ("flags0", "Flags"),
        ("delta_short", "Malformed"), ("delta_count", "DeltaImageCount"),
        ("delta_len", "Malformed"), ("delta_bucket", "Malformed"),
        ("chunk_short", "Malformed"), ("chunk_count0", "Malformed"),
        ("chunk_index", "Malformed"), ("chunk_words", "Malformed"),
        ("chunk_overrun", "Malformed"),
    ],
)
def test_cbi1_decoder_rejects(case, kind):
    d1 = bytes.fromhex(D1)
    s1 = bytes.fromhex(S1)
    seed, bc = 0x5EED, 1024
    if case == "truncated":
        buf = d1[:47]
    elif case == "too_large":
        buf = cbi1_seal(d1 + bytes(IMAGES_MAX_FRAME_BYTES))
    elif case == "magic":
        buf = b"CBI2" + d1[4:]
    elif case == "wire_version":
        buf = _patch(d1, 4, "<H", 2, reseal=False)
    elif case == "checksum":
        buf = d1[:-1] + bytes([d1[-1] ^ 1])
    elif case == "checksum_before_format":
        buf = _patch(_patch(d1, 10, "<H", 2), 44, "<I", 0, reseal=False)
    elif case == "format_version":
        buf = _patch(d1, 10, "<H", 2)
    elif case == "fp_bits":
        buf = _patch(d1, 8, "<B", 8)
    elif case == "slots":
        buf = _patch(d1, 9, "<B", 8)
    elif case == "seed":
        seed = 0x5EEE
        buf = d1
    elif case == "bucket_count":
        bc = 2048
        buf = d1
    elif case == "flags3":
        buf = _patch(d1, 6, "<H", 3)
    elif case == "flags0":
        buf = _patch(d1, 6, "<H", 0)
    elif case == "delta_short":
        buf = cbi1_seal(d1[:48 + 11])
    elif case == "delta_count":
        buf = _patch(d1, 48 + 8, "<I", MAX_DELTA_IMAGES + 1)
    elif case == "delta_len":
        buf = cbi1_seal(d1 + b"\0")
    elif case == "delta_bucket":
        buf = cbi1_encode_delta(0x5EED, 1024, 7, 4, 5, [(1024, 1)])
    elif case == "chunk_short":
        seed, bc = 0x5EED, 2
        buf = cbi1_seal(s1[:48 + 15])
    elif case == "chunk_count0":
        seed, bc = 0x5EED, 2
        buf = _patch(s1, 48 + 4, "<I", 0)
    elif case == "chunk_index":
        seed, bc = 0x5EED, 2
        buf = _patch(s1, 48, "<I", 1)
    elif case == "chunk_words":
        seed, bc = 0x5EED, 2
        buf = cbi1_seal(s1 + b"\0\0\0\0")
    elif case == "chunk_overrun":
        seed, bc = 0x5EED, 2
        buf = cbi1_encode_chunk(0x5EED, 2, 9, 6, 0, 1, [1, 2, 3])
    if case in ("seed", "bucket_count"):
        buf = d1
    with pytest.raises(Cbi1Error) as ei:
        cbi1_decode(buf, seed, bc)
    assert ei.value.kind == kind, f"{case}: {ei.value}"


def test_snapshot_assembly():
    bc = 1 << 20  # two chunks
    c0 = cbi1_decode(cbi1_encode_chunk(1, bc, 0, 7, 0, 2, [5] * 524288), 1, bc)
    c1 = cbi1_decode(cbi1_encode_chunk(1, bc, 0, 7, 1, 2, [6] * 524288), 1, bc)
    a = SnapshotAssembly(bc)
    assert a.push(c0) is None
    words = a.push(c1)
    assert len(words) == bc and words[0] == 5 and words[-1] == 6
    # out of order, epoch change, delta during assembly, short coverage
    with pytest.raises(Cbi1Error, match="ChunkSequence"):
        SnapshotAssembly(bc).push(c1)
    a = SnapshotAssembly(bc)
    a.push(c0)
    c1e = cbi1_decode(cbi1_encode_chunk(1, bc, 0, 8, 1, 2, [6] * 524288), 1, bc)
    with pytest.raises(Cbi1Error, match="ChunkSequence"):
        a.push(c1e)
    a = SnapshotAssembly(bc)
    a.push(c0)
    d = cbi1_decode(cbi1_encode_delta(1, bc, 0, 7, 8, []), 1, bc)
    with pytest.raises(Cbi1Error, match="ChunkSequence"):
        a.push(d)
    a = SnapshotAssembly(bc)
    a.push(c0)
    short = cbi1_decode(cbi1_encode_chunk(1, bc, 0, 7, 1, 2, [6] * 1000), 1, bc)
    with pytest.raises(Cbi1Error, match="IncompleteCoverage"):
        a.push(short)


# ---------------------------------------------------------------------------------------------
# Producer identity and the replica, on synthetic messages built with the generated stubs


def make_producer(pb, bc=1024, gen=3, dc=0x77, inc=0x1234):
    p = pb.ProducerIdentity(producer_incarnation=inc, layout_generation=gen)
    p.pool_id.identity_version = 1
    p.pool_id.dc_id = dc
    p.pool_id.indexer_domain.cache_semantics.digest = b"c" * 16
    p.pool_id.indexer_domain.cache_semantics.source = 1
    p.pool_id.indexer_domain.routing_scope.digest = b"r" * 16
    p.pool_id.indexer_domain.routing_scope.source = 1
    f = p.ckf_format
    f.format_version, f.seed, f.bucket_count, f.fingerprint_bits, f.slots_per_bucket = (
        1, DEFAULT_SEED, bc, 16, 4)
    return p


def test_producer_identity_checks(stubs):
    pb = stubs.pb
    check_producer(make_producer(pb))
    cases = {
        "malformed": [
            lambda p: setattr(p.pool_id, "identity_version", 0),
            lambda p: p.pool_id.ClearField("indexer_domain"),
            lambda p: p.pool_id.indexer_domain.ClearField("routing_scope"),
            lambda p: setattr(p.pool_id.indexer_domain.cache_semantics, "digest", b"x" * 15),
            lambda p: setattr(p.pool_id.indexer_domain.cache_semantics, "source", 0),
            lambda p: setattr(p, "layout_generation", 0),
            lambda p: p.ClearField("ckf_format"),
            lambda p: setattr(p.ckf_format, "bucket_count", 1000),
            lambda p: setattr(p.ckf_format, "seed", 0),
            lambda p: p.ClearField("pool_id"),
        ],
        "unsupported": [
            lambda p: setattr(p.pool_id, "identity_version", 2),
            lambda p: setattr(p.pool_id.indexer_domain.routing_scope, "source", 3),
            lambda p: setattr(p.ckf_format, "format_version", 2),
            lambda p: setattr(p.ckf_format, "fingerprint_bits", 8),
            lambda p: setattr(p.ckf_format, "slots_per_bucket", 8),
            lambda p: setattr(p.ckf_format, "bucket_count", 1 << 25),
        ],
    }
    for kind, muts in cases.items():
        for i, m in enumerate(muts):
            p = make_producer(pb)
            m(p)
            with pytest.raises(ProtocolViolation) as ei:
                check_producer(p)
            assert ei.value.kind == kind, (kind, i, producer_problems(p))


class _Feed:
    def __init__(self, pb, producer):
        self.pb = pb
        self.p = producer
        self.bc = producer.ckf_format.bucket_count
        self.dc = producer.pool_id.dc_id

    def msg(self, kind, base, seq, payload=b"", **over):
        u = self.pb.FilterUpdate(protocol_version=1, base_sequence=base, sequence=seq, kind=kind,
                                 payload=payload, contract_marker=CONTRACT_MARKER)
        u.relay.relay_incarnation = 0x1234
        u.producer.CopyFrom(self.p)
        for k, v in over.items():
            setattr(u, k, v)
        return u

    def chunk(self, seq, words=None, epoch=None, dc=None):
        words = words if words is not None else [0] * self.bc
        return self.msg(KIND_SNAPSHOT_CHUNK, seq, seq, cbi1_encode_chunk(
            DEFAULT_SEED, self.bc, self.dc if dc is None else dc,
            seq if epoch is None else epoch, 0, 1, words))

    def delta(self, base, seq, images, base_epoch=None, epoch=None):
        return self.msg(KIND_DELTA, base, seq, cbi1_encode_delta(
            DEFAULT_SEED, self.bc, self.dc, base if base_epoch is None else base_epoch,
            seq if epoch is None else epoch, images))


def test_replica_happy_path(stubs):
    feed = _Feed(stubs.pb, make_producer(stubs.pb))
    r = PoolReplica(feed.p)
    r.apply(feed.chunk(4))
    assert r.ready and r.seq == 4
    fp, a, _b = prepare(0x7EE2CBEDC694AB46, 1024)
    r.apply(feed.delta(4, 5, [(a, fp)]))
    r.apply(feed.msg(KIND_HEARTBEAT, 5, 5))
    assert r.seq == 5 and r.contains(0x7EE2CBEDC694AB46)
    assert filter_contains(r.words, 0x7EE2CBEDC694AB46)
    assert (r.chunks, r.deltas, r.heartbeats) == (1, 1, 1)


def _violations(pb):
    """(name, list of frames) where the last frame must be rejected."""
    p = make_producer(pb)
    f = _Feed(pb, p)
    other = make_producer(pb, gen=4)
    wrong_prod = f.msg(KIND_HEARTBEAT, 4, 4)
    wrong_prod.producer.CopyFrom(other)
    bad_marker = f.msg(KIND_HEARTBEAT, 4, 4, contract_marker=0x4B565232)
    bad_version = f.msg(KIND_HEARTBEAT, 4, 4, protocol_version=2)
    no_relay = f.msg(KIND_HEARTBEAT, 4, 4)
    no_relay.ClearField("relay")
    new_inc = f.msg(KIND_HEARTBEAT, 4, 4)
    new_inc.relay.relay_incarnation = 0x1235
    hb_payload = f.msg(KIND_HEARTBEAT, 4, 4, payload=b"x")
    chunk_as_delta = f.chunk(5)
    chunk_as_delta.kind = KIND_DELTA
    chunk_as_delta.base_sequence = 4
    return [
        ("wrong producer", [f.chunk(4), wrong_prod]),
        ("bad marker", [f.chunk(4), bad_marker]),
        ("bad protocol_version", [f.chunk(4), bad_version]),
        ("relay absent", [f.chunk(4), no_relay]),
        ("incarnation changed", [f.chunk(4), new_inc]),
        ("chunk base != seq", [f.msg(KIND_SNAPSHOT_CHUNK, 3, 4, f.chunk(4).payload)]),
        ("chunk epoch != seq", [f.chunk(4, epoch=5)]),
        ("chunk dc_id", [f.chunk(4, dc=0x78)]),
        ("heartbeat before snapshot", [f.msg(KIND_HEARTBEAT, 0, 0)]),
        ("delta before snapshot", [f.delta(0, 1, [])]),
        ("second snapshot", [f.chunk(4), f.chunk(4)]),
        ("delta gap", [f.chunk(4), f.delta(5, 6, [])]),
        ("delta seq != base+1", [f.chunk(4), f.delta(4, 6, [])]),
        ("delta base_epoch", [f.chunk(4), f.delta(4, 5, [], base_epoch=3)]),
        ("delta epoch", [f.chunk(4), f.delta(4, 5, [], epoch=6)]),
        ("delta duplicate bucket", [f.chunk(4), f.delta(4, 5, [(1, 1), (1, 2)])]),
        ("delta bad checksum", [f.chunk(4), f.msg(KIND_DELTA, 4, 5, f.delta(4, 5, [(1, 1)])
                                                  .payload[:-1] + b"\x07")]),
        ("heartbeat seq moves", [f.chunk(4), f.msg(KIND_HEARTBEAT, 4, 5)]),
        ("heartbeat stale", [f.chunk(4), f.delta(4, 5, []), f.msg(KIND_HEARTBEAT, 4, 4)]),
        ("heartbeat payload", [f.chunk(4), hb_payload]),
        ("unknown kind 4", [f.chunk(4), f.msg(4, 4, 4)]),
        ("kind 0", [f.chunk(4), f.msg(0, 4, 4)]),
        ("kind/flags disagree", [f.chunk(4), chunk_as_delta]),
        ("chunk_count wrong", [f.msg(KIND_SNAPSHOT_CHUNK, 4, 4, cbi1_encode_chunk(
            DEFAULT_SEED, 1024, 0x77, 4, 0, 2, [0] * 1024))]),
    ]


def test_replica_rejects_every_violation(stubs):
    for name, frames in _violations(stubs.pb):
        r = PoolReplica(make_producer(stubs.pb))
        for fr in frames[:-1]:
            r.apply(fr)
        with pytest.raises(ProtocolViolation):
            r.apply(frames[-1])
            pytest.fail(f"{name}: accepted")
