"""
Timeouts on the HTTP/1.1 data plane measure progress, not duration: slow but moving transfers
complete under short --io-timeout values, stalled ones are cut at it and leave no reservation
or pin behind.
"""

import socket
import threading
import time

from conftest import KiB, MiB, SLOW, kv_path, make_block, parse_raw_response, raw_connect, read_one_response, read_until_close
from h1_raw import _req


# ------------------------------------------------------------------ progress-based timeouts


def _paced_put(srv, key, data, rate, chunk=256 * KiB):
    s = raw_connect(srv, timeout=60)
    try:
        s.sendall(_req("PUT", kv_path(key), [("Content-Length", str(len(data)))]))
        t0 = time.monotonic()
        for off in range(0, len(data), chunk):
            s.sendall(data[off : off + chunk])
            lag = (off + chunk) / rate - (time.monotonic() - t0)
            if lag > 0:
                time.sleep(lag)  # pacing the upload at `rate`: the slow client under test
        return read_one_response(s, 10 * SLOW)
    finally:
        s.close()


def _paced_get(srv, key, rate, chunk=256 * KiB):
    s = raw_connect(srv, timeout=60)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * KiB)
    buf = bytearray()
    try:
        s.sendall(_req("GET", kv_path(key)))
        t0 = time.monotonic()
        while True:
            more = s.recv(chunk)
            if not more:
                break
            buf += more
            lag = len(buf) / rate - (time.monotonic() - t0)
            if lag > 0:
                time.sleep(lag)  # pacing the download at `rate`: the slow reader under test
            head, sep, rest = bytes(buf[:2048]).partition(b"\r\n\r\n")
            if sep:
                n = int([ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")][0])
                if len(buf) - len(head) - 4 >= n:
                    break
        status, hdrs, body = parse_raw_response(bytes(buf))
        return status, body
    finally:
        s.close()


def test_slow_but_moving_transfers_complete_and_stalled_ones_are_cut(kvrelay):
    """64 MiB in and out at 2 MiB/s (32 s each, side by side) complete under the default
    timeouts and under 3 s ones (progress resets the timer); a PUT and a GET that stop moving
    are cut at --io-timeout and leave no reservation or pin behind."""
    rate = 2 * MiB
    data = make_block(64 * MiB, "paced")
    default = kvrelay("--memory", "512M")
    short = kvrelay("--memory", "512M", "--io-timeout", "3s", "--idle-timeout", "3s")
    for srv in (default, short):
        assert srv.put("paced-src", data).status == 201
    results = {}

    def run(name, fn):
        try:
            results[name] = fn()
        except Exception as e:  # asserted below
            results[name] = e

    threads = []
    for label, srv in (("default", default), ("short", short)):
        threads.append(threading.Thread(target=run, args=(f"put-{label}", lambda srv=srv: _paced_put(srv, "paced-up", data, rate))))
        threads.append(threading.Thread(target=run, args=(f"get-{label}", lambda srv=srv: _paced_get(srv, "paced-src", rate))))
    for t in threads:
        t.start()

    # Meanwhile, on the short-timeout server: a PUT and a GET that stop moving.
    stalled_put = raw_connect(short)
    stalled_put.sendall(_req("PUT", kv_path("stalled-up"), [("Content-Length", str(8 * MiB))]) + b"q" * MiB)
    stalled_get = raw_connect(short, rcvbuf=64 * KiB)
    stalled_get.sendall(_req("GET", kv_path("paced-src")))
    t0 = time.monotonic()
    data_put, how_put = read_until_close(stalled_put, 15 * SLOW)
    cut_put = time.monotonic() - t0
    data_get, how_get = read_until_close(stalled_get, 15 * SLOW, max_bytes=1)
    stalled_put.close()
    for t in threads:
        t.join(90 * SLOW)
    assert how_put in ("eof", "reset") and 2.5 < cut_put < 8 * SLOW, (how_put, cut_put)
    # the GET's reader stopped: its connection is cut too (drain the socket to see the end)
    rest, how_get = read_until_close(stalled_get, 15 * SLOW)
    stalled_get.close()
    assert how_get in ("eof", "reset")
    assert len(data_get) + len(rest) < 64 * MiB

    for label in ("default", "short"):
        r = results[f"put-{label}"]
        assert not isinstance(r, Exception) and r.status == 201, (label, r)
        st, body = results[f"get-{label}"]
        assert st == 200 and body == data, (label, st, len(body))
    for srv in (default, short):
        assert srv.get("paced-up").body == data
        srv.assert_consistent()
    doc = short.debug_store()
    assert doc["reserved_blocks"] == 0 and doc["pinned_blocks"] == 0, doc
