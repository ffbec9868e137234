"""
The KV event stream across the store's lifecycle, against the real server: a warm restart
(--segment-path) whose streams open with what the segment still holds; a change-log overflow
(the publisher stopped while the workers write) whose rebuild states every pool again with
AllBlocksCleared in the running sequence; a block stored without X-KV-Sequence-Hash (the hash
derived from its key, which POST /batch/lookup must know by the same number); a dedup hit and
a DELETE that leaves references (no event); and kvrelay.events following the two map encodings
to the exact contents.
"""

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from conftest import wait_stopped  # noqa: E402  (tests/e2e/conftest.py)

from . import vllm_kv_events as vk
from .conftest import SLOW, publisher_pid, wait_until
from .test_events_server import events_of, replay, stored_minus_removed


def expected(es, keys, token=None):
    """topic -> the hashes the store holds, from POST /batch/exists on the keys put."""
    held = es.exists_many(list(keys), token=token)
    out = {}
    for k, (topic, h) in keys.items():
        out.setdefault(topic, set())
        if held[k]:
            out[topic].add(h)
    return out


def opening(zctx, es, topic):
    """The listing of a stream's opening, asked by replay from 0: (seqs, hashes listed)."""
    ans = replay(zctx, es, 0, topic)
    seqs = [int.from_bytes(s, "big") for s, _ in ans]
    batches = [vk.decode_batch(p) for _, p in ans]
    assert seqs and seqs[0] == 0 and isinstance(batches[0].events[0], vk.AllBlocksCleared), (seqs[:3], batches[:1])
    listed, i = [], 0
    for b in batches:  # the opening: AllBlocksCleared, then BlockStored only, up to the first change
        for e in b.events[1 if i == 0 else 0:]:
            if not isinstance(e, vk.BlockStored):
                return seqs, listed
            listed += e.block_hashes
        i += 1
    return seqs, listed


@pytest.fixture
def seg_path():
    p = Path("/dev/shm") / f"kvrelay-e2e-ev-{uuid.uuid4().hex[:12]}.seg"
    yield p
    try:
        p.unlink()
    except FileNotFoundError:
        pass


def test_warm_restart_streams_open_with_what_the_segment_holds(events_server, zctx, seg_path):
    args = ("--segment-path", str(seg_path), "--kv-events-max-batch", "16")
    es = events_server(*args)
    keys = {}
    for i in range(60):
        model = ("m-wa", "m-wb")[i % 2]
        keys[f"w/{i}"] = (es.topic(model), 0xAB000 + i)
        es.put(f"w/{i}", 0xAB000 + i, model=model)
    for i in range(0, 60, 7):
        es.delete(f"w/{i}")
    es.put("w/shared", 0xAB001, model="m-wb")  # a second key of a hash the pool holds
    keys["w/shared"] = (es.topic("m-wb"), 0xAB001)
    before = expected(es, keys)
    es.srv.stop()
    es2 = events_server(*args)
    assert expected(es2, keys) == before, "the warm restart lost or gained blocks"
    for topic, want in before.items():
        seqs, listed = opening(zctx, es2, topic)
        assert sorted(listed) == sorted(want), f"{topic}: the opening after a warm restart lists what it holds"
        assert seqs == list(range(len(seqs))) and len(seqs) == (len(want) + 1 + 15) // 16, seqs


def test_changelog_overflow_restates_in_the_running_sequence(events_server, raw_sub, follower, subscriber):
    es = events_server("--memory", "1M", "--max-blocks", "256", "--change-log-events", "4096",
                       "--hang-timeout", "60s")
    topic = es.topic("m-ov")
    raw = raw_sub(es)
    raw.ready()
    fol = follower(es, name="overflow")
    sub = subscriber(es)
    keys = {}
    for i in range(40):
        keys[f"o/{i}"] = (topic, 0xC000 + i)
        es.put(f"o/{i}", 0xC000 + i, model="m-ov", size=2000)
    raw.wait_for(lambda r: stored_minus_removed(events_of(r, topic)) == expected(es, keys)[topic],
                 what="the stream before the overflow")
    last = raw.of(topic)[-1][0]
    pub = publisher_pid(es.srv)
    assert pub is not None
    es.srv.kills_expected = True
    os.kill(pub, signal.SIGSTOP)
    try:
        assert wait_stopped(pub, 5 * SLOW), "the publisher did not stop"
        # 2,500 PUTs into a 1 MiB arena: an insert and an eviction each, past the 4,096 events
        # of the change log (--change-log-events)
        for i in range(40, 2540):
            keys[f"o/{i}"] = (topic, 0xC000 + i)
            es.put(f"o/{i}", 0xC000 + i, model="m-ov", size=2000)
    finally:
        os.kill(pub, signal.SIGCONT)
    want = expected(es, keys)[topic]
    assert publisher_pid(es.srv) == pub, "the publisher was replaced: this test wants a rebuild, not a restart"

    def restated(r):
        msgs = [(s, vk.decode_batch(p)) for s, p in r.of(topic) if s > last]
        return any(b.events and isinstance(b.events[0], vk.AllBlocksCleared) for _, b in msgs)

    raw.wait_for(restated, 10, what="AllBlocksCleared after the overflow")
    msgs = [(s, vk.decode_batch(p)) for s, p in raw.of(topic) if s > last]
    seqs = [s for s, _ in msgs]
    assert seqs[0] == last + 1 and seqs == list(range(last + 1, last + 1 + len(seqs))), \
        f"the rebuild continues the sequence (last {last}): {seqs[:10]}"
    assert "change log overflowed" in es.srv.log_text()
    assert stored_minus_removed(events_of(raw, topic)) == want
    # both consumers follow it without a restart
    deadline = time.monotonic() + 10 * SLOW
    while fol.hashes(topic) != want and time.monotonic() < deadline:
        fol.pump(0.05)
    assert fol.hashes(topic) == want and not fol.violations
    assert sub.run_until(lambda s: s.idle() and s.hashes(topic) == want, 10 * SLOW), sub.pools.get(topic)
    assert sub.pools[topic].restarts == 0 and fol.view(topic).restarts == 0


