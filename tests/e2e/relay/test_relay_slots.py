"""
The relay's subscriber slots against the real server (docs/concurrency.md, "Subscriber
slots"): pool streams cancelled in the middle of their snapshot must give their snapshot copy
back, so that the next subscriber is served. With two copies, two such cancellations at two
different sequences used to pin both copies until the next generation, and every later pool
subscriber received nothing.
"""

import time

from .conftest import SLOW, describe_end
from .kvrelay_consumer import KIND_SNAPSHOT_CHUNK, PoolReplica, bucket_count_for, check_envelope
from .test_relay_faults import SMALL_WINDOW, put_blocks, wait_for

REPEATS = 20
WHOLE_SNAPSHOT_S = 5.0  # scaled by SLOW under the sanitizers


def _first_chunk_then_cancel(r, producer, name):
    """Subscribes with a small receive window, takes the first snapshot chunk, cancels.
    Returns the sequence the snapshot was taken at."""
    call = r.subscribe(producer, name, stub=r.new_stub(SMALL_WINDOW), timeout=30 * SLOW)
    try:
        first = next(iter(call))
    finally:
        call.cancel()
    assert first.kind == KIND_SNAPSHOT_CHUNK, f"{name}: first message is not a snapshot chunk: {first.kind}"
    return first.sequence


def test_cancelled_mid_snapshot_streams_give_their_copy_back(relay):
    expected = 4194304
    bc = bucket_count_for(expected)  # 2097152 buckets: a 16 MiB snapshot in 4 chunks
    r = relay("--workers", "1", "--expected-unique-blocks", str(expected), "--max-blocks", "4096")
    inc = check_envelope(r.relay_info())
    producer = r.producer()
    assert producer.ckf_format.bucket_count == bc
    put_blocks(r, [0xC000 + i for i in range(32)], "seed")
    r.quiesce()

    for rep in range(REPEATS):
        # two cancellations mid-snapshot, at two different sequences (a PUT in between)
        seq_a = _first_chunk_then_cancel(r, producer, f"cancel-a-{rep}")
        put_blocks(r, [0xD0000 + 2 * rep], f"between-{rep}")
        r.quiesce()
        seq_b = _first_chunk_then_cancel(r, producer, f"cancel-b-{rep}")
        assert seq_b > seq_a, f"round {rep}: both snapshots at sequence {seq_a}: not two copies"
        put_blocks(r, [0xD0001 + 2 * rep], f"after-{rep}")

        # the next subscriber must receive a whole snapshot, promptly
        rep_name = f"whole-{rep}"
        replica = PoolReplica(producer, inc, name=rep_name)
        rd = r.reader(r.subscribe(producer, rep_name, stub=r.new_stub()), rep_name)
        t0 = time.monotonic()
        deadline = t0 + WHOLE_SNAPSHOT_S * SLOW
        while not replica.ready:
            left = deadline - time.monotonic()
            assert left > 0, (
                f"round {rep}: no whole snapshot within {WHOLE_SNAPSHOT_S * SLOW:.0f}s after two "
                f"cancelled snapshots at {seq_a} and {seq_b} ({replica.chunks} chunks received; "
                f"/debug/relay {r.debug_relay()})")
            ev = rd.get(min(left, 0.5))
            if ev is None:
                continue
            assert ev[0] == "msg", f"round {rep}: stream ended: {describe_end(ev)}"
            replica.apply(ev[2])
        assert replica.chunks == 4
        rd.cancel()
    # every cancelled stream released its slot: none is left live
    wait_for(lambda: r.debug_relay()["live_pool_subscribers"] == 0, 5, "no live pool subscriber left")
