"""
Accept turns (docs/concurrency.md, "Accept turns"): the workers share one HTTP listener and
take turns at it by the connections each holds, so a burst of long-lived connections (a few
engines' connection pools) spreads evenly instead of by a hash of the client's port; a
worker that does not run (here: SIGSTOP) holds up no new connection for longer than a few
ticks, though the kernel may hand it the wake-up.

With one SO_REUSEPORT socket per worker (the design before), 32 connections over 4 workers
spread within 3 of each other in 18 % of rounds (simulated), so three rounds in a row pass by
chance about once in 170 runs; and with one worker stopped, the connections hashed to its
socket waited until the watchdog replaced it.
"""

import http.client
import os
import re
import signal
import socket
import time

from conftest import SLOW, wait_stopped

LOAD_RE = re.compile(r'^kvrelay_worker_connections\{slot="(\d+)"\} (\d+)$', re.M)


def _loads(srv, conn):
    conn.request("GET", "/metrics")
    r = conn.getresponse()
    body = r.read().decode()
    assert r.status == 200, body[:200]
    return {int(s): int(n) for s, n in LOAD_RE.findall(body)}


def _wait_total(srv, conn, total, limit):
    """Polls the per-worker gauges until they add up to total; returns the last reading."""
    deadline = time.monotonic() + limit
    loads = _loads(srv, conn)
    while sum(loads.values()) != total and time.monotonic() < deadline:
        time.sleep(0.02)  # poll interval of this bounded wait (the caller asserts the reading)
        loads = _loads(srv, conn)
    return loads


def _served(sock, timeout):
    """GET /healthz on an open socket; True when a 200 came back within timeout."""
    sock.settimeout(timeout)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(4096)
        if not chunk:
            return False
        got += chunk
    return got.startswith(b"HTTP/1.1 200")


def test_a_burst_of_connections_spreads_evenly_over_the_workers(kvrelay):
    nworkers, nconns, rounds = 4, 32, 3
    srv = kvrelay("--memory", "64M", "--workers", str(nworkers))
    scraper = http.client.HTTPConnection(srv.host, srv.port, timeout=10 * SLOW)
    loads = _wait_total(srv, scraper, 1, 5 * SLOW)
    assert len(loads) == nworkers, f"a gauge per worker: {loads}"
    for rnd in range(rounds):
        socks = []
        try:
            # connect all at once (a pool opening), then use every one
            for _ in range(nconns):
                socks.append(socket.create_connection((srv.host, srv.port), timeout=10 * SLOW))
            assert all(_served(s, 10 * SLOW) for s in socks), "every connection is answered"
            loads = _wait_total(srv, scraper, nconns + 1, 5 * SLOW)
            print(f"round {rnd}: connections per worker {loads}")
            assert sum(loads.values()) == nconns + 1, f"the gauges count every connection: {loads}"
            spread = max(loads.values()) - min(loads.values())
            assert spread <= 3, f"round {rnd}: {nconns} connections spread {loads} over the workers"
        finally:
            for s in socks:
                s.close()
        loads = _wait_total(srv, scraper, 1, 5 * SLOW)
        assert sum(loads.values()) == 1, f"closed connections leave the gauges: {loads}"
    scraper.close()


def test_a_stopped_worker_holds_up_no_new_connection(kvrelay):
    # the watchdog stays out of it: a stopped worker is only replaced after 60 s
    srv = kvrelay("--memory", "64M", "--workers", "2", "--hang-timeout", "60s")
    srv.kills_expected = True
    workers = srv.worker_pids()
    assert len(workers) == 2, workers
    held = []
    try:
        # a few long-lived connections on both workers, so that the running one reaches its
        # turn limit and gives the turn to the stopped one
        for _ in range(6):
            s = socket.create_connection((srv.host, srv.port), timeout=5 * SLOW)
            assert _served(s, 5 * SLOW)
            held.append(s)
        os.kill(workers[0], signal.SIGSTOP)
        # SIGSTOP takes effect when the worker next runs, and on its way to stopping the kernel
        # still runs its io_uring task work: a connection that arrives in that window can be
        # accepted into the ring of a worker that then stops, and waits for it (or for the
        # watchdog) as it would behind any worker that stalls right after an accept. The claim
        # here is about connections that arrive once the worker is stopped.
        assert wait_stopped(workers[0], 5 * SLOW), "the worker stops"
        slow = []
        for i in range(16):
            t0 = time.monotonic()
            s = socket.create_connection((srv.host, srv.port), timeout=5 * SLOW)
            held.append(s)
            ok = _served(s, 3 * SLOW)
            took = time.monotonic() - t0
            assert ok, f"new connection {i} was not answered in {3 * SLOW:.0f} s with a worker stopped"
            slow.append(took)
        print("answer times with one worker stopped (s):", [round(x, 3) for x in slow])
        # a tick (50 ms) for a swallowed wake-up, 200 ms for a turn given to the stopped worker
        assert max(slow) < 1.0 * SLOW, f"slowest new connection took {max(slow):.2f} s"
    finally:
        os.kill(workers[0], signal.SIGCONT)
        for s in held:
            s.close()
    # the stopped worker serves again once it runs
    assert srv.wait_ready(10 * SLOW)
    assert srv.get("kvrelay-turns-missing").status == 404
