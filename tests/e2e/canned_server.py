"""A stand-in HTTP/1.1 server for the load clients' tests: every request head gets one canned
byte string back (a wrong, short or cut answer), so that a client's error kinds can be checked
(tests/e2e/test_kvrelay_bench.py, tests/e2e/test_lean_client.py)."""
import socket
import threading


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
