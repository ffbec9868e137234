"""
A fail-closed consumer of the KV DC Relay wire contract (docs/relay-contract.md), written from the
spec alone and used by the relay end-to-end tests to judge the real server:

- CKF addressing (§4.4) and bucket words (§3.5);
- the CBI1 codec (§3): decoder with every check of §3.6 in its order, the snapshot assembly,
  and an encoder used only to reproduce the golden frames of §3.8;
- the envelope and ProducerIdentity checks of §6.1, the descriptor checks, the load-window
  checks;
- PoolReplica: one pool stream's replica with every "Pool stream" check of §6.1 (plus the
  producer guarantees of §6.2.4 that a consumer can see: unique in-range images, image count).

Nothing here talks to the network; a violation raises ProtocolViolation (an AssertionError, so
that pytest shows it as a test failure with its message).

The CBI1 checksum uses Debian's python3-xxhash (XXH3-64, seeded variant), which reproduces the
spec's xxh3 vectors (checked by test_consumer.py before anything else relies on it).
"""

import struct
from array import array

import xxhash

# ---------------------------------------------------------------------------------------------
# Constants (§2.2, §2.3, §3.1, §4.2)

CONTRACT_MARKER = 0x4B565231
PROTOCOL_VERSION = 1
POOL_IDENTITY_VERSION = 1

IMAGES_MAGIC = b"CBI1"
IMAGES_WIRE_VERSION = 1
IMAGES_HEADER_LEN = 48
SNAPSHOT_CHUNK_BUCKETS = 524288
MAX_BUCKET_COUNT = 1 << 24
IMAGES_MAX_FRAME_BYTES = 48 + 16 + SNAPSHOT_CHUNK_BUCKETS * 8  # 4194368
FLAG_SNAPSHOT_CHUNK = 1
FLAG_DELTA = 2
FORMAT_VERSION = 1
FINGERPRINT_BITS = 16
SLOTS_PER_BUCKET = 4
MAX_DELTA_IMAGES = (IMAGES_MAX_FRAME_BYTES - 48 - 12) // 12  # 349525

DEFAULT_SEED = 0x5DEECE66D1B54A33
ALTERNATE_BUCKET_DOMAIN = 0x9E3779B97F4A7C15
U64 = (1 << 64) - 1

KIND_UNSPECIFIED = 0
KIND_SNAPSHOT_CHUNK = 1
KIND_DELTA = 2
KIND_HEARTBEAT = 3

SOURCE_DEFAULT_DERIVED = 1
SOURCE_EXPLICIT = 2

WORKER_ROLES = {1, 2, 3, 4, 5}  # PREFILL, DECODE, ENCODE, AGGREGATED, LEGACY
WORKER_ROLE_LEGACY = 5
HASH_FORMATS = {1, 2}

DATA_STATUS_COMPLETE = 1
DATA_STATUS_DEGRADED = 2
DATA_STATUS_UNAVAILABLE = 3

ERROR_REASON_KEY = "kv-relay-error-reason"


class ProtocolViolation(AssertionError):
    """The server broke the contract. `kind` is 'malformed', 'unsupported' or a CBI1 error."""

    def __init__(self, msg, kind="violation"):
        super().__init__(msg)
        self.kind = kind


class Cbi1Error(ProtocolViolation):
    """A CBI1 decode/assembly error; kind is the reference error name (Truncated, Checksum...)."""

    def __init__(self, kind, msg=""):
        super().__init__(f"CBI1 {kind}: {msg}" if msg else f"CBI1 {kind}", kind=kind)


# ---------------------------------------------------------------------------------------------
# Hashing and CKF addressing (§4.3, §4.4, §3.5)


def xxh3_64(data, seed=0):
    return xxhash.xxh3_64_intdigest(bytes(data), seed=seed & U64)


