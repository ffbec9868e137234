"""
`--io-engine` where io_uring is denied, as under a container runtime's default seccomp profile
(docs/dataplane.md "I/O engines"):

  - auto: the supervisor probes io_uring_setup once, before forking, logs the epoll engine and
    why, and serves; no worker exits or is respawned;
  - uring: exits at once with a clear error, forking no worker (no respawn loop);
  - auto where io_uring works takes io_uring (the workers hold a ring).

io_uring is denied by a seccomp filter installed between fork and exec of the supervisor
(prctl(PR_SET_SECCOMP) with a classic BPF program; filters are inherited by every process it
forks): io_uring_setup fails with EPERM (the errno of Docker's and podman's default profiles
for what they do not allow) or ENOSYS; every other call is allowed. kernel.io_uring_disabled=2
would deny it too, but it is one switch for the whole machine (other tests run beside these),
so it is not touched here.
"""

import ctypes
import errno
import os
import platform
import struct
import subprocess
import time

import pytest

import conftest
from conftest import SLOW, KiB, MiB, make_block, require_binary, server_env
from test_io_engine import assert_engine

_NR_IO_URING_SETUP = 425  # x86_64
_AUDIT_ARCH_X86_64 = 0xC000003E
_ORIG_PREEXEC = conftest._die_with_parent


def _bpf(code, jt, jf, k):
    return struct.pack("HBBI", code, jt, jf, k)


def _deny_io_uring_setup(err):
    """A preexec_fn: the harness's own, then the filter failing io_uring_setup with `err`."""
    prog = b"".join([
        _bpf(0x20, 0, 0, 4),                    # ld [4]: arch
        _bpf(0x15, 0, 3, _AUDIT_ARCH_X86_64),  # not x86_64: allow
        _bpf(0x20, 0, 0, 0),                    # ld [0]: syscall number
        _bpf(0x15, 0, 1, _NR_IO_URING_SETUP),  # io_uring_setup?
        _bpf(0x06, 0, 0, 0x00050000 | err),    # SECCOMP_RET_ERRNO | err
        _bpf(0x06, 0, 0, 0x7FFF0000),          # SECCOMP_RET_ALLOW
    ])
    libc = ctypes.CDLL(None, use_errno=True)
    filt = ctypes.create_string_buffer(prog)
    fprog = ctypes.create_string_buffer(struct.pack("HxxxxxxQ", len(prog) // 8, ctypes.addressof(filt)))

    def preexec(keep=(filt, fprog)):  # the buffers must outlive this call's maker
        _ORIG_PREEXEC()
        if libc.prctl(38, ctypes.c_ulong(1), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            os._exit(121)  # PR_SET_NO_NEW_PRIVS
        if libc.prctl(22, ctypes.c_ulong(2), ctypes.c_void_p(ctypes.addressof(fprog)), ctypes.c_ulong(0),
                      ctypes.c_ulong(0)) != 0:
            os.write(2, f"seccomp filter: {os.strerror(ctypes.get_errno())}\n".encode())
            os._exit(122)  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER

    return preexec


@pytest.fixture
def deny_io_uring(monkeypatch):
    """deny_io_uring(err): servers started afterwards in this test run under the filter."""
    if platform.machine() != "x86_64":
        pytest.skip("the filter's syscall number is x86_64's")

    def deny(err=errno.EPERM):
        monkeypatch.setattr(conftest, "_die_with_parent", _deny_io_uring_setup(err))

    return deny


@pytest.mark.parametrize("err", [errno.EPERM, errno.ENOSYS], ids=["EPERM", "ENOSYS"])
def test_auto_falls_back_to_epoll_when_io_uring_is_denied(kvrelay, deny_io_uring, err):
    deny_io_uring(err)
    s = kvrelay("--memory", "64M", "--workers", "2", "--grpc-bind", "127.0.0.1:0")
    log = s.log_text()
    line = [ln for ln in log.splitlines() if "io engine:" in ln]
    assert len(line) == 1, f"the engine is chosen and logged once, by the supervisor: {line}"
    assert "supervisor" in line[0] and " WARN " in line[0], line[0]
    assert f"io engine: epoll, because io_uring_setup fails: {os.strerror(err)}" in line[0], line[0]
    assert_engine(s, "epoll")
    pids = set(s.worker_pids())
    for size in (16 * KiB, 4 * MiB):
        key = f"denied-{err}-{size}"
        d = make_block(size, key)
        assert s.put(key, d).status == 201
        r = s.get(key)
        assert r.status == 200 and r.body == d
    time.sleep(1.0)  # an observation window, not a wait: a worker that dies late shows up below
    assert set(s.worker_pids()) == pids, "no worker may have exited or been respawned"
    assert s.log_text().count("worker 0 started") == 1, s.log_tail(30)
    assert s.stop() == 0


def test_uring_engine_fails_fast_when_io_uring_is_denied(tmp_path):
    """--io-engine uring under the filter: exit 1 within a moment, the reason on the log, and
    no worker forked (the supervisor decided before forking)."""
    binary = require_binary()
    t0 = time.monotonic()
    p = subprocess.run([binary, "--io-engine", "uring", "--http-bind", "127.0.0.1:0", "--grpc-bind", "off",
                        "--memory", "64M", "--port-file", str(tmp_path / "pf")],
                       env=server_env(), stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=20 * SLOW, preexec_fn=_deny_io_uring_setup(errno.EPERM))
    took = time.monotonic() - t0
    out = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode == 1, (p.returncode, out)
    assert took < 5 * SLOW, took
    assert "--io-engine uring: io_uring_setup fails: Operation not permitted" in out, out
    assert "started (pid" not in out, f"nothing may be forked: {out}"
    assert not (tmp_path / "pf").exists(), "no port file: nothing was bound"


def test_auto_takes_io_uring_where_it_works(kvrelay):
    s = kvrelay("--memory", "64M", "--workers", "1")
    assert "io engine: io_uring (--io-engine auto)" in s.log_text(), s.log_tail(30)
    assert_engine(s, "uring")


def test_bad_engine_name_is_refused():
    p = conftest.run_binary(["--io-engine", "kqueue"])
    assert p.returncode != 0
    assert b"--io-engine must be auto, uring or epoll" in p.stderr, p.stderr
