#!/usr/bin/env python3
"""
bench/bench_clients.py — the Python engine adapters against a real kvrelay, next to
kvrelay-bench at the same concurrency. Prints `name value unit` lines.

    python3 bench/bench_clients.py                 # starts build/kvrelay-supervisor itself
    python3 bench/bench_clients.py --url http://127.0.0.1:9130 --no-kvrelay-bench

Measured (each for about --seconds):
  lmcache_l2_{set,get}_16x32MiB    KvrelayL2Adapter batches of 16 x 32 MiB through the
                                   eventfd and drain_completions (num_workers 16, two
                                   batches in flight), GB/s
  sglang_v1_{set,get}_8MiB         KvrelayHiCacheStorage batch_set_v1 / batch_get_v1 of 16
                                   pages of 8 MiB (K and V halves of 4 MiB), GB/s
  kvrelay_bench_{put,get}_{32M,8M} build/kvrelay-bench, 16 connections, same sizes, GB/s
  *_vs_kvrelay_bench               the ratio of the two
  exists_many_1000 / heads_1000    one POST /batch/exists vs 1,000 HEADs one after the other
                                   on one keep-alive connection, ms, and their ratio
  get_many_128x16KiB / gets_128    one POST /batch/get of 128 blocks of 16 KiB into 128
                                   buffers vs 128 get_into one after the other, on one
                                   keep-alive connection, ms (best of 5), and their ratio

GB/s is 10^9 bytes of payload per second, as kvrelay-bench reports it. Not like for like on
one point: kvrelay-bench receives every GET body into one 256 KiB buffer per thread (it stays
in the CPU cache), the adapters into the engine's distinct buffers (16 x 32 MiB per LMCache
batch, written to memory), which is the work an engine needs done. Every loop is bounded
by --seconds and a repetition cap; the server started here is stopped by PID.
"""

import argparse
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "clients" / "python"))

from kvrelay import Client  # noqa: E402
from kvrelay.lmcache import KvrelayL2Adapter  # noqa: E402
from kvrelay.sglang import KvrelayHiCacheStorage  # noqa: E402

MiB = 1 << 20
MAX_REPS = 200


def out(name, value, unit):
    print(f"{name} {value:.3f} {unit}", flush=True)


