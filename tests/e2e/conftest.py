"""
End-to-end harness for kvrelay: starts the real kvrelay-supervisor on an ephemeral loopback
port, talks to it with real clients (Python's http.client, curl, raw sockets) and always stops
it by PID.

The binary is $KVRELAY_BUILD/kvrelay-supervisor (default build/), relative to the repository
root. A missing binary is a test FAILURE, never a skip.

Everything here is bounded: every wait has a deadline, every loop a count.
"""

import http.client
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
import uuid
from pathlib import Path

import pytest

# REPO, BUILD, BINARY and the one SLOW factor live in harness.py (shared with relay/ and clients/).
from harness import BINARY, BUILD, REPO, SLOW, wait_until  # noqa: F401  (re-exported to tests)

MiB = 1 << 20
KiB = 1 << 10

# Environment variables that configure the server; scrubbed from every child's environment
# so that the caller's shell cannot change what a test means.
_SCRUB_PREFIXES = ("KVRELAY_", "EPISTEMIC_GRAPH_KVCACHE_")

SANITIZER_RE = re.compile(
    r"(ERROR: AddressSanitizer|ERROR: LeakSanitizer|UndefinedBehaviorSanitizer|runtime error:)"
)


def server_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUB_PREFIXES)}
    env.setdefault("ASAN_OPTIONS", "abort_on_error=0:detect_leaks=1")
    env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1")
    if extra:
        env.update(extra)
    return env


def _die_with_parent():
    """preexec_fn: the server gets SIGTERM if the test process dies without stopping it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def require_binary():
    if not BINARY.is_file() or not os.access(BINARY, os.X_OK):
        pytest.fail(
            f"kvrelay binary not found or not executable: {BINARY} "
            f"(build it with `make` or set KVRELAY_BUILD)",
            pytrace=False,
        )
    return str(BINARY)


def run_binary(args, env=None, timeout=10.0):
    """Runs the binary to completion (for --help / --print-config / bad flags)."""
    binary = require_binary()
    return subprocess.run(
        [binary, *args],
        env=server_env(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout * SLOW,
    )


def parse_kv_lines(text):
    out = {}
    for line in text.splitlines():
        if "=" in line:
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def quote_key(key):
    """The reference driver's encoding: every reserved character percent-encoded."""
    return urllib.parse.quote(str(key), safe="")


def kv_path(key):
    return "/kv/" + quote_key(key)


