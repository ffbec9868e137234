"""
The two I/O engines (src/io/uring.c, docs/dataplane.md "I/O engines") against the real server.

  1. The HTTP/1.1 fast path's contract re-run over the epoll engine: the tests imported below
     from test_h1_*.py (the split test_dataplane.py) and test_http_contract.py run here unchanged,
     with every server they start given `--io-engine epoll` (the `srv`, `plain`, `tls_srv`
     and `kvrelay` fixtures are overridden in this module), plus PUT/GET of 16 KiB..64 MiB,
     pipelining and many connections at once. Each server's log must name the epoll engine and its workers
     must hold no io_uring descriptor.

The fallback where io_uring is denied is tests/e2e/test_io_engine_fallback.py; the relay's
re-run over epoll is tests/e2e/relay/test_relay_epoll.py.
"""

import os
import threading

import pytest

from conftest import SLOW, MiB, KiB, kv_path, make_block, module_server, raw_connect

# The contract tests re-run over epoll (collected in this module, so they use its fixtures).
from h1_raw import Reader, _req  # noqa: F401
from test_h1_parser_rules import (  # noqa: F401
    test_length_with_transfer_encoding_is_refused_and_closed,
    test_two_different_lengths_are_refused_and_closed,
    test_bad_content_length_is_a_json_400,
    test_chunked_put_round_trips_and_pipelines,
    test_chunked_body_over_its_cap_is_413,
    test_expect_100_continue,
    test_dedup_hit_consumes_the_body_and_keeps_the_connection,
    test_conflict_answered_from_the_head_then_body_consumed,
)
from test_h1_early_answers import (  # noqa: F401
    test_put_of_max_block_size_into_a_small_arena_is_413_at_once,
    test_401_after_at_most_the_head,
)
from test_h1_progress_timeouts import test_slow_but_moving_transfers_complete_and_stalled_ones_are_cut  # noqa: F401
from test_h1_budgets import (  # noqa: F401
    test_chunked_uploads_in_flight_are_bounded,
    test_puts_beyond_the_inflight_budget_wait_then_503,
    test_out_of_descriptors_pauses_accept_without_spinning,
)
from test_h1_framing import (  # noqa: F401
    test_pipelined_after_chunked_in_one_write,
    test_pipelined_after_chunked_split_at_every_byte,
    test_pipelined_after_large_chunked_body,
    test_pipelined_after_chunked_answered_409_or_dedup,
)
from test_http_contract import (  # noqa: F401
    tx,
    test_block_lifecycle,
    test_block_sizes_roundtrip,
    test_80mib_chunk_of_a_70b_model,
    test_keepalive_http_client,
    test_keepalive_curl,
    test_store_consistent_after_contract_traffic,
)

EPOLL = ("--io-engine", "epoll")


def worker_fd_kinds(srv):
    """For each worker: the anon-inode kinds of its descriptors ("[io_uring]", "[eventpoll]")."""
    out = {}
    for pid in srv.worker_pids():
        kinds = set()
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if link.startswith("anon_inode:"):
                    kinds.add(link[len("anon_inode:"):])
        except FileNotFoundError:
            continue
        out[pid] = kinds
    return out


def assert_engine(srv, engine):
    log = srv.log_text()
    if engine == "epoll":
        assert "io engine: epoll" in log, srv.log_tail(30)
        assert "the loop waits in h2o's epoll" in log, srv.log_tail(30)
    else:
        assert "io engine: io_uring" in log, srv.log_tail(30)
        assert "the loop waits in the io_uring ring" in log, srv.log_tail(30)
    kinds = worker_fd_kinds(srv)
    assert kinds, "no worker to look at"
    for pid, k in kinds.items():
        if engine == "epoll":
            assert "[io_uring]" not in k, f"worker {pid} holds an io_uring under the epoll engine: {k}"
            assert "[eventpoll]" in k, f"worker {pid}: {k}"
        else:
            assert "[io_uring]" in k, f"worker {pid} holds no io_uring: {k}"


