"""
The HTTP/1.1 data plane answers a PUT from its head when the head alone decides it: a block
that can never fit is a 413 at once, a PUT without a valid token a 401 before its body, and
what the kernel took from the client by then is bounded by the socket buffers, not the body.
"""

import time

from conftest import KiB, MiB, SLOW, kv_path, parse_raw_response, raw_connect, read_one_response
from h1_raw import _json_error, _req


def test_put_of_max_block_size_into_a_small_arena_is_413_at_once(kvrelay):
    """--max-block-size 64M with --memory 64M: a 64 MiB block plus its key can never fit, so
    the flag is clamped at start and the PUT is refused from its head (it was a 507 from the
    head before the clamp; either way no body byte is waited for)."""
    srv = kvrelay("--memory", "64M", "--max-block-size", "64M")
    s = raw_connect(srv)
    try:
        s.sendall(_req("PUT", kv_path("too-big-for-room"), [("Content-Length", str(64 * MiB))]))
        t0 = time.monotonic()
        r = read_one_response(s, 5 * SLOW)
        _json_error(r, 413)
        assert r.header("connection") == "close", r
        assert time.monotonic() - t0 < 2 * SLOW
    finally:
        s.close()
    srv.assert_consistent()


# ------------------------------------------------------------------ early answers


def _bytes_accepted_before_answer(srv, head, total, headers_extra=()):
    """Sends head, then body bytes as fast as the kernel takes them, until an answer arrives.
    Returns (status, body bytes the kernel accepted from us before the answer)."""
    s = raw_connect(srv)
    s.setblocking(False)
    sent, chunk = 0, b"z" * (256 * KiB)
    deadline = time.monotonic() + 20 * SLOW
    buf = bytearray()
    try:
        s.setblocking(True)
        s.sendall(head)
        s.setblocking(False)
        while time.monotonic() < deadline and sent < total:
            try:
                buf += s.recv(65536)
                if b"\r\n\r\n" in buf:
                    break
            except BlockingIOError:
                pass
            try:
                sent += s.send(chunk[: min(len(chunk), total - sent)])
            except BlockingIOError:
                time.sleep(0.001)  # send buffer full: back off before offering more bytes
            except OSError:
                break
        s.setblocking(True)
        s.settimeout(5 * SLOW)
        while b"\r\n\r\n" not in buf:
            more = s.recv(65536)
            if not more:
                break
            buf += more
    finally:
        s.close()
    status, _, _ = parse_raw_response(bytes(buf))
    return status, sent


def test_401_after_at_most_the_head(kvrelay):
    """A 256 MiB PUT without a valid token is answered before the body: what the kernel took
    from the client by then is bounded by the two socket buffers, not the body."""
    srv = kvrelay("--memory", "64M", "--token", "s3cret", token="s3cret")
    total = 256 * MiB
    head = _req("PUT", kv_path("no-token"), [("Content-Length", str(total))])
    status, sent = _bytes_accepted_before_answer(srv, head, total)
    print(f"401: {sent} body bytes of {total} accepted by the kernel before the answer")
    assert status == 401
    assert sent < 16 * MiB, f"{sent} body bytes accepted before the 401"
    status, sent = _bytes_accepted_before_answer(
        srv, _req("PUT", kv_path("bad-token"), [("Content-Length", str(total)), ("Authorization", "Bearer nope")]), total)
    assert status == 401 and sent < 16 * MiB