def start_server(build, memory, workers):
    tmp = tempfile.mkdtemp(prefix="bench-clients-")
    port_file = Path(tmp) / "port"
    log = open(Path(tmp) / "kvrelay.log", "wb")
    proc = subprocess.Popen([str(build / "kvrelay-supervisor"), "--port-file", str(port_file),
                             "--http-bind", "127.0.0.1:0", "--grpc-bind", "off", "--memory", memory,
                             "--workers", str(workers)], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if port_file.exists() and "http=" in port_file.read_text():
            port = int(port_file.read_text().split("http=")[1].split()[0].rsplit(":", 1)[1])
            c = Client(url=f"http://127.0.0.1:{port}")
            for _ in range(100):
                if c.healthy():
                    c.close()
                    return proc, f"http://127.0.0.1:{port}"
                time.sleep(0.05)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("bench_clients: the server did not start")


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


class Driver:
    """The demux side of LMCache's NativeConnectorL2Adapter: poll the eventfd, drain."""

    def __init__(self, adapter):
        self.a = adapter
        self.poller = select.poll()
        self.poller.register(adapter.event_fd(), select.POLLIN)
        self.done = {}

    def submit(self, op, *args):
        return getattr(self.a, "submit_batch_" + op)(*args)

    def wait(self, fids, op="batch"):
        """Waits for every future in fids; their per-key bools by future id."""
        want = set(fids)
        got = {}
        deadline = time.monotonic() + 120
        while want and time.monotonic() < deadline:
            for f in list(want):
                if f in self.done:
                    ok, err, bools = self.done.pop(f)
                    if not ok:
                        raise SystemExit(f"bench_clients: {op} failed: {err}")
                    want.discard(f)
                    got[f] = bools
            if not want or not self.poller.poll(500):
                continue
            for f, ok, err, bools in self.a.drain_completions():
                self.done[f] = (ok, err, bools)  # another batch's completion is kept for it
        if want:
            raise SystemExit(f"bench_clients: {op} never completed")
        return got

    def run(self, op, *args):
        fid = self.submit(op, *args)
        return self.wait([fid], op)[fid]


def bench_lmcache(url, seconds):
    a = KvrelayL2Adapter(url=url, num_workers=16, timeout_s=30.0)
    d = Driver(a)
    pool = memoryview(bytearray(os.urandom(33 * MiB)))
    src = [pool[i * 4096: i * 4096 + 32 * MiB] for i in range(16)]
    dst = [memoryview(bytearray(32 * MiB)) for _ in range(16)]
    batch = 16 * 32 * MiB
    try:
        # Two batches in flight, as LMCache's store controller keeps several store tasks
        # submitted: the 16 workers (the concurrency, as kvrelay-bench's 16 connections)
        # never wait for a batch's last transfer before starting the next batch. Fresh keys
        # every batch: the arena fills and evicts, as under kvrelay-bench's put.
        n_set = 0
        t0 = time.monotonic()
        inflight = []
        while (time.monotonic() - t0 < seconds and n_set < MAX_REPS) or inflight:
            if time.monotonic() - t0 < seconds and n_set + len(inflight) < MAX_REPS and len(inflight) < 2:
                keys = [f"bench-lmc@{n_set + len(inflight):08x}@{time.monotonic_ns()}@{i:064x}" for i in range(16)]
                inflight.append(d.submit("set", keys, src))
                continue
            d.wait([inflight.pop(0)], "set")
            n_set += 1
        t_set = time.monotonic() - t0
        keys = [f"bench-lmc-get@0@{i:064x}" for i in range(16)]
        d.run("set", keys, src)
        dst2 = [memoryview(bytearray(32 * MiB)) for _ in range(16)]
        n_get = 0
        t0 = time.monotonic()
        inflight = []
        while (time.monotonic() - t0 < seconds and n_get < MAX_REPS) or inflight:
            if time.monotonic() - t0 < seconds and n_get + len(inflight) < MAX_REPS and len(inflight) < 2:
                inflight.append(d.submit("get", keys, dst if len(inflight) == 0 else dst2))
                continue
            fid = inflight.pop(0)
            assert all(d.wait([fid], "get")[fid])
            n_get += 1
            if inflight:  # keep the buffers paired with their batch: the next one uses dst
                dst, dst2 = dst2, dst
        t_get = time.monotonic() - t0
        assert all(bytes(dst[i][:4096]) == bytes(src[i][:4096]) for i in range(16))
        d.run("delete", keys)
    finally:
        a.close()
    return n_set * batch / t_set / 1e9, n_get * batch / t_get / 1e9


class HostPool:
    def __init__(self, pages, half):
        self.page_size = 64
        self.half = half
        self.buf = (ctypes.c_ubyte * (pages * 2 * half))()
        self.base = ctypes.addressof(self.buf)
        ctypes.memmove(self.base, os.urandom(1 << 20) * (pages * 2 * half >> 20), pages * 2 * half)

    def get_page_buffer_meta(self, indices):
        ptrs, sizes = [], []
        for i in range(0, len(indices), self.page_size):
            k = self.base + (indices[i] // self.page_size) * 2 * self.half
            ptrs += [k, k + self.half]
            sizes += [self.half, self.half]
        return ptrs, sizes

    def indices(self, first, count):
        return list(range(first * self.page_size, (first + count) * self.page_size))


def bench_sglang(url, seconds, pages=16):
    pool = HostPool(2 * pages, 4 * MiB)
    s = KvrelayHiCacheStorage(None, {"url": url, "num_workers": 16, "timeout_s": 30.0})
    s.register_mem_pool_host(pool)
    batch = pages * 8 * MiB
    try:
        t_set, n_set, rep = 0.0, 0, 0
        while t_set < seconds and rep < MAX_REPS:
            keys = [f"bench-sgl-{rep}-{i:064x}" for i in range(pages)]
            t0 = time.monotonic()
            res = s.batch_set_v1(keys, pool.indices(0, pages))
            t_set += time.monotonic() - t0
            n_set += 1
            assert all(res), res
            rep += 1
        keys = [f"bench-sgl-get-{i:064x}" for i in range(pages)]
        assert all(s.batch_set_v1(keys, pool.indices(0, pages)))
        t_get, n_get = 0.0, 0
        while t_get < seconds and n_get < MAX_REPS:
            t0 = time.monotonic()
            res = s.batch_get_v1(keys, pool.indices(pages, pages))
            t_get += time.monotonic() - t0
            n_get += 1
            assert all(res), res
    finally:
        s.close()
    return n_set * batch / t_set / 1e9, n_get * batch / t_get / 1e9


def kvrelay_bench(build, url, workload, size, seconds):
    target = url.split("://", 1)[1].rstrip("/")
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        # put: kvrelay-bench's default key space (fresh keys, the arena evicts); get: 16 keys
        # (get: --no-verify, as the adapters do not checksum what they receive either)
        keys = ["--keys", "16", "--preload", "--no-verify"] if workload == "get" else []
        argv = [str(build / "kvrelay-bench"), "--target", target, "--workload", workload, "--size", size,
                *keys, "--connections", "16", "--duration", f"{seconds}s", "--quiet",
                "--key-prefix", f"bench-kvb-{workload}-{size}", "--json", f.name]
        subprocess.run(argv, check=True, capture_output=True, timeout=seconds + 120)
        return json.load(open(f.name))["throughput"]["gb_per_s"]


def bench_exists(url, n=1000):
    c = Client(url=url, max_connections=1)
    try:
        keys = [f"bench-ex-{i}" for i in range(n)]
        for k in keys[::2]:
            c.put(k, b"x")
        c.contains(keys[0])  # the connection is open and kept alive
        best_batch, best_heads = float("inf"), float("inf")
        for _ in range(5):
            t0 = time.monotonic()
            r = c.exists_many(keys)
            best_batch = min(best_batch, time.monotonic() - t0)
            assert r == [i % 2 == 0 for i in range(n)]
            t0 = time.monotonic()
            r2 = [c.contains(k) for k in keys]
            best_heads = min(best_heads, time.monotonic() - t0)
            assert r2 == r
        assert c.connections_opened == 1
        return best_batch * 1000, best_heads * 1000
    finally:
        c.close()


def bench_get_many(url, n=128, size=16 * 1024):
    c = Client(url=url, max_connections=1)
    try:
        keys = [f"bench-gm-{i}" for i in range(n)]
        for i, k in enumerate(keys):
            assert c.put(k, bytes([i]) * size)
        bufs = [bytearray(size) for _ in keys]
        best_batch, best_single = float("inf"), float("inf")
        for _ in range(5):
            t0 = time.monotonic()
            r = c.get_many_into(keys, bufs)
            best_batch = min(best_batch, time.monotonic() - t0)
            assert r == [True] * n and all(b[0] == i for i, b in enumerate(bufs))
            t0 = time.monotonic()
            r2 = [c.get_into(k, b) == size for k, b in zip(keys, bufs)]
            best_single = min(best_single, time.monotonic() - t0)
            assert r2 == r
        assert c.connections_opened == 1
        return best_batch * 1000, best_single * 1000
    finally:
        c.close()


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running kvrelay (default: start one)")
    ap.add_argument("--build", default=str(REPO / "build"))
    ap.add_argument("--seconds", type=float, default=1.0, help="per measurement (default 1)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="adapter and kvrelay-bench alternate this many times; medians (default 3)")
    ap.add_argument("--memory", default="2G")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-kvrelay-bench", action="store_true")
    args = ap.parse_args()
    build = Path(args.build)
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(build, args.memory, args.workers)
    try:
        ms_batch, ms_heads = bench_exists(url)
        out("exists_many_1000", ms_batch, "ms")
        out("heads_1000_one_connection", ms_heads, "ms")
        out("exists_many_speedup", ms_heads / ms_batch, "x")
        ms_many, ms_gets = bench_get_many(url)
        out("get_many_128x16KiB", ms_many, "ms")
        out("gets_128x16KiB_one_connection", ms_gets, "ms")
        out("get_many_speedup", ms_gets / ms_many, "x")
        # Alternate the adapter and kvrelay-bench so that a busy machine slows both alike.
        runs = {k: [] for k in ("lset", "lget", "sset", "sget", "p32", "g32", "p8", "g8")}
        for _ in range(max(1, args.rounds)):
            lset, lget = bench_lmcache(url, args.seconds)
            runs["lset"].append(lset)
            runs["lget"].append(lget)
            if not args.no_kvrelay_bench:
                runs["p32"].append(kvrelay_bench(build, url, "put", "32M", args.seconds))
                runs["g32"].append(kvrelay_bench(build, url, "get", "32M", args.seconds))
            sset, sget = bench_sglang(url, args.seconds)
            runs["sset"].append(sset)
            runs["sget"].append(sget)
            if not args.no_kvrelay_bench:
                runs["p8"].append(kvrelay_bench(build, url, "put", "8M", args.seconds))
                runs["g8"].append(kvrelay_bench(build, url, "get", "8M", args.seconds))
        for name, key, ref in (("lmcache_l2_set_16x32MiB", "lset", "p32"), ("lmcache_l2_get_16x32MiB", "lget", "g32"),
                               ("sglang_v1_set_8MiB", "sset", "p8"), ("sglang_v1_get_8MiB", "sget", "g8")):
            mine = median(runs[key])
            out(name, mine, "GB/s")
            if runs[ref]:
                theirs = median(runs[ref])
                wl = "put" if ref.startswith("p") else "get"
                out(f"kvrelay_bench_{wl}_{ref[1:]}M_16conns", theirs, "GB/s")
                out(f"{name}_vs_kvrelay_bench", mine / theirs, "ratio")
    finally:
        if proc is not None:
            stop_server(proc)


if __name__ == "__main__":
    main()
