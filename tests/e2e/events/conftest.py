"""
Harness for the KV event tests (docs/kv-events.md): the real kvrelay-supervisor through the
e2e `kvrelay` fixture (ephemeral loopback ports, stopped by PID) with the events bound on
`tcp://127.0.0.1:*`, their ports read from the port file (`kv_events=`, `kv_events_replay=`),
and pyzmq (python3-zmq) / msgpack (python3-msgpack) as the subscriber's side.

Two independent consumers judge the stream:
- follower.StrictFollower: vLLM's own definitions (vllm_kv_events.py) plus the replay
  protocol, written for the tests;
- kvrelay.events.Subscriber: the package's consumer (clients/python), imported from the source
  tree exactly as `pip install ./clients/python` installs it.

Every wait has a deadline, every loop a count; every socket has LINGER 0 and is closed.
"""

import http.client
import json
import sys
import time
import urllib.parse
from pathlib import Path

import pytest

from conftest import parse_kv_lines  # noqa: E402  (tests/e2e/conftest.py)
from harness import SLOW, wait_until  # noqa: E402,F401  (tests/e2e/harness.py)

REPO = Path(__file__).resolve().parents[3]
CLIENT_SRC = REPO / "clients" / "python"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))

BACKEND = "be-test"
MISSING = []
for _mod, _pkg in (("zmq", "python3-zmq"), ("msgpack", "python3-msgpack")):
    try:
        __import__(_mod)
    except ImportError:
        MISSING.append(_pkg)


def pytest_collection_modifyitems(config, items):
    """Without pyzmq or msgpack nothing here can run: every test of this directory is skipped,
    naming what to install (scripts/install-deps.sh installs both)."""
    if not MISSING:
        return
    mark = pytest.mark.skip(reason=f"KV event tests need {' and '.join(MISSING)} (apt-get install them)")
    here = str(Path(__file__).parent)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(mark)


@pytest.fixture
def zctx():
    """A ZMQ context of its own per test; every socket made from it is closed at the end."""
    import zmq

    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


# ---------------------------------------------------------------------------------------------
# The server


