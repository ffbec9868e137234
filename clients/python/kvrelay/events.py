"""
kvrelay.events — a consumer of kvrelay's KV event stream (vLLM's ZMQ KV-event format), for a
router that wants to know which block hashes each relay pool holds.

    sub = Subscriber("tcp://10.0.0.5:5557", replay_endpoint="tcp://10.0.0.5:5558")
    while serving:
        sub.poll(0.1)                          # applies what arrived; never blocks longer
        for topic, st in sub.pools.items():    # one TopicState per topic seen
            st.hashes                          # the set of hashes the pool holds
            st.seq                             # the last applied sequence number

The wire (docs/kv-events.md): a PUB socket sends `[topic, seq (8 bytes big-endian), payload]`
per batch, one topic per relay pool, `kv@<backend_id>@<model>` for namespace `default` and
`kv@<backend_id>/<namespace>@<model>` for any other; the payload is msgpack
`[ts, events, data_parallel_rank]`. A ROUTER answers replay requests `["", seq8, topic]` with
`["", seq8, payload]` per buffered batch of that topic from seq on, then the end marker
`["", b"\\xff" * 8, b""]`; when the buffer no longer holds seq, with a resync: batches that all
carry the topic's last seq S and begin with AllBlocksCleared (the pool's whole state as of S).

Events are decoded in all three encodings kvrelay writes (`--kv-events-format`), detected per
event: vLLM's positional arrays (`["BlockStored", hashes, ...]`), vLLM's maps tagged by
`"type"`, and the Mooncake RFC #1527 maps (`"event_type"`). Each becomes an `Event`
(kind "stored" | "removed" | "cleared", the hashes, the remaining fields).

What the consumer guarantees, per topic (TopicState):

- exact order: a batch is applied only when its seq is the last applied plus one;
- gap: a seq beyond that asks the ROUTER for a replay from the first missing seq; live batches
  that arrive meanwhile are held (at most `max_held` in all) and applied after it, those the
  replay already covered are dropped. More than `max_held`: the held ones are dropped and
  another replay follows the current one;
- resync: a replay answer that starts, beyond the seq asked for, with AllBlocksCleared
  replaces the set (the server's buffer had lost the seq asked for);
- restart: seq 0 beginning with AllBlocksCleared is a new stream (the publisher restarted):
  the set is replaced. A seq that goes backwards otherwise means a new stream whose beginning
  was missed: a replay from 0 (which answers either the whole new stream or a resync). When
  the SUB socket's connection drops and comes back (a publisher restart looks like that; ZMQ
  reconnects by itself), every topic is replayed from 0 at once, without waiting for a live
  batch: the new stream's first batches went out before the socket had subscribed again.
  Batches older (by their ts) than the current stream's seq 0 are dropped;
- late join: the first batch of a topic with seq > 0 asks for a replay from 0;
- bounded: every replay answer has `replay_timeout` seconds between its messages (then the
  DEALER is replaced and the request sent again, at most `max_attempts` times in a row before
  a pause of `retry_backoff`), and one replay runs at a time (the replies do not name their
  topic).

Without a replay endpoint a gap can only be counted: the topic is marked `exact = False`
until its next seq-0 stream. The consumer runs no thread of its own: everything happens in
`poll()`. python3-zmq (pyzmq) and python3-msgpack are needed, imported at first use.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

log = logging.getLogger("kvrelay.events")

END_SEQ = b"\xff" * 8  # vLLM's END_SEQ: -1 as 8 signed big-endian bytes
TOPIC_PREFIX = "kv@"
STORED, REMOVED, CLEARED = "stored", "removed", "cleared"

# vLLM's tags (array and map forms) and Mooncake RFC #1527's event_type values.
_VLLM_KIND = {"BlockStored": STORED, "BlockRemoved": REMOVED, "AllBlocksCleared": CLEARED}
_RFC_KIND = {"stored": STORED, "removed": REMOVED, "cleared": CLEARED}
# The positional fields after the tag, in vLLM's declaration order (array form).
_VLLM_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}


def _zmq():
    try:
        import zmq
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("kvrelay.events needs pyzmq (Debian: python3-zmq; pip: "
                          "kvrelay[events])") from e
    return zmq


def _msgpack():
    try:
        import msgpack
    except ImportError as e:  # pragma: no cover - depends on the machine
        raise ImportError("kvrelay.events needs msgpack (Debian: python3-msgpack; pip: "
                          "kvrelay[events])") from e
    return msgpack


class DecodeError(ValueError):
    """A payload or event that is not in any of the three encodings."""


@dataclasses.dataclass(frozen=True)
class Event:
    kind: str  # "stored" | "removed" | "cleared"
    hashes: Tuple[int, ...]
    fields: dict  # every other field as sent (block_size, medium, tenant_id, ...)
    form: str  # "vllm" | "vllm-map" | "rfc1527"


@dataclasses.dataclass
class Batch:
    ts: float
    events: List[Event]
    data_parallel_rank: Optional[int]


def _hash_list(v, what) -> Tuple[int, ...]:
    if not isinstance(v, (list, tuple)):
        raise DecodeError(f"{what}: hashes must be an array, not {type(v).__name__}")
    out = []
    for h in v:
        if isinstance(h, bool) or not isinstance(h, (int, bytes)):
            raise DecodeError(f"{what}: a hash must be an integer or bytes, not {type(h).__name__}")
        out.append(h)
    return tuple(out)


def decode_event(ev) -> Event:
    """One event in any of the three encodings (detected from its shape)."""
    if isinstance(ev, (list, tuple)):
        if not ev or ev[0] not in _VLLM_FIELDS:
            raise DecodeError(f"array event with tag {ev[:1]!r}")
        names = _VLLM_FIELDS[ev[0]]
        if len(ev) < 1 + len(names):
            raise DecodeError(f"{ev[0]}: {len(ev) - 1} fields, {len(names)} expected")
        fields = dict(zip(names, ev[1:]))
        hashes = _hash_list(fields.pop("block_hashes"), ev[0]) if names else ()
        return Event(_VLLM_KIND[ev[0]], hashes, fields, "vllm")
    if isinstance(ev, dict):
        if "event_type" in ev:
            kind = _RFC_KIND.get(ev["event_type"])
            if kind is None:
                raise DecodeError(f"event_type {ev['event_type']!r}")
            fields = {k: v for k, v in ev.items() if k not in ("event_type", "seq_hashes")}
            hashes = () if kind == CLEARED else _hash_list(ev.get("seq_hashes"), "rfc1527")
            return Event(kind, hashes, fields, "rfc1527")
        kind = _VLLM_KIND.get(ev.get("type"))
        if kind is None:
            raise DecodeError(f"map event of type {ev.get('type')!r}")
        fields = {k: v for k, v in ev.items() if k not in ("type", "block_hashes")}
        hashes = () if kind == CLEARED else _hash_list(ev.get("block_hashes"), ev["type"])
        return Event(kind, hashes, fields, "vllm-map")
    raise DecodeError(f"event of type {type(ev).__name__}")


def decode_batch(payload: bytes) -> Batch:
    """A PUB/replay payload: msgpack [ts, events, data_parallel_rank?]."""
    msgpack = _msgpack()
    try:
        obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:
        raise DecodeError(f"payload is not msgpack: {e}") from e
    if not isinstance(obj, (list, tuple)) or len(obj) < 2:
        raise DecodeError("payload is not an array [ts, events, ...]")
    ts, events = obj[0], obj[1]
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not isinstance(events, (list, tuple)):
        raise DecodeError("payload is not [ts: float, events: array, ...]")
    rank = obj[2] if len(obj) > 2 else None
    return Batch(float(ts), [decode_event(e) for e in events], rank)


def parse_topic(topic: str) -> Tuple[str, str, str]:
    """(backend_id, namespace, model) of `kv@<backend_id>[/<namespace>]@<model>`."""
    if not topic.startswith(TOPIC_PREFIX):
        raise ValueError(f"not a kvrelay topic: {topic!r}")
    head, at, model = topic[len(TOPIC_PREFIX):].partition("@")
    if not at or not head or not model:
        raise ValueError(f"not a kvrelay topic: {topic!r}")
    backend, _, ns = head.partition("/")
    return backend, ns or "default", model


@dataclasses.dataclass
class TopicState:
    """What the subscriber knows of one pool (one topic)."""

    topic: str
    hashes: set = dataclasses.field(default_factory=set)  # held in any medium
    # medium ("CPU": the server's RAM, "DISK": its disk tier) -> the hashes held there; each
    # medium has its own BlockStored and BlockRemoved (a block copied to disk is in both)
    media: dict = dataclasses.field(default_factory=dict)
    seq: Optional[int] = None  # the last applied seq; None before the first
    ts: float = 0.0  # the ts of the last applied batch
    batches: int = 0  # batches applied (live and replayed)
    events: int = 0  # events applied
    gaps: int = 0  # live seqs beyond the last applied + 1
    replays: int = 0  # replay requests sent for this topic
    resyncs: int = 0  # replay answers that replaced the set (the buffer had lost the seq)
    restarts: int = 0  # new streams seen (another seq 0 with AllBlocksCleared; seq backwards)
    rejoins: int = 0  # replays from 0 after the SUB connection came back (maybe a new stream)
    late_joins: int = 0  # first batch seen with seq > 0
    dropped: int = 0  # live batches dropped as already applied (covered by a replay)
    overflows: int = 0  # times the held batches exceeded max_held and were dropped
    anomalies: int = 0  # stored of a hash already held in that medium, removed of one not held there
    held: collections.deque = dataclasses.field(default_factory=collections.deque, repr=False)
    waiting: bool = False  # a replay is queued or running for this topic
    inexact: bool = False  # applied across a gap that no replay could repair
    replayed_through: int = -1  # the last seq a replay applied (stale live batches up to it)
    stream_ts: Optional[float] = None  # the ts of the current stream's seq 0, when applied
    suspect_restart: bool = False  # a seq went backwards: the replay from 0 tells the rest
    rereplay: bool = False  # ask again once the current replay ends (held ones were dropped)
    failures: int = 0  # replays in a row that brought nothing while something was missing

    @property
    def exact(self) -> bool:
        """The set is the pool's as of `seq`: a stream followed from its beginning (or a
        resync) without an open gap."""
        return self.seq is not None and not self.waiting and not self.inexact and not self.held

    @property
    def backend_id(self) -> str:
        return parse_topic(self.topic)[0]

    @property
    def namespace(self) -> str:
        return parse_topic(self.topic)[1]

    @property
    def model(self) -> str:
        return parse_topic(self.topic)[2]

    def counters(self) -> dict:
        return {k: getattr(self, k) for k in ("batches", "events", "gaps", "replays", "resyncs", "restarts",
                                               "rejoins", "late_joins", "dropped", "overflows", "anomalies")}


class _Replay:
    """The one replay in flight: its topic, the seq asked for, the answer so far."""

    def __init__(self, topic: str, start: int, deadline: float):
        self.topic = topic
        self.start = start
        self.deadline = deadline
        self.messages: List[Tuple[int, bytes]] = []


def _starts_stream(seq: int, batch: Batch) -> bool:
    return seq == 0 and _starts_clear(batch)


def _starts_clear(batch: Batch) -> bool:
    return bool(batch.events) and batch.events[0].kind == CLEARED


class Subscriber:
    """Follows kvrelay's KV events; see the module docstring.

    endpoint         the PUB endpoint to connect to ("tcp://host:port")
    replay_endpoint  the ROUTER endpoint (None: gaps are counted, not repaired)
    topics           topics to follow, each compared exactly (ZMQ subscriptions match by
                     prefix); None: every topic that starts with "kv@"
    rcvhwm           ZMQ_RCVHWM of the SUB socket (None: ZMQ's default, 1000)
    rcvbuf           SO_RCVBUF of the SUB socket in bytes (None: the kernel's)
    replay_timeout   seconds allowed between two messages of a replay answer
    max_held         live batches held, all topics together, while replays run
    max_attempts     replays of one topic in a row that time out or bring nothing while
                     something is missing before the topic rests retry_backoff seconds (from
                     the second such replay on, the request asks from seq 0: a full answer)
    on_event         on_event(topic, seq, event) for every event applied, in order
    context          a zmq.Context (default: the process's shared instance)
    """

    def __init__(self, endpoint: str, replay_endpoint: Optional[str] = None,
                 topics: Optional[Iterable[str]] = None, *, rcvhwm: Optional[int] = None,
                 rcvbuf: Optional[int] = None, replay_timeout: float = 5.0, max_held: int = 100_000,
                 max_attempts: int = 5, retry_backoff: float = 1.0,
                 on_event: Optional[Callable[[str, int, Event], None]] = None, context=None):
        zmq = _zmq()
        _msgpack()
        self._zmq = zmq
        self.endpoint = endpoint
        self.replay_endpoint = replay_endpoint
        self.topics = None if topics is None else [t if isinstance(t, str) else t.decode() for t in topics]
        if self.topics is not None and not self.topics:
            raise ValueError("topics: an empty list follows nothing (None follows every topic)")
        self.replay_timeout = float(replay_timeout)
        self.max_held = int(max_held)
        self.max_attempts = max(1, int(max_attempts))
        self.retry_backoff = float(retry_backoff)
        self.on_event = on_event
        self.pools: Dict[str, TopicState] = {}
        self.reconnects = 0  # the SUB connection dropped and came back
        self.replay_timeouts = 0  # replay answers that stopped coming (the DEALER was replaced)
        self.decode_errors = 0  # batches that could not be decoded (skipped: a gap follows)
        self.foreign = 0  # messages of a topic not followed (a longer topic with our prefix)
        self._held_total = 0
        self._queue: collections.deque = collections.deque()  # topics waiting for their replay
        self._starts: Dict[str, int] = {}  # queued replay -> its start seq
        self._rest_until: Dict[str, float] = {}
        self._replay: Optional[_Replay] = None
        self._closed = False

        self._ctx = context or zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        if rcvhwm is not None:
            self._sub.setsockopt(zmq.RCVHWM, int(rcvhwm))
        if rcvbuf is not None:
            self._sub.setsockopt(zmq.RCVBUF, int(rcvbuf))
        for t in (self.topics if self.topics is not None else [TOPIC_PREFIX]):
            self._sub.setsockopt(zmq.SUBSCRIBE, t.encode())
        # The connection's events: a drop and a reconnect mean the stream may have restarted.
        self._mon = self._sub.get_monitor_socket(zmq.EVENT_CONNECTED)
        self._connected_once = False
        self._sub.connect(endpoint)
        self._dealer = None
        if replay_endpoint is not None:
            self._new_dealer()

    # -- sockets ------------------------------------------------------------------------------

    def _new_dealer(self):
        zmq = self._zmq
        if self._dealer is not None:
            self._dealer.close(linger=0)
        self._dealer = self._ctx.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.connect(self.replay_endpoint)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sub.disable_monitor()
        except Exception:
            pass
        for s in (self._mon, self._sub, self._dealer):
            if s is not None:
                s.close(linger=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the loop -----------------------------------------------------------------------------

    def poll(self, timeout: float = 0.0, max_messages: int = 10_000) -> int:
        """Waits at most timeout seconds for traffic, then handles what is there (at most
        max_messages messages of each socket). Returns the number of batches applied."""
        zmq = self._zmq
        applied = 0
        self._start_next_replay()
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        poller.register(self._mon, zmq.POLLIN)
        if self._dealer is not None:
            poller.register(self._dealer, zmq.POLLIN)
        wait = max(0.0, timeout)
        if self._replay is not None:
            wait = min(wait, max(0.0, self._replay.deadline - time.monotonic()))
        ready = dict(poller.poll(int(wait * 1000)))
        if self._mon in ready:
            self._read_monitor()
        if self._dealer is not None and self._dealer in ready:
            applied += self._read_replay(max_messages)
        if self._sub in ready:
            for _ in range(max_messages):
                try:
                    frames = self._sub.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                applied += self._on_live(frames)
        self._check_replay_deadline()
        self._start_next_replay()
        return applied

    def run_until(self, predicate: Callable[["Subscriber"], bool], timeout: float,
                  step: float = 0.05) -> bool:
        """poll() until predicate(self) is true or timeout seconds passed; the last answer."""
        deadline = time.monotonic() + timeout
        while True:
            if predicate(self):
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return bool(predicate(self))
            self.poll(min(step, left))

    def catch_up(self, topics: Optional[Iterable[str]] = None) -> None:
        """Asks for a replay from the last applied seq + 1 (from 0 for a topic not seen yet)
        of each topic (default: the topics followed, else every topic seen). A stream's last
        batches can be lost without a later one to reveal the gap: this finds them; it also
        gives a named topic its state before its next change."""
        names = list(topics) if topics is not None else list(self.topics or self.pools)
        for t in names:
            st = self._state(t)
            self._ask(st, 0 if st.seq is None else st.seq + 1)

    def idle(self) -> bool:
        """No replay running or queued and nothing held."""
        return self._replay is None and not self._queue and self._held_total == 0

    def hashes(self, topic: str) -> frozenset:
        st = self.pools.get(topic)
        return frozenset(st.hashes) if st else frozenset()

    # -- live batches -------------------------------------------------------------------------

    def _state(self, topic: str) -> TopicState:
        st = self.pools.get(topic)
        if st is None:
            st = self.pools[topic] = TopicState(topic)
        return st

    def _wanted(self, topic: str) -> bool:
        if self.topics is None:
            return topic.startswith(TOPIC_PREFIX)
        return topic in self.topics

    def _read_monitor(self):
        zmq = self._zmq
        from zmq.utils.monitor import recv_monitor_message

        for _ in range(1000):
            try:
                ev = recv_monitor_message(self._mon, zmq.NOBLOCK)
            except zmq.Again:
                return
            if ev["event"] == zmq.EVENT_CONNECTED:
                if self._connected_once:
                    self._reconnected()
                self._connected_once = True

    def _reconnected(self):
        """The SUB connection dropped and came back: the publisher may have restarted (a new
        stream from seq 0, whose first batches went out before this socket subscribed again)
        or not. Either way a replay from 0 of every topic states it exactly: the new stream
        from its beginning, or the old one (whole, or as a resync)."""
        self.reconnects += 1
        if self._dealer is None:
            for st in self.pools.values():
                st.inexact = st.seq is not None
            return
        if self._replay is not None:  # sent to the publisher that went away
            topic = self._replay.topic
            self._replay = None
            self._new_dealer()
            self._starts[topic] = 0
            self._queue.appendleft(topic)
        for st in self.pools.values():
            if st.seq is not None:
                st.rejoins += 1
                self._ask(st, 0)

    def _on_live(self, frames) -> int:
        if len(frames) != 3 or len(frames[1]) != 8:
            self.decode_errors += 1
            return 0
        try:
            topic = frames[0].decode("utf-8")
        except UnicodeDecodeError:
            self.decode_errors += 1
            return 0
        if not self._wanted(topic):
            self.foreign += 1
            return 0
        seq = int.from_bytes(frames[1], "big")
        try:
            batch = decode_batch(frames[2])
        except DecodeError as e:
            log.warning("kvrelay.events: %s seq %d: %s", topic, seq, e)
            self.decode_errors += 1
            return 0
        return self._route(self._state(topic), seq, batch)

    def _route(self, st: TopicState, seq: int, batch: Batch) -> int:
        if st.waiting:
            self._hold(st, seq, batch)
            return 0
        return self._live(st, seq, batch)

    def _hold(self, st: TopicState, seq: int, batch: Batch) -> None:
        if self._held_total >= self.max_held:
            st.overflows += 1
            self._held_total -= len(st.held)
            st.held.clear()
            st.rereplay = True  # what was dropped is asked for once this replay ends
            return
        st.held.append((seq, batch))
        self._held_total += 1

    def _live(self, st: TopicState, seq: int, batch: Batch) -> int:
        """One live batch of a topic with no replay queued or running."""
        if st.stream_ts is not None and batch.ts < st.stream_ts:
            st.dropped += 1  # older than the current stream's beginning: a stream gone
            return 0
        if st.seq is None:
            if _starts_stream(seq, batch):
                return self._apply(st, seq, batch)
            st.late_joins += 1
            return self._repair(st, 0, seq, batch)
        if seq == st.seq + 1:
            return self._apply(st, seq, batch)
        if seq > st.seq + 1:
            st.gaps += 1
            return self._repair(st, st.seq + 1, seq, batch)
        # seq <= the last applied
        if _starts_stream(seq, batch) and batch.ts > st.ts:
            return self._apply(st, seq, batch)  # a new stream, from its beginning
        if seq <= st.replayed_through and batch.ts <= st.ts:
            st.dropped += 1  # published before what a replay already applied
            return 0
        st.suspect_restart = True  # a new stream whose beginning was missed
        return self._repair(st, 0, seq, batch)

    def _repair(self, st: TopicState, start: int, seq: int, batch: Batch) -> int:
        """A batch that cannot be applied in order: a replay from start, the batch held.
        Without a replay endpoint it is applied all the same and the set marked inexact."""
        if self._dealer is None:
            st.inexact = True
            return self._apply(st, seq, batch)
        self._ask(st, start)
        self._hold(st, seq, batch)
        return 0

    def _apply(self, st: TopicState, seq: int, batch: Batch) -> int:
        if _starts_stream(seq, batch):
            if st.seq is not None and batch.ts != st.stream_ts:
                st.restarts += 1
                st.suspect_restart = False
            st.stream_ts = batch.ts
        for ev in batch.events:
            if ev.kind == STORED:
                held = st.media.setdefault(ev.fields.get("medium") or "CPU", set())
                for h in ev.hashes:
                    if h in held:
                        st.anomalies += 1
                    held.add(h)
                    st.hashes.add(h)
            elif ev.kind == REMOVED:
                held = st.media.setdefault(ev.fields.get("medium") or "CPU", set())
                for h in ev.hashes:
                    if h not in held:
                        st.anomalies += 1
                    held.discard(h)
                    if not any(h in other for other in st.media.values()):
                        st.hashes.discard(h)
            else:
                st.hashes.clear()
                st.media.clear()
                st.inexact = False
            if self.on_event is not None:
                self.on_event(st.topic, seq, ev)
        st.seq = seq
        st.ts = max(st.ts, batch.ts) if seq else batch.ts
        st.batches += 1
        st.events += len(batch.events)
        return 1

    # -- replays ------------------------------------------------------------------------------

    def _ask(self, st: TopicState, start: int) -> None:
        if self._dealer is None:
            return
        if st.failures >= 2:
            start = 0  # asking from the gap brought nothing twice: the whole stream instead
        if st.waiting:
            if st.topic in self._starts:  # queued, not sent yet: from the lower seq
                self._starts[st.topic] = min(self._starts[st.topic], start)
            else:
                st.rereplay = True
            return
        st.waiting = True
        self._starts[st.topic] = start
        self._queue.append(st.topic)

    def _start_next_replay(self):
        if self._replay is not None or self._dealer is None:
            return
        now = time.monotonic()
        for _ in range(len(self._queue)):
            topic = self._queue.popleft()
            if self._rest_until.get(topic, 0.0) > now:
                self._queue.append(topic)
                continue
            start = self._starts.pop(topic)
            self.pools[topic].replays += 1
            self._replay = _Replay(topic, start, now + self.replay_timeout)
            self._dealer.send_multipart([b"", start.to_bytes(8, "big"), topic.encode()])
            return

    def _read_replay(self, max_messages: int) -> int:
        zmq = self._zmq
        applied = 0
        for _ in range(max_messages):
            try:
                frames = self._dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            rp = self._replay
            if rp is None:
                continue  # an answer to a request given up on
            if len(frames) != 3 or frames[0] != b"" or len(frames[1]) != 8:
                log.warning("kvrelay.events: malformed replay message (%d frames)", len(frames))
                continue
            rp.deadline = time.monotonic() + self.replay_timeout
            if frames[1] == END_SEQ and frames[2] == b"":
                applied += self._finish_replay(rp)
            else:
                rp.messages.append((int.from_bytes(frames[1], "big"), frames[2]))
        return applied

    def _finish_replay(self, rp: _Replay) -> int:
        """Applies a complete replay answer, then the batches held meanwhile."""
        self._replay = None
        st = self.pools[rp.topic]
        applied = 0
        expect = rp.start
        for seq, payload in rp.messages:
            try:
                batch = decode_batch(payload)
            except DecodeError as e:
                log.warning("kvrelay.events: replay of %s, seq %d: %s", rp.topic, seq, e)
                self.decode_errors += 1
                break
            if applied and seq == expect - 1:
                # the same seq again: only a resync does that, its listing going on
                applied += self._apply(st, seq, batch)
            elif seq == expect:
                applied += self._apply(st, seq, batch)
                expect = seq + 1
            elif seq > expect and _starts_clear(batch):
                st.resyncs += 1  # the buffer no longer held `expect`: the state as of seq
                if st.suspect_restart:
                    st.restarts += 1  # a new stream (its seq 0 is gone from the buffer too)
                    st.suspect_restart = False
                applied += self._apply(st, seq, batch)
                expect = seq + 1
            elif seq < expect:
                continue
            else:
                log.warning("kvrelay.events: replay of %s from %d: seq %d where %d was due", rp.topic,
                            rp.start, seq, expect)
                break
        progressed = applied > 0
        if progressed:
            st.replayed_through = st.seq
        return applied + self._after_replay(st, progressed)

    def _after_replay(self, st: TopicState, progressed: bool) -> int:
        st.waiting = False
        held, st.held = st.held, collections.deque()
        self._held_total -= len(held)
        again, st.rereplay = st.rereplay, False
        missing = bool(held) or again or st.seq is None
        if progressed:
            st.failures = 0
        elif missing:
            st.failures += 1
            if st.failures >= self.max_attempts:
                st.failures = 0
                self._rest_until[st.topic] = time.monotonic() + self.retry_backoff
        applied = 0
        for seq, batch in held:
            applied += self._route(st, seq, batch)
        if again:
            self._ask(st, 0 if st.seq is None else st.seq + 1)
        return applied

    def _check_replay_deadline(self) -> None:
        rp = self._replay
        if rp is None or time.monotonic() < rp.deadline:
            return
        self.replay_timeouts += 1
        log.warning("kvrelay.events: replay of %s from %d: no answer within %.1fs", rp.topic, rp.start,
                    self.replay_timeout)
        self._replay = None
        self._new_dealer()  # late answers to the old request must not be taken for new ones
        st = self.pools[rp.topic]
        st.failures += 1
        if st.failures >= self.max_attempts:
            st.failures = 0
            self._rest_until[rp.topic] = time.monotonic() + self.retry_backoff
        # the topic stays waiting, its held batches with it: the same request goes again
        self._starts[rp.topic] = 0 if st.failures >= 2 else rp.start
        self._queue.append(rp.topic)


__all__ = ["Subscriber", "TopicState", "Event", "Batch", "DecodeError", "decode_batch", "decode_event",
           "parse_topic", "END_SEQ", "STORED", "REMOVED", "CLEARED"]