def test_derived_hash_dedup_hit_and_references(events_server, raw_sub):
    es = events_server()
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-dh")
    marks = iter(range(0xD00D00, 0xD00D99))

    def barrier():
        """A marker block: what came before it in this pool's stream has arrived."""
        m = next(marks)
        es.put(f"dh/mark/{m}", m, model="m-dh")
        raw.wait_for(lambda r: any(m in getattr(e, "block_hashes", []) for _, e in events_of(r, topic)),
                     what=f"marker {m:#x}")
        return m

    st, body = es.call("PUT", "/kv/dh%2Fplain", body=b"x" * 100, headers={"X-KV-Model": "m-dh"})
    assert st == 201, (st, body)
    barrier()
    evs = [e for _, e in events_of(raw, topic)]
    derived = evs[1].block_hashes[0]  # after the opening's AllBlocksCleared
    assert isinstance(evs[1], vk.BlockStored) and 0 < derived < 1 << 64
    look = es.lookup([derived, derived ^ 1], model="m-dh")
    assert look is not None and look["held"] == [True, False], f"lookup of the derived hash {derived:#x}: {look}"
    n = len(evs)
    # a dedup hit (the same key again) and a DELETE that leaves a reference make no event
    st, _ = es.call("PUT", "/kv/dh%2Fplain", body=b"x" * 100, headers={"X-KV-Model": "m-dh"})
    assert st == 200
    es.delete("dh/plain", expect=(200,))
    m = barrier()
    evs = [e for _, e in events_of(raw, topic)]
    assert len(evs) == n + 1 and evs[-1].block_hashes == [m], evs[n - 1:]
    es.delete("dh/plain", expect=(200,))  # the last reference
    barrier()
    evs = [e for _, e in events_of(raw, topic)]
    assert isinstance(evs[-2], vk.BlockRemoved) and evs[-2].block_hashes == [derived], evs[-3:]
    assert es.lookup([derived], model="m-dh")["held"] == [False]


@pytest.mark.parametrize("fmt", ["vllm-map", "rfc1527"])
def test_kvrelay_events_follows_each_encoding(events_server, subscriber, tmp_path, fmt):
    tenants = tmp_path / "tenants"
    tenants.write_text("team-e tok-enc-e\n")
    es = events_server("--tenants", str(tenants), "--admin-token", "tok-enc-admin", "--memory", "1M", fmt=fmt)
    forms = set()
    sub = subscriber(es, on_event=lambda t, s, e: forms.add(e.form))
    keys = {}
    for i in range(600):  # evictions too: 600 blocks of 2,000 bytes in a 1 MiB arena
        token = ("tok-enc-admin", "tok-enc-e")[i % 2]
        model = ("m-e1", "m-e2")[i % 3 == 0]
        topic = es.topic(model, None if token == "tok-enc-admin" else "team-e")
        keys[f"e/{i}"] = (topic, token, 0xE000 + i % 450)
        es.put(f"e/{i}", 0xE000 + i % 450, model=model, token=token, size=2000)
        if i % 5 == 0:
            es.delete(f"e/{i - 2}" if i >= 2 else "e/0", token=token)  # same parity: same token
        sub.poll(0)
    want = {}
    for token in ("tok-enc-admin", "tok-enc-e"):
        mine = {k: (t, h) for k, (t, tok, h) in keys.items() if tok == token}
        for t, hs in expected(es, mine, token=token).items():
            want.setdefault(t, set()).update(hs)
    sub.catch_up(list(want))
    ok = sub.run_until(lambda s: s.idle() and all(s.hashes(t) == want[t] for t in want), 10 * SLOW)
    assert ok, [(t, len(sub.hashes(t)), len(want[t])) for t in want]
    assert forms == {fmt}
    assert all(st.anomalies == 0 for st in sub.pools.values()), sub.pools
    assert {st.namespace for st in sub.pools.values() if st.topic in want} == {"default", "team-e"}
