"""
SIGKILLed workers under mixed load on the HTTP/1.1 data plane: bodies received straight into
the arena are never served torn, and nothing acknowledged is lost.
"""

import os
import threading
import time

from conftest import KiB, MiB, SLOW, kv_path, make_block


# ------------------------------------------------------------------ crashes


def test_sigkill_of_workers_under_mixed_load_loses_nothing_acknowledged(kvrelay):
    """PUTs and GETs of 16 KiB to 80 MiB received straight into the arena while a worker is
    SIGKILLed every 0.8 s for 8 s: no torn block is ever served, every acknowledged block is
    intact afterwards, and no reservation or pin is left behind."""
    import hashlib
    import http.client
    import random

    srv = kvrelay("--memory", "2G", "--workers", "2", "--grpc-bind", "off")
    srv.kills_expected = True
    sizes = [16 * KiB] * 8 + [256 * KiB] * 6 + [2 * MiB] * 4 + [8 * MiB] * 2 + [32 * MiB, 80 * MiB]
    acked, lock, stop = {}, threading.Lock(), threading.Event()
    torn, served, budget = [], [0], [1400 * MiB]  # volume below the arena: nothing is evicted

    def conn():
        return http.client.HTTPConnection(srv.host, srv.port, timeout=10 * SLOW)

    def writer(seed):
        rnd, c, n = random.Random(seed), conn(), 0
        while not stop.is_set():
            size = rnd.choice(sizes)
            with lock:
                if budget[0] < size:
                    break
                budget[0] -= size
            key = f"kill-{seed}-{n}"
            n += 1
            data = make_block(size, key)
            try:
                c.request("PUT", kv_path(key), body=data)
                r = c.getresponse()
                r.read()
                if r.status == 201:
                    with lock:
                        acked[key] = (size, hashlib.blake2b(data).digest())
            except (OSError, http.client.HTTPException):
                c.close()
                c = conn()
        c.close()

    def reader(seed):
        rnd, c = random.Random(seed), conn()
        while not stop.is_set():
            with lock:
                if not acked:
                    key = None
                else:
                    key = rnd.choice(list(acked))
                    size, digest = acked[key]
            if key is None:
                time.sleep(0.01)  # nothing acknowledged yet to read back; the load loop polls
                continue
            try:
                c.request("GET", kv_path(key))
                r = c.getresponse()
                body = r.read()
                if r.status == 200:
                    served[0] += 1
                    if len(body) != size or hashlib.blake2b(body).digest() != digest:
                        torn.append(key)
            except (OSError, http.client.HTTPException):
                c.close()
                c = conn()
        c.close()

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader, args=(100 + i,)) for i in range(2)]
    for t in threads:
        t.start()
    kills = 0
    t_start = time.monotonic()
    rnd = random.Random(7)
    # 8 s of load, and on a busy machine (where a worker is sometimes still being replaced when
    # its turn comes) on until 6 kills, at most 20 s
    while time.monotonic() < t_start + 8 or (kills < 6 and time.monotonic() < t_start + 20):
        time.sleep(0.8)  # pacing: a worker is killed every 0.8 s while the load runs
        pids = srv.worker_pids()
        if pids:
            os.kill(rnd.choice(pids), 9)
            kills += 1
    stop.set()
    for t in threads:
        t.join(60 * SLOW)
    srv.wait_workers(2)
    print(f"sigkill: {kills} kills, {len(acked)} blocks acknowledged, {served[0]} verified GETs")
    assert not torn, f"torn blocks served: {torn[:5]}"
    assert kills >= 6 and len(acked) > 20 and served[0] > 20
    c = conn()
    for key, (size, digest) in acked.items():
        c.request("GET", kv_path(key))
        r = c.getresponse()
        body = r.read()
        assert r.status == 200 and hashlib.blake2b(body).digest() == digest, key
    c.close()
    d, _ = srv.assert_consistent()
    assert d["reserved_blocks"] == 0, d
