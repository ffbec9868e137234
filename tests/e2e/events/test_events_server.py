"""
kvrelay's KV event stream (docs/kv-events.md, the contract of issue 24) against the real
kvrelay-supervisor: events off by default; one topic per relay pool (`kv@<backend_id>@<model>`,
`kv@<backend_id>/<ns>@<model>`) and a namespace's events on its own topic only; each encoding
(vllm, vllm-map, rfc1527) decoded and checked field by field (the vLLM forms by the strict
decoder of vllm_kv_events.py); BlockStored / BlockRemoved at a hash's first owner and last
one leaving (two keys with one hash); every stream opening with AllBlocksCleared and what the
pool holds, also after the publisher is SIGKILLed (its PID from the supervisor's children);
replay edge cases (a future seq, an unknown topic, vLLM's topic-less request, a REQ client,
malformed requests counted and unanswered, a resync when the buffer lost the seq); the metrics.

What the store holds is asked independently: POST /batch/exists on the keys the test put.
"""

import os
import signal
import time

import pytest

from . import vllm_kv_events as vk
from .conftest import BACKEND, SLOW, publisher_pid, wait_until

END = b"\xff" * 8
HIGH = 0xF000_0000_0000_0001  # a hash above 2**63: msgpack must carry it as an unsigned integer
MODEL = "kvrelay"  # the server's --model default: pool 0


def u64(n):
    return n.to_bytes(8, "big")


def events_of(raw, topic, fmt="vllm"):
    """[(seq, event)] of every batch of topic the raw SUB holds, strictly decoded, in order."""
    import msgpack

    out = []
    for seq, payload in raw.of(topic):
        batch = msgpack.unpackb(payload, raw=False)
        # [ts: a msgpack float, events, 0] (the strict decoder would also take an integer ts)
        assert isinstance(batch, list) and len(batch) == 3 and type(batch[0]) is float and batch[2] == 0, batch
        if fmt == "rfc1527":
            out += [(seq, ev) for ev in batch[1]]
        else:
            batch = vk.decode_batch(payload, "array" if fmt == "vllm" else "map")
            assert batch.data_parallel_rank == 0, batch
            assert abs(batch.ts - time.time()) < 300, f"ts {batch.ts} is not the wall clock"
            out += [(seq, ev) for ev in batch.events]
    return out


def seqs_of(raw, topic):
    return [s for s, _ in raw.of(topic)]


def replay(zctx, es, start, topic=None, frames=None, limit=5.0):
    """One request on a fresh DEALER; the whole answer [(seq bytes, payload)] up to and without
    the end marker. Fails when the end marker does not come within limit."""
    import zmq

    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(es.replay)
    try:
        if frames is None:
            frames = [b"", u64(start)] + ([] if topic is None else [topic.encode()])
        d.send_multipart(frames)
        out = []
        deadline = time.monotonic() + limit * SLOW
        for _ in range(1_000_000):
            left = deadline - time.monotonic()
            assert left > 0 and d.poll(int(left * 1000) + 1), f"replay {frames!r}: no end marker ({len(out)} messages)"
            msg = d.recv_multipart()
            assert len(msg) == 3 and msg[0] == b"" and len(msg[1]) == 8, f"replay message {msg!r}"
            if msg[1] == END:
                assert msg[2] == b"", f"end marker with payload {msg[2]!r}"
                return out
            out.append((msg[1], msg[2]))
    finally:
        d.close(linger=0)


def no_answer(zctx, es, frames, wait=0.5):
    """Sends frames on a fresh DEALER; True when nothing at all comes back within wait."""
    import zmq

    d = zctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 0)
    d.connect(es.replay)
    try:
        d.send_multipart(frames)
        return not d.poll(int(wait * SLOW * 1000))
    finally:
        d.close(linger=0)


# ---------------------------------------------------------------------------------------------


def test_events_off_by_default(kvrelay):
    srv = kvrelay("--workers", "1", "--memory", "16M")
    text = srv.port_file.read_text()
    assert "http=" in text and "kv_events" not in text, text
    assert "kv events" not in srv.log_text().lower().replace("kv_events", "")


