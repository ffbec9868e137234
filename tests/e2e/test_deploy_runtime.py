"""
What a cluster sees of the binary (issue 13): --version prints the release and the git commit
it was built from; --log-format json writes one JSON object per line (time, level, role, pid,
message, fields) from the supervisor, every worker and the publisher, with key=value tokens of
the message in fields.
"""

import json
import re
import uuid
from pathlib import Path

from conftest import BINARY, run_binary

KEYS = {"time", "level", "role", "pid", "message", "fields"}
TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_version_prints_release_and_commit():
    p = run_binary(["--version"])
    assert p.returncode == 0, p
    out = p.stdout.decode()
    m = re.fullmatch(r"kvrelay (\d+\.\d+\.\d+) \(commit ([0-9a-f]{12}|unknown)\)\n", out)
    assert m, out
    # the build wrote the same values into its generated header
    hdr = (BINARY.parent / "gen" / "version.h").read_text()
    assert f'#define KVR_VERSION "{m.group(1)}"' in hdr and f'#define KVR_GIT_COMMIT "{m.group(2)}"' in hdr, hdr
    assert "--version" in run_binary(["--help"]).stdout.decode()


def test_json_logs_one_object_per_line_from_every_role(kvrelay):
    seg = Path("/dev/shm") / f"kvrelay-e2e-json-{uuid.uuid4().hex[:8]}.seg"
    try:
        a = kvrelay("--log-format", "json", "--workers", "2", "--memory", "16M", "--segment-path", str(seg))
        assert a.put("j-key", b"j" * 100).status == 201
        assert a.stop() == 0
        b = kvrelay("--log-format", "json", "--workers", "2", "--memory", "16M", "--segment-path", str(seg),
                    name="json-again")
        assert b.get("j-key").status == 200
        assert b.stop() == 0
        objs = []
        for srv in (a, b):
            for ln in srv.log_text().splitlines():
                if not ln.strip():
                    continue
                o = json.loads(ln)  # every line is one object
                assert set(o) == KEYS, o
                assert TIME_RE.match(o["time"]), o
                assert o["level"] in ("debug", "info", "warn", "error"), o
                assert isinstance(o["pid"], int) and o["pid"] > 0, o
                assert isinstance(o["message"], str) and isinstance(o["fields"], dict), o
                objs.append(o)
        roles = {o["role"] for o in objs}
        assert {"supervisor", "publisher", "worker 0", "worker 1"} <= roles, roles
        sup_pids = {o["pid"] for o in objs if o["role"] == "supervisor"}
        assert sup_pids == {a.pid, b.pid}, (sup_pids, a.pid, b.pid)
        reattach = [o for o in objs if o["message"].startswith("segment: re-attach and repair")]
        assert len(reattach) == 1 and isinstance(reattach[0]["fields"]["reattach_ms"], int), reattach
        assert any("starting" in o["message"] and "commit" in o["message"] for o in objs)
    finally:
        if seg.exists():
            seg.unlink()


def test_log_format_is_validated():
    p = run_binary(["--log-format", "yaml"])
    assert p.returncode == 2 and b"--log-format must be text or json" in p.stderr, p
