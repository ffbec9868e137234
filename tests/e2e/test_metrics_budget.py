"""
The levels and counters of the PUT budget and of making room, on a real server's /metrics:

- a PUT that finds its worker's in-flight budget (--max-inflight-bytes) taken waits on the wait
  queue: kvrelay_put_budget_waits_total counts it, kvrelay_put_budget_waiting shows it while it
  waits, kvrelay_put_reservations / kvrelay_put_reserved_bytes show the reservation that holds
  the budget; all three levels are back at 0 once the bodies are in;
- a burst of concurrent large PUTs against a small budget all succeed and leave the levels at 0;
- a worker killed while it holds a reservation and a waiter leaves no level behind: the
  supervisor's reap zeroes the dead slot's levels (shm/stats.c) and keeps its counters;
- closing the longest-idle connections at --max-connections is counted, and so is a pause of
  accept when the worker runs out of descriptors.

Raw sockets hold a body half-sent or a head without its body, so the waits are made, not hoped
for. Every wait polls /metrics with a deadline.
"""

import os
import resource
import signal
import socket
import threading
import time

from conftest import SLOW, KiB, MiB, kv_path, make_block, unique_key
from harness import wait_until
from test_metrics import parse, promtool_check, value

BODY = 768 * KiB  # two of them do not fit the 1 MiB budget of the one worker


def metrics(srv):
    text = srv.metrics_text()
    return parse(text)[1]


def wait_metrics(srv, what, cond, limit=10.0):
    """Polls /metrics until cond(samples) holds; returns those samples."""
    seen = {}

    def check():
        seen["m"] = metrics(srv)
        return cond(seen["m"])

    def why():
        m = seen.get("m", {})
        return what + ": " + repr({k[0]: v for k, v in m.items()
                                   if k[0].startswith(("kvrelay_put_", "kvrelay_accept", "kvrelay_idle"))})

    wait_until(check, limit * SLOW, what=why)
    return seen["m"]


def levels(m):
    return (value(m, "kvrelay_put_reservations"), value(m, "kvrelay_put_reserved_bytes"),
            value(m, "kvrelay_put_budget_waiting"))


def open_put(srv, key, length):
    """A connection that has sent a PUT head announcing `length` body bytes, and nothing more."""
    s = socket.create_connection((srv.host, srv.port), timeout=10 * SLOW)
    s.sendall((f"PUT {kv_path(key)} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n").encode())
    return s


def read_status(s):
    """The status code of the response on s (the head is enough)."""
    buf = b""
    while b"\r\n" not in buf:
        chunk = s.recv(4096)
        assert chunk, f"connection closed before a status line: {buf!r}"
        buf += chunk
    return int(buf.split(b" ", 2)[1])