def print_config(env=None):
    from conftest import run_binary

    p = run_binary(["--print-config"], env=env)
    assert p.returncode == 0, p.stderr
    return dict(line.split("=", 1) for line in p.stdout.decode().splitlines() if "=" in line)


def test_flag_defaults():
    """The defaults docs/kv-events.md states (hwm: the next test)."""
    cfg = print_config()
    assert (cfg["kv-events-bind"], cfg["kv-events-replay-bind"], cfg["kv-events-format"]) == ("", "", "vllm")
    assert cfg["kv-events-buffer"] == "10000" and cfg["kv-events-buffer-bytes"] == str(64 << 20)
    assert cfg["kv-events-max-batch"] == "512"
    import socket

    assert cfg["kv-events-backend-id"] == (os.environ.get("POD_NAME") or socket.gethostname()), cfg
    assert print_config({"POD_NAME": "kvrelay-7"})["kv-events-backend-id"] == "kvrelay-7"


def test_hwm_default_bounds_a_stuck_subscriber():
    """docs/kv-events.md: 10,000 batches queued per subscriber by default (vLLM's 100,000 are one
    engine step each; a kvrelay batch holds up to --kv-events-max-batch events)."""
    assert print_config()["kv-events-hwm"] == "10000"
    assert print_config({"KVRELAY_KV_EVENTS_HWM": "500"})["kv-events-hwm"] == "500"


def test_metrics_present(events_server, raw_sub):
    es = events_server()
    raw = raw_sub(es)
    raw.ready()
    es.put("m/1", 11, model="mm")
    es.put("m/2", 12, model="mm")
    es.delete("m/1")
    raw.wait_for(lambda r: any(isinstance(e, vk.BlockRemoved) for _, e in events_of(r, es.topic("mm"))),
                 what="the BlockRemoved of m/1")
    text = es.metrics()
    for name in ("kvrelay_kv_events_batches_total", 'kvrelay_kv_events_total{type="stored"}',
                 'kvrelay_kv_events_total{type="removed"}', 'kvrelay_kv_events_total{type="cleared"}',
                 "kvrelay_kv_events_bytes_total", "kvrelay_kv_events_replays_total",
                 "kvrelay_kv_events_resyncs_total", "kvrelay_kv_events_bad_requests_total",
                 "kvrelay_kv_events_send_errors_total", "kvrelay_kv_events_buffer_batches",
                 "kvrelay_kv_events_buffer_bytes", "kvrelay_kv_events_latency_seconds_count",
                 'kvrelay_kv_events_latency_seconds_bucket{le="+Inf"}'):
        assert any(line.startswith(name + " ") for line in text.splitlines()), f"{name} missing from /metrics"
    assert "# TYPE kvrelay_kv_events_latency_seconds histogram" in text
    assert "# TYPE kvrelay_kv_events_buffer_bytes gauge" in text
    assert es.metric("kvrelay_kv_events_total", 'type="stored"') >= 2
    assert es.metric("kvrelay_kv_events_total", 'type="removed"') >= 1
    assert es.metric("kvrelay_kv_events_batches_total") >= len(raw.of(es.topic("mm")))
    assert es.metric("kvrelay_kv_events_buffer_batches") >= 1 and es.metric("kvrelay_kv_events_bytes_total") > 0
    assert es.metric("kvrelay_kv_events_latency_seconds_count") >= 1


