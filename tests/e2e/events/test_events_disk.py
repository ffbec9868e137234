"""
The KV events with the disk tier (docs/kv-events.md, "Media"), against the real server: each
medium has its own BlockStored and BlockRemoved. A block read once is copied to disk: stored in
DISK too. Evicted from RAM, it is removed from CPU only (routers still see it, on disk); read
back (promoted), it is stored in CPU again; deleted, it is removed from both. After a restart
on the same tier file the stream holds it in DISK only. A strict follower keeps one set per
medium and finds nothing out of order.
"""
import time

from . import vllm_kv_events as vk
from .conftest import SLOW, kv_path, wait_until
from .test_events_server import events_of

BLOCK = 1 << 20


def media_events(raw, topic, h):
    """[(kind, medium)] of the events of topic naming hash h, in order (the stream opens with
    the pool's first block: AllBlocksCleared, then its BlockStored)."""
    out = []
    for _, e in events_of(raw, topic):
        if not isinstance(e, vk.AllBlocksCleared) and h in e.block_hashes:
            out.append(("stored" if isinstance(e, vk.BlockStored) else "removed", e.medium))
    return out


def start(events_server, tier):
    return events_server("--memory", "16M", "--max-block-size", "1M", "--ssd-path", str(tier), "--ssd-size", "200M",
                         "--ssd-page-size", "16M", "--ssd-window", "16M")


def test_a_block_moves_between_cpu_and_disk(events_server, raw_sub, follower, tmp_path):
    tier = tmp_path / "tier"
    es = start(events_server, tier)
    raw = raw_sub(es)
    raw.ready()
    fol = follower(es, name="media")
    topic = es.topic("m-disk")
    h = 0xD15C0001

    es.put("d/0", h, model="m-disk", size=BLOCK)
    assert es.call("GET", kv_path("d/0"))[0] == 200  # read once: admitted to the disk tier
    raw.wait_for(lambda r: media_events(r, topic, h) == [("stored", "CPU"), ("stored", "DISK")],
                 what="stored in CPU, then in DISK once copied")

    for i in range(24):  # 24 MiB through a 16 MiB arena: d/0, the oldest, is evicted
        es.put(f"f/{i}", 0xF000 + i, model="m-disk", size=BLOCK)
    raw.wait_for(lambda r: media_events(r, topic, h)[2:] == [("removed", "CPU")],
                 what="removed from CPU only: still on disk")
    assert es.call("HEAD", kv_path("d/0"))[0] == 200, "on disk: still there"

    assert es.call("GET", kv_path("d/0"))[0] == 200  # promoted back into RAM
    raw.wait_for(lambda r: media_events(r, topic, h)[3:] == [("stored", "CPU")], what="stored in CPU again")

    fol.pump(0.5)
    fol.catch_up()
    v = fol.view(topic)
    assert h in v.media.get("CPU", set()) and h in v.media.get("DISK", set()), v.media
    assert not fol.violations, fol.violations

    assert es.delete("d/0") == 200
    raw.wait_for(lambda r: sorted(media_events(r, topic, h)[4:]) == [("removed", "CPU"), ("removed", "DISK")],
                 limit=10.0, what="removed from both (the disk copy once the writer reaps the delete)")
    fol.pump(0.5)
    fol.catch_up()
    assert h not in v.hashes and all(h not in s for s in v.media.values()), v.media
    assert not fol.violations, fol.violations


def test_after_a_restart_the_stream_holds_disk_blocks_in_disk_only(events_server, raw_sub, follower, tmp_path):
    tier = tmp_path / "tier"
    es = start(events_server, tier)
    hs = [0xD15C1000 + i for i in range(4)]
    for i, h in enumerate(hs):
        es.put(f"r/{i}", h, model="m-rs", size=BLOCK)
        assert es.call("GET", kv_path(f"r/{i}"))[0] == 200
    wait_until(lambda: es.metric("kvrelay_disk_blocks") >= len(hs), 10 * SLOW, what="every block on disk")
    es.close()
    es.srv.stop()

    again = start(events_server, tier)  # a new segment: RAM starts empty, the tier file is restored
    fol = follower(again, name="restart")
    topic = again.topic("m-rs")
    deadline = time.monotonic() + 10 * SLOW
    while True:
        fol.pump(0.2)
        fol.catch_up([topic])
        v = fol.view(topic)
        if set(hs) <= v.media.get("DISK", set()) or time.monotonic() > deadline:
            break
    assert set(hs) <= v.media.get("DISK", set()), v.media
    assert not set(hs) & v.media.get("CPU", set()), "not in RAM after the restart"
    assert not fol.violations, fol.violations