def unique_key(prefix="k"):
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def free_port():
    """A loopback port that was free a moment ago (used for dead-server and bind tests)."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


# ---------------------------------------------------------------------------------------------
# Test data: blocks are slices of one random pool, each stamped with its tag, so that any two
# blocks differ and a torn or mixed-up block is detected.

_POOL = None
_POOL_LOCK = threading.Lock()
_POOL_SIZE = 64 * MiB + 64 * KiB


def _pool():
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = os.urandom(_POOL_SIZE)
        return _POOL


def make_block(size, tag):
    if size > 64 * MiB:
        reps = size // (64 * MiB) + 1
        base = (_pool()[: 64 * MiB] * reps)[:size]
        data = bytearray(base)
    else:
        off = (hash(tag) & 0xFFFF) % (64 * KiB)
        data = bytearray(_pool()[off : off + size])
    stamp = f"<{tag}>".encode()
    data[: min(len(stamp), size)] = stamp[: min(len(stamp), size)]
    return bytes(data)


# ---------------------------------------------------------------------------------------------
# Responses


class Resp:
    """One HTTP response as seen by a client: status 0 means the transport failed (error)."""

    def __init__(self, status, headers=None, body=b"", version="", error=None, connects=None):
        self.status = status
        self.headers = headers or {}
        self.body = body
        self.version = version
        self.error = error
        self.connects = connects

    def header(self, name, default=None):
        return self.headers.get(name.lower(), default)

    def json(self):
        try:
            return json.loads(self.body)
        except Exception as e:  # pragma: no cover - reported by the assertion
            raise AssertionError(f"body is not JSON ({e}): {self!r}")

    def __repr__(self):
        b = self.body[:300]
        return (
            f"Resp(status={self.status}, version={self.version!r}, headers={self.headers!r}, "
            f"body={b!r}{'...' if len(self.body) > 300 else ''}, error={self.error!r})"
        )


def assert_error(resp, status, code=None):
    """Asserts a contract error: status, JSON {"error": code, "message": str}."""
    assert resp.status == status, f"expected {status}: {resp!r}"
    ctype = resp.header("content-type", "")
    assert "json" in ctype, f"error body must be JSON (content-type {ctype!r}): {resp!r}"
    j = resp.json()
    assert isinstance(j, dict), resp
    if code is not None:
        assert j.get("error") == code, f"expected error code {code}: {resp!r}"
    assert isinstance(j.get("message"), str) and j["message"], f"error needs a message: {resp!r}"
    return j


def _headers_dict(items):
    d = {}
    for k, v in items:
        k = k.lower()
        d[k] = f"{d[k]}, {v}" if k in d else v
    return d


def http_request(
    host,
    port,
    method,
    path,
    body=None,
    headers=None,
    timeout=10.0,
    conn=None,
    tls=False,
):
    """One request with http.client. With conn given the connection is reused (keep-alive)."""
    own = conn is None
    if own:
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            conn = http.client.HTTPSConnection(host, port, timeout=timeout * SLOW, context=ctx)
        else:
            conn = http.client.HTTPConnection(host, port, timeout=timeout * SLOW)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return Resp(
            r.status,
            _headers_dict(r.getheaders()),
            data,
            version="1.1" if r.version == 11 else "1.0",
        )
    except (OSError, http.client.HTTPException) as e:
        if not own:
            conn.close()
        return Resp(0, error=f"{type(e).__name__}: {e}")
    finally:
        if own:
            conn.close()


def _parse_curl_headers(text):
    blocks = [b for b in re.split(r"\r?\n\r?\n", text) if b.strip()]
    if not blocks:
        return {}
    lines = blocks[-1].splitlines()[1:]
    items = []
    for ln in lines:
        if ":" in ln:
            k, v = ln.split(":", 1)
            items.append((k.strip(), v.strip()))
    return _headers_dict(items)


CURL_MODES = {
    "curl-h1": (["--http1.1"], False, "1.1"),
    "curl-h2c": (["--http2-prior-knowledge"], False, "2"),
    "curl-tls-h1": (["--http1.1", "-k"], True, "1.1"),
    "curl-tls-h2": (["--http2", "-k"], True, "2"),
}


def curl_request(
    base_url, mode, method, path, body=None, headers=None, timeout=20.0, extra=(), tmpdir=None
):
    """One request with the curl binary. The negotiated HTTP version is checked."""
    flags, _tls, want_version = CURL_MODES[mode]
    with tempfile.TemporaryDirectory(dir=tmpdir) as td:
        hfile = os.path.join(td, "h")
        bfile = os.path.join(td, "b")
        cmd = [
            "curl",
            "-sS",
            "--path-as-is",
            "--max-time",
            str(timeout * SLOW),
            "-D",
            hfile,
            "-o",
            bfile,
            "-w",
            "%{http_code} %{http_version} %{num_connects}",
            *flags,
        ]
        if method == "HEAD":
            cmd.append("-I")
        else:
            cmd += ["-X", method]
        for k, v in (headers or {}).items():
            cmd += ["-H", f"{k}: {v}"]
        if body is not None:
            dfile = os.path.join(td, "d")
            with open(dfile, "wb") as f:
                f.write(body)
            cmd += ["--data-binary", f"@{dfile}", "-H", "Content-Type: application/octet-stream"]
        cmd += list(extra)
        cmd.append(base_url + path)
        p = subprocess.run(cmd, capture_output=True, timeout=timeout * SLOW + 10)
        out = p.stdout.decode(errors="replace").split()
        hdrs = {}
        if os.path.exists(hfile):
            with open(hfile, encoding="latin-1") as f:
                hdrs = _parse_curl_headers(f.read())
        data = b""
        # with -I curl writes the header block to -o and never reads a body
        if method != "HEAD" and os.path.exists(bfile):
            with open(bfile, "rb") as f:
                data = f.read()
        code = int(out[0]) if out and out[0].isdigit() else 0
        version = out[1] if len(out) > 1 else ""
        connects = int(out[2]) if len(out) > 2 and out[2].isdigit() else None
        err = None
        if p.returncode != 0:
            err = f"curl rc={p.returncode}: {p.stderr.decode(errors='replace').strip()}"
            if code == 0:
                return Resp(0, hdrs, data, version, error=err, connects=connects)
        if code and version != want_version:
            err = (err or "") + f" negotiated HTTP/{version}, wanted HTTP/{want_version}"
            return Resp(0, hdrs, data, version, error=err, connects=connects)
        return Resp(code, hdrs, data, version, error=err, connects=connects)


def curl_multi(base_url, mode, paths, timeout=20.0, headers=None):
    """Several GETs in one curl invocation (one connection if the server keeps it alive).
    Returns [(code, num_connects)]."""
    flags = CURL_MODES[mode][0]
    cmd = ["curl", "-sS", "--path-as-is", "--max-time", str(timeout * SLOW), *flags]
    for k, v in (headers or {}).items():
        cmd += ["-H", f"{k}: {v}"]
    for p in paths:
        cmd += ["-o", "/dev/null", "-w", "%{http_code} %{num_connects}\\n", base_url + p]
    p = subprocess.run(cmd, capture_output=True, timeout=timeout * SLOW + 10)
    assert p.returncode == 0, p.stderr
    rows = [ln.split() for ln in p.stdout.decode().splitlines() if ln.strip()]
    return [(int(a), int(b)) for a, b in rows]


# ---------------------------------------------------------------------------------------------
# The server under test

_DEFAULT = object()
LIVE_SERVERS = []  # started and not yet stopped
RECENT_SERVERS = []  # every server touched by the current test (for log dumps)


class Server:
    def __init__(self, tmpdir, args=(), env=None, name="kvrelay", tls=None, token=None,
                 http_bind="127.0.0.1:0"):
        self.tmpdir = Path(tmpdir)
        self.http_bind = http_bind  # None: no --http-bind flag (env compat tests)
        self.args = list(args)
        self.env = dict(env or {})
        self.name = name
        self.tls = tls  # (cert, key) or None
        self.token = token  # sent by default on every request
        self.proc = None
        self.host = "127.0.0.1"
        self.port = None
        self.grpc = None
        self.log_path = self.tmpdir / f"{name}.log"
        self.port_file = self.tmpdir / f"{name}.port"
        self.returncode = None
        self.kills_expected = False  # set by tests that kill workers on purpose
        self.known_pids = set()
        self.ready_at_start = None

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, wait_ready=True):
        binary = require_binary()
        argv = [binary, "--port-file", str(self.port_file)]
        if self.http_bind is not None:
            argv += ["--http-bind", self.http_bind]
        if "--grpc-bind" not in self.args:
            argv += ["--grpc-bind", "off"]
        if "--shutdown-grace" not in self.args:
            argv += ["--shutdown-grace", "2s"]
        if "--hang-timeout" not in self.args and "KVRELAY_HANG_TIMEOUT" not in self.env and SLOW > 1:
            # The watchdog's 5 s is for release builds. Under the sanitizers one h2o loop turn
            # that takes in a few 80 MiB bodies (h2o grows each body's buffer by doubling, into
            # fresh pages) ran 2-4 s here, and once past 5 s, so the worker was killed mid-upload.
            argv += ["--hang-timeout", f"{5 * SLOW:g}s"]
        if self.tls:
            argv += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        argv += self.args
        if self.port_file.exists():
            self.port_file.unlink()
        self.argv = argv
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=server_env(self.env),
            preexec_fn=_die_with_parent,
        )
        LIVE_SERVERS.append(self)
        RECENT_SERVERS.append(self)
        try:
            self._wait_port_file(15.0 * SLOW)
            self._wait_health(15.0 * SLOW)
            if wait_ready:
                self.ready_at_start = self.wait_ready(10.0 * SLOW)
        except BaseException:
            self.stop()
            raise
        self.known_pids = set(self.worker_pids())
        return self

    def _wait_port_file(self, limit):
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(
                    f"{self.name} exited with {self.proc.returncode} before writing its port "
                    f"file; argv={self.argv}\n--- log ---\n{self.log_tail()}",
                    pytrace=False,
                )
            if self.port_file.exists():
                lines = parse_kv_lines(self.port_file.read_text())
                if "http" in lines:
                    host, _, port = lines["http"].rpartition(":")
                    assert host == "127.0.0.1", f"port file http={lines['http']}"
                    self.port = int(port)
                    assert self.port > 0, lines
                    self.grpc = lines.get("grpc")
                    return
            time.sleep(0.02)  # poll interval of this bounded wait (it also watches for an early exit)
        pytest.fail(
            f"{self.name}: no port file {self.port_file} after {limit:.0f}s\n--- log ---\n"
            f"{self.log_tail()}",
            pytrace=False,
        )

    def _wait_health(self, limit):
        deadline = time.monotonic() + limit
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            last = self.request("GET", "/healthz", timeout=2.0, token=None)
            if last.status == 200:
                return
            time.sleep(0.05)  # poll interval of this bounded wait (it also watches for an early exit)
        pytest.fail(
            f"{self.name}: /healthz never answered 200 (last {last!r})\n--- log ---\n"
            f"{self.log_tail()}",
            pytrace=False,
        )

    def wait_ready(self, limit=10.0):
        """True once /readyz answers 200 within limit seconds, else False."""
        try:
            wait_until(lambda: self.request("GET", "/readyz", timeout=2.0, token=None).status == 200, limit,
                       what=f"{self.name}: /readyz 200")
        except AssertionError:
            return False
        return True

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace=None):
        """SIGTERM by PID, then SIGKILL (supervisor and its known children) after a bound."""
        if self.proc is None:
            return self.returncode
        kids = set(self.children()) | self.known_pids
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=grace if grace is not None else 10.0 * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.returncode = self.proc.returncode
        # Children must not outlive the supervisor; if they do, they are ours to reap.
        deadline = time.monotonic() + 3.0 * SLOW
        while kids and time.monotonic() < deadline:
            kids = {p for p in kids if _pid_alive_child_of(p, self.proc.pid)}
            if kids:
                time.sleep(0.05)  # poll interval of this bounded wait for the children to go
        self.orphans = set(kids)
        for p in kids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self in LIVE_SERVERS:
            LIVE_SERVERS.remove(self)
        try:
            self._log.close()
        except Exception:
            pass
        return self.returncode

    @property
    def pid(self):
        return self.proc.pid

    @property
    def base_url(self):
        scheme = "https" if self.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

    # -- processes --------------------------------------------------------------------------

    def children(self):
        pid = self.proc.pid
        kids = []
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{task}/children") as f:
                        kids += [int(x) for x in f.read().split()]
                except OSError:
                    pass
        except OSError:
            return []
        return sorted(set(kids))

    def publisher_pids(self):
        """Pids the log names as the publisher ("publisher[pid]" / "publisher started (pid N")."""
        text = self.log_text()
        pids = {int(p) for p in re.findall(r"\bpublisher\[(\d+)\]", text)}
        pids |= {int(p) for p in re.findall(r"\bpublisher\b[^\n]*?\bpid (\d+)", text)}
        return pids

    def worker_pids(self):
        """Direct children of the supervisor, minus the publisher."""
        kids = self.children()
        if not kids:
            return []
        pub = self.publisher_pids()
        return [p for p in kids if p not in pub and _proc_role(p) != "publisher"]

    def wait_workers(self, n, exclude=(), limit=15.0):
        """Waits until exactly n workers run and none of `exclude` is among them."""
        def workers():
            pids = self.worker_pids()
            return pids if len(pids) == n and not (set(pids) & set(exclude)) else None

        return wait_until(workers, limit * SLOW, what=lambda: f"{n} workers without {list(exclude)} (now {self.worker_pids()})")

    # -- logs -------------------------------------------------------------------------------

    def log_text(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n=120):
        return "\n".join(self.log_text().splitlines()[-n:])

    def log_size(self):
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    # -- requests ---------------------------------------------------------------------------

    def _auth(self, headers, token):
        h = dict(headers or {})
        tok = self.token if token is _DEFAULT else token
        if tok is not None and not any(k.lower() == "authorization" for k in h):
            h["Authorization"] = f"Bearer {tok}"
        return h

    def request(self, method, path, body=None, headers=None, token=_DEFAULT, timeout=10.0, conn=None):
        return http_request(
            self.host,
            self.port,
            method,
            path,
            body=body,
            headers=self._auth(headers, token),
            timeout=timeout,
            conn=conn,
            tls=bool(self.tls),
        )

    def curl(self, mode, method, path, body=None, headers=None, token=_DEFAULT, timeout=20.0, extra=()):
        return curl_request(
            self.base_url,
            mode,
            method,
            path,
            body=body,
            headers=self._auth(headers, token),
            timeout=timeout,
            extra=extra,
            tmpdir=str(self.tmpdir),
        )

    def connection(self, timeout=10.0):
        if self.tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout * SLOW, context=ctx)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout * SLOW)

    def put(self, key, data, headers=None, **kw):
        return self.request("PUT", kv_path(key), body=data, headers=headers, **kw)

    def get(self, key, **kw):
        return self.request("GET", kv_path(key), **kw)

    def delete(self, key, **kw):
        return self.request("DELETE", kv_path(key), **kw)

    def stats(self):
        r = self.request("GET", "/kv/stats")
        assert r.status == 200, r
        return r.json()

    def debug_store(self):
        r = self.request("GET", "/debug/store")
        assert r.status == 200, r
        return r.json()

    def metrics_text(self):
        r = self.request("GET", "/metrics")
        assert r.status == 200, r
        return r.body.decode()

    def assert_consistent(self, limit=5.0, zombies=True):
        """/debug/store ok, no pin held (idle), and /kv/stats agreeing with the scan.
        Pins and zombies may lag the last response by a moment: polled, bounded."""
        deadline = time.monotonic() + limit * SLOW
        while True:
            d = self.debug_store()
            s = self.stats()
            problems = []
            if d.get("ok") is not True:
                problems.append(f"/debug/store ok={d.get('ok')!r}")
            if d.get("pinned_blocks") != 0:
                problems.append(f"pinned_blocks={d.get('pinned_blocks')!r} (leaked pins?)")
            if zombies and d.get("zombie_blocks") != 0:
                problems.append(f"zombie_blocks={d.get('zombie_blocks')!r}")
            for f in ("unique_blocks", "total_refs", "resident_bytes", "logical_bytes"):
                if d.get(f) != s.get(f):
                    problems.append(f"{f}: /debug/store {d.get(f)!r} != /kv/stats {s.get(f)!r}")
            if s.get("logical_bytes", 0) - s.get("resident_bytes", 0) != s.get("dedup_savings_bytes"):
                problems.append("dedup_savings_bytes != logical_bytes - resident_bytes")
            if not problems:
                return d, s
            if time.monotonic() > deadline:
                raise AssertionError(
                    "store inconsistent: " + "; ".join(problems) + f"\ndebug={d}\nstats={s}"
                )
            time.sleep(0.1)  # poll interval of this bounded wait for pins and zombies to settle


class GroupServer(Server):
    """A Server in its own session (process group), so that SIGKILL of the group kills the
    supervisor and every child at once, as a container runtime or the OOM killer would."""

    def start(self, wait_ready=True):
        orig = subprocess.Popen

        def popen(*a, **kw):
            kw["start_new_session"] = True
            return orig(*a, **kw)

        subprocess.Popen = popen
        try:
            return super().start(wait_ready)
        finally:
            subprocess.Popen = orig


def _pid_alive_child_of(pid, ppid):
    """True while pid is a live (non-zombie) process running our binary: a child of the
    supervisor, or an orphan it left behind. The exe check guards against pid reuse."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            st = f.read()
        exe = os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return False
    state = st.rsplit(")", 1)[1].split()[0]
    if state in ("Z", "X"):
        return False
    return os.path.basename(exe.replace(" (deleted)", "")) == BINARY.name


