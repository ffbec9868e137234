"""
kvrelay.events.Subscriber against a fake publisher (fake_publisher.py: pyzmq XPUB + ROUTER
driven from the test's thread), so that the consumer's rules are tested on their own, each case
made to happen on purpose: in-order application, exact topics, the three encodings, a gap and
its replay (live batches held meanwhile, those the replay covered dropped), a resync (the
buffer lost the seq: one seq, AllBlocksCleared first, over several messages), a late joiner, a
stream restart (seq 0 with AllBlocksCleared; a seq that goes backwards; a new publisher on the
same endpoint), the held-batches cap, a replay that gets no answer, catch_up() for batches lost
at a stream's end, and a subscriber without a replay endpoint.

After every case the subscriber's set is compared with the fake's own truth.
"""

import msgpack
import pytest
import zmq

from kvrelay.events import CLEARED, REMOVED, STORED, DecodeError, Subscriber, decode_batch, parse_topic

from .fake_publisher import FakePublisher, encode_event, pump
from .conftest import SLOW

T = "kv@be@m"
T2 = "kv@be/team-a@m"


@pytest.fixture
def fake(zctx):
    f = FakePublisher(zctx)
    yield f
    f.close()


@pytest.fixture
def subscriber(zctx, fake):
    subs = []

    def make(topics=None, replay=True, **kw):
        kw.setdefault("replay_timeout", 2.0 * SLOW)
        s = Subscriber(fake.pub_ep, fake.replay_ep if replay else None, topics=topics, context=zctx, **kw)
        subs.append(s)
        fake.wait_subscribed(5 * SLOW, count=len(topics) if topics else 1)
        return s

    yield make
    for s in subs:
        s.close()


def exact(sub, fake, *topics):
    def ok():
        return sub.idle() and all(
            t in sub.pools and sub.pools[t].exact and sub.pools[t].hashes == fake.stream(t).hashes
            and sub.pools[t].seq == fake.stream(t).next_seq - 1 for t in topics)
    return ok


def follow(sub, fake, *topics, timeout=5.0):
    ok = pump(sub, fake, exact(sub, fake, *topics), timeout * SLOW)
    assert ok, {t: (sub.pools.get(t), sorted(fake.stream(t).hashes)[:20], fake.stream(t).next_seq) for t in topics}


def test_in_order_exact_topics_and_callback(fake, subscriber):
    seen = []
    sub = subscriber(topics=[T], on_event=lambda t, s, e: seen.append((t, s, e.kind, e.hashes)))
    fake.open(T)
    fake.open(T + "x")  # shares T's prefix: ZMQ delivers it, the subscriber must not take it
    fake.store(T, 1, 2, 3)
    fake.store(T + "x", 9)
    fake.remove(T, 2)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.hashes == {1, 3} and st.seq == 2 and st.batches == 3
    assert T + "x" not in sub.pools and sub.foreign == 2
    assert (st.gaps, st.replays, st.resyncs, st.restarts, st.late_joins, st.anomalies) == (0, 0, 0, 0, 0, 0)
    assert seen == [(T, 0, CLEARED, ()), (T, 1, STORED, (1,)), (T, 1, STORED, (2,)), (T, 1, STORED, (3,)),
                    (T, 2, REMOVED, (2,))]
    assert parse_topic(T2) == ("be", "team-a", "m") and st.model == "m" and st.namespace == "default"


@pytest.mark.parametrize("fmt", ["vllm", "vllm-map", "rfc1527"])
def test_formats_decoded(zctx, fmt):
    f = FakePublisher(zctx, fmt=fmt)
    try:
        b = decode_batch(f.payload([("cleared", []), ("stored", [7]), ("stored", [1 << 63]), ("removed", [7, 8])], T2))
        assert [(e.kind, e.hashes, e.form) for e in b.events] == [
            (CLEARED, (), fmt), (STORED, (7,), fmt), (STORED, (1 << 63,), fmt), (REMOVED, (7, 8), fmt)]
        assert b.data_parallel_rank == 0 and b.ts > 1e9
        stored = b.events[1].fields
        assert stored["block_size"] == 256 and stored["medium"] == "CPU"
        if fmt == "rfc1527":
            assert (stored["tenant_id"], stored["model_name"], stored["backend_id"]) == ("team-a", "m", "be")
            assert stored["block_hashes"] == [7]
    finally:
        f.close()


def test_decode_errors():
    for bad in (b"\xc1", msgpack.packb({"ts": 1}), msgpack.packb([1.0, [["Nope", [1]]], 0]),
                msgpack.packb([1.0, [{"type": "BlockStored"}], 0]), msgpack.packb([1.0, [["BlockRemoved"]], 0]),
                msgpack.packb([1.0, [{"event_type": "gone"}], 0]), msgpack.packb([1.0, [["BlockStored", [True], None,
                                                                                        [], 1, None, "CPU", None]], 0])):
        with pytest.raises(DecodeError):
            decode_batch(bad)
    # one event of each encoding in one batch: detected per event
    mixed = msgpack.packb([1.5, [encode_event("stored", [5], "vllm"), encode_event("stored", [6], "vllm-map"),
                                 encode_event("removed", [5], "rfc1527")], 0])
    assert [(e.kind, e.hashes, e.form) for e in decode_batch(mixed).events] == [
        (STORED, (5,), "vllm"), (STORED, (6,), "vllm-map"), (REMOVED, (5,), "rfc1527")]


