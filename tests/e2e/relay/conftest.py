"""
Harness for the relay end-to-end tests: the real kvrelay-supervisor (started through the e2e
`kvrelay` fixture of tests/e2e/conftest.py, which stops it by PID), real gRPC clients
(Debian's python3-grpcio) with stubs generated at test time by the system protoc from
src/wire/relay.proto and src/wire/health.proto, and the fail-closed consumer of
kvrelay_consumer.py.

Every wait has a deadline, every loop a count, every stream a gRPC deadline.
"""

import json
import queue
import subprocess
import sys
import threading
import time
import types
import urllib.parse
from array import array

import pytest

from .kvrelay_consumer import CONTRACT_MARKER, ERROR_REASON_KEY

from harness import REPO, SLOW, wait_until  # noqa: E402,F401  (tests/e2e/harness.py: the one SLOW)

SERVICE = "dynamo.kvrelay.v1.KvEventRelay"
STREAM_DEADLINE = 120.0 * SLOW  # no stream of these tests may outlive this
RPC_DEADLINE = 10.0 * SLOW
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 << 20),
    ("grpc.max_send_message_length", 16 << 20),
    ("grpc.enable_retries", 0),
    # every channel its own connection (grpcio otherwise shares one subchannel per target)
    ("grpc.use_local_subchannel_pool", 1),
]
MiB = 1 << 20


# ---------------------------------------------------------------------------------------------
# Stubs


def _generate_stubs(out):
    src = (REPO / "src/wire/relay.proto").read_text()
    kept = []
    removed = 0
    for line in src.splitlines():
        s = line.strip()
        if s.startswith('import "protobuf-c/protobuf-c.proto"') or s.startswith("option (pb_c_msg)"):
            removed += 1
            continue
        kept.append(line)
    assert removed == 2, f"expected the two protoc-c-only lines in relay.proto, removed {removed}"
    (out / "relay.proto").write_text("\n".join(kept) + "\n")
    (out / "health.proto").write_text((REPO / "src/wire/health.proto").read_text())
    for proto in ("relay.proto", "health.proto"):
        p = subprocess.run(
            [
                "protoc", f"-I{out}", f"--python_out={out}", f"--grpc_python_out={out}",
                "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin", str(out / proto),
            ],
            capture_output=True,
            timeout=60,
        )
        assert p.returncode == 0, f"protoc {proto}: {p.stderr.decode(errors='replace')}"


@pytest.fixture(scope="session")
def stubs(tmp_path_factory):
    out = tmp_path_factory.mktemp("relay_stubs")
    _generate_stubs(out)
    sys.path.insert(0, str(out))
    try:
        import relay_pb2
        import relay_pb2_grpc
        import health_pb2
        import health_pb2_grpc
    finally:
        sys.path.remove(str(out))
    return types.SimpleNamespace(
        pb=relay_pb2, rpc=relay_pb2_grpc, hpb=health_pb2, hrpc=health_pb2_grpc
    )


# ---------------------------------------------------------------------------------------------
# gRPC helpers


def rpc_status(err):
    """(code name, reason trailer or None, details) of a grpc.RpcError."""
    md = {}
    for k, v in err.trailing_metadata() or ():
        md[k] = v
    return err.code().name, md.get(ERROR_REASON_KEY), err.details()