@pytest.fixture
def kvrelay(kvrelay):
    """The e2e factory, every server on the epoll engine."""

    def start(*args, **kw):
        s = kvrelay(*args, *EPOLL, **kw)
        assert_engine(s, "epoll")
        return s

    return start


def _module_epoll(tmp_path_factory, name, args, **kw):
    s = module_server(tmp_path_factory, name, args=(*args, *EPOLL), **kw)
    assert_engine(s, "epoll")
    return s


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = _module_epoll(tmp_path_factory, "dataplane-epoll", ("--memory", "256M", "--workers", "2"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    s = _module_epoll(tmp_path_factory, "plain-epoll", ("--memory", "512M", "--workers", "2"))
    yield s
    s.stop()


@pytest.fixture(scope="module")
def tls_srv(tmp_path_factory, tls_cert):
    s = _module_epoll(tmp_path_factory, "tls-epoll", ("--memory", "256M", "--workers", "2"), tls=tls_cert)
    yield s
    s.stop()


# ------------------------------------------------------------------ the epoll engine's own


@pytest.mark.parametrize("size", [16 * KiB, 256 * KiB, 1 * MiB + 17, 16 * MiB, 64 * MiB])
def test_epoll_put_get_sizes(srv, size):
    key = f"ep-size-{size}"
    d = make_block(size, key)
    assert srv.put(key, d, timeout=60).status == 201
    r = srv.get(key, timeout=60)
    assert r.status == 200 and r.body == d, (r.status, len(r.body))
    assert srv.delete(key).status == 200


def test_epoll_pipelined_puts_and_gets_in_one_write(srv):
    """64 PUTs then 64 GETs of 16 KiB written in one go on one connection: answered in order
    (heads and bodies that arrive together are taken apart without a wait in between)."""
    blocks = [make_block(16 * KiB, f"ep-pipe-{i}") for i in range(64)]
    wire = b"".join(_req("PUT", kv_path(f"ep-pipe-{i}"), [("Content-Length", str(len(b)))], b)
                    for i, b in enumerate(blocks))
    wire += b"".join(_req("GET", kv_path(f"ep-pipe-{i}")) for i in range(64))
    s = raw_connect(srv)
    try:
        sender = threading.Thread(target=s.sendall, args=(wire,))
        sender.start()
        rd = Reader(s)
        for i in range(64):
            r = rd.response(10 * SLOW)
            assert r.status == 201, (i, r)
        for i in range(64):
            r = rd.response(10 * SLOW)
            assert r.status == 200 and r.body == blocks[i], (i, r.status, len(r.body))
        sender.join(10 * SLOW)
    finally:
        s.close()


def test_epoll_16_connections_at_once(srv):
    """16 connections, each 8 PUT/GET pairs of 256 KiB and 16 KiB, side by side."""
    errors = []

    def run(n):
        try:
            for j in range(8):
                size = 256 * KiB if j % 2 == 0 else 16 * KiB
                key = f"ep-conc-{n}-{j}"
                d = make_block(size, key)
                r = srv.put(key, d, timeout=30)
                if r.status != 201:
                    errors.append((key, "put", r.status))
                    continue
                g = srv.get(key, timeout=30)
                if g.status != 200 or g.body != d:
                    errors.append((key, "get", g.status, len(g.body)))
        except Exception as e:  # collected and asserted below
            errors.append((n, repr(e)))

    threads = [threading.Thread(target=run, args=(n,)) for n in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 * SLOW)
    assert not any(t.is_alive() for t in threads), "a client thread did not finish"
    assert not errors, errors[:5]
    srv.assert_consistent()


def test_epoll_sigterm_drains_and_exits_0(kvrelay):
    """The drain cancels the workers' outstanding accepts (-ECANCELED) and they exit 0."""
    s = kvrelay("--memory", "64M", "--workers", "2")
    assert s.put("ep-drain", b"x" * 1000).status == 201
    rc = s.stop()
    assert rc == 0, (rc, s.log_tail(30))
    assert s.log_text().count("drained; exiting") >= 2, s.log_tail(30)