@pytest.mark.parametrize("fmt", ["vllm", "vllm-map", "rfc1527"])
def test_topic_and_format_field_by_field(events_server, raw_sub, fmt):
    es = events_server(fmt=fmt)
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-fmt")
    assert topic == f"kv@{BACKEND}@m-fmt"
    es.put("f/1", HIGH, model="m-fmt")  # opens the pool: seq 0 = AllBlocksCleared + its state
    es.put("f/2", "0x00000000000000ff", model="m-fmt")  # X-KV-Sequence-Hash in hex
    es.delete("f/1")
    es.delete("f/2")
    want_kinds = ["cleared", "stored", "stored", "removed"]

    def kinds(evs):
        out = []
        for _, e in evs:
            k = kind_of(e, fmt)
            if k == "removed" and out and out[-1] == "removed":
                continue  # consecutive removals of one batch coalesce
            out.append(k)
        return out

    raw.wait_for(lambda r: sum(len(hashes_of(e, fmt)) for _, e in events_of(r, topic, fmt)
                               if kind_of(e, fmt) == "removed") >= 2, what=f"the events of {topic}")
    evs = events_of(raw, topic, fmt)
    seqs = seqs_of(raw, topic)
    assert seqs == list(range(len(seqs))), f"seqs of a new pool's stream: {seqs}"
    assert kinds(evs) == want_kinds, evs
    removed = [h for _, e in evs if kind_of(e, fmt) == "removed" for h in hashes_of(e, fmt)]
    stored = [h for _, e in evs if kind_of(e, fmt) == "stored" for h in hashes_of(e, fmt)]
    assert stored == [HIGH, 0xFF] and removed == [HIGH, 0xFF], evs
    for _, e in evs:
        check_fields(e, fmt, ns="default", model="m-fmt")
    # nothing of this pool on another topic: pool 0's and the warm-up's streams say nothing of it
    for t, _s, payload in raw.messages:
        if t != topic:
            assert str(HIGH).encode() not in payload and HIGH.to_bytes(8, "big") not in payload, t


def kind_of(e, fmt):
    if fmt == "rfc1527":
        return e["event_type"]
    return {vk.AllBlocksCleared: "cleared", vk.BlockStored: "stored", vk.BlockRemoved: "removed"}[type(e)]


def hashes_of(e, fmt):
    return e["seq_hashes"] if fmt == "rfc1527" else list(getattr(e, "block_hashes", []))


def check_fields(e, fmt, ns, model):
    """Every field of one event as the spec writes it (block_size: its own test)."""
    if fmt in ("vllm", "vllm-map"):
        # the strict decoder took the field order and types; the values the spec fixes:
        if isinstance(e, vk.BlockStored):
            assert len(e.block_hashes) == 1 and e.parent_block_hash is None and e.token_ids == [], e
            assert e.lora_id is None and e.medium == "CPU" and e.lora_name is None, e
            assert isinstance(e.block_size, int) and e.block_size > 0, e
            assert (e.extra_keys, e.group_idx, e.locality, e.session_id) == (None, None, None, None), e
        elif isinstance(e, vk.BlockRemoved):
            assert e.medium == "CPU" and e.block_hashes, e
        return
    kind = e["event_type"]
    common = {"event_type", "type", "backend_id", "tenant_id", "model_name"}
    if kind == "stored":
        assert set(e) == common | {"seq_hashes", "block_hashes", "medium", "block_size"}, sorted(e)
        assert e["type"] == "BlockStored" and isinstance(e["block_size"], int) and len(e["seq_hashes"]) == 1
    elif kind == "removed":
        assert set(e) == common | {"seq_hashes", "block_hashes", "medium"}, sorted(e)
        assert e["type"] == "BlockRemoved"
    else:
        assert kind == "cleared" and set(e) == common, sorted(e)
        assert e["type"] == "AllBlocksCleared"
    if kind != "cleared":
        assert e["block_hashes"] == e["seq_hashes"] and e["medium"] == "CPU", e
        assert all(type(h) is int and 0 <= h < 1 << 64 for h in e["seq_hashes"]), e
    assert (e["backend_id"], e["tenant_id"], e["model_name"]) == (BACKEND, ns, model), e


def block_sizes(events_server, raw_sub, *args):
    es = events_server(*args)
    raw = raw_sub(es)
    raw.ready()
    es.put("b/1", 77, model="m-bs")
    topic = es.topic("m-bs")
    raw.wait_for(lambda r: any(isinstance(e, vk.BlockStored) for _, e in events_of(r, topic)), what="BlockStored")
    return {e.block_size for _, e in events_of(raw, topic) if isinstance(e, vk.BlockStored)}