def test_gap_replayed_live_held_and_dropped(fake, subscriber):
    sub = subscriber()
    fake.open(T)
    fake.store(T, 1, 2)
    follow(sub, fake, T)
    fake.store(T, 3, send=False)  # lost: seq 2
    fake.remove(T, 1, send=False)  # lost: seq 3
    fake.store(T, 4)  # seq 4: the gap shows
    # the replay is not answered yet: what arrives meanwhile is held
    for _ in range(50):
        sub.poll(0.01)
        if sub.pools[T].waiting:
            break
    assert sub.pools[T].waiting and sub.pools[T].gaps == 1
    fake.store(T, 5)
    fake.store(T, 6)
    assert sub.run_until(lambda s: len(s.pools[T].held) == 3, 2 * SLOW), sub.pools[T]
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.hashes == {2, 3, 4, 5, 6} and st.replays == 1 and st.gaps == 1
    assert st.dropped == 3  # the replay went to seq 6: the three held ones were covered by it
    assert fake.requests == [(T, 2)]
    assert st.anomalies == 0


def test_resync_when_the_buffer_lost_the_seq(fake, subscriber):
    sub = subscriber()
    fake.open(T)
    fake.store(T, 1)
    follow(sub, fake, T)
    for h in range(100, 120):  # lost, and evicted from the buffer
        fake.store(T, h, send=False)
    fake.remove(T, 1, send=False)
    fake.evict(T, fake.stream(T).next_seq - 1)
    fake.store(T, 500)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.resyncs == 1 and st.gaps == 1 and st.replays == 1
    assert st.hashes == set(range(100, 120)) | {500}
    # the resync came in several messages stamped with one seq (max_batch 4 events each)
    assert len(fake.state_batches(T)) > 1
    assert st.anomalies == 0


def test_late_joiner_replays_from_zero(fake, subscriber):
    fake.open(T)
    fake.store(T, 1, 2, 3)  # nobody listens: dropped by the XPUB
    fake.remove(T, 2)
    sub = subscriber()
    fake.store(T, 4)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.late_joins == 1 and st.replays == 1 and st.resyncs == 0 and st.hashes == {1, 3, 4}
    assert fake.requests == [(T, 0)]


def test_late_joiner_resyncs_when_zero_is_gone(fake, subscriber):
    fake.open(T)
    fake.store(T, 1, 2, 3)
    fake.evict(T, 1)
    sub = subscriber()
    fake.store(T, 4)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.late_joins == 1 and st.resyncs == 1 and st.hashes == {1, 2, 3, 4}


def test_restart_seq0_replaces_the_set(fake, subscriber):
    sub = subscriber()
    fake.open(T)
    fake.store(T, 1, 2)
    fake.store(T, 3)
    follow(sub, fake, T)
    fake.stream(T).hashes.discard(2)  # what the new publisher finds: 2 went while it was down
    fake.restart()
    fake.store(T, 9)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.restarts == 1 and st.replays == 0 and st.hashes == {1, 3, 9} and st.seq == 1


def test_restart_seen_as_seq_going_backwards(fake, subscriber):
    sub = subscriber()
    fake.open(T)
    for h in range(1, 9):
        fake.store(T, h)
    follow(sub, fake, T)
    fake.stream(T).hashes -= {1, 2}
    fake.restart(send=False)  # the new stream's beginning never reached this subscriber
    fake.store(T, 50)  # seq 1 of the new stream, below the last applied (8)
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.restarts == 1 and st.hashes == set(range(3, 9)) | {50}
    assert fake.requests[-1] == (T, 0)


def test_restart_by_a_new_publisher_on_the_same_endpoint(zctx, fake, subscriber):
    sub = subscriber()
    fake.open(T)
    fake.store(T, 1, 2, 3)
    follow(sub, fake, T)
    # the publisher process goes away; a new one binds the same endpoints with a new stream
    pub_ep, replay_ep, truth = fake.pub_ep, fake.replay_ep, set(fake.stream(T).hashes) - {3}
    fake.close()
    new = None
    for _ in range(100):  # the old listener's close completes in ZMQ's I/O thread
        try:
            new = FakePublisher(zctx, pub_ep=pub_ep, replay_ep=replay_ep)
            break
        except zmq.ZMQError:
            sub.poll(0.05)
    assert new is not None, "could not bind the same endpoints again"
    try:
        new.stream(T).hashes = truth
        new.wait_subscribed(5 * SLOW, sub=sub)
        # the new stream's first batches go out before the subscriber is back, and nothing
        # follows them: the reconnection alone must make the subscriber replay from 0
        new.open(T, send=False)
        new.store(T, 7, send=False)
        follow(sub, new, T)
        st = sub.pools[T]
        assert sub.reconnects == 1 and st.rejoins == 1 and st.restarts == 1 and st.hashes == {1, 2, 7}
        assert new.requests == [(T, 0)]
    finally:
        new.close()


