"""
kvrelay.lmcache.KvrelayL2Adapter driven as LMCache multi-process mode drives a native_plugin
L2 store, against the real server.

The driver follows LMCache (dev branch, 2026):
  - lmcache/v1/distributed/l2_adapters/native_plugin_l2_adapter.py: the config is JSON
    {"type": "native_plugin", "module_path", "class_name", "adapter_params"}; the factory
    imports module_path, calls class(**adapter_params), and refuses an object without
    event_fd / submit_batch_get / submit_batch_set / submit_batch_exists / drain_completions /
    close (submit_batch_delete optional);
  - lmcache/v1/distributed/l2_adapters/native_connector_l2_adapter.py: submissions are made
    under the bridge's lock with lists of byte memoryviews, and a demux thread polls the
    client's eventfd (select.poll, POLLIN, 500 ms), calls drain_completions() and routes each
    (future_id, ok, error, per_key_bools) to the waiting task.
"""

import importlib
import json
import select
import threading
import time

import pytest

from .conftest import MiB, kill_server

from conftest import SLOW  # noqa: E402  (tests/e2e/conftest.py)

REQUIRED = ["event_fd", "submit_batch_get", "submit_batch_set", "submit_batch_exists",
            "drain_completions", "close"]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def lmcache_key(i, salt=None):
    # native_connector_l2_adapter._object_key_to_string:
    # <model>@<kv_rank 08x>@<object_group_id x>@<chunk hash hex>[@<cache_salt>]
    k = f"{LLAMA}@{0xff:08x}@{0:x}@{(0xC0FFEE00 + i):064x}"
    return k if salt is None else f"{k}@{salt}"


class NativePluginDriver:
    """Plays LMCache's native_plugin factory and NativeConnectorL2Adapter's demux thread."""

    def __init__(self, config_json):
        cfg = json.loads(config_json)
        assert cfg["type"] == "native_plugin"
        module = importlib.import_module(cfg["module_path"])
        cls = getattr(module, cfg["class_name"])
        self.client = cls(**cfg.get("adapter_params", {}))
        for m in REQUIRED:
            assert callable(getattr(self.client, m, None)), f"missing {m}"
        self.has_delete = callable(getattr(self.client, "submit_batch_delete", None))
        self.fd = int(self.client.event_fd())
        self.lock = threading.Lock()
        self.done = {}
        self.unknown = []
        self.drain_errors = []
        self.wakeups = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._demux, daemon=True)
        self.thread.start()

    def _demux(self):
        poller = select.poll()
        poller.register(self.fd, select.POLLIN)
        while not self.stop.is_set():
            if not poller.poll(500):
                continue
            try:
                completions = self.client.drain_completions()
            except Exception as e:  # the bridge logs and goes on; the test fails on it
                self.drain_errors.append(e)
                continue
            self.wakeups += 1
            with self.lock:
                for fid, ok, err, bools in completions:
                    self.done[int(fid)] = (bool(ok), err, bools)

    def submit(self, op, *args):
        with self.lock:  # the bridge submits under its lock: submissions must not block
            t0 = time.monotonic()
            fid = int(getattr(self.client, "submit_batch_" + op)(*args))
            took = time.monotonic() - t0
        # generous for a loaded 2-core machine; a submission that waited for the network
        # would take the transfer time (a 16 x 32 MiB batch: hundreds of ms at least)
        assert took < 0.25 * SLOW, f"submit_batch_{op} blocked for {took * 1000:.1f} ms"
        return fid

    def wait(self, fid, timeout=60.0):
        deadline = time.monotonic() + timeout * SLOW
        while time.monotonic() < deadline:
            with self.lock:
                if fid in self.done:
                    return self.done.pop(fid)
            time.sleep(0.002)  # poll interval of this bounded wait for the future
        raise AssertionError(f"future {fid} never completed")

    def run(self, op, *args, timeout=60.0):
        return self.wait(self.submit(op, *args), timeout)

    def close(self):
        self.stop.set()
        self.thread.join(5)
        self.client.close()
        assert not self.drain_errors, self.drain_errors


def config(srv, **params):
    p = {"url": srv.base_url, "num_workers": 8, "timeout_s": 10.0 * SLOW}
    p.update(params)
    return json.dumps({"type": "native_plugin", "module_path": "kvrelay.lmcache",
                       "class_name": "KvrelayL2Adapter", "adapter_params": p})


