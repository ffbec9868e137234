"""Servers the load clients' tests run against (tests/e2e/test_kvrelay_bench.py,
tests/e2e/test_lean_client.py): a stand-in HTTP/1.1 server whose every answer is one canned
byte string (a wrong, short or cut answer, so that a client's error kinds can be checked), and
the start and stop of a real peer (redis-server, memcached, the null server)."""
import signal
import socket
import subprocess
import threading

import pytest

from conftest import SLOW, _die_with_parent
from harness import port_open, wait_until


class CannedServer:
    """Answers every HTTP/1.1 request (heads only: GETs) with one canned byte string; with
    close=True it closes the connection after each answer."""

    def __init__(self, answer, close=False):
        self.answer, self.close_after = answer, close
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        c.settimeout(5)
        try:
            while not self.stop.is_set():
                b = c.recv(65536)
                if not b:
                    return
                buf += b
                while b"\r\n\r\n" in buf:
                    buf = buf[buf.index(b"\r\n\r\n") + 4:]
                    c.sendall(self.answer)
                    if self.close_after:
                        return
        except OSError:
            pass
        finally:
            c.close()

    def close(self):
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def start_and_wait(argv, port, log):
    """Starts a peer server (redis-server, memcached, the null server) with its output in log and
    waits until it accepts on port; fails the test with the log's tail when it does not."""
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            preexec_fn=_die_with_parent)
    try:
        wait_until(lambda: proc.poll() is not None or port_open("127.0.0.1", port, timeout=1), 15 * SLOW,
                   what=f"{argv[0]} to accept connections on port {port}")
    except AssertionError:
        pass  # reported below with the log
    if proc.poll() is None and port_open("127.0.0.1", port, timeout=1):
        return proc
    stop_proc(proc)
    log.seek(0)
    pytest.fail(f"{argv[0]} did not start: {log.read()[-2000:]!r}", pytrace=False)


def stop_proc(proc):
    """SIGTERM, then SIGKILL after 10 s: by the process object, never by name."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
