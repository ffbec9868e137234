"""
The relay under --tenants (docs/tenancy.md): its filter covers every namespace, so only the
admin token may open it. grpcio against the real server; the token travels as gRPC metadata
(`authorization: Bearer ...`), as HTTP sends it.
"""

import pytest

from .conftest import CONTRACT_MARKER, rpc_status

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


@pytest.mark.parametrize("token,code", [(None, "UNAUTHENTICATED"), ("no-such-token", "UNAUTHENTICATED"),
                                        (TENANT, "PERMISSION_DENIED")])
def test_a_relay_call_without_the_admin_token_is_refused(rs, token, code):
    with pytest.raises(rs.grpc.RpcError) as ei:
        _info(rs, token)
    name, _, details = rpc_status(ei.value)
    assert name == code, (name, details)


def test_the_admin_token_opens_the_relay_and_health_stays_open(rs):
    info = _info(rs, ADMIN)
    assert info.relay.relay_incarnation and info.contract_marker == CONTRACT_MARKER, info
    # a stream as well: the catalog's first message under the admin token
    call = rs.stub.WatchKvPoolCatalog(
        rs.s.pb.WatchKvPoolCatalogRequest(subscriber_id="admin-catalog", contract_marker=CONTRACT_MARKER),
        timeout=10, metadata=[("authorization", f"Bearer {ADMIN}")])
    try:
        msg = rs.reader(call, "catalog").next_msg(5, "catalog snapshot")
        assert len(msg.snapshot.pools) == 1, msg
    finally:
        call.cancel()
    # the standard health service needs no token (probes)
    h = rs.s.hrpc.HealthStub(rs.default_channel).Check(rs.s.hpb.HealthCheckRequest(service=""), timeout=10)
    assert h.status == rs.s.hpb.HealthCheckResponse.SERVING
