"""
A fake KV event publisher with pyzmq, driven step by step from the test's own thread (no
thread here): the spec's wire (docs/kv-events.md) on an XPUB socket (a PUB that also tells
when a subscription arrived, so a test never publishes into the slow-joiner void) and a ROUTER
that answers replay requests only when serve() is called. A test can lose batches on purpose
(send=False: kept for replay, never sent), evict them from the buffer, make the ROUTER ignore
requests, and restart the stream.

It keeps each topic's set of hashes, so that a consumer's set can be compared with the truth.
"""

import collections
import time

import msgpack
import zmq

END_SEQ = b"\xff" * 8


def encode_event(kind, hashes, fmt, block_size=256, topic_info=("be", "default", "m"), medium="CPU"):
    backend, ns, model = topic_info
    if fmt == "vllm":
        if kind == "stored":
            return ["BlockStored", list(hashes), None, [], block_size, None, medium, None]
        if kind == "removed":
            return ["BlockRemoved", list(hashes), medium]
        return ["AllBlocksCleared"]
    if fmt == "vllm-map":
        if kind == "stored":
            return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None, "token_ids": [],
                    "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None}
        if kind == "removed":
            return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium}
        return {"type": "AllBlocksCleared"}
    assert fmt == "rfc1527", fmt
    base = {"backend_id": backend, "tenant_id": ns, "model_name": model}
    if kind == "stored":
        return {"event_type": "stored", "type": "BlockStored", "seq_hashes": list(hashes),
                "block_hashes": list(hashes), "medium": medium, "block_size": block_size, **base}
    if kind == "removed":
        return {"event_type": "removed", "type": "BlockRemoved", "seq_hashes": list(hashes),
                "block_hashes": list(hashes), "medium": medium, **base}
    return {"event_type": "cleared", "type": "AllBlocksCleared", **base}


class Stream:
    def __init__(self):
        self.next_seq = 0
        self.hashes = set()  # held in any medium
        self.media = {}  # medium -> hashes held there


