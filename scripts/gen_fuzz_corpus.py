#!/usr/bin/python3
"""Writes the libFuzzer seed corpora of tests/fuzz/ from the vectors in tests/data/.

Run from the repository root: scripts/gen_fuzz_corpus.py. The input formats are those
documented at the top of tests/fuzz/fuzz_cbi1.c and tests/fuzz/fuzz_relay_req.c.
XXH3 comes from the system libxxhash through ctypes.
"""
import ctypes
import os
import struct

XXH = ctypes.CDLL("libxxhash.so.0")
XXH.XXH3_64bits.restype = ctypes.c_uint64
XXH.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]


def xxh3(b):
    return XXH.XXH3_64bits(b, len(b))


def load_hex(path):
    text = "".join(l.split("#")[0] for l in open(path))
    return bytes.fromhex("".join(text.split()))


def cbi1_header(flags, seed, bc, dc, epoch):
    return b"CBI1" + struct.pack("<HHBBHQQQQI", 1, flags, 16, 4, 1, seed, bc, dc, epoch, 0)


def seal(frame):
    return frame[:44] + struct.pack("<I", xxh3(frame[48:]) & 0xFFFFFFFF) + frame[48:]


def chunk(seed, bc, dc, epoch, words):
    body = struct.pack("<IIQ", 0, 1, 0) + b"".join(struct.pack("<Q", w) for w in words)
    return seal(cbi1_header(1, seed, bc, dc, epoch) + body)


def record(kind, opts, base, seq, payload=b""):
    return bytes([kind, opts, base, seq]) + struct.pack("<H", len(payload)) + payload


# ---- protobuf helpers ----
def varint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def key(field, wt):
    return varint(field << 3 | wt)


def f_varint(field, v):
    return key(field, 0) + varint(v)


def f_fixed64(field, v):
    return key(field, 1) + struct.pack("<Q", v)


def f_bytes(field, b):
    return key(field, 2) + varint(len(b)) + b


def marker():
    return key(127, 5) + struct.pack("<I", 0x4B565231)


def producer(seed, bc, dc):
    digest = lambda d, src: f_bytes(1, d) + f_varint(2, src)
    domain = f_bytes(1, digest(b"\x11" * 16, 1)) + f_bytes(2, digest(b"\x22" * 16, 2))
    pool = f_varint(1, 1) + f_bytes(2, domain) + f_fixed64(3, dc)
    fmt = f_varint(1, 1) + f_fixed64(2, seed) + f_varint(3, bc) + f_varint(4, 16) + f_varint(5, 4)
    return f_bytes(1, pool) + f_fixed64(2, 7) + f_varint(3, 1) + f_bytes(4, fmt)