class EventsServer:
    """A started kvrelay with its KV event endpoints (pub, replay) read from the port file."""

    def __init__(self, srv, backend=BACKEND, pub=None):
        self.srv = srv
        self.backend = backend
        ports = wait_until(lambda: self._ports(pub is None), 10 * SLOW, what="kv_events lines in the port file")
        self.pub_port, self.replay_port = ports
        self.pub = pub or f"tcp://127.0.0.1:{self.pub_port}"
        self.replay = None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"
        self._conns = {}

    def _ports(self, tcp_pub=True):
        lines = parse_kv_lines(self.srv.port_file.read_text())
        if tcp_pub and "kv_events" not in lines:
            return None
        if not tcp_pub:  # an ipc:// PUB has no port; the replay socket is still tcp
            assert "kv_events" not in lines, lines
            if "kv_events_replay" not in lines:
                return None
        pub = int(lines["kv_events"].rpartition(":")[2]) if tcp_pub else None
        rep = lines.get("kv_events_replay")
        return pub, (None if rep is None else int(rep.rpartition(":")[2]))

    def topic(self, model, ns=None):
        b = self.backend
        return f"kv@{b}@{model}" if ns in (None, "default") else f"kv@{b}/{ns}@{model}"

    # -- HTTP on keep-alive connections, one per token ------------------------------------------

    def conn(self, token=None):
        c = self._conns.get(token)
        if c is None:
            c = self._conns[token] = http.client.HTTPConnection(self.srv.host, self.srv.port, timeout=10 * SLOW)
        return c

    def call(self, method, path, body=None, headers=None, token=None):
        h = dict(headers or {})
        if token is not None:
            h["Authorization"] = f"Bearer {token}"
        for attempt in range(2):
            c = self.conn(token)
            try:
                c.request(method, path, body=body, headers=h)
                r = c.getresponse()
                return r.status, r.read()
            except (http.client.HTTPException, OSError):
                c.close()
                self._conns.pop(token, None)
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def put(self, key, seqhash, model=None, token=None, size=64, expect=(201,)):
        h = {"X-KV-Sequence-Hash": str(seqhash)}
        if model is not None:
            h["X-KV-Model"] = model
        body = (f"<{key}>".encode() * (size // 4 + 1))[:size]
        st, data = self.call("PUT", kv_path(key), body=body, headers=h, token=token)
        assert expect is None or st in expect, f"PUT {key} (hash {seqhash}, model {model}): {st} {data[:200]!r}"
        return st

    def delete(self, key, token=None, expect=(200, 404)):
        st, data = self.call("DELETE", kv_path(key), token=token)
        assert expect is None or st in expect, f"DELETE {key}: {st} {data[:200]!r}"
        return st

    def exists_many(self, keys, token=None):
        """POST /batch/exists, 4,096 keys a request: key -> bool."""
        keys = list(keys)
        out = {}
        for i in range(0, len(keys), 4096):
            part = keys[i:i + 4096]
            body = "\n".join(quote_key(k) for k in part).encode()
            st, data = self.call("POST", "/batch/exists", body=body, token=token)
            assert st == 200, f"/batch/exists: {st} {data[:200]!r}"
            got = json.loads(data)["exists"]
            assert len(got) == len(part), (len(got), len(part))
            out.update(zip(part, got))
        return out

    def lookup(self, hashes, model=None, token=None):
        """POST /batch/lookup (docs/kv-lookup.md): the answer's JSON."""
        h = {} if model is None else {"X-KV-Model": model}
        body = "\n".join(str(x) for x in hashes).encode()
        st, data = self.call("POST", "/batch/lookup", body=body, headers=h, token=token)
        assert st == 200, f"/batch/lookup: {st} {data[:200]!r}"
        return json.loads(data)

    def metrics(self, token=None):
        st, data = self.call("GET", "/metrics", token=token)
        assert st == 200, f"/metrics: {st}"
        return data.decode()

    def metric(self, name, labels="", token=None):
        """The value of one sample of /metrics (0 when absent)."""
        want = name + (("{" + labels + "}") if labels else "")
        for line in self.metrics(token).splitlines():
            if line.startswith(want + " "):
                return float(line.split()[-1])
        return 0.0

    def close(self):
        for c in self._conns.values():
            c.close()
        self._conns.clear()


def quote_key(key):
    return urllib.parse.quote(str(key), safe="")


def kv_path(key):
    return "/kv/" + quote_key(key)


@pytest.fixture
def events_server(kvrelay):
    """Factory: events_server(*args, replay=True, fmt=None, backend=BACKEND, pub=None) starts
    kvrelay with the KV events on ephemeral loopback ports (--kv-events-backend-id backend) plus
    the flags; pub: another PUB endpoint (the storm's ipc://)."""
    started = []

    def start(*args, replay=True, fmt=None, token=None, env=None, backend=BACKEND, pub=None):
        argv = ["--kv-events-bind", pub or "tcp://127.0.0.1:*", "--kv-events-backend-id", backend]
        if replay:
            argv += ["--kv-events-replay-bind", "tcp://127.0.0.1:*"]
        if fmt is not None:
            argv += ["--kv-events-format", fmt]
        if "--workers" not in args:
            argv += ["--workers", "1"]
        if "--memory" not in args:
            argv += ["--memory", "16M"]
        es = EventsServer(kvrelay(*argv, *args, token=token, env=env), backend, pub)
        started.append(es)
        return es

    yield start
    for es in started:
        es.close()


# ---------------------------------------------------------------------------------------------
# A raw SUB socket: every message as it came, for the tests that look at single events


class RawSub:
    """A SUB socket on the server's PUB endpoint that keeps every message [(topic, seq,
    payload)]. ready() makes sure the subscription has reached the server (ZMQ drops what a
    PUB sends before: the slow joiner) by putting blocks into a warm-up model's pool until one
    of its batches arrives."""

    def __init__(self, ctx, es, prefix=b"kv@"):
        import zmq

        self.zmq = zmq
        self.es = es
        self.sock = ctx.socket(zmq.SUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SUBSCRIBE, prefix)
        self.sock.connect(es.pub)
        self.messages = []

    def close(self):
        self.sock.close(linger=0)

    def drain(self, timeout=0.0):
        """Reads what is there (waiting at most timeout for the first message)."""
        n = 0
        if timeout and not self.sock.poll(int(timeout * 1000)):
            return 0
        for _ in range(1_000_000):
            try:
                frames = self.sock.recv_multipart(self.zmq.NOBLOCK)
            except self.zmq.Again:
                break
            assert len(frames) == 3, f"a PUB message of {len(frames)} frames: {frames!r}"
            assert len(frames[1]) == 8, f"a seq frame of {len(frames[1])} bytes"
            self.messages.append((frames[0].decode(), int.from_bytes(frames[1], "big"), frames[2]))
            n += 1
        return n

    def ready(self, limit=5.0, token=None):
        warm = self.es.topic("warmup")
        deadline = time.monotonic() + limit * SLOW
        i = 0
        while time.monotonic() < deadline:
            i += 1
            self.es.put(f"warmup/{time.monotonic_ns()}/{i}", 0x5EED0000 + i, model="warmup", token=token)
            self.drain(0.1)
            if any(t == warm for t, _, _ in self.messages):
                self.messages.clear()
                return
        raise AssertionError(f"no batch of {warm} within {limit * SLOW:.1f}s: the subscription never took")

    def of(self, topic):
        return [(s, p) for t, s, p in self.messages if t == topic]

    def wait_for(self, pred, limit=5.0, what="messages"):
        deadline = time.monotonic() + limit * SLOW
        while True:
            self.drain(0.02)
            if pred(self):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: not within {limit * SLOW:.1f}s; got "
                                     f"{[(t, s, len(p)) for t, s, p in self.messages][-20:]}")


@pytest.fixture
def raw_sub(zctx):
    subs = []

    def make(es, prefix=b"kv@"):
        s = RawSub(zctx, es, prefix)
        subs.append(s)
        return s

    yield make
    for s in subs:
        s.close()


@pytest.fixture
def follower(zctx):
    """Factory: follower(es, fmt=..., pub=None, **kw) -> follower.StrictFollower on es's
    endpoints (pub: another PUB endpoint, a SlowLink's)."""
    from .follower import StrictFollower

    made = []

    def make(es, fmt="vllm", pub=None, **kw):
        kw.setdefault("replay_timeout", 5.0 * SLOW)
        f = StrictFollower(zctx, pub or es.pub, es.replay, fmt=fmt, **kw)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


@pytest.fixture
def subscriber(zctx):
    """Factory: subscriber(es, pub=None, **kw) -> kvrelay.events.Subscriber on es's endpoints."""
    from kvrelay.events import Subscriber

    made = []

    def make(es, pub=None, **kw):
        kw.setdefault("replay_timeout", 5.0 * SLOW)
        s = Subscriber(pub or es.pub, es.replay, context=zctx, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


def publisher_pid(srv):
    """The publisher among the supervisor's children, by /proc (its comm says so), never by a
    process name search."""
    for pid in srv.children():
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if "publisher" in comm:
            return pid
    return None