@pytest.mark.parametrize("flag", [None, "64"])
def test_block_size_is_the_kv_block_size(events_server, raw_sub, flag):
    """docs/kv-events.md: BlockStored's block_size is the relay's --kv-block-size (16 by default)."""
    sizes = block_sizes(events_server, raw_sub, *([] if flag is None else ["--kv-block-size", flag]))
    assert sizes == {16 if flag is None else int(flag)}, sizes


def test_tenancy_topics(events_server, raw_sub, follower, tmp_path):
    tenants = tmp_path / "tenants"
    tenants.write_text("team-a tok-ev-a\nteam-b tok-ev-b\n")
    es = events_server("--tenants", str(tenants), "--admin-token", "tok-ev-admin", fmt="rfc1527")
    raw = raw_sub(es)
    raw.ready(token="tok-ev-admin")
    h_shared, h_a, h_b = 0xA11, 0xA12, 0xB13
    es.put("t/1", h_shared, token="tok-ev-a")
    es.put("t/2", h_a, token="tok-ev-a", model="m-x")
    es.put("t/1", h_shared, token="tok-ev-b")  # same key and hash, another namespace
    es.put("t/3", h_b, token="tok-ev-b")
    es.put("t/4", 0xD14, token="tok-ev-admin")  # the default namespace
    ta, tax, tb, td = (es.topic(MODEL, "team-a"), es.topic("m-x", "team-a"), es.topic(MODEL, "team-b"),
                       es.topic(MODEL))
    assert ta == f"kv@{BACKEND}/team-a@{MODEL}" and td == f"kv@{BACKEND}@{MODEL}"

    def stored(r, t):
        return {h for _, e in events_of(r, t, "rfc1527") if e["event_type"] == "stored" for h in e["seq_hashes"]}

    raw.wait_for(lambda r: stored(r, ta) == {h_shared} and stored(r, tax) == {h_a} and
                 stored(r, tb) == {h_shared, h_b} and stored(r, td) == {0xD14}, what="every namespace's events")
    for t, ns, model in ((ta, "team-a", MODEL), (tax, "team-a", "m-x"), (tb, "team-b", MODEL), (td, "default", MODEL)):
        for _, e in events_of(raw, t, "rfc1527"):
            check_fields(e, "rfc1527", ns, model)
    topics = {t for t, _, _ in raw.messages}
    assert topics <= {ta, tax, tb, td, es.topic("warmup")}, topics
    # team-a's own hash appears on its topic only
    for t, _s, payload in raw.messages:
        if t != tax:
            assert h_a not in stored_raw(payload), t


def stored_raw(payload):
    import msgpack

    return {h for e in msgpack.unpackb(payload, raw=False)[1] for h in (e.get("seq_hashes") or [])}


def test_two_keys_one_hash(events_server, raw_sub):
    es = events_server()
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-2k")
    h, marker = 0x2222, 0x3333
    es.put("2k/a", h, model="m-2k")
    es.put("2k/b", h, model="m-2k")
    es.put("2k/c", h, model="m-other")  # the same hash in another pool: its own stream
    es.delete("2k/a")
    es.put("2k/m1", marker, model="m-2k")  # a barrier: what the DELETE caused comes before it
    raw.wait_for(lambda r: any(marker in getattr(e, "block_hashes", []) for _, e in events_of(r, topic)),
                 what="the marker's BlockStored")
    evs = [e for _, e in events_of(raw, topic)]
    assert [type(e).__name__ for e in evs] == ["AllBlocksCleared", "BlockStored", "BlockStored"], evs
    assert evs[1].block_hashes == [h] and evs[2].block_hashes == [marker]
    es.delete("2k/b")  # the last owner of h goes
    raw.wait_for(lambda r: any(isinstance(e, vk.BlockRemoved) for _, e in events_of(r, topic)), what="BlockRemoved")
    evs = [e for _, e in events_of(raw, topic)]
    assert isinstance(evs[-1], vk.BlockRemoved) and evs[-1].block_hashes == [h] and len(evs) == 4, evs
    other = [e for _, e in events_of(raw, es.topic("m-other"))]
    assert [type(e).__name__ for e in other] == ["AllBlocksCleared", "BlockStored"] and other[1].block_hashes == [h]


