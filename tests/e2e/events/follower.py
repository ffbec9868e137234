"""
StrictFollower: a subscriber of kvrelay's KV events written for the tests from vLLM's
definitions (vllm_kv_events.py) and the replay protocol of the spec (docs/kv-events.md), without
kvrelay.events, so that the package's consumer and the server are both judged by something
else.

It is deliberately simple and synchronous: pump() reads what the SUB socket holds; a gap, a late
join or a stream restart sends a replay request on its DEALER and reads the whole answer there
and then (bounded by replay_timeout), while live messages wait in the SUB socket (where ZMQ's
high-water mark may drop some: the next gap replays them). After its SUB connection dropped and
came back (a publisher restart), each topic's next live batch makes it replay from 0: a new
stream whose seq has passed the old one's would otherwise look like a mere gap.

Strict: every payload goes through the strict decoder (a malformed one raises), every replay
answer is checked against the protocol (frames, consecutive seqs, a resync's messages all
stamped with one seq and opening with AllBlocksCleared), and the set semantics are checked per
event: a BlockStored of a hash the pool already holds, or a BlockRemoved of one it does not,
is a violation (recorded; the tests assert there is none).
"""

import collections
import time

import zmq

from . import vllm_kv_events as vk

END_SEQ = b"\xff" * 8
FORMS = {"vllm": "array", "vllm-map": "map"}


class Violation(AssertionError):
    pass


class TopicView:
    def __init__(self, topic):
        self.topic = topic
        self.hashes = set()  # held in any medium
        self.media = {}  # medium -> the hashes held in it (CPU: the server's RAM, DISK: its disk tier)
        self.seq = None  # the last applied seq
        self.ts = 0.0
        self.replayed_through = -1
        self.stream_ts = None  # ts of the applied seq 0 (AllBlocksCleared) of the current stream
        self.rejoin = False  # the SUB connection came back: the next batch replays from 0
        self.batches = 0
        self.gaps = 0
        self.replays = 0
        self.resyncs = 0
        self.restarts = 0
        self.late_joins = 0
        self.stale = 0
        self.first_batches = []  # the first few batches applied (decoded), for the tests


