"""
kvrelay-top (src/main/kvrelay-top.c) against a live server: its plain-text lines (stdout not a
terminal) carry the numbers the server's /kv/stats and /metrics hold, for requests the test
made and counted itself; its terminal view redraws a screen; a token, a dead address and bad
command lines are handled. Every run is bounded by a timeout.
"""

import http.server
import json
import os
import re
import subprocess
import threading
import time

import pytest

from conftest import BINARY, SLOW, free_port, make_block, unique_key
from harness import read_terminal, wait_until

TOP = BINARY.parent / "kvrelay-top"
KiB = 1 << 10
BLOCK = 256 * KiB
KEYS = {"ts", "req_s", "get_s", "put_s", "head_s", "delete_s", "other_s", "in_gbps", "out_gbps", "requests", "hits",
        "misses", "hit_ratio", "hit_ratio_now", "fill", "blocks", "resident_bytes", "logical_bytes",
        "capacity_bytes", "dedup_hits", "evict_s", "evictions", "pins", "workers", "restarts", "subscribers",
        "errors"}


def top(srv, *args, timeout=30.0):
    assert TOP.is_file(), f"{TOP} is not built (make)"
    return subprocess.run([str(TOP), "-a", f"127.0.0.1:{srv.port}" if srv else "127.0.0.1:1", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout * SLOW)


def parse(out):
    lines = out.decode().splitlines()
    rows = []
    for ln in lines:
        assert "\x1b" not in ln, f"an escape sequence in plain mode: {ln!r}"
        row = dict(kv.split("=", 1) for kv in ln.split(" "))
        assert set(row) == KEYS, sorted(set(row) ^ KEYS)
        rows.append(row)
    return rows


def error_statuses(text):
    """{status: count} of the statuses >= 400 in /metrics, over every method."""
    out = {}
    for st, v in re.findall(r'^kvrelay_http_requests_total\{method="[^"]*",status="([^"]*)"\} (\S+)$', text, re.M):
        if (st == "other" or int(st) >= 400) and float(v) > 0:
            out[st] = out.get(st, 0) + int(float(v))
    return out


def metric(text, name):
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


class Puts:
    """New blocks PUT in a thread until stopped (bounded): requests and evictions keep moving,
    GET hits and misses do not."""

    def __init__(self, srv):
        self.srv, self.stop_ev, self.bad, self.n = srv, threading.Event(), [], 0
        self.t = threading.Thread(target=self._run, args=(time.monotonic() + 60 * SLOW,), daemon=True)
        self.t.start()

    def _run(self, deadline):
        while not self.stop_ev.is_set() and time.monotonic() < deadline:
            k = unique_key("top")
            r = self.srv.put(k, make_block(BLOCK, k))
            if r.status != 201:
                self.bad.append(repr(r))
            self.n += 1
            self.stop_ev.wait(0.02)

    def stop(self):
        self.stop_ev.set()
        self.t.join(30 * SLOW)
        assert not self.bad, self.bad[:3]


def test_plain_lines_carry_the_servers_numbers(kvrelay):
    srv = kvrelay("--memory", "4M", "--workers", "1")
    keys = [unique_key("seed") for _ in range(4)]
    blocks = [make_block(BLOCK, k) for k in keys]
    for k, b in zip(keys, blocks):
        assert srv.put(k, b).status == 201
    assert srv.put(keys[0], blocks[0]).status == 200  # dedup
    assert srv.put(keys[0], blocks[0][:-1]).status == 409
    for i in range(6):
        assert srv.get(keys[i % 4]).status == 200
    for _ in range(2):
        assert srv.get(unique_key("absent")).status == 404

    errs = error_statuses(srv.metrics_text())  # 404 x 2, 409, and a 503 of /readyz at start, if any
    assert errs.get("404") == 2 and errs.get("409") == 1, errs
    want_errors = ",".join(f"{k}:{v}" for k, v in sorted(errs.items(), key=lambda kv: (-kv[1], kv[0])))

    puts = Puts(srv)
    try:
        p = top(srv, "-n", "3", "-i", "0.5")
        # enough new blocks for the 4M arena to evict before the final comparison
        wait_until(lambda: srv.stats()["evictions"] > 0, 30 * SLOW, what="an eviction")
    finally:
        puts.stop()
    assert p.returncode == 0, p.stderr.decode()
    rows = parse(p.stdout)
    assert len(rows) == 3, p.stdout
    print(p.stdout.decode())
    for r in rows:
        # the test's GETs only: 6 hits, 2 misses; the PUTs in flight change neither
        assert (r["hits"], r["misses"], r["hit_ratio"], r["hit_ratio_now"]) == ("6", "2", "0.7500", "-"), r
        assert r["errors"] == want_errors, r
        assert r["workers"] == "1" and r["restarts"] == "0" and r["pins"] == "0" and r["subscribers"] == "0", r
        assert r["capacity_bytes"] == str(4 << 20) and 0 < float(r["fill"]) <= 1, r
        assert float(r["put_s"]) > 0 and float(r["in_gbps"]) > 0, r
        assert float(r["get_s"]) > 0, "kvrelay-top's own two GETs a sample"
        assert int(r["dedup_hits"]) == 1 and int(r["blocks"]) >= 3, r
    for a, b in zip(rows, rows[1:]):
        assert int(b["requests"]) > int(a["requests"]), (a, b)
        assert int(b["evictions"]) >= int(a["evictions"]), (a, b)
        assert 0.3 < float(b["ts"]) - float(a["ts"]) < 0.5 + 2 * SLOW, (a, b)  # one interval apart

    # traffic stopped: one more sample equals the server's own numbers
    p = top(srv, "-n", "1", "-i", "0.2")
    assert p.returncode == 0, p.stderr.decode()
    (r,) = parse(p.stdout)
    st = srv.stats()
    text = srv.metrics_text()
    assert int(r["blocks"]) == st["unique_blocks"] and int(r["evictions"]) == st["evictions"] > 0, (r, st)
    assert int(r["resident_bytes"]) == st["resident_bytes"] and int(r["logical_bytes"]) == st["logical_bytes"]
    assert int(r["hits"]) == st["get_hits"] == 6 and int(r["misses"]) == st["get_misses"] == 2
    fill = 1 - metric(text, "kvrelay_free_bytes") / metric(text, "kvrelay_capacity_bytes")
    assert abs(float(r["fill"]) - fill) < 1e-4, (r["fill"], fill)
    assert float(r["put_s"]) == 0 and float(r["evict_s"]) == 0, r
    served = sum(float(v) for v in re.findall(r"^kvrelay_http_requests_total\{[^}]*\} (\S+)$", text, re.M))
    assert int(r["requests"]) <= served, (r["requests"], served)
    assert int(r["requests"]) >= 4 + 2 + 6 + 2 + puts.n, "every request the test made"


def test_terminal_view_redraws_a_screen(kvrelay):
    srv = kvrelay("--workers", "1")
    assert srv.get(unique_key("absent")).status == 404
    master, slave = os.openpty()
    try:
        p = subprocess.Popen([str(TOP), "-a", f"127.0.0.1:{srv.port}", "-n", "2", "-i", "0.3"],
                             stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE)
        os.close(slave)
        slave = None
        out = read_terminal(master, 20 * SLOW)
        assert p.wait(10 * SLOW) == 0, p.stderr.read()
    finally:
        if slave is not None:
            os.close(slave)
        os.close(master)
    text = out.decode(errors="replace")
    assert text.count("\x1b[H\x1b[2J") == 2, text
    assert "GET hits   0.0 % (last interval -)   hits 0   misses 1" in text, text
    assert "errors      404" in text and "1 workers" in text, text


def test_token_dead_address_and_bad_flags(kvrelay, tmp_path):
    srv = kvrelay("--workers", "1", "--token", "s3cret", token="s3cret")
    p = top(srv, "-n", "1", "-i", "0.1", "--token", "wrong")
    assert p.returncode == 1 and b"HTTP 401" in p.stderr, p
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    p = top(srv, "-n", "1", "-i", "0.1", "--token-file", str(f))
    assert p.returncode == 0, p.stderr.decode()
    assert len(parse(p.stdout)) == 1

    p = subprocess.run([str(TOP), "-a", f"127.0.0.1:{free_port()}", "-n", "1"], capture_output=True,
                       timeout=20 * SLOW)
    assert p.returncode == 1 and b"Connection refused" in p.stderr, p
    for bad in (["-i", "0"], ["-i", "x"], ["-n", "-1"], ["-a", "host:0"], ["-a", "host:99999"], ["--frob"],
                ["extra"]):
        p = top(srv, *bad)
        assert p.returncode == 2 and p.stderr, (bad, p)
    p = top(None, "--help")
    assert p.returncode == 0 and b"--interval" in p.stderr


def test_chunked_responses_read_as_the_servers_own(kvrelay):
    """A server that answers in chunks (an HTTP/1.1 proxy might) gives the same line: the pages
    of a live server, served again chunked by a stand-in, are read alike."""
    srv = kvrelay("--workers", "1")
    k = unique_key("c")
    assert srv.put(k, make_block(BLOCK, k)).status == 201
    assert srv.get(k).status == 200 and srv.get(unique_key("absent")).status == 404
    pages = {"/kv/stats": srv.request("GET", "/kv/stats").body, "/metrics": srv.request("GET", "/metrics").body}

    class Chunked(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            body = pages[self.path]
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 1000):
                part = body[i:i + 1000]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")

        def log_message(self, *a):
            pass

    stand_in = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chunked)
    t = threading.Thread(target=stand_in.serve_forever, daemon=True)
    t.start()
    try:
        p = subprocess.run([str(TOP), "-a", f"127.0.0.1:{stand_in.server_address[1]}", "-n", "1", "-i", "0.1"],
                           capture_output=True, timeout=20 * SLOW)
    finally:
        stand_in.shutdown()
        stand_in.server_close()
        t.join(10)
    assert p.returncode == 0, p.stderr.decode()
    (r,) = parse(p.stdout)
    stats = json.loads(pages["/kv/stats"])
    assert (int(r["hits"]), int(r["misses"]), int(r["blocks"])) == (stats["get_hits"], stats["get_misses"],
                                                                    stats["unique_blocks"]) == (1, 1, 1), r
    assert dict(e.split(":") for e in r["errors"].split(","))["404"] == "1", r
    assert r["req_s"] == "0.0" and r["workers"] == "1", r
    assert r["capacity_bytes"] == str(int(metric(pages["/metrics"].decode(), "kvrelay_capacity_bytes")))


