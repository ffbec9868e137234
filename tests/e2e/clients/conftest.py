"""
Harness for the engine-adapter tests: the real kvrelay-supervisor through tests/e2e/conftest.py's
`kvrelay` fixture (ephemeral loopback ports, stopped by PID), and the kvrelay package imported
from the source tree (clients/python), exactly as `pip install ./clients/python` installs it.

LMCache and SGLang cannot be installed here: each test module holds a driver that calls the
adapters the way the engine does, and names the upstream files it follows. Where an adapter
adapts to the engine's installed interface (LMCache's remote connector, SGLang's HiCacheStorage),
stand-ins of the engine's interface files (upstream/, README there) are loaded under the
engine's module names first (engines.py).
"""

import os
import signal
import sys
from pathlib import Path

import pytest

from conftest import wait_stopped  # noqa: E402  (tests/e2e/conftest.py)
from harness import wait_until  # noqa: E402  (tests/e2e/harness.py)

REPO = Path(__file__).resolve().parents[3]
CLIENT_SRC = REPO / "clients" / "python"
if str(CLIENT_SRC) not in sys.path:
    sys.path.insert(0, str(CLIENT_SRC))

MiB = 1 << 20
KiB = 1 << 10


def kill_server(srv, limit=10.0):
    """SIGKILL the supervisor and every child by PID (a crash, not a shutdown); waits until
    none of them runs. The fixture's stop() reaps afterwards.

    The supervisor is stopped (SIGSTOP, then state T) before anything is killed: killed
    children first, a running supervisor replaces them at once, and a replacement that
    serves before the supervisor's own SIGKILL lands is a server that did not go down."""
    srv.kills_expected = True
    sup = srv.proc.pid
    os.kill(sup, signal.SIGSTOP)
    assert wait_stopped(sup, limit), f"supervisor {sup} did not stop"
    kids = list(srv.children())  # complete now: a stopped supervisor forks nothing
    for p in kids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    srv.proc.kill()
    srv.proc.wait(timeout=limit)
    def alive():
        return [p for p in kids if os.path.exists(f"/proc/{p}") and _state(p) not in ("Z", "X", None)]

    wait_until(lambda: not alive(), limit, interval=0.02, what=f"the children {kids} to die of SIGKILL")


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def pattern(size, seed):
    """size bytes that differ for every seed (a cheap, reproducible stand-in for KV data)."""
    import hashlib

    block = hashlib.blake2b(seed.encode(), digest_size=64).digest() * 1024  # 64 KiB
    reps = size // len(block) + 1
    return memoryview((block * reps)[:size])


@pytest.fixture(scope="session")
def random_pool():
    """64 MiB + 1 MiB of random bytes; slices at different offsets are distinct blocks."""
    return memoryview(bytearray(os.urandom(65 * MiB)))