def bucket_count_for(n):
    """§4.3 bucket_count(n) for n > 0."""
    assert n > 0
    x = max((5 * n + 15) // 16, 2)
    return 1 << (x - 1).bit_length()


def alt_bucket(bucket, fp, bucket_count, seed):
    m = xxh3_64(struct.pack("<H", fp), seed ^ ALTERNATE_BUCKET_DOMAIN)
    delta = m & (bucket_count - 1)
    if delta == 0:
        delta = 1
    return bucket ^ delta


def prepare(h, bucket_count, seed=DEFAULT_SEED):
    """(fp, bucket_a, bucket_b) of canonical hash h (§4.4)."""
    assert bucket_count >= 2 and bucket_count & (bucket_count - 1) == 0
    mixed = xxh3_64(struct.pack("<Q", h & U64), seed)
    fp = mixed & 0xFFFF
    if fp == 0:
        fp = 1
    a = (mixed >> 16) & (bucket_count - 1)
    return fp, a, alt_bucket(a, fp, bucket_count, seed)


def slots(word):
    return [(word >> (16 * s)) & 0xFFFF for s in range(4)]


def word_contains(word, fp):
    """Slot test, cross-checked against the reference SWAR formula (§4.5)."""
    direct = fp in slots(word)
    x = word ^ ((fp * 0x0001000100010001) & U64)
    swar = (((x - 0x0001000100010001) & U64) & (~x & U64) & 0x8000800080008000) != 0
    assert direct == swar, f"SWAR and slot test disagree on word {word:#x} fp {fp:#x}"
    return direct


def filter_contains(words, h, seed=DEFAULT_SEED):
    fp, a, b = prepare(h, len(words), seed)
    return word_contains(words[a], fp) or word_contains(words[b], fp)


def occupied_slots(words):
    n = 0
    for w in words:
        if w:
            n += sum(1 for s in slots(w) if s)
    return n


# ---------------------------------------------------------------------------------------------
# CBI1 (§3)

_HDR = struct.Struct("<4sHHBBHQQQQI")  # 48 bytes
assert _HDR.size == IMAGES_HEADER_LEN


class Cbi1Frame:
    __slots__ = (
        "flags", "seed", "bucket_count", "dc_id", "epoch", "checksum",
        "chunk_index", "chunk_count", "bucket_offset", "words",
        "base_epoch", "images",
    )

    def __repr__(self):
        if self.flags == FLAG_DELTA:
            body = f"base_epoch={self.base_epoch} images={len(self.images)}"
        else:
            body = (f"chunk {self.chunk_index}/{self.chunk_count} offset={self.bucket_offset} "
                    f"words={len(self.words)}")
        return f"Cbi1Frame(flags={self.flags} epoch={self.epoch} dc={self.dc_id:#x} {body})"


def cbi1_checksum(body):
    return xxh3_64(body, 0) & 0xFFFFFFFF


def cbi1_decode(buf, expected_seed, expected_bucket_count):
    """Decodes one CBI1 frame with the checks of §3.6 (steps 1-9) in their order."""
    buf = bytes(buf)
    n = len(buf)
    if n < IMAGES_HEADER_LEN:
        raise Cbi1Error("Truncated", f"{n} bytes")
    if n > IMAGES_MAX_FRAME_BYTES:
        raise Cbi1Error("FrameTooLarge", f"{n} bytes")
    magic, wire, flags, fpb, spb, fmt, seed, bc, dc, epoch, csum = _HDR.unpack_from(buf, 0)
    if magic != IMAGES_MAGIC:
        raise Cbi1Error("Magic", repr(magic))
    if wire != IMAGES_WIRE_VERSION:
        raise Cbi1Error("WireVersion", str(wire))
    body = buf[IMAGES_HEADER_LEN:]
    want = cbi1_checksum(body)
    if csum != want:
        raise Cbi1Error("Checksum", f"header {csum:#010x}, body hashes to {want:#010x}")
    if fmt != FORMAT_VERSION or fpb != FINGERPRINT_BITS or spb != SLOTS_PER_BUCKET:
        raise Cbi1Error("Format", f"format_version={fmt} fingerprint_bits={fpb} slots={spb}")
    if seed != expected_seed or bc != expected_bucket_count:
        raise Cbi1Error(
            "FormatMismatch",
            f"header seed={seed:#x} bucket_count={bc}, producer seed={expected_seed:#x} "
            f"bucket_count={expected_bucket_count}",
        )
    if flags not in (FLAG_SNAPSHOT_CHUNK, FLAG_DELTA):
        raise Cbi1Error("Flags", str(flags))
    f = Cbi1Frame()
    f.flags, f.seed, f.bucket_count, f.dc_id, f.epoch, f.checksum = flags, seed, bc, dc, epoch, csum
    if flags == FLAG_DELTA:
        if len(body) < 12:
            raise Cbi1Error("Malformed", f"delta body of {len(body)} bytes")
        base, count = struct.unpack_from("<QI", body, 0)
        if count > MAX_DELTA_IMAGES:
            raise Cbi1Error("DeltaImageCount", str(count))
        if len(body) != 12 + 12 * count:
            raise Cbi1Error("Malformed", f"delta body {len(body)} bytes for {count} images")
        images = list(struct.iter_unpack("<IQ", body[12:]))
        for b, _v in images:
            if b >= bc:
                raise Cbi1Error("Malformed", f"image bucket {b} >= bucket_count {bc}")
        f.base_epoch, f.images = base, images
        f.chunk_index = f.chunk_count = f.bucket_offset = f.words = None
    else:
        if len(body) < 16:
            raise Cbi1Error("Malformed", f"chunk body of {len(body)} bytes")
        idx, cnt, off = struct.unpack_from("<IIQ", body, 0)
        if cnt == 0 or idx >= cnt:
            raise Cbi1Error("Malformed", f"chunk_index {idx} chunk_count {cnt}")
        wbytes = len(body) - 16
        if wbytes % 8:
            raise Cbi1Error("Malformed", f"{wbytes} word bytes")
        k = wbytes // 8
        if k > SNAPSHOT_CHUNK_BUCKETS:
            raise Cbi1Error("SnapshotChunkWordCount", str(k))
        if off + k > bc:
            raise Cbi1Error("Malformed", f"bucket_offset {off} + {k} words > {bc}")
        words = array("Q")
        words.frombytes(body[16:])
        if words.itemsize != 8:  # pragma: no cover - platform guard
            raise RuntimeError("array('Q') is not 64-bit here")
        f.chunk_index, f.chunk_count, f.bucket_offset, f.words = idx, cnt, off, words
        f.base_epoch = f.images = None
    return f


def _header(flags, seed, bucket_count, dc_id, epoch):
    return bytearray(
        _HDR.pack(IMAGES_MAGIC, 1, flags, 16, 4, 1, seed, bucket_count, dc_id, epoch, 0)
    )


def cbi1_seal(frame):
    """Writes the checksum of frame[48:] into frame[44:48] (§3.7 finish)."""
    frame = bytearray(frame)
    struct.pack_into("<I", frame, 44, cbi1_checksum(bytes(frame[48:])))
    return bytes(frame)


def cbi1_encode_delta(seed, bucket_count, dc_id, base, epoch, images):
    out = _header(FLAG_DELTA, seed, bucket_count, dc_id, epoch)
    out += struct.pack("<QI", base, len(images))
    for b, v in images:
        out += struct.pack("<IQ", b, v)
    return cbi1_seal(out)


def cbi1_encode_chunk(seed, bucket_count, dc_id, epoch, index, count, words):
    out = _header(FLAG_SNAPSHOT_CHUNK, seed, bucket_count, dc_id, epoch)
    out += struct.pack("<IIQ", index, count, index * SNAPSHOT_CHUNK_BUCKETS)
    out += array("Q", words).tobytes()
    return cbi1_seal(out)


class SnapshotAssembly:
    """§3.6 step 10. push() returns the complete word array, or None while incomplete."""

    def __init__(self, bucket_count):
        self.bucket_count = bucket_count
        self.reset()

    def reset(self):
        self.active = False
        self.words = None
        self.epoch = None
        self.chunk_count = None
        self.next_index = 0
        self.next_bucket = 0

    def push(self, f):
        if f.flags != FLAG_SNAPSHOT_CHUNK:
            self.reset()
            raise Cbi1Error("ChunkSequence", "a delta arrived during the snapshot assembly")
        if f.chunk_index == 0:
            self.reset()
            self.active = True
            self.epoch = f.epoch
            self.chunk_count = f.chunk_count
            self.words = array("Q", bytes(8 * self.bucket_count))
        elif not self.active:
            raise Cbi1Error("ChunkSequence", f"chunk {f.chunk_index} without chunk 0")
        problems = []
        if f.chunk_index != self.next_index:
            problems.append(f"index {f.chunk_index} != expected {self.next_index}")
        if f.chunk_count != self.chunk_count:
            problems.append(f"chunk_count {f.chunk_count} != {self.chunk_count}")
        if f.epoch != self.epoch:
            problems.append(f"epoch {f.epoch} != {self.epoch}")
        if f.bucket_count != self.bucket_count:
            problems.append(f"bucket_count {f.bucket_count} != {self.bucket_count}")
        if f.bucket_offset != self.next_bucket:
            problems.append(f"bucket_offset {f.bucket_offset} != {self.next_bucket}")
        if problems:
            self.reset()
            raise Cbi1Error("ChunkSequence", "; ".join(problems))
        k = len(f.words)
        self.words[self.next_bucket:self.next_bucket + k] = f.words
        self.next_bucket += k
        self.next_index += 1
        if self.next_index == self.chunk_count:
            covered = self.next_bucket
            words = self.words
            self.reset()
            if covered != self.bucket_count:
                raise Cbi1Error("IncompleteCoverage", f"{covered} of {self.bucket_count} buckets")
            return words
        return None


# ---------------------------------------------------------------------------------------------
# Envelope and identity checks (§6.1)


def check_envelope(msg, incarnation=None, what="response"):
    """Marker, protocol_version, relay present, relay_incarnation nonzero (and unchanged when
    `incarnation` is given). Returns the incarnation."""
    if msg.contract_marker != CONTRACT_MARKER:
        raise ProtocolViolation(f"{what}: contract_marker {msg.contract_marker:#x}")
    if msg.protocol_version != PROTOCOL_VERSION:
        raise ProtocolViolation(f"{what}: protocol_version {msg.protocol_version}")
    if not msg.HasField("relay"):
        raise ProtocolViolation(f"{what}: relay absent")
    inc = msg.relay.relay_incarnation
    if inc == 0 or inc > 0x7FFFFFFFFFFFFFFF:
        raise ProtocolViolation(f"{what}: relay_incarnation {inc:#x} (must be 63-bit nonzero)")
    if incarnation is not None and inc != incarnation:
        raise ProtocolViolation(f"{what}: relay_incarnation changed {incarnation:#x} -> {inc:#x}")
    return inc


def _digest_problems(d, name):
    """(malformed, unsupported) lists for one DigestIdentity."""
    mal, uns = [], []
    if len(d.digest) != 16:
        mal.append(f"{name}.digest has {len(d.digest)} bytes")
    if d.source == 0:
        mal.append(f"{name}.source UNSPECIFIED")
    elif d.source not in (SOURCE_DEFAULT_DERIVED, SOURCE_EXPLICIT):
        uns.append(f"{name}.source {d.source}")
    return mal, uns


def pool_id_problems(p):
    mal, uns = [], []
    if p.identity_version == 0:
        mal.append("identity_version 0")
    elif p.identity_version != POOL_IDENTITY_VERSION:
        uns.append(f"identity_version {p.identity_version}")
    if not p.HasField("indexer_domain"):
        mal.append("indexer_domain absent")
    else:
        for name in ("cache_semantics", "routing_scope"):
            if not p.indexer_domain.HasField(name):
                mal.append(f"{name} absent")
            else:
                m, u = _digest_problems(getattr(p.indexer_domain, name), name)
                mal += m
                uns += u
    return mal, uns


def producer_problems(p):
    """§6.1 ProducerIdentity: (malformed, unsupported) lists, both empty when valid."""
    mal, uns = [], []
    if not p.HasField("pool_id"):
        mal.append("pool_id absent")
    else:
        m, u = pool_id_problems(p.pool_id)
        mal += m
        uns += u
    if p.layout_generation == 0:
        mal.append("layout_generation 0")
    if not p.HasField("ckf_format"):
        mal.append("ckf_format absent")
    else:
        f = p.ckf_format
        for name in ("format_version", "seed", "bucket_count", "fingerprint_bits",
                     "slots_per_bucket"):
            if getattr(f, name) == 0:
                mal.append(f"ckf_format.{name} 0")
        if f.format_version not in (0, FORMAT_VERSION):
            uns.append(f"ckf_format.format_version {f.format_version}")
        if f.fingerprint_bits not in (0, FINGERPRINT_BITS):
            uns.append(f"ckf_format.fingerprint_bits {f.fingerprint_bits}")
        if f.slots_per_bucket not in (0, SLOTS_PER_BUCKET):
            uns.append(f"ckf_format.slots_per_bucket {f.slots_per_bucket}")
        bc = f.bucket_count
        if bc > MAX_BUCKET_COUNT:
            uns.append(f"bucket_count {bc} > 2^24")
        elif bc != 0 and (bc < 2 or bc & (bc - 1)):
            mal.append(f"bucket_count {bc} is not a power of two >= 2")
    return mal, uns


def check_producer(p, what="producer"):
    mal, uns = producer_problems(p)
    if mal:
        raise ProtocolViolation(f"{what} malformed: {mal}", kind="malformed")
    if uns:
        raise ProtocolViolation(f"{what} unsupported: {uns}", kind="unsupported")


def producer_key(p):
    """Every field of a ProducerIdentity, presence included: the frozen v1 equality."""
    def dig(d):
        return (d.digest, d.source)

    pid = p.pool_id if p.HasField("pool_id") else None
    dom = pid.indexer_domain if pid is not None and pid.HasField("indexer_domain") else None
    f = p.ckf_format if p.HasField("ckf_format") else None
    return (
        None if pid is None else (
            pid.identity_version,
            None if dom is None else (
                dig(dom.cache_semantics) if dom.HasField("cache_semantics") else None,
                dig(dom.routing_scope) if dom.HasField("routing_scope") else None,
            ),
            pid.dc_id,
        ),
        p.producer_incarnation,
        p.layout_generation,
        None if f is None else (
            f.format_version, f.seed, f.bucket_count, f.fingerprint_bits, f.slots_per_bucket,
        ),
    )


def _trimmed_text(s):
    return isinstance(s, str) and s != "" and s == s.strip()


def check_descriptor(d):
    """§6.1 Descriptor."""
    for name in ("producer", "serving_endpoint", "query_semantics"):
        if not d.HasField(name):
            raise ProtocolViolation(f"descriptor: {name} absent", kind="malformed")
    check_producer(d.producer, "descriptor.producer")
    ep = d.serving_endpoint
    for name in ("namespace", "component", "endpoint"):
        if not _trimmed_text(getattr(ep, name)):
            raise ProtocolViolation(f"descriptor: serving_endpoint.{name} {getattr(ep, name)!r}")
    q = d.query_semantics
    if q.kv_block_size == 0:
        raise ProtocolViolation("descriptor: kv_block_size 0")
    if q.hash_format not in HASH_FORMATS:
        raise ProtocolViolation(f"descriptor: hash_format {q.hash_format}")
    if len(d.registrations) == 0:
        raise ProtocolViolation("descriptor: no registration")
    ids = set()
    for r in d.registrations:
        if not _trimmed_text(r.canonical_model_id):
            raise ProtocolViolation(f"registration id {r.canonical_model_id!r}")
        if r.canonical_model_id in ids:
            raise ProtocolViolation(f"duplicate registration {r.canonical_model_id!r}")
        ids.add(r.canonical_model_id)
        if not r.HasField("target") or r.target.WhichOneof("target") is None:
            raise ProtocolViolation(f"registration {r.canonical_model_id!r}: target unset",
                                    kind="unsupported")
        t = r.target
        if t.WhichOneof("target") == "base":
            if not _trimmed_text(t.base.base_model):
                raise ProtocolViolation(f"base_model {t.base.base_model!r}")
        else:
            if not _trimmed_text(t.lora.base_model) or not _trimmed_text(t.lora.adapter):
                raise ProtocolViolation(f"lora target {t.lora!r}")
        if len(set(r.aliases)) != len(r.aliases):
            raise ProtocolViolation(f"duplicate aliases {list(r.aliases)}")
        for a in r.aliases:
            if not _trimmed_text(a):
                raise ProtocolViolation(f"alias {a!r}")
    roles = list(d.pool_roles)
    if not roles:
        raise ProtocolViolation("descriptor: pool_roles empty")
    if len(set(roles)) != len(roles) or any(x not in WORKER_ROLES for x in roles):
        raise ProtocolViolation(f"descriptor: pool_roles {roles}")


# ---------------------------------------------------------------------------------------------
# Pool stream replica (§6.1 "Pool stream", §1.5, §1.6, §3.6)


class PoolReplica:
    """The replica of one pool stream. apply() takes FilterUpdate messages in arrival order and
    raises ProtocolViolation at the first breach. `words` is None until the snapshot assembly
    has completed (the filter is never exposed before that)."""

    def __init__(self, producer, incarnation=None, name="replica"):
        check_producer(producer, f"{name}: subscribed producer")
        self.name = name
        self.key = producer_key(producer)
        self.producer = producer
        self.seed = producer.ckf_format.seed
        self.bucket_count = producer.ckf_format.bucket_count
        self.dc_id = producer.pool_id.dc_id
        self.incarnation = incarnation
        self.assembly = SnapshotAssembly(self.bucket_count)
        self.words = None
        self.seq = None
        self.snapshot_seq = None
        self.frames = 0
        self.chunks = 0
        self.deltas = 0
        self.heartbeats = 0
        self.images = 0
        self.log = []  # (kind, base, seq) of every frame, for failure messages

    def _fail(self, msg, kind="violation"):
        tail = self.log[-8:]
        raise ProtocolViolation(f"{self.name}: {msg} (after {self.frames} frames; last {tail})",
                                kind=kind)

    @property
    def ready(self):
        return self.words is not None

    def apply(self, upd):
        try:
            self.incarnation = check_envelope(upd, self.incarnation, what=f"{self.name} frame")
        except ProtocolViolation as e:
            self._fail(str(e))
        self.frames += 1
        kind, base, seq = upd.kind, upd.base_sequence, upd.sequence
        self.log.append((kind, base, seq))
        if not upd.HasField("producer") or producer_key(upd.producer) != self.key:
            self._fail(f"frame producer {producer_key(upd.producer)} != subscribed {self.key}")
        if kind == KIND_SNAPSHOT_CHUNK:
            self._chunk(upd, base, seq)
        elif kind == KIND_DELTA:
            self._delta(upd, base, seq)
        elif kind == KIND_HEARTBEAT:
            if self.words is None:
                self._fail("heartbeat before the snapshot completed")
            if not (base == seq == self.seq):
                self._fail(f"heartbeat base={base} seq={seq}, installed {self.seq}")
            if len(upd.payload) != 0:
                self._fail(f"heartbeat with a {len(upd.payload)}-byte payload")
            self.heartbeats += 1
        else:
            self._fail(f"unknown kind {kind}")
        return kind

    def _decode(self, upd, want_flags):
        try:
            f = cbi1_decode(upd.payload, self.seed, self.bucket_count)
        except Cbi1Error as e:
            self._fail(str(e), kind=e.kind)
        if f.flags != want_flags:
            self._fail(f"kind {upd.kind} carries CBI1 flags {f.flags}")
        if f.dc_id != self.dc_id:
            self._fail(f"CBI1 dc_id {f.dc_id:#x} != producer dc_id {self.dc_id:#x}")
        if f.epoch != upd.sequence:
            self._fail(f"CBI1 epoch {f.epoch} != sequence {upd.sequence}")
        return f

    def _chunk(self, upd, base, seq):
        if self.words is not None:
            self._fail("snapshot chunk after the snapshot was installed")
        if base != seq:
            self._fail(f"snapshot chunk base {base} != seq {seq}")
        f = self._decode(upd, FLAG_SNAPSHOT_CHUNK)
        expected_chunks = -(-self.bucket_count // SNAPSHOT_CHUNK_BUCKETS)
        if f.chunk_count != expected_chunks:
            self._fail(f"chunk_count {f.chunk_count}, ceil(bucket_count/524288) = {expected_chunks}")
        try:
            words = self.assembly.push(f)
        except Cbi1Error as e:
            self._fail(str(e), kind=e.kind)
        self.chunks += 1
        if words is not None:
            self.words = words
            self.seq = seq
            self.snapshot_seq = seq

    def _delta(self, upd, base, seq):
        if self.words is None:
            self._fail("delta during the snapshot assembly (ChunkSequence)", kind="ChunkSequence")
        if base != self.seq:
            self._fail(f"delta base {base} != installed sequence {self.seq}")
        if seq != base + 1:
            self._fail(f"delta sequence {seq} != base + 1 ({base + 1})")
        f = self._decode(upd, FLAG_DELTA)
        if f.base_epoch != base:
            self._fail(f"delta base_epoch {f.base_epoch} != base_sequence {base}")
        seen = set()
        for b, v in f.images:
            if b in seen:
                self._fail(f"bucket {b} twice in one delta (§6.2.4: unique indices)")
            seen.add(b)
        for b, v in f.images:
            self.words[b] = v
        self.images += len(f.images)
        self.deltas += 1
        self.seq = seq

    def contains(self, h):
        assert self.words is not None, "replica not installed"
        return filter_contains(self.words, h, self.seed)


# ---------------------------------------------------------------------------------------------
# Load windows (§6.1 "Load windows", §6.2.7)


class LoadWindowChecker:
    """Envelope, unique pool producers / models, window_sequence +1 per window."""

    def __init__(self, name, serving=False):
        self.name = name
        self.serving = serving
        self.incarnation = None
        self.last_seq = None

    def apply(self, upd):
        self.incarnation = check_envelope(upd, self.incarnation, what=self.name)
        if self.last_seq is not None and upd.window_sequence != self.last_seq + 1:
            raise ProtocolViolation(
                f"{self.name}: window_sequence {upd.window_sequence} after {self.last_seq}")
        self.last_seq = upd.window_sequence
        keys = [producer_key(p.producer) for p in upd.pools]
        if len(set(keys)) != len(keys):
            raise ProtocolViolation(f"{self.name}: duplicate pool producer")
        for p in upd.pools:
            if not p.HasField("producer"):
                raise ProtocolViolation(f"{self.name}: pool entry without producer")
            check_producer(p.producer, f"{self.name} pool producer")
        if self.serving:
            mk = [(m.namespace, m.canonical_model_id) for m in upd.models]
            if len(set(mk)) != len(mk):
                raise ProtocolViolation(f"{self.name}: duplicate (namespace, model)")
            for p in upd.pools:
                check_pool_load_view(p, self.name)
        return upd


_POOL_TOKEN_GAUGES = ("active_prefill_tokens", "active_decode_blocks")
_MODEL_ONLY_TOKEN_FIELDS = ("awaiting_first_token_input_tokens", "inflight_input_tokens",
                            "input_tokens_total", "output_tokens_total")


def check_pool_load_view(p, what):
    """Serving-load presence rules for one PoolServingLoad (§6.1, §2.4)."""
    if not p.HasField("load"):
        raise ProtocolViolation(f"{what}: pool load view absent")
    if not p.HasField("deployment"):
        raise ProtocolViolation(f"{what}: pool deployment absent (required, may be empty)")
    v = p.load
    if v.status == 0:
        raise ProtocolViolation(f"{what}: DataStatus UNSPECIFIED")
    if v.status not in (DATA_STATUS_COMPLETE, DATA_STATUS_DEGRADED, DATA_STATUS_UNAVAILABLE):
        raise ProtocolViolation(f"{what}: unknown DataStatus {v.status}", kind="unsupported")
    if v.HasField("requests"):
        raise ProtocolViolation(f"{what}: a pool view carries requests")
    if not v.HasField("tokens"):
        raise ProtocolViolation(f"{what}: tokens absent (required)")
    t = v.tokens
    for name in _MODEL_ONLY_TOKEN_FIELDS:
        if t.HasField(name):
            raise ProtocolViolation(f"{what}: pool view sets model-only {name}")
    for name in _POOL_TOKEN_GAUGES:
        if (v.status == DATA_STATUS_COMPLETE) != t.HasField(name):
            raise ProtocolViolation(
                f"{what}: status {v.status} with {name} {'set' if t.HasField(name) else 'unset'}")