class FakePublisher:
    def __init__(self, ctx, fmt="vllm", buffer=10_000, max_batch=4, pub_ep="tcp://127.0.0.1:*",
                 replay_ep="tcp://127.0.0.1:*"):
        self.ctx = ctx
        self.fmt = fmt
        self.buffer_cap = buffer
        self.max_batch = max_batch
        self.streams = {}
        self.buffer = collections.deque()  # (topic, seq, payload), all topics, FIFO
        self.first_kept = {}  # topic -> the oldest seq the buffer holds
        self.ignore_requests = 0  # the next N replay requests get no answer at all
        self.requests = []  # (topic, start) of every request served
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.SNDHWM, 1_000_000)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        try:
            self.pub.bind(pub_ep)
            self.router.bind(replay_ep)
        except zmq.ZMQError:
            self.close()
            raise
        self.pub_ep = self.pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_ep = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self):
        self.pub.close(linger=0)
        self.router.close(linger=0)

    def wait_subscribed(self, timeout=5.0, count=1, sub=None):
        """Waits until `count` subscription messages arrived on the XPUB. A SUB socket sends its
        subscriptions on a (re)connection only while its own thread calls into it: pass the
        subscriber whose poll() must run meanwhile."""
        deadline = time.monotonic() + timeout
        got = 0
        while got < count:
            left = deadline - time.monotonic()
            assert left > 0, f"no subscription within {timeout}s ({got} of {count})"
            if sub is not None:
                sub.poll(0.01)
            if self.pub.poll(10 if sub is not None else int(left * 1000) + 1):
                msg = self.pub.recv()
                if msg[:1] == b"\x01":
                    got += 1

    # -- publishing ---------------------------------------------------------------------------

    def stream(self, topic):
        s = self.streams.get(topic)
        if s is None:
            s = self.streams[topic] = Stream()
        return s

    def payload(self, events, topic="kv@be@m", ts=None):
        from kvrelay.events import parse_topic

        info = parse_topic(topic)
        evs = [encode_event(k, h, self.fmt, topic_info=info, medium=(m[0] if m else "CPU")) for k, h, *m in events]
        return msgpack.packb([time.time() if ts is None else ts, evs, 0], use_bin_type=True)

    def publish(self, topic, events, send=True):
        """One batch of events [(kind, hashes[, medium])] (medium "CPU" unless given) as the
        topic's next seq; returns the seq."""
        s = self.stream(topic)
        for kind, hashes, *m in events:
            held = s.media.setdefault(m[0] if m else "CPU", set())
            if kind == "stored":
                held.update(hashes)
            elif kind == "removed":
                held.difference_update(hashes)
            else:
                s.media.clear()
            s.hashes = set().union(*s.media.values())
        seq = s.next_seq
        s.next_seq += 1
        data = self.payload(events, topic)
        self.buffer.append((topic, seq, data))
        self.first_kept.setdefault(topic, seq)
        while len(self.buffer) > self.buffer_cap:
            t, q, _ = self.buffer.popleft()
            self.first_kept[t] = q + 1
        if send:
            self.pub.send_multipart([topic.encode(), seq.to_bytes(8, "big"), data])
        return seq

    def store(self, topic, *hashes, send=True):
        return self.publish(topic, [("stored", [h]) for h in hashes], send)

    def remove(self, topic, *hashes, send=True):
        return self.publish(topic, [("removed", list(hashes))], send)

    def state_batches(self, topic):
        """AllBlocksCleared + BlockStored of every held hash, max_batch events a batch."""
        evs = [("cleared", [])] + [("stored", [h]) for h in sorted(self.stream(topic).hashes)]
        return [evs[i:i + self.max_batch] for i in range(0, len(evs), self.max_batch)]

    def open(self, topic, send=True):
        """A stream's beginning: seq 0.. with the whole state."""
        s = self.stream(topic)
        assert s.next_seq == 0
        seqs = []
        for evs in self.state_batches(topic):
            seqs.append(self.publish(topic, evs, send=send))
        return seqs

    def restart(self, topics=None, send=True):
        """A publisher restart: every stream (or those named) starts again at seq 0 with its
        state; the buffer forgets them."""
        names = list(topics if topics is not None else self.streams)
        self.buffer = collections.deque(e for e in self.buffer if e[0] not in names)
        for t in names:
            self.first_kept.pop(t, None)
            self.streams[t].next_seq = 0
            self.open(t, send=send)

    def evict(self, topic, upto):
        """Drops the topic's kept batches with seq <= upto (a full buffer did that)."""
        self.buffer = collections.deque(e for e in self.buffer if not (e[0] == topic and e[1] <= upto))
        self.first_kept[topic] = upto + 1

    # -- replay -------------------------------------------------------------------------------

    def serve(self, timeout=0.0):
        """Answers the replay requests waiting (after at most timeout for the first)."""
        n = 0
        if timeout and not self.router.poll(int(timeout * 1000)):
            return 0
        for _ in range(1000):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return n
            n += 1
            ident = frames[0]
            if len(frames) not in (3, 4) or frames[1] != b"" or len(frames[2]) != 8:
                continue
            start = int.from_bytes(frames[2], "big")
            topic = frames[3].decode() if len(frames) == 4 else None
            self.requests.append((topic, start))
            if self.ignore_requests:
                self.ignore_requests -= 1
                continue
            s = self.streams.get(topic)
            if s is not None and start < s.next_seq:
                if start < self.first_kept.get(topic, 0):
                    last = s.next_seq - 1
                    for evs in self.state_batches(topic):
                        self.router.send_multipart([ident, b"", last.to_bytes(8, "big"), self.payload(evs, topic)])
                else:
                    for t, q, data in self.buffer:
                        if t == topic and q >= start:
                            self.router.send_multipart([ident, b"", q.to_bytes(8, "big"), data])
            self.router.send_multipart([ident, b"", END_SEQ, b""])
        return n


def pump(sub, fake, until, timeout=5.0, step=0.01):
    """Alternates fake.serve() and sub.poll() until until() is true; bounded by timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fake.serve()
        sub.poll(step)
        if until():
            return True
    fake.serve()
    sub.poll(0)
    return bool(until())