def test_replay_edge_cases(events_server, raw_sub, zctx):
    es = events_server()
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-rp")
    for i in range(5):
        es.put(f"rp/{i}", 0x500 + i, model="m-rp")
    raw.wait_for(lambda r: len([e for _, e in events_of(r, topic) if isinstance(e, vk.BlockStored)]) == 5,
                 what="5 BlockStored")
    last = seqs_of(raw, topic)[-1]
    live = {s: p for s, p in raw.of(topic)}

    # from 0: the whole stream as it was sent, byte for byte
    ans = replay(zctx, es, 0, topic)
    assert [int.from_bytes(s, "big") for s, _ in ans] == list(range(last + 1))
    assert all(p == live[int.from_bytes(s, "big")] for s, p in ans)
    # from the middle
    ans = replay(zctx, es, last, topic)
    assert [int.from_bytes(s, "big") for s, _ in ans] == [last]
    # from a future seq, from far away, of an unknown topic: the end marker only
    assert replay(zctx, es, last + 1, topic) == []
    assert replay(zctx, es, 1 << 62, topic) == []
    assert replay(zctx, es, 0, topic + "x") == []
    assert replay(zctx, es, 0, "kv@nobody@nothing") == []
    # vLLM's own request, without a topic: pool 0's stream (the server's --model)
    pool0 = replay(zctx, es, 0, es.topic(MODEL))
    assert replay(zctx, es, 0) == pool0 and pool0, pool0
    assert isinstance(vk.decode_batch(pool0[0][1]).events[0], vk.AllBlocksCleared)
    # a REQ client (it adds the empty frame itself) gets the first message of the answer
    import zmq

    req = zctx.socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(es.replay)
    try:
        req.send_multipart([u64(last), topic.encode()])
        assert req.poll(int(5000 * SLOW)), "REQ: no answer"
        assert req.recv_multipart() == [u64(last), live[last]]
    finally:
        req.close(linger=0)

    # malformed requests: no answer, each counted
    before = es.metric("kvrelay_kv_events_bad_requests_total")
    bad = [
        [b"", b"\x00" * 7, topic.encode()],  # seq of 7 bytes
        [b"", u64(0), topic.encode(), b"more"],  # one frame too many
        [u64(0), topic.encode()],  # no empty delimiter
        [b"x", u64(0)],  # a delimiter that is not empty
        [b""],  # nothing after the delimiter
    ]
    for frames in bad:
        assert no_answer(zctx, es, frames), f"an answer to the malformed request {frames!r}"
    wait_until(lambda: es.metric("kvrelay_kv_events_bad_requests_total") - before == len(bad), 5 * SLOW,
               what=lambda: f"bad_requests_total + {len(bad)} "
                            f"(now + {es.metric('kvrelay_kv_events_bad_requests_total') - before})")
    # and the socket still answers the good ones
    assert replay(zctx, es, last, topic) == ans


def test_resync_when_the_buffer_lost_the_seq(events_server, raw_sub, zctx):
    es = events_server("--kv-events-buffer", "8", "--kv-events-max-batch", "7")
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-rs")
    keys = {}

    def arrived():  # one operation at a time, each in a batch of its own
        raw.wait_for(lambda r: stored_minus_removed(events_of(r, topic)) == set(keys.values()), what="the live stream")

    for i in range(40):
        keys[f"rs/{i}"] = 0x7000 + i
        es.put(f"rs/{i}", 0x7000 + i, model="m-rs")
        arrived()
        if i % 3 == 0:
            es.delete(f"rs/{i}")
            del keys[f"rs/{i}"]
            arrived()
    last = seqs_of(raw, topic)[-1]
    assert last >= 9, f"too few batches ({last + 1}) to have lost seq 1 from a buffer of 8"
    before = es.metric("kvrelay_kv_events_resyncs_total")
    ans = replay(zctx, es, 1, topic)
    seqs = {int.from_bytes(s, "big") for s, _ in ans}
    assert seqs == {last}, f"a resync is stamped with the last seq {last}: {sorted(seqs)}"
    batches = [vk.decode_batch(p) for _, p in ans]
    assert isinstance(batches[0].events[0], vk.AllBlocksCleared)
    assert all(len(b.events) <= 7 for b in batches), [len(b.events) for b in batches]
    listed = [h for b in batches for e in b.events if isinstance(e, vk.BlockStored) for h in e.block_hashes]
    assert sorted(listed) == sorted(keys.values()), "a resync lists every held hash once"
    assert sum(isinstance(e, vk.AllBlocksCleared) for b in batches for e in b.events) == 1
    assert not any(isinstance(e, vk.BlockRemoved) for b in batches for e in b.events)
    wait_until(lambda: es.metric("kvrelay_kv_events_resyncs_total") == before + 1, 5 * SLOW, what="resyncs_total + 1")
    # what the store holds, asked independently
    held = es.exists_many(list(keys))
    assert all(held.values()), held


