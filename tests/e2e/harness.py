"""
Generic waiting helpers for the end-to-end tests, shared by every directory under tests/e2e.

Rules a new test follows (and why these exist):

* Never `time.sleep(x)` to let something happen. Say what you are waiting for and poll it:
  `wait_until(lambda: cond(), 5 * SLOW, what="the worker restarted")`. On timeout the
  AssertionError names `what` and the last value the predicate returned.
* Every bound is multiplied by the ONE factor `SLOW` defined here (sanitizer builds are ~3x
  slower; a loaded machine can be given more time with KVRELAY_SLOW=N).
* A sleep that is part of what the test does (trickling bytes to test a timeout, pacing a
  load) may stay, with a comment on the same or previous line saying so.

* A test must not depend on the tests before it: `pytest --shuffle-seed N tests/e2e` (an
  option of conftest.py) runs the modules, and the tests within each, in a seeded order.

This module imports nothing from conftest.py, so conftest.py and any test can import it.
"""

import os
import select
import socket
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BUILD = os.environ.get("KVRELAY_BUILD", "build")
BINARY = (Path(BUILD) if os.path.isabs(BUILD) else REPO / BUILD) / "kvrelay-supervisor"


def _sanitized():
    """A sanitizer build: the build dir says so, or the binary carries the runtimes."""
    if "asan" in BUILD or "ubsan" in BUILD:
        return True
    try:
        with open(BINARY, "rb") as f:
            blob = f.read()
        return b"__asan_init" in blob or b"__ubsan_handle" in blob
    except OSError:
        return False


def _slow_factor():
    # KVRELAY_SLOW (or its older name KVRELAY_E2E_SLOW) wins when set to a positive number;
    # otherwise sanitizer builds get 3x and everything else 1x.
    for name in ("KVRELAY_SLOW", "KVRELAY_E2E_SLOW"):
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                v = float(raw)
            except ValueError:
                raise RuntimeError(f"{name}={raw!r} is not a number") from None
            if v > 0:
                return v
    return 3.0 if _sanitized() else 1.0


# The one factor every bounded wait in tests/e2e is multiplied by.
SLOW = _slow_factor()


def wait_until(predicate, timeout, interval=0.05, what="condition"):
    """Polls predicate() until it returns something truthy and returns that value.

    timeout is in seconds and is used as given (callers multiply by SLOW). The predicate
    is always called at least once, and once more at the deadline, so a slow poll cannot
    miss a condition that became true just before time ran out. On timeout raises
    AssertionError naming `what` (a string, or a function giving one at that moment) and the
    last value (or exception) the predicate gave.
    """
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = predicate()
        except (OSError, ValueError) as e:  # a file not yet written, a socket not yet up
            last = e
        else:
            if last:
                return last
        now = time.monotonic()
        if now >= deadline:
            what = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {what}; last value: {last!r}")
        time.sleep(min(interval, max(0.0, deadline - now)))  # poll interval, not synchronisation