def test_tenants_admin_token_and_a_tenants_token(kvrelay, tmp_path):
    """Under --tenants, /metrics is the admin's (docs/tenancy.md): --token and --token-file with
    the admin token sample; a tenant's token is refused with one clear line, exit 1."""
    admin, tenant = "tok-admin-top-4c2e", "tok-tenant-top-a91d"
    path = tmp_path / "tenants"
    path.write_text(f"team-a {tenant}\n")
    srv = kvrelay("--workers", "1", "--tenants", str(path), "--admin-token", admin)
    assert srv.put(unique_key("top-tenant"), make_block(64 * KiB, "top-tenant"), token=tenant).status == 201
    p = top(srv, "-n", "1", "-i", "0.1", "--token", admin)
    assert p.returncode == 0, p.stderr.decode()
    rows = parse(p.stdout)
    assert len(rows) == 1 and float(rows[0]["capacity_bytes"]) > 0, rows
    # the operator's view is the server's: the tenant's block counts
    assert rows[0]["blocks"] == "1" and rows[0]["resident_bytes"] == str(64 * KiB), rows
    f = tmp_path / "admin-token"
    f.write_text(admin + "\n")
    p = top(srv, "-n", "1", "-i", "0.1", "--token-file", str(f))
    assert p.returncode == 0 and len(parse(p.stdout)) == 1, p.stderr.decode()
    for tok, want in ((tenant, ["GET /metrics: HTTP 403", "admin token"]),
                      (None, ["GET /kv/stats: HTTP 401", "--token"])):
        p = top(srv, "-n", "1", "-i", "0.1", *(["--token", tok] if tok else []))
        err = p.stderr.decode()
        assert p.returncode == 1 and p.stdout == b"", (p.returncode, err)
        assert len(err.splitlines()) == 1 and all(w in err for w in want), err