# The ROUTER's send queue once held --kv-events-buffer + 2 messages per requester: enough for any
# replay from the buffer, but a resync has one message per --kv-events-max-batch hashes of the
# pool, and past that it was cut without its end marker on every request (found here; fixed on
# kv-events by 2812834). Buffer 4, max-batch 2, 200 hashes: 101 messages, all of them.
def test_resync_larger_than_the_replay_queue(events_server, zctx):
    es = events_server("--kv-events-buffer", "4", "--kv-events-max-batch", "2")
    topic = es.topic("m-big")
    for i in range(200):
        es.put(f"big/{i}", 0xB16000 + i, model="m-big")
    wait_until(lambda: es.metric("kvrelay_kv_events_total", 'type="stored"') >= 200, 5 * SLOW, what="200 stored")
    errors = es.metric("kvrelay_kv_events_send_errors_total")
    ans = replay(zctx, es, 0, topic, limit=3.0)
    listed = sorted(h for _, p in ans for e in vk.decode_batch(p).events if isinstance(e, vk.BlockStored)
                    for h in e.block_hashes)
    assert listed == [0xB16000 + i for i in range(200)] and len(ans) == 101, len(ans)
    assert es.metric("kvrelay_kv_events_send_errors_total") == errors


def stored_minus_removed(evs):
    s = set()
    for _, e in evs:
        if isinstance(e, vk.AllBlocksCleared):
            s.clear()
        elif isinstance(e, vk.BlockStored):
            s.update(e.block_hashes)
        else:
            s.difference_update(e.block_hashes)
    return s