def test_budget_wait_is_counted_and_levels_return_to_zero(kvrelay):
    srv = kvrelay("--memory", "16M", "--workers", "1", "--max-inflight-bytes", "1M")
    m0 = metrics(srv)
    assert levels(m0) == (0, 0, 0)
    waits0 = value(m0, "kvrelay_put_budget_waits_total")

    ka, kb = unique_key("budget-a"), unique_key("budget-b")
    da, db = make_block(BODY, ka), make_block(BODY, kb)
    a = open_put(srv, ka, BODY)
    b = None
    try:
        a.sendall(da[: BODY // 2])  # A holds the budget, its body half in
        wait_metrics(srv, "A's reservation", lambda m: levels(m)[:2] == (1, BODY))
        b = open_put(srv, kb, BODY)  # B's head finds the budget taken: it waits
        m = wait_metrics(srv, "B waiting", lambda m: value(m, "kvrelay_put_budget_waiting") == 1)
        assert value(m, "kvrelay_put_budget_waits_total") == waits0 + 1
        assert levels(m)[:2] == (1, BODY), "B has no reservation while it waits"

        a.sendall(da[BODY // 2:])  # A's body is in: its budget goes to B
        assert read_status(a) == 201
        wait_metrics(srv, "B admitted", lambda m: levels(m) == (1, BODY, 0))
        b.sendall(db)
        assert read_status(b) == 201
    finally:
        a.close()
        if b is not None:
            b.close()
    m = wait_metrics(srv, "levels back at 0", lambda m: levels(m) == (0, 0, 0))
    assert value(m, "kvrelay_put_budget_waits_total") == waits0 + 1, "B waited once, however often it was retried"
    assert srv.get(ka).body == da and srv.get(kb).body == db
    rc, out = promtool_check(srv.metrics_text())
    assert rc == 0, out


def test_concurrent_large_puts_under_a_small_budget(kvrelay):
    srv = kvrelay("--memory", "16M", "--workers", "1", "--max-inflight-bytes", "1M")
    waits0 = value(metrics(srv), "kvrelay_put_budget_waits_total")
    n = 8
    keys = [unique_key("burst") for _ in range(n)]
    statuses, errors = [None] * n, []
    go = threading.Barrier(n)

    def one(i):
        try:
            s = socket.create_connection((srv.host, srv.port), timeout=30 * SLOW)
            try:
                go.wait(10 * SLOW)
                data = make_block(BODY, keys[i])
                s.sendall((f"PUT {kv_path(keys[i])} HTTP/1.1\r\nHost: x\r\nContent-Length: {BODY}\r\n\r\n").encode())
                for off in range(0, BODY, 64 * KiB):  # in pieces, so that bodies overlap
                    s.sendall(data[off:off + 64 * KiB])
                statuses[i] = read_status(s)
            finally:
                s.close()
        except Exception as e:  # reported below, on the test's thread
            errors.append(repr(e))

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 * SLOW)
    assert not errors and statuses == [201] * n, (statuses, errors)
    m = wait_metrics(srv, "levels back at 0", lambda m: levels(m) == (0, 0, 0))
    assert value(m, "kvrelay_put_budget_waits_total") >= waits0
    for k in keys:
        assert srv.get(k).body == make_block(BODY, k)


def test_levels_of_a_killed_worker_are_zeroed_at_reap(kvrelay):
    srv = kvrelay("--memory", "16M", "--workers", "1", "--max-inflight-bytes", "1M")
    srv.kills_expected = True
    a = open_put(srv, unique_key("dead-a"), BODY)
    b = None
    try:
        a.sendall(b"x" * (BODY // 2))
        wait_metrics(srv, "A's reservation", lambda m: levels(m)[:2] == (1, BODY))
        b = open_put(srv, unique_key("dead-b"), BODY)
        m = wait_metrics(srv, "B waiting", lambda m: levels(m) == (1, BODY, 1))
        waits = value(m, "kvrelay_put_budget_waits_total")
        restarts = value(m, "kvrelay_worker_restarts_total")
        [pid] = srv.worker_pids()
        os.kill(pid, signal.SIGKILL)
        srv.wait_workers(1, exclude=[pid])
        m = wait_metrics(srv, "the replacement serving", lambda m: value(m, "kvrelay_worker_restarts_total") > restarts)
    finally:
        a.close()
        if b is not None:
            b.close()
    assert levels(m) == (0, 0, 0), "the dead worker's levels linger"
    assert value(m, "kvrelay_put_budget_waits_total") == waits, "its counters are kept"


def test_idle_connections_closed_at_max_connections_are_counted(kvrelay):
    srv = kvrelay("--memory", "16M", "--workers", "1", "--max-connections", "2")
    m0 = metrics(srv)
    assert ("kvrelay_accept_pauses_total", frozenset()) in m0
    reclaimed0 = value(m0, "kvrelay_idle_connections_reclaimed_total")
    socks = []
    try:
        for _ in range(3):  # silent: the third newcomer makes the server close the longest idle
            socks.append(socket.create_connection((srv.host, srv.port), timeout=10 * SLOW))
        wait_metrics(srv, "an idle connection closed",
                     lambda m: value(m, "kvrelay_idle_connections_reclaimed_total") > reclaimed0)
    finally:
        for s in socks:
            s.close()


def test_accept_pause_out_of_descriptors_is_counted(kvrelay):
    """A worker out of descriptors stops accepting for a moment (h1_accept.c): each such episode
    is counted. The server starts under a soft RLIMIT_NOFILE of 64 (children inherit it; ours is
    restored at once) and --max-connections far above it, so descriptors run out first; the
    clients each send part of a request head, so no connection is idle for long."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(64, hard), hard))
    try:
        srv = kvrelay("--memory", "16M", "--workers", "1", "--max-connections", "1000")
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    pauses0 = value(metrics(srv), "kvrelay_accept_pauses_total")
    socks = []
    try:
        deadline = time.monotonic() + 10 * SLOW
        for _ in range(96):  # more than the server's 64 descriptors
            s = socket.create_connection((srv.host, srv.port), timeout=10 * SLOW)
            s.sendall(b"GET /healthz HTTP/1.1\r\n")
            socks.append(s)
        # the log says when a worker could not accept (pausing, or closing idle ones first)
        wait_until(lambda: "Too many open files" in srv.log_text(), max(0.0, deadline - time.monotonic()),
                   what="the worker to run out of descriptors")
    finally:
        for s in socks:
            s.close()
    m = wait_metrics(srv, "an accept pause", lambda m: value(m, "kvrelay_accept_pauses_total") > pauses0)
    assert srv.stats() is not None  # and it serves again