def wait_stopped(pid, limit):
    """Polls /proc until every thread of pid is in state T (a SIGSTOP has taken effect: kill()
    returns before it has); True if it got there within limit seconds."""
    deadline = time.monotonic() + limit
    while True:
        states = []
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        states.append(f.read().rsplit(")", 1)[1].split()[0])
                except OSError:
                    pass
        except OSError:
            return False
        if states and all(st == "T" for st in states):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)  # poll interval of this bounded wait for SIGSTOP to take effect


def _proc_role(pid):
    """'publisher' when the process calls itself that (comm or argv), else 'worker'."""
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    if "publish" in comm.lower() or "publish" in cmd.lower():
        return "publisher"
    return "worker"


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="session")
def binary():
    return require_binary()


@pytest.fixture(scope="session")
def tls_cert(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "ec",
            "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
            "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@pytest.fixture
def kvrelay(tmp_path):
    """Factory: kvrelay(*args, env=..., tls=..., token=...) starts a server for this test."""
    started = []

    def start(*args, env=None, tls=None, token=None, name=None, wait_ready=True,
              http_bind="127.0.0.1:0"):
        srv = Server(
            tmp_path,
            args=args,
            env=env,
            name=name or f"kvrelay{len(started)}",
            tls=tls,
            token=token,
            http_bind=http_bind,
        )
        started.append(srv)
        return srv.start(wait_ready=wait_ready)

    yield start
    for srv in started:
        srv.stop()


def module_server(tmp_path_factory, name, args=(), tls=None, token=None, env=None):
    srv = Server(tmp_path_factory.mktemp(name), args=args, tls=tls, token=token, name=name, env=env)
    return srv.start()


@pytest.fixture(autouse=True)
def _watch_servers():
    """Per test: no worker of a live server may die unless the test kills workers on
    purpose, and no sanitizer report may appear in any server log."""
    del RECENT_SERVERS[:]
    RECENT_SERVERS.extend(LIVE_SERVERS)
    before = {id(s): (set(s.worker_pids()), s.log_size()) for s in LIVE_SERVERS}
    yield
    problems = []
    for s in list(RECENT_SERVERS):
        pids, off = before.get(id(s), (None, 0))
        if s.alive() and pids is not None and not s.kills_expected:
            gone = pids - set(s.worker_pids())
            if gone:
                problems.append(f"{s.name}: worker(s) {sorted(gone)} died during this test")
        try:
            with open(s.log_path, "rb") as f:
                f.seek(off)
                new = f.read().decode(errors="replace")
        except OSError:
            new = ""
        m = SANITIZER_RE.search(new)
        if m:
            problems.append(f"{s.name}: sanitizer report in log: ...{new[max(0, m.start() - 200):m.start() + 2000]}")
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


# ---------------------------------------------------------------------------------------------
# --shuffle-seed: run the tests in a seeded random order, to find tests that depend on the order.


def pytest_addoption(parser):
    parser.addoption(
        "--shuffle-seed", type=int, default=None, metavar="N",
        help="shuffle the collected tests with seed N: the order of the modules, and the tests "
             "within each module (a module's tests stay together, so its module-scoped server "
             "starts once). The same N gives the same order.",
    )


def _shuffle_seed(config):
    return config.getoption("--shuffle-seed", default=None)


def pytest_collection_modifyitems(session, config, items):
    seed = _shuffle_seed(config)
    if seed is None:
        return
    import random

    rnd = random.Random(seed)
    modules = {}  # insertion-ordered: the collected order of the modules is the starting point
    for item in items:
        modules.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    groups = list(modules.values())
    rnd.shuffle(groups)
    for g in groups:
        rnd.shuffle(g)
    items[:] = [item for g in groups for item in g]
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"shuffle-seed {seed}: {len(items)} tests in {len(groups)} modules shuffled")