def test_stream_opens_with_state_and_restarts_after_publisher_sigkill(events_server, raw_sub, follower,
                                                                       subscriber, zctx):
    es = events_server("--kv-events-max-batch", "50")
    srv = es.srv
    raw = raw_sub(es)
    fol = follower(es, name="strict")
    sub = subscriber(es)
    ta, tb = es.topic("m-ra"), es.topic("m-rb")
    keys = {}
    for i in range(130):
        model = "m-ra" if i % 2 else "m-rb"
        keys[f"rs/{i}"] = (model, 0x9000 + i)
        es.put(f"rs/{i}", 0x9000 + i, model=model)
        if i % 10 == 0:
            fol.pump()
            sub.poll(0)

    def expected():
        held = es.exists_many(list(keys))
        return {t: {h for k, (m, h) in keys.items() if held[k] and es.topic(m) == t} for t in (ta, tb)}

    def settle(what):
        """Both consumers reach what the store holds (asked with /batch/exists), bounded."""
        want = expected()
        sub.catch_up([ta, tb])
        ok = sub.run_until(lambda s: s.idle() and all(s.hashes(t) == want[t] for t in want), 10 * SLOW)
        assert ok, (f"{what}: kvrelay.events {[(t, len(sub.hashes(t))) for t in want]} != "
                    f"{[len(v) for v in want.values()]}: {[sub.pools.get(t) for t in want]}, idle {sub.idle()}, "
                    f"reconnects {sub.reconnects}, timeouts {sub.replay_timeouts}")
        deadline = time.monotonic() + 10 * SLOW
        while any(fol.hashes(t) != want[t] for t in want) and time.monotonic() < deadline:
            fol.pump(0.05)
            fol.catch_up([ta, tb])
        for t in want:
            assert fol.hashes(t) == want[t], f"{what}: strict follower on {t}"
        return want

    settle("before the kill")
    old = publisher_pid(srv)
    assert old is not None, f"no publisher among {srv.children()}"
    srv.kills_expected = True
    os.kill(old, signal.SIGKILL)
    new = wait_until(lambda: (lambda p: p if p not in (None, old) else None)(publisher_pid(srv)), 15 * SLOW,
                     what="a new publisher")
    # the new stream: seq 0 opens with AllBlocksCleared, then every block the pool holds, in
    # batches of at most 50 events (asked by replay: a SUB misses what a new PUB sends first)
    want = expected()
    for t in (ta, tb):
        ans = wait_until(lambda: replay(zctx, es, 0, t) or None, 10 * SLOW, what=f"the new stream of {t}")
        seqs = [int.from_bytes(s, "big") for s, _ in ans]
        assert seqs == list(range(len(seqs))), seqs
        batches = [vk.decode_batch(p) for _, p in ans]
        assert isinstance(batches[0].events[0], vk.AllBlocksCleared), batches[0]
        assert all(len(b.events) <= 50 for b in batches)
        listed = [h for b in batches for e in b.events if isinstance(e, vk.BlockStored) for h in e.block_hashes]
        assert sorted(listed) == sorted(want[t]), f"{t}: the opening lists what the pool holds"
        assert len(seqs) == (len(want[t]) + 1 + 49) // 50, (len(seqs), len(want[t]))
    # kvrelay.events replays every topic from 0 as soon as its SUB connection is back: exact
    # without waiting for a live batch
    ok = sub.run_until(lambda s: s.idle() and all(s.hashes(t) == want[t] and s.pools[t].restarts for t in want),
                       10 * SLOW)
    assert ok, [sub.pools[t] for t in want]
    for t in (ta, tb):
        st = sub.pools[t]
        assert sub.reconnects >= 1 and st.rejoins >= 1 and st.restarts == 1, st
    # the strict follower notices the new stream from its live batches (seq going backwards)
    deadline = time.monotonic() + 15 * SLOW
    i = 130
    while (fol.view(ta).restarts < 1 or fol.view(tb).restarts < 1) and time.monotonic() < deadline and i < 400:
        model = "m-ra" if i % 2 else "m-rb"
        keys[f"rs/{i}"] = (model, 0x9000 + i)
        es.put(f"rs/{i}", 0x9000 + i, model=model)
        fol.pump(0.01)
        sub.poll(0)
        i += 1
    es.delete("rs/3")
    settle("after the restart")
    assert fol.views[ta].restarts >= 1 and fol.views[tb].restarts >= 1
    for t in (ta, tb):
        assert sub.pools[t].restarts == 1 and sub.pools[t].anomalies == 0, sub.pools[t]
    assert not fol.violations
    assert new != old


def test_events_follow_their_put_within_milliseconds(events_server, raw_sub):
    """An acknowledged PUT's BlockStored reaches a subscriber within --kv-events-interval (5 ms)
    plus a publisher turn, also when no other operation follows it (the pending batch is
    flushed by time, not by the next event). Bounds loose enough for a loaded machine."""
    es = events_server()
    raw = raw_sub(es)
    raw.ready()
    topic = es.topic("m-lat")
    lat = []
    for i in range(60):
        h = 0x1A7000 + i
        es.put(f"lat/{i}", h, model="m-lat")
        t = time.monotonic()
        raw.wait_for(lambda r: any(h in getattr(e, "block_hashes", []) for _, e in events_of(r, topic)[-3:]),
                     what=f"the BlockStored of lat/{i}")
        lat.append(time.monotonic() - t)
    lat.sort()
    p50, worst = lat[len(lat) // 2], lat[-1]
    print(f"PUT acknowledged -> event received: p50 {p50 * 1e3:.2f} ms, max {worst * 1e3:.2f} ms")
    assert p50 < 0.02 * SLOW and worst < 0.5 * SLOW, (p50, worst)