def test_held_cap_drops_and_replays_again(fake, subscriber):
    sub = subscriber(max_held=3)
    fake.open(T)
    follow(sub, fake, T)
    fake.store(T, 1, send=False)
    fake.store(T, 2)  # gap: replay asked, not answered yet
    assert sub.run_until(lambda s: s.pools[T].waiting, 2 * SLOW)
    for h in range(10, 20):
        fake.store(T, h)
    assert sub.run_until(lambda s: s.pools[T].overflows >= 1, 2 * SLOW), sub.pools[T]
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.hashes == {1, 2} | set(range(10, 20)) and st.overflows >= 1 and len(st.held) == 0


def test_replay_without_answer_times_out_and_is_sent_again(fake, subscriber):
    sub = subscriber(replay_timeout=0.3 * SLOW)
    fake.open(T)
    follow(sub, fake, T)
    fake.ignore_requests = 1
    fake.store(T, 1, send=False)
    fake.store(T, 2)
    follow(sub, fake, T, timeout=5.0)
    st = sub.pools[T]
    assert sub.replay_timeouts == 1 and st.replays == 2 and fake.requests == [(T, 1), (T, 1)]
    assert st.hashes == {1, 2}


def test_catch_up_finds_batches_lost_at_the_end(fake, subscriber):
    sub = subscriber(topics=[T, T2])
    fake.open(T)
    fake.store(T, 1)
    follow(sub, fake, T)
    fake.store(T, 2, send=False)  # the stream's last batch, lost: nothing reveals it
    fake.open(T2, send=False)  # a topic never seen live
    fake.store(T2, 8, send=False)
    for _ in range(5):
        sub.poll(0.01)
    assert sub.pools[T].hashes == {1} and T2 not in sub.pools
    sub.catch_up()
    follow(sub, fake, T, T2)
    assert sub.pools[T2].hashes == {8} and sub.pools[T].hashes == {1, 2}


def test_without_replay_endpoint_gaps_are_counted(fake, subscriber):
    sub = subscriber(replay=False)
    fake.open(T)
    fake.store(T, 1)
    fake.store(T, 2, send=False)
    fake.store(T, 3)
    assert sub.run_until(lambda s: T in s.pools and s.pools[T].seq == 3, 2 * SLOW)
    st = sub.pools[T]
    assert st.gaps == 1 and not st.exact and st.hashes == {1, 3}
    fake.restart()  # a new stream states everything: exact again
    assert sub.run_until(lambda s: s.pools[T].seq == 0 and s.pools[T].exact, 2 * SLOW), st
    assert st.hashes == {1, 2, 3} and st.restarts == 1


def test_package_imports_without_zmq_and_msgpack():
    """pyzmq and msgpack are an optional extra: kvrelay and kvrelay.events import without
    them, and only making a Subscriber (or decoding) says what is missing."""
    import subprocess
    import sys

    from .conftest import CLIENT_SRC

    code = ("import sys; sys.modules['zmq'] = None; sys.modules['msgpack'] = None\n"
            "import kvrelay, kvrelay.events\n"
            "try:\n    kvrelay.events.Subscriber('tcp://127.0.0.1:1')\n"
            "except ImportError as e:\n    print('subscriber:', e)\n"
            "try:\n    kvrelay.events.decode_batch(b'\\x90')\n"
            "except ImportError as e:\n    print('decode:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60, cwd=str(CLIENT_SRC))
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = r.stdout.decode()
    assert "subscriber: kvrelay.events needs pyzmq (Debian: python3-zmq" in out, out
    assert "decode: kvrelay.events needs msgpack (Debian: python3-msgpack" in out, out


def test_media_are_sets_of_their_own(fake, subscriber):
    """A hash is held per medium (CPU, DISK: kvrelay's RAM and disk tiers), each stored and removed
    apart; the pool holds the union; a stored of a hash already held in that medium is an
    anomaly, one held in the other is not."""
    sub = subscriber(topics=[T])
    fake.open(T)
    fake.publish(T, [("stored", [5], "CPU"), ("stored", [5], "DISK"), ("stored", [6], "DISK")])
    fake.publish(T, [("removed", [5], "CPU")])
    follow(sub, fake, T)
    st = sub.pools[T]
    assert st.hashes == {5, 6} and st.media == {"CPU": set(), "DISK": {5, 6}}, st.media
    assert st.anomalies == 0
    fake.publish(T, [("removed", [5, 6], "DISK"), ("stored", [6], "CPU")])
    follow(sub, fake, T)
    assert st.hashes == {6} and st.media == {"CPU": {6}, "DISK": set()}, st.media
    assert st.anomalies == 0
    fake.publish(T, [("stored", [6], "CPU")])  # held there already
    follow(sub, fake, T)
    assert st.anomalies == 1
