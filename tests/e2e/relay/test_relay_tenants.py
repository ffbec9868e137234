"""
The relay under --tenants (docs/tenancy.md): the relay publishes a pool per namespace and model
(issue 23; test_relay_pools.py checks the pools themselves), so every valid token opens it and
sees its own namespace's pools, the admin token all of them; no token or an unknown one is
UNAUTHENTICATED. grpcio against the real server; the token travels as gRPC metadata
(`authorization: Bearer ...`), as HTTP sends it.
"""

import os
import subprocess
import time

import pytest

from .conftest import CONTRACT_MARKER, SLOW, kv_path, rpc_status
from .test_relay_pools import assert_pool_holds, catalog_until

from conftest import BINARY  # noqa: E402

TENANT, ADMIN = "tok-tenant-3c1d", "tok-admin-8e4f"


@pytest.fixture
def rs(relay, tmp_path):
    path = tmp_path / "tenants"
    path.write_text(f"team-a {TENANT}\n")
    return relay("--tenants", str(path), "--admin-token", ADMIN)


def _info(rs, token):
    md = [("authorization", f"Bearer {token}")] if token is not None else None
    return rs.stub.GetRelayInfo(rs.s.pb.RelayInfoRequest(contract_marker=CONTRACT_MARKER), timeout=10,
                                metadata=md)


@pytest.mark.parametrize("token", [None, "no-such-token"])
def test_a_relay_call_without_a_valid_token_is_unauthenticated(rs, token):
    with pytest.raises(rs.grpc.RpcError) as ei:
        _info(rs, token)
    name, _, details = rpc_status(ei.value)
    assert name == "UNAUTHENTICATED", (name, details)


def test_a_tenant_token_opens_the_relay(rs):
    """A tenant's token is accepted: GetRelayInfo answers it with the relay's one incarnation,
    the same the admin token gets."""
    info = _info(rs, TENANT)
    assert info.relay.relay_incarnation and info.contract_marker == CONTRACT_MARKER, info
    assert info.relay.relay_incarnation == _info(rs, ADMIN).relay.relay_incarnation


def test_the_admin_token_opens_the_relay_and_health_stays_open(rs):
    info = _info(rs, ADMIN)
    assert info.relay.relay_incarnation and info.contract_marker == CONTRACT_MARKER, info
    # a stream as well: the catalog's first message under the admin token
    call = rs.stub.WatchKvPoolCatalog(
        rs.s.pb.WatchKvPoolCatalogRequest(subscriber_id="admin-catalog", contract_marker=CONTRACT_MARKER),
        timeout=10, metadata=[("authorization", f"Bearer {ADMIN}")])
    try:
        msg = rs.reader(call, "catalog").next_msg(5, "catalog snapshot")
        # the default pool and team-a's default-model pool, made when the file was loaded
        names = sorted(p.serving_endpoint.namespace for p in msg.snapshot.pools)
        assert names == ["kvrelay", "kvrelay.team-a"], msg
    finally:
        call.cancel()
    # the standard health service needs no token (probes)
    h = rs.s.hrpc.HealthStub(rs.default_channel).Check(rs.s.hpb.HealthCheckRequest(service=""), timeout=10)
    assert h.status == rs.s.hpb.HealthCheckResponse.SERVING


# kvrelay-watch (src/main/kvrelay-watch.c) under --tenants: --token, --token-file or
# KVRELAY_TOKEN travel as the same `authorization` metadata.

WATCH = BINARY.parent / "kvrelay-watch"
SEQ = 0x5EED7E4A47C0FFEE  # the X-KV-Sequence-Hash of the one block put
NEVER = 0x0DDBA11CAFEF00D5  # a hash never put: "no" is exact


