"""The default number of workers (--workers 0) is one per CPU the supervisor may run on: its
affinity mask, which is what a container's cpuset gives it, not every CPU of the node
(src/proc/supervisor.c, worker_count). The test narrows the mask the server inherits with
os.sched_setaffinity before it starts, so a count taken from the online CPUs fails it."""
import os
import re

import pytest

from conftest import Server


def workers_of(srv):
    body = srv.request("GET", "/metrics").body.decode()
    return int(float(re.search(r"^kvrelay_workers (\S+)$", body, re.M).group(1)))


def test_default_workers_follow_the_affinity_mask(tmp_path):
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        pytest.skip(f"needs two CPUs to narrow the mask to one (this process may run on {sorted(mine)})")
    one = {min(mine)}
    os.sched_setaffinity(0, one)
    try:
        narrow = Server(tmp_path, args=["--memory", "32M"], name="narrow").start()
    finally:
        os.sched_setaffinity(0, mine)  # the server forked with one CPU; pytest gets all back
    try:
        assert workers_of(narrow) == 1
        assert "1 workers" in narrow.log_text(), narrow.log_text()
    finally:
        narrow.stop()
    wide = Server(tmp_path, args=["--memory", "32M"], name="wide").start()
    try:
        assert workers_of(wide) == len(mine)
    finally:
        wide.stop()