def pytest_report_header(config):
    seed = _shuffle_seed(config)
    return f"shuffle-seed: {seed}" if seed is not None else None


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    seed = _shuffle_seed(config)
    if seed is not None:
        terminalreporter.write_line(f"test order shuffled with --shuffle-seed {seed} (rerun with it to repeat)")


def pytest_sessionfinish(session, exitstatus):
    """Safety net: no server outlives the session, whatever a fixture did."""
    for srv in list(LIVE_SERVERS):
        srv.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        for s in RECENT_SERVERS:
            rep.sections.append((f"kvrelay log: {s.name} (pid {s.proc.pid if s.proc else '-'})", s.log_tail(150)))


# ---------------------------------------------------------------------------------------------
# Raw sockets


def raw_connect(server, rcvbuf=None, timeout=10.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(timeout * SLOW)
    s.connect((server.host, server.port))
    return s


def read_until_close(sock, limit_s, max_bytes=1 << 30):
    """Reads until EOF/reset or the time limit. Returns (data, how) with how in
    'eof' | 'reset' | 'timeout'."""
    buf = bytearray()
    deadline = time.monotonic() + limit_s
    while len(buf) < max_bytes:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(buf), "timeout"
        sock.settimeout(min(left, 1.0))
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return bytes(buf), "reset"
        if not chunk:
            return bytes(buf), "eof"
        buf += chunk
    return bytes(buf), "max"


def parse_raw_response(data):
    """(status, headers, body) of the first HTTP/1.x response in data, or (None, {}, b'')."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None, {}, b""
    lines = head.decode("latin-1").split("\r\n")
    m = re.match(r"HTTP/1\.[01] (\d{3})", lines[0])
    if not m:
        return None, {}, b""
    hdrs = _headers_dict(ln.split(":", 1) for ln in lines[1:] if ":" in ln)
    hdrs = {k: v.strip() for k, v in hdrs.items()}
    return int(m.group(1)), hdrs, rest


def response_length(buf):
    """Bytes of the first HTTP/1.x response in buf (head plus Content-Length body) once its
    head is complete, else None. Looks at the head only, so a reader that calls it per recv
    stays linear in the body's size (a 48 MiB body copied per recv was quadratic and slow
    enough under load to miss a drain's grace)."""
    end = buf.find(b"\r\n\r\n", 0, 65536)
    if end < 0:
        return None
    _, hdrs, _ = parse_raw_response(bytes(buf[: end + 4]))
    return end + 4 + int(hdrs.get("content-length", "0"))


def read_one_response(sock, limit_s):
    """Reads exactly one HTTP/1.1 response with a Content-Length body (bounded)."""
    buf = bytearray()
    deadline = time.monotonic() + limit_s
    status, hdrs, total = None, {}, None
    while time.monotonic() < deadline:
        if total is None:
            total = response_length(buf)
            if total is not None:
                status, hdrs, _ = parse_raw_response(bytes(buf[: buf.find(b"\r\n\r\n") + 4]))
        if total is not None and len(buf) >= total:
            head = buf.find(b"\r\n\r\n") + 4
            return Resp(status, hdrs, bytes(buf[head:total]), "1.1")
        sock.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
        try:
            chunk = sock.recv(1 << 20)
        except socket.timeout:
            continue
        except OSError as e:
            return Resp(0, hdrs, bytes(buf), error=f"{type(e).__name__}: {e}")
        if not chunk:
            return Resp(0, hdrs, bytes(buf), error="eof before the whole response")
        buf += chunk
    return Resp(0, hdrs, bytes(buf), error="timeout")


def send_while_reading(srv, head, chunks, limit=10.0):
    """Sends head and then chunks while a reader thread collects the answer: a server that
    answers early (413) and closes is heard even though the rest of the upload is refused."""
    s = raw_connect(srv)
    got = bytearray()
    done = threading.Event()

    def reader():
        deadline = time.monotonic() + limit * SLOW
        s2 = s
        while time.monotonic() < deadline:
            try:
                c = s2.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
            if not c:
                break
            got.extend(c)
        done.set()

    s.settimeout(1.0)
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        s.sendall(head)
        for c in chunks:
            if done.is_set() or b"\r\n\r\n" in got:
                break
            try:
                s.sendall(c)
            except OSError:
                break
        t.join(limit * SLOW + 2)
    finally:
        s.close()
    return bytes(got)