class StrictFollower:
    def __init__(self, ctx, pub, replay, fmt="vllm", topics=None, rcvhwm=None, rcvbuf=None,
                 replay_timeout=5.0, name="follower", strict_sets=True):
        if fmt not in FORMS:
            raise ValueError(f"the strict follower reads vLLM's forms, not {fmt!r}")
        self.form = FORMS[fmt]
        self.name = name
        self.replay_timeout = replay_timeout
        self.strict_sets = strict_sets
        self.topics = topics
        self.views = {}
        self.violations = []
        self.log = collections.deque(maxlen=200)  # recent (what, topic, seq) for failure messages
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        if rcvbuf is not None:
            self.sub.setsockopt(zmq.RCVBUF, rcvbuf)
        for t in (topics or ["kv@"]):
            self.sub.setsockopt(zmq.SUBSCRIBE, t.encode())
        self.mon = self.sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        self.connects = 0
        self.sub.connect(pub)
        self.dealer = None
        if replay is not None:
            self.dealer = ctx.socket(zmq.DEALER)
            self.dealer.setsockopt(zmq.LINGER, 0)
            self.dealer.connect(replay)

    def close(self):
        try:
            self.sub.disable_monitor()
        except zmq.ZMQError:
            pass
        self.mon.close(linger=0)
        self.sub.close(linger=0)
        if self.dealer is not None:
            self.dealer.close(linger=0)

    def view(self, topic):
        v = self.views.get(topic)
        if v is None:
            v = self.views[topic] = TopicView(topic)
        return v

    def hashes(self, topic):
        v = self.views.get(topic)
        return set(v.hashes) if v else set()

    def total(self, field):
        return sum(getattr(v, field) for v in self.views.values())

    def _violate(self, msg):
        self.violations.append(msg)
        raise Violation(f"{self.name}: {msg}; recent: {list(self.log)[-12:]}")

    # -- live ---------------------------------------------------------------------------------

    def pump(self, timeout=0.0, max_messages=100_000):
        """Handles the live messages there are (waiting at most timeout for the first).
        Returns how many were read."""
        n = 0
        self._monitor()
        if timeout and not self.sub.poll(int(timeout * 1000)):
            return 0
        self._monitor()
        while n < max_messages:
            try:
                frames = self.sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
            self._live(frames)
        return n

    def _monitor(self):
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(1000):
            try:
                ev = recv_monitor_message(self.mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] == zmq.EVENT_CONNECTED:
                self.connects += 1
                if self.connects > 1:
                    for v in self.views.values():
                        v.rejoin = True

    def _live(self, frames):
        if len(frames) != 3:
            self._violate(f"a PUB message of {len(frames)} frames, 3 expected")
        topic_b, seq_b, payload = frames
        if len(seq_b) != 8:
            self._violate(f"seq frame of {len(seq_b)} bytes")
        topic = topic_b.decode("utf-8")
        if self.topics is not None and topic not in self.topics:
            return
        seq = int.from_bytes(seq_b, "big")
        batch = vk.decode_batch(payload, self.form)
        if batch.data_parallel_rank != 0:
            self._violate(f"{topic} seq {seq}: data_parallel_rank {batch.data_parallel_rank!r}, 0 expected")
        self.log.append(("live", topic, seq, len(batch.events)))
        v = self.view(topic)
        if v.stream_ts is not None and batch.ts < v.stream_ts:
            v.stale += 1  # older than the current stream's beginning
            return None
        if v.rejoin:
            v.rejoin = False
            if not (seq == 0 and batch.events and isinstance(batch.events[0], vk.AllBlocksCleared)):
                self._replay(v, 0)
        for _round in range(4):  # a replay makes room for the batch; a second one at most
            if v.seq is None:
                if seq == 0:
                    self._starts_with_clear(topic, seq, batch)
                    return self._apply(v, seq, batch)
                v.late_joins += 1
                self._replay(v, 0)
                continue
            if seq == v.seq + 1:
                return self._apply(v, seq, batch)
            if seq > v.seq + 1:
                v.gaps += 1
                self._replay(v, v.seq + 1)
                if v.seq is not None and seq > v.seq + 1:
                    self._violate(f"{topic}: a replay from the gap ended at {v.seq}, before live seq {seq}")
                continue
            # seq <= v.seq
            if seq == 0 and batch.ts > v.ts and batch.events and isinstance(batch.events[0], vk.AllBlocksCleared):
                v.seq = None  # a new stream from its beginning
                return self._apply(v, seq, batch)
            if seq <= v.replayed_through and batch.ts <= v.ts:
                v.stale += 1  # covered by a replay already
                return None
            self._replay(v, 0)  # a new stream whose beginning this follower missed
            continue
        self._violate(f"{topic}: live seq {seq} could not be placed after the replays (last {v.seq})")

    def _starts_with_clear(self, topic, seq, batch):
        if not batch.events or not isinstance(batch.events[0], vk.AllBlocksCleared):
            self._violate(f"{topic} seq {seq}: a stream's first batch must begin with AllBlocksCleared, "
                          f"got {batch.events[:1]}")

    def _apply(self, v, seq, batch):
        if seq == 0 and batch.events and isinstance(batch.events[0], vk.AllBlocksCleared):
            if v.stream_ts is not None and batch.ts != v.stream_ts:
                v.restarts += 1  # another stream's seq 0 than the one applied before
            v.stream_ts = batch.ts
        for ev in batch.events:
            if isinstance(ev, vk.AllBlocksCleared):
                v.hashes.clear()
                v.media.clear()
            elif isinstance(ev, vk.BlockStored):
                if len(ev.block_hashes) != 1:
                    self._violate(f"{v.topic} seq {seq}: BlockStored of {len(ev.block_hashes)} hashes, one expected")
                if ev.medium not in ("CPU", "DISK"):
                    self._violate(f"{v.topic} seq {seq}: BlockStored of medium {ev.medium!r}")
                held = v.media.setdefault(ev.medium, set())
                for h in ev.block_hashes:
                    if self.strict_sets and h in held:
                        self._violate(f"{v.topic} seq {seq}: BlockStored({h}, {ev.medium}) of a hash the pool "
                                      "holds there already")
                    held.add(h)
                    v.hashes.add(h)
            else:
                held = v.media.setdefault(ev.medium, set())
                for h in ev.block_hashes:
                    if self.strict_sets and h not in held:
                        self._violate(f"{v.topic} seq {seq}: BlockRemoved({h}, {ev.medium}) of a hash the pool "
                                      "does not hold there")
                    held.discard(h)
                    if not any(h in other for other in v.media.values()):
                        v.hashes.discard(h)
        v.seq = seq
        v.ts = max(v.ts, batch.ts) if seq else batch.ts
        v.batches += 1
        if len(v.first_batches) < 8:
            v.first_batches.append((seq, batch))

    # -- replay -------------------------------------------------------------------------------

    def request(self, topic, start, frames=None):
        """Sends one replay request and returns the whole answer: [(seq_bytes, payload)], the
        end marker excluded. Raises Violation when it does not end within replay_timeout."""
        if self.dealer is None:
            self._violate(f"{topic}: a replay is needed and there is no replay endpoint")
        self.dealer.send_multipart(frames if frames is not None else [b"", start.to_bytes(8, "big"), topic.encode()])
        out = []
        deadline = time.monotonic() + self.replay_timeout
        for _ in range(10_000_000):
            left = deadline - time.monotonic()
            if left <= 0 or not self.dealer.poll(int(left * 1000) + 1):
                self._violate(f"{topic}: replay from {start}: no end marker within {self.replay_timeout:.1f}s "
                              f"({len(out)} messages)")
            msg = self.dealer.recv_multipart()
            if len(msg) != 3 or msg[0] != b"" or len(msg[1]) != 8:
                self._violate(f"{topic}: replay message {[len(f) for f in msg]} is not ['', seq8, payload]")
            if msg[1] == END_SEQ:
                if msg[2] != b"":
                    self._violate(f"{topic}: the end marker carries a payload of {len(msg[2])} bytes")
                return out
            out.append((msg[1], msg[2]))
            deadline = time.monotonic() + self.replay_timeout
        self._violate("replay answer without end")

    def _replay(self, v, start):
        v.replays += 1
        answer = self.request(v.topic, start)
        self.log.append(("replay", v.topic, start, len(answer)))
        if not answer:
            return
        seqs = [int.from_bytes(s, "big") for s, _ in answer]
        batches = [vk.decode_batch(p, self.form) for _, p in answer]
        if seqs[0] == start:
            if seqs != list(range(start, start + len(seqs))):
                self._violate(f"{v.topic}: replay from {start} not consecutive: {seqs[:20]}")
            if start == 0:
                self._starts_with_clear(v.topic, 0, batches[0])
                v.seq = None
            for s, b in zip(seqs, batches):
                if v.seq is not None and s <= v.seq:
                    continue
                self._apply(v, s, b)
        else:
            # a resync: every message stamped with the topic's last seq S, AllBlocksCleared first
            if seqs[0] < start:
                self._violate(f"{v.topic}: replay from {start} began at {seqs[0]}")
            if len(set(seqs)) != 1:
                self._violate(f"{v.topic}: resync with several seqs {sorted(set(seqs))[:10]}")
            self._starts_with_clear(v.topic, seqs[0], batches[0])
            v.resyncs += 1
            for b in batches:
                self._apply(v, seqs[0], b)
        v.replayed_through = v.seq

    def catch_up(self, topics=None):
        """Replays from the last applied seq + 1 of each topic (from 0 for one not seen):
        what a stream lost at its end is found this way."""
        for t in (topics if topics is not None else list(self.views)):
            v = self.view(t)
            self._replay(v, 0 if v.seq is None else v.seq + 1)