def write(directory, name, data):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def main():
    d1, d2, s1, e1 = (load_hex(f"tests/data/cbi1/{n}.hex") for n in ("D1", "D2", "S1", "E1"))
    cbi = "tests/fuzz/corpus/fuzz_cbi1"
    for name, frame in (("D1", d1), ("D2", d2), ("S1", s1), ("E1", e1)):
        write(cbi, f"frame_{name}", b"\x00\x00" + frame)
        write(cbi, f"frame_{name}_reseal", b"\x00\x01" + frame)
    # streams: mode bit 0 = stream, bits 1-2 = bucket_count index (0:2, 1:64, 2:1024, 3:8192)
    write(cbi, "stream_S1_heartbeat",
          bytes([0x01]) + record(1, 0, 6, 6, s1) + record(3, 0, 6, 6))
    snap1024 = chunk(0x5EED, 1024, 7, 0, [0] * 1024)
    write(cbi, "stream_1024_D2",
          bytes([0x01 | 2 << 1]) + record(1, 0, 0, 0, snap1024) + record(2, 0, 0, 1, d2)
          + record(3, 0, 1, 1))
    snap1024_4 = chunk(0x5EED, 1024, 7, 4, [0] * 1024)
    write(cbi, "stream_1024_D1",
          bytes([0x01 | 2 << 1]) + record(1, 0, 4, 4, snap1024_4) + record(2, 0, 4, 5, d1))
    write(cbi, "stream_64_violations",
          bytes([0x01 | 1 << 1]) + record(2, 0, 0, 1, d2) + record(3, 0x80, 0, 0, b"x")
          + record(1, 0, 0, 0, chunk(0x5EED, 64, 7, 0, list(range(64)))))

    req = "tests/fuzz/corpus/fuzz_relay_req"
    write(req, "get_relay_info", b"\x00" + load_hex("tests/data/relay/relay_info_request.hex"))
    watch = load_hex("tests/data/relay/watch_catalog_request.hex")
    for sel in (1, 3, 4, 5):
        write(req, f"watch_{sel}", bytes([sel]) + watch)
    sub = f_bytes(1, b"pylon") + f_bytes(2, producer(0x5DEECE66D1B54A33, 524288, 9)) + marker()
    write(req, "subscribe_kv_pool", b"\x02" + sub)
    write(req, "subscribe_kv_pool_bad_id", b"\x02" + f_bytes(1, b"a\x00b") + marker())
    relay = f_fixed64(1, 17) + f_fixed64(2, 23)
    fu = (f_varint(1, 1) + f_bytes(2, relay) + f_bytes(3, producer(0x5EED, 2, 9))
          + f_varint(4, 6) + f_varint(5, 6) + f_varint(7, 1) + f_bytes(8, s1) + marker())
    write(req, "filter_update_S1", b"\x06" + fu)

    # the disk tier's headers (layouts at the top of src/wire/ssdfmt.c); mode bit 2 makes the
    # driver write the checksum, bits 0-1 pick the decoder
    ssd = "tests/fuzz/corpus/fuzz_ssdfmt"
    write(ssd, "super", bytes([0 | 4]) + b"KVRSSDSB" + struct.pack("<II4Q", 1, 0, 64 << 20, 16, 99, 5))
    write(ssd, "page_open", bytes([1 | 4]) + b"KVRSSDPG" + struct.pack("<4QII3Q", 3, 11, 99, 8, 0, 0, 0, 0, 0))
    write(ssd, "page_sealed", bytes([1 | 4]) + b"KVRSSDPG"
          + struct.pack("<4QII3Q", 3, 11, 99, 8, 1, 2, 5 * 4096, 200, 77))
    k = b"prefix/0001/layer-07"
    rec = (b"KVRSSDRC" + struct.pack("<7QHBB", 7, 1, xxh3(k), 0xFEED, 2 << 20, 0x11, 42, len(k), 8, 21)
           + b"tenant-a".ljust(32, b"\0") + b"meta-llama/Llama-3-8B".ljust(128, b"\0") + bytes(28) + k)
    write(ssd, "record", bytes([2 | 4]) + rec)
    tomb = (b"KVRSSDRC" + struct.pack("<7QHBB", 7, 2, xxh3(k), 0xFEED, 0, 0x11, 43, len(k), 8, 21)
            + b"tenant-a".ljust(32, b"\0") + b"meta-llama/Llama-3-8B".ljust(128, b"\0")
            + struct.pack("<I", 1) + bytes(24) + k)
    write(ssd, "record_tombstone", bytes([2 | 4]) + tomb)
    write(ssd, "summary_entry", bytes([3]) + struct.pack("<II6QHBBI", 1, 514, 9, xxh3(k), 0xFEED, 2 << 20, 0x11, 42,
                                                          len(k), 8, 21, 0)
          + b"tenant-a" + b"meta-llama/Llama-3-8B" + k)
    write(ssd, "summary_tombstone", bytes([3]) + struct.pack("<II6QHBBI", 1, 2, 10, xxh3(k), 0xFEED, 0, 0x11, 43,
                                                              len(k), 8, 21, 1)
          + b"tenant-a" + b"meta-llama/Llama-3-8B" + k)


if __name__ == "__main__":
    main()