def test_lmcache_l2_16x32mib_set_exists_get_delete(kvrelay, random_pool):
    srv = kvrelay("--memory", "1G", "--workers", "2")
    d = NativePluginDriver(config(srv))
    try:
        keys = [lmcache_key(i, salt="alice" if i % 3 == 0 else None) for i in range(16)]
        # 16 distinct 32 MiB chunks: slices of one random pool at different offsets
        src = [random_pool[i * 64 * 1024: i * 64 * 1024 + 32 * MiB] for i in range(16)]

        t0 = time.monotonic()
        fid = d.submit("set", keys, src)
        with d.lock:
            assert fid not in d.done, "the 512 MiB set completed inside its submission"
        ok, err, bools = d.wait(fid)
        set_s = time.monotonic() - t0
        assert ok and err == "" and bools == [True] * 16, (ok, err, bools)
        st = srv.stats()
        assert st["unique_blocks"] == 16 and st["resident_bytes"] == 16 * 32 * MiB, st

        missing = [lmcache_key(100 + i) for i in range(4)]
        probe = keys[:5] + missing[:2] + keys[5:] + missing[2:]
        ok, err, bools = d.run("exists", probe)
        assert ok, err
        assert bools == [True] * 5 + [False] * 2 + [True] * 11 + [False] * 2, bools

        dst = [bytearray(32 * MiB) for _ in range(16)]
        t0 = time.monotonic()
        ok, err, bools = d.run("get", keys, [memoryview(b) for b in dst])
        get_s = time.monotonic() - t0
        assert ok and bools == [True] * 16, (ok, err, bools)
        for i in range(16):
            assert dst[i] == src[i], f"chunk {i} differs after the round trip"

        # per-key bools are exact under misses, and a miss leaves its buffer untouched
        for b in dst:
            b[:8] = b"untouchd"
        mixed = [keys[0], missing[0], keys[1], missing[1]]
        ok, err, bools = d.run("get", mixed, [memoryview(b) for b in dst[:4]])
        assert ok and bools == [True, False, True, False], (ok, err, bools)
        assert dst[0] == src[0] and dst[2] == src[1]
        assert bytes(dst[1][:8]) == b"untouchd" and bytes(dst[3][:8]) == b"untouchd"

        # a buffer of another size is a per-key miss (nothing written), the others load
        short = bytearray(32 * MiB - 4096)
        short[:8] = b"untouchd"
        views = [memoryview(dst[0]), memoryview(short), memoryview(dst[2])]
        ok, err, bools = d.run("get", [keys[3], keys[4], keys[5]], views)
        assert ok and bools == [True, False, True], (ok, err, bools)
        assert bytes(short[:8]) == b"untouchd" and dst[0] == src[3] and dst[2] == src[5]

        assert d.has_delete
        ok, err, bools = d.run("delete", keys + [missing[0]])
        assert ok and bools == [True] * 16 + [False], (ok, err, bools)
        ok, err, bools = d.run("exists", keys)
        assert ok and bools == [False] * 16, bools
        assert d.wakeups >= 1
        print(f"lmcache_l2 16x32MiB set {16 * 32 / set_s:.0f} MiB/s get {16 * 32 / get_s:.0f} MiB/s")
    finally:
        d.close()
    srv.assert_consistent()


def test_lmcache_l2_server_killed_mid_batch(kvrelay, random_pool):
    srv = kvrelay("--memory", "1G", "--workers", "2")
    d = NativePluginDriver(config(srv, timeout_s=2.0 * SLOW))
    try:
        keys = [lmcache_key(200 + i) for i in range(16)]
        src = [random_pool[i * 4096: i * 4096 + 32 * MiB] for i in range(16)]
        fid = d.submit("set", keys, src)
        time.sleep(0.01)  # the transfers are under way: 512 MiB cannot be done in 10 ms
        kill_server(srv)
        ok, err, bools = d.wait(fid, timeout=30.0)
        assert ok is False and err, (ok, err)
        assert len(bools) == 16
        # later batches against the dead server complete too, with ok=False
        for op, args in (("get", (keys[:4], [memoryview(bytearray(32 * MiB)) for _ in range(4)])),
                         ("exists", (keys,)), ("delete", (keys[:2],))):
            ok, err, bools = d.run(op, *args, timeout=30.0)
            assert ok is False and err and bools == [False] * len(args[0]), (op, ok, err, bools)
    finally:
        d.close()
    d.client.close()  # close() twice is fine
    assert d.client.drain_completions() == []


def test_lmcache_l2_contract_edges(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "1")
    d = NativePluginDriver(config(srv, max_pending_keys=8, some_future_param=1))
    try:
        # the binding's errors: count mismatch and empty batches raise at submission
        with pytest.raises(ValueError):
            d.client.submit_batch_set(["a", "b"], [memoryview(b"x")])
        with pytest.raises(ValueError):
            d.client.submit_batch_exists([])
        # the stated bound: more than max_pending_keys keys in flight completes at once, failed
        ok, err, bools = d.run("exists", [f"k{i}" for i in range(9)])
        assert ok is False and "in flight" in err and bools == [False] * 9
        ok, err, bools = d.run("exists", [f"k{i}" for i in range(8)])
        assert ok is True and bools == [False] * 8
        # per-key bools of a partly failing set: another length under an existing key is
        # refused by the server (409), that key is False and the batch is not ok
        ok, err, bools = d.run("set", ["s1", "s2"], [memoryview(b"one"), memoryview(b"two")])
        assert ok and bools == [True, True]
        ok, err, bools = d.run("set", ["s1", "s3"], [memoryview(b"longer"), memoryview(b"three")])
        assert ok is False and bools == [False, True], (ok, err, bools)
    finally:
        d.close()
    # many futures in flight at once all complete, each exactly once (default bound)
    d = NativePluginDriver(config(srv, num_workers=4))
    try:
        fids = [d.submit("exists", ["s1", "s2", "nope"]) for _ in range(40)]
        for fid in fids:
            ok, err, bools = d.wait(fid)
            assert ok and bools == [True, True, False], (ok, err, bools)
        assert len(set(fids)) == 40
    finally:
        d.close()
