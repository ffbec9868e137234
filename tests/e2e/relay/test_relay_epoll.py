"""
The relay's contract re-run over the epoll I/O engine (docs/dataplane.md "I/O engines"): the
tests imported below from test_relay_contract.py run unchanged, with every server given
`--io-engine epoll` (this module overrides the e2e `kvrelay` factory that the `relay`
fixture starts servers through): GetRelayInfo and health, a pool subscription replicated
through snapshot and deltas while PUT/DELETE/eviction traffic runs, heartbeats and a delta on
an idle stream, the load and readiness streams, request validation, a lagging subscriber cut while the other keeps its order, a
stalled snapshot timed out. Each server's log must
name the epoll engine.
"""

import pytest

from .test_relay_contract import (  # noqa: F401
    test_heartbeats_when_idle,
    test_load_and_readiness_streams,
    test_pool_stream_replica_under_traffic,
    test_relay_info_and_health,
    test_request_validation_subscribe_kv_pool,
)
from .test_relay_faults import (  # noqa: F401
    test_lagging_subscriber_cut_other_in_order,
    test_stalled_snapshot_times_out,
)


@pytest.fixture
def kvrelay(kvrelay):
    def start(*args, **kw):
        s = kvrelay(*args, "--io-engine", "epoll", **kw)
        assert "io engine: epoll (--io-engine epoll)" in s.log_text(), s.log_tail(30)
        return s

    return start