def port_open(host, port, timeout=0.5):
    """True if a TCP connect to host:port succeeds now."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host, port, timeout, what=None):
    """Waits until host:port accepts TCP connections."""
    return wait_until(lambda: port_open(host, port), timeout, what=what or f"{host}:{port} to accept connections")


def read_terminal(master, timeout):
    """Reads what a program wrote to the pseudo-terminal whose master is `master` (the test has
    closed its own copy of the slave) until the program's side is closed: the read fails with
    EIO, or gives nothing. Not until the program has merely exited: the kernel hands the last
    bytes a program wrote to the master a moment after it wrote them, so a reader that stops
    at the exit can lose them. Bounded by `timeout` seconds."""
    out = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if not ready:
            continue
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every slave closed and nothing left to read
            break
        if not chunk:
            break
        out += chunk
    return out


def read_text(path):
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def wait_log(path_or_fn, needle, timeout, start=0, what=None):
    """Waits until the text (a file path, or a function returning the text) contains needle
    (a str, or a compiled regex) at or after offset start; returns the match end offset."""
    get = path_or_fn if callable(path_or_fn) else (lambda: read_text(path_or_fn))

    def found():
        text = get()
        if hasattr(needle, "search"):
            m = needle.search(text, start)
            return m.end() if m else None
        i = text.find(needle, start)
        return i + len(needle) if i >= 0 else None

    return wait_until(found, timeout, what=what or f"log line {getattr(needle, 'pattern', needle)!r}")


# /proc/net/tcp states (include/net/tcp_states.h)
TCP_STATES = {
    "01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1",
    "05": "FIN_WAIT2", "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT",
    "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING",
}


def tcp_sockets(port=None):
    """Rows of /proc/net/tcp and tcp6 as dicts: local/remote (host, port), state name,
    tx_queue, rx_queue, inode; filtered to those whose local or remote port is `port`."""
    out = []
    lines = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):  # gRPC's clients use v4-mapped IPv6 sockets
        try:
            lines += Path(table).read_text().splitlines()[1:]
        except OSError:
            pass
    for line in lines:
        f = line.split()
        if len(f) < 5:
            continue
        lh, lp = f[1].split(":")
        rh, rp = f[2].split(":")
        tx, rx = f[4].split(":")
        row = {
            "local": (lh, int(lp, 16)), "remote": (rh, int(rp, 16)),
            "state": TCP_STATES.get(f[3], f[3]), "tx_queue": int(tx, 16), "rx_queue": int(rx, 16),
            "inode": int(f[9]) if len(f) > 9 else 0,
        }
        if port is None or port in (row["local"][1], row["remote"][1]):
            out.append(row)
    return out


def wait_tcp_state(sock, state, timeout, what=None):
    """Waits until the kernel's /proc/net/tcp row of our socket `sock` is in `state`
    (e.g. 'CLOSE_WAIT': the peer has closed its side)."""
    lport = sock.getsockname()[1]
    rport = sock.getpeername()[1]

    def st():
        for r in tcp_sockets(lport):
            if r["local"][1] == lport and r["remote"][1] == rport:
                return r["state"] == state or None
        return None

    return wait_until(st, timeout, what=what or f"socket :{lport} -> :{rport} in {state}")


def peer_unread(sock):
    """Bytes we sent on the connected socket `sock` that the server has not read yet (the
    rx_queue of the server's end in /proc/net/tcp); None when that end is not found. 0 means
    the server has taken everything we sent so far, e.g. it has read a request's head."""
    lport = sock.getsockname()[1]
    rport = sock.getpeername()[1]
    for r in tcp_sockets(lport):
        if r["local"][1] == rport and r["remote"][1] == lport:
            return r["rx_queue"]
    return None


def wait_peer_read(sock, timeout, what=None):
    """Waits until the server has read everything sent on sock so far (see peer_unread)."""
    return wait_until(lambda: peer_unread(sock) == 0, timeout,
                      what=what or f"the server to read what connection :{sock.getsockname()[1]} sent")


def socket_inodes(pid):
    """Inodes of the sockets process pid holds open (from /proc/pid/fd)."""
    out = set()
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in fds:
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def peer_ports(pid, port):
    """Client ports of the established connections process pid serves on its local `port`."""
    inodes = socket_inodes(pid)
    return {r["remote"][1] for r in tcp_sockets(port)
            if r["inode"] in inodes and r["local"][1] == port and r["state"] == "ESTABLISHED"}


def client_ports(port):
    """Local ports of every established connection to `port` on this machine (the client ends)."""
    return {r["local"][1] for r in tcp_sockets(port) if r["remote"][1] == port and r["state"] == "ESTABLISHED"}


def accept_queue(port):
    """Connections to `port` that the kernel has completed and no process has accepted yet
    (the rx_queue of the LISTEN sockets on port: one per worker with SO_REUSEPORT)."""
    return sum(r["rx_queue"] for r in tcp_sockets(port) if r["state"] == "LISTEN" and r["local"][1] == port)


def wait_accepted(port, timeout, what=None):
    """Waits until the server has accepted every connection made to `port` so far."""
    return wait_until(lambda: accept_queue(port) == 0, timeout,
                      what=what or f"the server on :{port} to accept every pending connection")


def server_end_open(client_port, server_port):
    """True while the server still holds its end of the connection client_port -> server_port
    open (ESTABLISHED, or CLOSE_WAIT: the client has closed, the server not yet)."""
    return any(r["local"][1] == server_port and r["remote"][1] == client_port
               and r["state"] in ("ESTABLISHED", "CLOSE_WAIT") for r in tcp_sockets(server_port))


def wait_server_closed(client_port, server_port, timeout, what=None):
    """Waits until the server has closed its end of the connection from client_port (take the
    port with sock.getsockname()[1] before closing sock)."""
    return wait_until(lambda: not server_end_open(client_port, server_port), timeout,
                      what=what or f"the server to close its end of :{client_port} -> :{server_port}")