def _watch(argv, env_token=None, timeout=20.0):
    """Runs kvrelay-watch (bounded; stopped by its PID on a timeout): (rc, stdout, stderr)."""
    assert WATCH.is_file(), f"{WATCH} is not built"
    env = {k: v for k, v in os.environ.items() if k != "KVRELAY_TOKEN"}
    if env_token is not None:
        env["KVRELAY_TOKEN"] = env_token
    p = subprocess.Popen([str(WATCH), *argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=timeout * SLOW)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate(timeout=10)
    return p.returncode, out, err


@pytest.fixture
def rs_block(rs):
    # put by the admin token, a data token of the namespace `default`: the block is in the
    # default pool, the only pool there is (kvrelay-watch follows the catalog's first pool)
    r = rs.srv.request("PUT", kv_path("watch/one"), body=b"x" * 4096, headers={"X-KV-Sequence-Hash": str(SEQ)},
                       token=ADMIN)
    assert r.status in (200, 201, 204), r
    return rs


def _contains(rs):
    return ["--grpc", rs.target, "--quiet", "--duration", "10", "--contains", hex(SEQ), "--contains", hex(NEVER)]


@pytest.mark.parametrize("token,code", [(None, "UNAUTHENTICATED"), ("no-such-token", "UNAUTHENTICATED")])
def test_watch_without_a_valid_token_is_refused_clearly(rs, token, code):
    extra = [] if token is None else ["--token", token]
    t0 = time.monotonic()
    rc, out, err = _watch(_contains(rs) + extra)
    assert rc == 1 and code in err and out == "", (rc, out, err)
    assert time.monotonic() - t0 < 10 * SLOW  # refused at the first call, not at --duration
    if code == "UNAUTHENTICATED":
        assert "--token" in err, err
    # over a fleet, the node is reported the same way (and the exit status is 1)
    rc, out, err = _watch(["--relay", f"n1={rs.target}", "--lookup", hex(SEQ), "--duration", "10", *extra])
    assert rc == 1 and "n1" in err and code in err, (rc, out, err)


def test_watch_with_the_admin_token_follows_the_relay(rs_block, tmp_path):
    rs = rs_block
    want = [f"0x{SEQ:016x} yes", f"0x{NEVER:016x} no"]
    rc, out, err = _watch(_contains(rs) + ["--token", ADMIN])
    assert rc == 0 and out.splitlines() == want, (rc, out, err)
    # --token-file: its content, trailing whitespace (the newline of an editor, a Secret's) stripped
    tf = tmp_path / "token"
    tf.write_text(f"{ADMIN}\n  \n")
    rc, out, err = _watch(_contains(rs) + ["--token-file", str(tf)])
    assert rc == 0 and out.splitlines() == want, (rc, out, err)
    # KVRELAY_TOKEN without either flag; a flag wins over it
    rc, out, err = _watch(_contains(rs), env_token=ADMIN)
    assert rc == 0 and out.splitlines() == want, (rc, out, err)
    rc, out, err = _watch(_contains(rs) + ["--token", "no-such-token"], env_token=ADMIN)
    assert rc == 1 and "UNAUTHENTICATED" in err, (rc, out, err)
    # a fleet of one, every node's connection with the token
    rc, out, err = _watch(["--relay", f"n1={rs.target}", "--lookup", hex(SEQ), "--token", ADMIN])
    assert rc == 0 and out.splitlines() == [f"0x{SEQ:016x} n1 hash"], (rc, out, err)


def test_watch_with_a_tenant_token_follows_its_own_pool(rs_block):
    """A tenant's token opens its namespace's pool: kvrelay-watch under it answers "yes" for the
    tenant's block and "no" for the admin's (the default pool's) one."""
    rs = rs_block
    mine = 0x7E4A47C0FFEE5EED
    r = rs.srv.request("PUT", kv_path("watch/mine"), body=b"t" * 4096, headers={"X-KV-Sequence-Hash": str(mine)},
                       token=TENANT)
    assert r.status == 201, r
    # the tenant's catalog lists its one pool, whose filter holds the block, before the watch
    # starts (kvrelay-watch answers from the first snapshot it gets)
    lab = ("kvrelay.team-a", "kvrelay")  # --endpoint's namespace . the tenant's, --model
    pools = catalog_until(rs, TENANT, {lab}, "the tenant's catalog")
    assert set(pools) == {lab}, sorted(pools)
    assert_pool_holds(rs, pools[lab], TENANT, [mine], [SEQ], "the tenant's pool")
    rc, out, err = _watch(["--grpc", rs.target, "--quiet", "--duration", "10", "--contains", hex(mine),
                           "--contains", hex(SEQ), "--token", TENANT])
    assert rc == 0 and out.splitlines() == [f"0x{mine:016x} yes", f"0x{SEQ:016x} no"], (rc, out, err)


def test_watch_token_flags_in_error(tmp_path):
    rc, _, err = _watch(["--grpc", "127.0.0.1:1", "--token-file", str(tmp_path / "absent")])
    assert rc == 2 and "absent" in err, err
    rc, _, err = _watch(["--grpc", "127.0.0.1:1", "--token", "two words"])
    assert rc == 2 and "token" in err, err