class StreamReader:
    """Drains one server-streaming call on a thread into a queue of
    ('msg', t, message) / ('err', t, RpcError) / ('eof', t, None) events."""

    def __init__(self, call, name="stream", on_msg=None):
        self.call = call
        self.name = name
        self.q = queue.Queue()
        self.on_msg = on_msg
        self.count = 0
        self.end = None  # the final event once the stream ended
        self.callback_error = None
        self.thread = threading.Thread(target=self._run, daemon=True, name=name)
        self.thread.start()

    def _run(self):
        import grpc

        try:
            for msg in self.call:
                t = time.monotonic()
                self.count += 1
                if self.on_msg is not None and self.callback_error is None:
                    try:
                        self.on_msg(msg)
                    except BaseException as e:  # a violation: record it, keep draining
                        self.callback_error = e
                self.q.put(("msg", t, msg))
            self.end = ("eof", time.monotonic(), None)
        except grpc.RpcError as e:
            self.end = ("err", time.monotonic(), e)
        except BaseException as e:  # pragma: no cover - surfaced by the tests
            self.end = ("exc", time.monotonic(), e)
        self.q.put(self.end)

    def get(self, timeout):
        try:
            return self.q.get(timeout=timeout)
        except queue.Empty:
            return None

    def next_msg(self, timeout, what="message"):
        ev = self.get(timeout)
        assert ev is not None, f"{self.name}: no {what} within {timeout:.1f}s"
        assert ev[0] == "msg", f"{self.name}: stream ended instead of {what}: {describe_end(ev)}"
        return ev[2]

    def wait_end(self, timeout):
        """The terminal event, draining messages; None if the stream is still open."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ev = self.get(min(0.2, max(0.01, deadline - time.monotonic())))
            if ev is not None and ev[0] != "msg":
                return ev
        return None

    def cancel(self):
        self.call.cancel()
        self.thread.join(10)


def describe_end(ev):
    if ev is None:
        return "still open"
    kind, _t, e = ev
    if kind == "err":
        return "RpcError%r" % (rpc_status(e),)
    if kind == "eof":
        return "clean end of stream"
    return f"{kind}: {e!r}"


def assert_rpc_error(fn, code, reason, what):
    """fn() must raise grpc.RpcError with `code` and the reason trailer `reason`."""
    import grpc

    try:
        r = fn()
        if hasattr(r, "__iter__") and not hasattr(r, "SerializeToString"):
            first = next(iter(r))
            raise AssertionError(f"{what}: expected {code}/{reason}, got a message: {first}")
        raise AssertionError(f"{what}: expected {code}/{reason}, got a response: {r}")
    except grpc.RpcError as e:
        got = rpc_status(e)
        assert (got[0], got[1]) == (code, reason), (
            f"{what}: expected status {code} with {ERROR_REASON_KEY}={reason}, "
            f"got {got[0]} with {ERROR_REASON_KEY}={got[1]} (details {got[2]!r})"
        )
        return got


# ---------------------------------------------------------------------------------------------
# The server


class RelayServer:
    """A started kvrelay with its gRPC listener, plus the relay-side helpers."""

    def __init__(self, srv, stubs):
        import grpc

        self.grpc = grpc
        self.srv = srv
        self.s = stubs
        assert srv.grpc, f"port file has no grpc= line: {srv.port_file.read_text()!r}"
        host, _, port = srv.grpc.rpartition(":")
        assert host == "127.0.0.1" and int(port) > 0, srv.grpc
        self.target = srv.grpc
        self.channels = []
        self.readers = []
        self.default_channel = self.channel()
        self.stub = self.stub_for(self.default_channel)

    # -- gRPC -------------------------------------------------------------------------------

    def channel(self, extra_options=()):
        ch = self.grpc.insecure_channel(self.target, options=CHANNEL_OPTIONS + list(extra_options))
        self.channels.append(ch)
        return ch

    def stub_for(self, ch):
        return self.s.rpc.KvEventRelayStub(ch)

    def new_stub(self, extra_options=()):
        return self.stub_for(self.channel(extra_options))

    def reader(self, call, name="stream", on_msg=None):
        r = StreamReader(call, name, on_msg)
        self.readers.append(r)
        return r

    def close(self):
        for r in self.readers:
            try:
                r.call.cancel()
            except Exception:
                pass
        for r in self.readers:
            r.thread.join(5)
        for ch in self.channels:
            try:
                ch.close()
            except Exception:
                pass
        self.readers.clear()
        self.channels.clear()

    def relay_info(self, stub=None):
        pb = self.s.pb
        return (stub or self.stub).GetRelayInfo(
            pb.RelayInfoRequest(contract_marker=CONTRACT_MARKER), timeout=RPC_DEADLINE)

    def watch_catalog(self, stub=None, sid="relay-test-catalog"):
        pb = self.s.pb
        return (stub or self.stub).WatchKvPoolCatalog(
            pb.WatchKvPoolCatalogRequest(subscriber_id=sid, contract_marker=CONTRACT_MARKER),
            timeout=STREAM_DEADLINE,
        )

    def catalog(self, timeout=5.0):
        """The first catalog message of a fresh watch (the call is cancelled)."""
        call = self.watch_catalog()
        try:
            r = self.reader(call, "catalog-once")
            return r.next_msg(timeout * SLOW, "catalog snapshot")
        finally:
            call.cancel()

    def producer(self, timeout=5.0):
        cat = self.catalog(timeout)
        assert len(cat.snapshot.pools) == 1, f"catalog must list exactly one pool: {cat}"
        return cat.snapshot.pools[0].producer

    def subscribe(self, producer, sid="relay-test-pool", stub=None, timeout=STREAM_DEADLINE):
        pb = self.s.pb
        req = pb.SubscribeKvPoolRequest(subscriber_id=sid, contract_marker=CONTRACT_MARKER)
        req.expected_producer.CopyFrom(producer)
        return (stub or self.stub).SubscribeKvPool(req, timeout=timeout)

    # -- HTTP -------------------------------------------------------------------------------

    def put(self, key, data, seqhash=None, conn=None):
        h = {} if seqhash is None else {"X-KV-Sequence-Hash": str(seqhash)}
        return self.srv.request("PUT", kv_path(key), body=data, headers=h, conn=conn)

    def head(self, key, conn=None):
        return self.srv.request("HEAD", kv_path(key), conn=conn)

    def delete(self, key, conn=None):
        return self.srv.request("DELETE", kv_path(key), conn=conn)

    def debug_relay(self):
        r = self.srv.request("GET", "/debug/relay")
        assert r.status == 200, f"/debug/relay: {r!r}"
        return json.loads(r.body)

    def debug_filter(self):
        r = self.srv.request("GET", "/debug/filter", timeout=30)
        assert r.status == 200, f"/debug/filter: {r!r}"
        assert len(r.body) % 8 == 0, f"/debug/filter body of {len(r.body)} bytes"
        words = array("Q")
        words.frombytes(r.body)
        if sys.byteorder != "little":  # pragma: no cover
            words.byteswap()
        return words

    def quiesce(self, limit=10.0):
        """Waits until the change log is drained and published_seq stays put for 300 ms."""
        deadline = time.monotonic() + limit * SLOW
        last = None
        stable_since = None
        while time.monotonic() < deadline:
            d = self.debug_relay()
            if d["log_head"] == d["log_tail"]:
                key = (d["published_seq"], d["generation"])
                if key == last:
                    if time.monotonic() - stable_since >= 0.3:
                        return d
                else:
                    last, stable_since = key, time.monotonic()
            else:
                last = None
            time.sleep(0.05)  # poll interval; quiet means unchanged for 0.3 s
        raise AssertionError(f"relay never quiesced: {self.debug_relay()}")

    def stats(self):
        return self.srv.stats()

    def worker_pids(self):
        pub = self.debug_relay()["publisher_pid"]
        return [p for p in self.srv.children() if p != pub]


def kv_path(key):
    return "/kv/" + urllib.parse.quote(str(key), safe="")


@pytest.fixture
def relay(kvrelay, stubs):
    """Factory: relay(*args) starts a kvrelay with a gRPC listener on an ephemeral loopback
    port (plus the given flags) and returns a RelayServer."""
    started = []

    def start(*args, memory="64M"):
        argv = ["--grpc-bind", "127.0.0.1:0"]
        if "--memory" not in args:
            argv += ["--memory", memory]
        argv += list(args)
        rs = RelayServer(kvrelay(*argv), stubs)
        started.append(rs)
        return rs

    yield start
    for rs in started:
        rs.close()


def hex_hash(h):
    return f"0x{h:016x}"
