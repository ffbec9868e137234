"""
Relay pools per namespace and model (issue 23): the relay publishes one pool, with its own
Cuckoo filter and its own identity, per (namespace, model). The model of a PUT is its
`X-KV-Model` header, else the namespace's `model=` of the tenants file, else `--model`; a pool
is made by the first PUT into it (at most `--max-pools`, and `--max-pools-per-namespace` per
namespace; past that a PUT gets 507), and the pool of (`default`, --model) always exists, as
does, from the load of the tenants file, each configured namespace's pool of its default model
(so that no other namespace can take its room; docs/tenancy.md, "Pools"). Under --tenants the bearer token travels as gRPC
metadata (`authorization: Bearer ...`) and scopes the relay: a tenant sees and follows its
own namespace's pools only, the admin token all of them.

grpcio against the real server; every filter is judged by the fail-closed consumer of
kvrelay_consumer.py (PoolReplica), every wait is bounded (SLOW), every server is stopped by PID
through the fixtures.

A pool is named here by its label (serving_endpoint.namespace, registrations[0].
canonical_model_id): with --endpoint prod/router/generate the pool of tenant namespace `team-a`
and model M is ("prod.team-a", M), the default namespace's is ("prod", M).
"""

import hashlib
import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from .conftest import (
    CONTRACT_MARKER,
    RPC_DEADLINE,
    SERVICE,
    SLOW,
    STREAM_DEADLINE,
    describe_end,
    kv_path,
    rpc_status,
)
from .kvrelay_consumer import (
    DEFAULT_SEED,
    LoadWindowChecker,
    PoolReplica,
    check_descriptor,
    check_envelope,
    occupied_slots,
    prepare,
    producer_key,
)
from .test_relay_contract import drain_replica

from conftest import assert_error  # noqa: E402  (tests/e2e/conftest.py)

TOK_A, TOK_A2, TOK_B, ADMIN = "tok-pa-6d1e", "tok-pa2-0b93", "tok-pb-c4a7", "tok-padmin-93fe"

# The identity case "standard-dc-a" of test_relay_contract.py: its golden digests are those of
# the pool (default namespace, --model) here.
MODEL = "meta/llama"
ENDPOINT = "prod/router/generate"
EP_NS = "prod"
GOLDEN_CACHE = "7d31eb9019357572470605f4a8be687e"
GOLDEN_ROUTE = "18270d3ba03effaec8d167ba02c7752d"
GOLDEN_DC = 0x04F110C98B1BFC48
BASE_ARGS = ("--workers", "2", "--max-blocks", "4096", "--model", MODEL, "--kv-block-size", "512",
             "--hash-format", "standard", "--endpoint", ENDPOINT, "--dc-id", "dc-a")

NS_A, NS_B = f"{EP_NS}.team-a", f"{EP_NS}.team-b"
DEFAULT_POOL = (EP_NS, MODEL)


# ---------------------------------------------------------------------------------------------
# Helpers


def tenants_text(b_model=None):
    """A on two lines (its second token stored as a digest), B with model=b_model if given."""
    sha_a2 = hashlib.sha256(TOK_A2.encode()).hexdigest()
    bm = f" model={b_model}" if b_model else ""
    return ("# namespace token [memory=SIZE] [model=NAME]\n"
            f"team-a {TOK_A}\n"
            f"team-a\tsha256:{sha_a2}\n"
            f"team-b {TOK_B}{bm}\n")


def start_tenants(relay, tmp_path, *extra, text=None):
    path = tmp_path / "tenants"
    path.write_text(text if text is not None else tenants_text())
    rs = relay(*BASE_ARGS, "--tenants", str(path), "--admin-token", ADMIN, *extra)
    rs.tenants_path = path
    return rs


def hashes(tag, n):
    """n distinct nonzero 64-bit sequence hashes, fixed by tag."""
    out = [int.from_bytes(hashlib.sha256(f"{tag}/{i}".encode()).digest()[:8], "little") or 1
           for i in range(n)]
    assert len(set(out)) == n
    return out


def md(token):
    return None if token is None else [("authorization", f"Bearer {token}")]


def put(rs, key, seqhash, token, model=None, size=1000):
    """PUT of one block with X-KV-Sequence-Hash (and X-KV-Model when model is given)."""
    h = {"X-KV-Sequence-Hash": str(seqhash)}
    if model is not None:
        h["X-KV-Model"] = model
    body = (f"<{key}>".encode() * (size // 8 + 1))[:size]
    return rs.srv.request("PUT", kv_path(key), body=body, headers=h, token=token)


def put_new(rs, prefix, hs, token, model=None):
    """PUTs one new block per hash (keys prefix/i); each must answer 201. Returns the keys."""
    keys = []
    for i, h in enumerate(hs):
        key = f"{prefix}/{i}"
        r = put(rs, key, h, token, model)
        assert r.status == 201, f"PUT {key} (token {token}, model {model}): {r!r}"
        keys.append(key)
    return keys


def info(rs, token):
    return rs.new_stub().GetRelayInfo(rs.s.pb.RelayInfoRequest(contract_marker=CONTRACT_MARKER),
                                      timeout=RPC_DEADLINE, metadata=md(token))


def label(d):
    assert len(d.registrations) >= 1, d
    return d.serving_endpoint.namespace, d.registrations[0].canonical_model_id


def pool_key(d):
    """The KvPoolId part of a descriptor's producer (identity version, both digests with their
    sources, dc_id): what stays the same across a restart."""
    return producer_key(d.producer)[0]


def cache_hex(d):
    return d.producer.pool_id.indexer_domain.cache_semantics.digest.hex()


def route_hex(d):
    return d.producer.pool_id.indexer_domain.routing_scope.digest.hex()


def by_label(cat):
    """{label: descriptor} of a catalog message; every descriptor checked, no label twice,
    no pool id twice."""
    out, ids = {}, {}
    for d in cat.snapshot.pools:
        check_descriptor(d)
        lab = label(d)
        assert lab not in out, f"two pools labelled {lab} in the catalog: {cat}"
        k = pool_key(d)
        assert k not in ids, f"pools {ids.get(k)} and {lab} have the same pool id"
        out[lab], ids[k] = d, lab
    return out


def summary(cat):
    return None if cat is None else sorted(label(d) for d in cat.snapshot.pools)


def catalog_until(rs, token, want, what, limit=10.0):
    """The pools ({label: descriptor}) of the first catalog message, on one watch under
    `token`, that lists every label of `want`. A catalog message carries the whole snapshot,
    so later messages of the same watch show pools made after the watch began."""
    call = rs.new_stub().WatchKvPoolCatalog(
        rs.s.pb.WatchKvPoolCatalogRequest(subscriber_id=f"pools-{uuid.uuid4().hex[:8]}",
                                          contract_marker=CONTRACT_MARKER),
        timeout=STREAM_DEADLINE, metadata=md(token))
    rd = rs.reader(call, f"catalog ({what})")
    deadline = time.monotonic() + limit * SLOW
    last = None
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"{what}: no catalog listing {sorted(want)} within {limit}s; last {summary(last)}"
            ev = rd.get(min(left, 0.5))
            if ev is None:
                continue
            assert ev[0] == "msg", f"{what}: catalog stream ended: {describe_end(ev)}"
            last = ev[2]
            check_envelope(last, what=f"{what}: catalog")
            pools = by_label(last)
            if set(want) <= set(pools):
                return pools
    finally:
        rd.cancel()


def subscribe(rs, d, token, name, timeout=STREAM_DEADLINE):
    pb = rs.s.pb
    req = pb.SubscribeKvPoolRequest(subscriber_id=name, contract_marker=CONTRACT_MARKER)
    req.expected_producer.CopyFrom(d.producer)
    return rs.new_stub().SubscribeKvPool(req, timeout=timeout, metadata=md(token))


def follow(rs, d, token, name):
    """(replica, reader) of a subscription to pool d under token."""
    rep = PoolReplica(d.producer, name=name)
    return rep, rs.reader(subscribe(rs, d, token, name), name)


def drain(rd, rep, until, what, limit=10.0, each=None):
    """drain_replica of test_relay_contract.py, with the arguments in this file's order."""
    drain_replica(rd, rep, until, limit, what, each)


def holding(hs):
    return lambda rep: rep.ready and all(rep.contains(h) for h in hs)


def assert_pool_holds(rs, d, token, own, others, name):
    """Subscribes to pool d under token and follows it until every hash of `own` is in its
    filter; then none of `others` may be, and the filter holds exactly len(own) fingerprints
    (a hash of another pool, had it been inserted, would be one more)."""
    rep, rd = follow(rs, d, token, name)
    try:
        drain(rd, rep, holding(own), f"{name}: its {len(own)} hashes")
        leaked = [f"{h:#018x}" for h in others if rep.contains(h)]
        assert not leaked, f"{name}: hashes of other pools in this pool's filter: {leaked}"
        assert occupied_slots(rep.words) == len(set(own)), (
            f"{name}: {occupied_slots(rep.words)} fingerprints for its {len(set(own))} hashes")
    finally:
        rd.cancel()
    return rep


def refusal(fn, what):
    """fn() (a unary call, or a stream whose first message is asked for) must end in an
    RpcError: its (code name, reason, details)."""
    import grpc

    try:
        r = fn()
        if hasattr(r, "__iter__") and not hasattr(r, "SerializeToString"):
            try:
                first = next(iter(r))
            except StopIteration:
                raise AssertionError(f"{what}: the stream ended cleanly, expected an error status")
            finally:
                if hasattr(r, "cancel"):
                    r.cancel()
            raise AssertionError(f"{what}: expected an error status, got a message: {first}")
        raise AssertionError(f"{what}: expected an error status, got {r}")
    except grpc.RpcError as e:
        return rpc_status(e)


# ---------------------------------------------------------------------------------------------
# 1. Scoping of the catalog and of the filters


def test_each_namespace_sees_and_follows_only_its_own_pools(relay, tmp_path):
    """A (tokens A and A2) and B PUT blocks with their own sequence hashes. A's catalog lists
    A's pool only, B's only B's, A2's exactly A's, the admin's every pool (A's, B's and the
    default one); A's pool's filter holds every hash A put and none of B's, B's likewise, and
    the default pool holds only the admin's block (the admin token is a data token of the
    namespace `default`). Proves the relay publishes one filter per namespace and scopes the
    catalog by token."""
    rs = start_tenants(relay, tmp_path)
    ha, hb, hd = hashes("one/a", 9), hashes("one/b", 7), hashes("one/default", 1)
    # A's blocks by both of A's tokens, then B's, then the admin's; the last of each (after
    # every other PUT) is the one the followers wait for
    for i, h in enumerate(ha[:-1]):
        put_new(rs, f"a{i}", [h], TOK_A if i % 2 else TOK_A2)
    put_new(rs, "b", hb[:-1], TOK_B)
    put_new(rs, "a-last", ha[-1:], TOK_A)
    put_new(rs, "b-last", hb[-1:], TOK_B)
    put_new(rs, "d-last", hd, ADMIN)

    a_pool, b_pool = (NS_A, MODEL), (NS_B, MODEL)
    every = catalog_until(rs, ADMIN, {a_pool, b_pool, DEFAULT_POOL}, "the admin's catalog")
    assert set(every) == {a_pool, b_pool, DEFAULT_POOL}, f"admin catalog {sorted(every)}"
    seen = {}
    for token, want in ((TOK_A, a_pool), (TOK_A2, a_pool), (TOK_B, b_pool)):
        pools = catalog_until(rs, token, {want}, f"the catalog under {token}")
        assert set(pools) == {want}, f"the catalog under {token} lists {sorted(pools)}, expected only {want}"
        assert pool_key(pools[want]) == pool_key(every[want]), f"{want}: another pool id than the admin's"
        seen[token] = pools[want]
    assert pool_key(seen[TOK_A]) == pool_key(seen[TOK_A2]), "A and A2 see different pools"
    for lab, d in every.items():
        assert (d.serving_endpoint.component, d.serving_endpoint.endpoint) == ("router", "generate"), (lab, d)

    assert_pool_holds(rs, every[a_pool], TOK_A, ha, hb + hd, "A's pool (token A)")
    assert_pool_holds(rs, every[a_pool], TOK_A2, ha, hb + hd, "A's pool (token A2)")
    assert_pool_holds(rs, every[b_pool], TOK_B, hb, ha + hd, "B's pool (token B)")
    assert_pool_holds(rs, every[DEFAULT_POOL], ADMIN, hd, ha + hb, "the default pool (admin)")
    # the admin follows a tenant's pool as well: the same filter
    assert_pool_holds(rs, every[b_pool], ADMIN, hb, ha + hd, "B's pool (admin)")


# ---------------------------------------------------------------------------------------------
# 2. Refusals


def test_another_namespaces_pool_is_refused_and_no_valid_token_is_unauthenticated(relay, tmp_path):
    """B subscribing to A's pool (and A to the default namespace's pool, or to a pool that exists
    nowhere) ends PERMISSION_DENIED, the admin's subscription to no pool NOT_FOUND;
    the catalog, a subscription and a load stream without a token or with an unknown token end
    UNAUTHENTICATED; GetRelayInfo answers every valid token and health needs none. The refused
    attempts leave the owners' subscriptions working."""
    rs = start_tenants(relay, tmp_path)
    pb = rs.s.pb
    ha, hb = hashes("refuse/a", 2), hashes("refuse/b", 2)
    put_new(rs, "a", ha, TOK_A)
    put_new(rs, "b", hb, TOK_B)
    every = catalog_until(rs, ADMIN, {(NS_A, MODEL), (NS_B, MODEL), DEFAULT_POOL}, "the admin's catalog")
    a_d, b_d = every[(NS_A, MODEL)], every[(NS_B, MODEL)]

    for token, d, what in ((TOK_B, a_d, "B subscribing to A's pool"),
                           (TOK_A, b_d, "A subscribing to B's pool"),
                           (TOK_A2, every[DEFAULT_POOL], "A2 subscribing to the default pool")):
        name, _reason, details = refusal(lambda: subscribe(rs, d, token, "intruder", timeout=RPC_DEADLINE), what)
        assert name == "PERMISSION_DENIED", f"{what}: {name} ({details!r})"

    # a pool that exists nowhere: the same answer to a namespace's token (it learns nothing of
    # which pools exist), POOL_NOT_FOUND to the admin
    ghost = pb.ProducerIdentity()
    ghost.CopyFrom(a_d.producer)
    ghost.pool_id.indexer_domain.cache_semantics.digest = bytes(16 * [0x5A])
    ghost_d = pb.KvPoolDescriptor()
    ghost_d.CopyFrom(a_d)
    ghost_d.producer.CopyFrom(ghost)
    name, _reason, details = refusal(lambda: subscribe(rs, ghost_d, TOK_A, "ghost", timeout=RPC_DEADLINE), "A, no pool")
    assert name == "PERMISSION_DENIED", f"A subscribing to no pool at all: {name} ({details!r})"
    name, reason, details = refusal(lambda: subscribe(rs, ghost_d, ADMIN, "ghost", timeout=RPC_DEADLINE), "admin")
    assert name == "NOT_FOUND", f"the admin subscribing to no pool at all: {name} {reason} ({details!r})"

    watch = lambda token: rs.new_stub().WatchKvPoolCatalog(  # noqa: E731
        pb.WatchKvPoolCatalogRequest(subscriber_id="no-auth", contract_marker=CONTRACT_MARKER),
        timeout=RPC_DEADLINE, metadata=md(token))
    load = lambda token: rs.new_stub().SubscribeKvPoolLoad(  # noqa: E731
        pb.SubscribeKvPoolLoadRequest(subscriber_id="no-auth", contract_marker=CONTRACT_MARKER),
        timeout=RPC_DEADLINE, metadata=md(token))
    for token in (None, "no-such-token", TOK_A + "x"):
        for what, fn in (("the catalog", lambda: watch(token)),
                         ("SubscribeKvPool of A's pool", lambda: subscribe(rs, a_d, token, "anon", RPC_DEADLINE)),
                         ("SubscribeKvPoolLoad", lambda: load(token)),
                         ("GetRelayInfo", lambda: info(rs, token))):
            name, _reason, details = refusal(fn, f"{what} with token {token!r}")
            assert name == "UNAUTHENTICATED", f"{what} with token {token!r}: {name} ({details!r})"

    incs = {check_envelope(info(rs, t), what=f"RelayInfo under {t}") for t in (TOK_A, TOK_A2, TOK_B, ADMIN)}
    assert len(incs) == 1, f"one relay incarnation whoever asks: {incs}"
    health = rs.s.hrpc.HealthStub(rs.channel())
    for token in (None, TOK_B):
        h = health.Check(rs.s.hpb.HealthCheckRequest(service=SERVICE), timeout=RPC_DEADLINE, metadata=md(token))
        assert h.status == rs.s.hpb.HealthCheckResponse.SERVING, (token, h)

    assert_pool_holds(rs, a_d, TOK_A, ha, hb, "A's pool after the refusals")
    assert_pool_holds(rs, b_d, TOK_B, hb, ha, "B's pool after the refusals")


# ---------------------------------------------------------------------------------------------
# 3. and 4. Models and pool identities


def test_models_make_pools_and_the_namespace_model_is_the_default(relay, tmp_path):
    """A's PUTs with X-KV-Model m1 and m2, and without the header, land in three pools of A
    (models m1, m2 and --model): their pool ids differ (the cache-semantics digest follows the
    model, the routing digest is A's for all three) and each filter holds its model's hashes
    only. B has model=mb in the tenants file: its PUTs without the header land in B's mb pool,
    one with X-KV-Model m1 in B's m1 pool (the header wins over model=)."""
    rs = start_tenants(relay, tmp_path, text=tenants_text(b_model="mb"))
    h1, h2, h0 = hashes("model/a-m1", 4), hashes("model/a-m2", 3), hashes("model/a-default", 2)
    hbm, hb1 = hashes("model/b-mb", 3), hashes("model/b-m1", 2)
    put_new(rs, "a-m1", h1[:2], TOK_A, "m1")
    put_new(rs, "a-m2", h2, TOK_A2, "m2")
    put_new(rs, "a-m1-more", h1[2:], TOK_A, "m1")
    put_new(rs, "a-none", h0, TOK_A)
    put_new(rs, "b-none", hbm, TOK_B)
    put_new(rs, "b-m1", hb1, TOK_B, "m1")

    a_want = {(NS_A, "m1"), (NS_A, "m2"), (NS_A, MODEL)}
    b_want = {(NS_B, "mb"), (NS_B, "m1")}
    a_pools = catalog_until(rs, TOK_A, a_want, "A's catalog")
    assert set(a_pools) == a_want, f"A's catalog {sorted(a_pools)}"
    b_pools = catalog_until(rs, TOK_B, b_want, "B's catalog")
    assert set(b_pools) == b_want, f"B's catalog {sorted(b_pools)}: a PUT without X-KV-Model is B's model=mb"
    every = catalog_until(rs, ADMIN, a_want | b_want | {DEFAULT_POOL}, "the admin's catalog")
    assert set(every) == a_want | b_want | {DEFAULT_POOL}, sorted(every)

    for lab, d in every.items():
        assert d.registrations[0].canonical_model_id == lab[1], d.registrations
    caches = {lab: cache_hex(d) for lab, d in every.items()}
    routes = {lab: route_hex(d) for lab, d in every.items()}
    assert len({caches[(NS_A, m)] for m in ("m1", "m2", MODEL)}) == 3, f"A's cache digests {caches}"
    assert len({routes[(NS_A, m)] for m in ("m1", "m2", MODEL)}) == 1, f"A's routing digests {routes}"
    assert caches[(NS_A, MODEL)] == caches[DEFAULT_POOL] == GOLDEN_CACHE, caches
    assert caches[(NS_B, "m1")] == caches[(NS_A, "m1")], "the cache digest is the model's"
    assert caches[(NS_B, "mb")] not in (caches[(NS_A, "m1")], caches[(NS_A, "m2")], GOLDEN_CACHE), caches
    assert routes[(NS_B, "mb")] == routes[(NS_B, "m1")] != routes[(NS_A, "m1")], routes

    own = {(NS_A, "m1"): (TOK_A, h1), (NS_A, "m2"): (TOK_A, h2), (NS_A, MODEL): (TOK_A2, h0),
           (NS_B, "mb"): (TOK_B, hbm), (NS_B, "m1"): (TOK_B, hb1)}
    allh = [h for _, hs in own.values() for h in hs]
    for lab, (token, hs) in own.items():
        assert_pool_holds(rs, every[lab], token, hs, [h for h in allh if h not in hs], f"pool {lab}")


def test_one_model_in_two_namespaces_is_two_pools(relay, tmp_path):
    """The same model m1 in A and in B: two pools whose ids differ by the routing-scope digest
    alone (serving endpoints prod.team-a and prod.team-b), while the cache-semantics digest and
    the dc_id agree; neither is the default pool's routing scope (GOLDEN_ROUTE)."""
    rs = start_tenants(relay, tmp_path)
    ha, hb = hashes("same/a", 2), hashes("same/b", 2)
    put_new(rs, "a", ha, TOK_A, "m1")
    put_new(rs, "b", hb, TOK_B, "m1")
    a_lab, b_lab = (NS_A, "m1"), (NS_B, "m1")
    # (which pools exist besides these is test_a_pool_is_made_by_the_first_put_into_it's)
    every = catalog_until(rs, ADMIN, {a_lab, b_lab, DEFAULT_POOL}, "the admin's catalog")
    a, b = every[a_lab], every[b_lab]
    assert pool_key(a) != pool_key(b), "A's and B's m1 pools must be two pool identities"
    assert cache_hex(a) == cache_hex(b), (cache_hex(a), cache_hex(b))
    assert route_hex(a) != route_hex(b), f"routing digest {route_hex(a)} in both namespaces"
    assert GOLDEN_ROUTE not in (route_hex(a), route_hex(b)) and route_hex(every[DEFAULT_POOL]) == GOLDEN_ROUTE
    assert a.producer.pool_id.dc_id == b.producer.pool_id.dc_id == GOLDEN_DC
    assert (a.serving_endpoint.namespace, b.serving_endpoint.namespace) == (NS_A, NS_B)
    assert_pool_holds(rs, a, TOK_A, ha, hb, "A's m1 pool")
    assert_pool_holds(rs, b, TOK_B, hb, ha, "B's m1 pool")


def test_a_pool_is_made_by_the_first_put_into_it(relay, tmp_path):
    """Before any PUT the admin's catalog lists the default pool and each configured namespace's
    default-model pool (made when the tenants file is loaded), A's catalog A's alone, B's B's
    alone; A's first PUT with X-KV-Model m1 makes (A, m1) and nothing else: A's catalog gains it,
    the admin's too, B's stays as it was."""
    rs = start_tenants(relay, tmp_path)
    a_def, b_def = (NS_A, MODEL), (NS_B, MODEL)
    first = catalog_until(rs, ADMIN, {DEFAULT_POOL, a_def, b_def}, "the admin's catalog before any PUT")
    assert set(first) == {DEFAULT_POOL, a_def, b_def}, f"before any PUT the admin sees {sorted(first)}"
    for token, mine in ((TOK_A, a_def), (TOK_B, b_def)):
        pools = catalog_until(rs, token, {mine}, f"the catalog under {token} before any PUT")
        assert set(pools) == {mine}, f"before any PUT {token} sees {sorted(pools)}"
    h = hashes("first/a-m1", 1)
    put_new(rs, "a", h, TOK_A, "m1")
    a_lab = (NS_A, "m1")
    pools = catalog_until(rs, TOK_A, {a_lab, a_def}, "A's catalog after its first PUT")
    assert set(pools) == {a_lab, a_def}, f"A's catalog after one PUT with X-KV-Model m1: {sorted(pools)}"
    every = catalog_until(rs, ADMIN, {a_lab, a_def, b_def, DEFAULT_POOL}, "the admin's catalog after A's PUT")
    assert set(every) == {a_lab, a_def, b_def, DEFAULT_POOL}, sorted(every)
    assert set(catalog_until(rs, TOK_B, {b_def}, "B's catalog after A's PUT")) == {b_def}
    assert_pool_holds(rs, pools[a_lab], TOK_A, h, [], "A's m1 pool")


# ---------------------------------------------------------------------------------------------
# 5. --max-pools


def test_a_put_past_max_pools_is_refused_and_stores_nothing(relay):
    """--max-pools 2 without tenants: the default pool is one, X-KV-Model m1 makes the second;
    a PUT with m2 gets 507 and stores nothing (GET 404, unique_blocks unchanged, no m2 pool), a
    retry too; the m1 and default pools keep taking PUTs into their own filters."""
    rs = relay(*BASE_ARGS, "--max-pools", "2")
    h1, h2, hd = hashes("max/m1", 2), hashes("max/m2", 1), hashes("max/default", 1)
    assert put(rs, "m1-0", h1[0], None, "m1").status == 201
    for attempt in range(2):
        r = put(rs, "m2-0", h2[0], None, "m2")
        assert_error(r, 507)
        g = rs.srv.request("GET", kv_path("m2-0"), token=None)
        assert g.status == 404, f"attempt {attempt}: a refused PUT left a block: {g!r}"
    assert rs.stats()["unique_blocks"] == 1, rs.stats()
    assert put(rs, "m1-1", h1[1], None, "m1").status == 201
    assert put(rs, "d-0", hd[0], None).status == 201
    assert rs.srv.request("GET", kv_path("m1-1"), token=None).status == 200
    assert rs.stats()["unique_blocks"] == 3, rs.stats()

    m1 = (EP_NS, "m1")
    pools = catalog_until(rs, None, {m1, DEFAULT_POOL}, "the catalog")
    assert set(pools) == {m1, DEFAULT_POOL}, f"catalog {sorted(pools)}: no m2 pool past --max-pools 2"
    assert_pool_holds(rs, pools[m1], None, h1, hd + h2, "the m1 pool")
    assert_pool_holds(rs, pools[DEFAULT_POOL], None, hd, h1 + h2, "the default pool")


def test_a_namespace_past_its_share_of_pools_is_refused_and_others_go_on(relay, tmp_path):
    """--max-pools-per-namespace 3: A has its default-model pool from the load of the file and
    makes two more with X-KV-Model; a third model's PUT gets 507 naming the flag and stores
    nothing, while B still makes a pool of that very model; A's existing pools keep taking PUTs.
    Defaults: 16 pools per segment, 4 per namespace (--help)."""
    rs = start_tenants(relay, tmp_path, "--max-pools-per-namespace", "3")
    ha, hb = hashes("share/a", 4), hashes("share/b", 1)
    assert put(rs, "a-m1", ha[0], TOK_A, "m1").status == 201
    assert put(rs, "a-m2", ha[1], TOK_A, "m2").status == 201
    r = put(rs, "a-m3", ha[2], TOK_A, "m3")
    assert_error(r, 507)
    assert b"--max-pools-per-namespace" in r.body, r.body
    assert rs.srv.request("GET", kv_path("a-m3"), token=TOK_A).status == 404
    assert put(rs, "b-m3", hb[0], TOK_B, "m3").status == 201, "another namespace is not held back"
    assert put(rs, "a-m1-again", ha[3], TOK_A, "m1").status == 201
    want = {(NS_A, MODEL), (NS_A, "m1"), (NS_A, "m2")}
    assert set(catalog_until(rs, TOK_A, want, "A's three pools")) == want


# ---------------------------------------------------------------------------------------------
# 6. Deltas per pool


def test_deltas_reach_only_the_pool_they_belong_to(relay, tmp_path):
    """A and B follow their own pools past the snapshot. A PUT by A arrives on A's stream as a
    delta touching only that hash's two candidate buckets, and B's replica never holds it; a PUT
    by B then arrives on B's stream likewise, and A's replica never holds B's hash."""
    rs = start_tenants(relay, tmp_path)
    ha, hb = hashes("delta/a", 3), hashes("delta/b", 2)
    put_new(rs, "a0", ha[:1], TOK_A)
    put_new(rs, "b0", hb[:1], TOK_B)
    a_lab, b_lab = (NS_A, MODEL), (NS_B, MODEL)
    a_d = catalog_until(rs, TOK_A, {a_lab}, "A's catalog")[a_lab]
    b_d = catalog_until(rs, TOK_B, {b_lab}, "B's catalog")[b_lab]
    rep_a, rd_a = follow(rs, a_d, TOK_A, "A")
    rep_b, rd_b = follow(rs, b_d, TOK_B, "B")
    drain(rd_a, rep_a, holding(ha[:1]), "A's first block")
    drain(rd_b, rep_b, holding(hb[:1]), "B's first block")

    def never(foreign, who):
        def check(rep):
            bad = [f"{h:#018x}" for h in foreign if rep.contains(h)]
            assert not bad, f"{who}'s replica holds another namespace's hashes {bad} (seq {rep.seq})"
        return check

    def touched(rep, before):
        return {i for i in range(len(before)) if before[i] != rep.words[i]}

    def candidates(rep, h):
        _fp, a, b = prepare(h, rep.bucket_count, rep.seed)
        return {a, b}

    assert rep_a.seed == rep_b.seed == DEFAULT_SEED
    foreign = {"A": hb, "B": ha}  # what each replica must never hold
    a_last, b_last = hashes("delta/a-last", 1), hashes("delta/b-last", 1)
    steps = ((TOK_A, ha[1], (rep_a, rd_a), (rep_b, rd_b)),
             (TOK_B, hb[1], (rep_b, rd_b), (rep_a, rd_a)),
             (TOK_A2, ha[2], (rep_a, rd_a), (rep_b, rd_b)))
    for step, (token, h, (mine, mrd), (other, ord_)) in enumerate(steps):
        before, deltas = mine.words[:], mine.deltas
        put_new(rs, f"step{step}", [h], token)
        drain(mrd, mine, holding([h]), f"step {step}: {h:#018x} on {mine.name}'s stream",
              each=never(foreign[mine.name], mine.name))
        assert mine.deltas > deltas, f"step {step}: {h:#018x} reached {mine.name} without a delta"
        extra = touched(mine, before) - candidates(mine, h)
        assert not extra, (f"step {step}: {mine.name}'s filter changed in buckets {sorted(extra)} "
                           f"besides the two of {h:#018x}")
        # the other stream: what it has queued by now (heartbeats at most) is applied and must
        # leave its filter as it was; anything later is caught by the last PUTs below
        other_before = other.words[:]
        for _ in range(1000):
            ev = ord_.get(0.05)
            if ev is None:
                break
            assert ev[0] == "msg", f"{other.name}'s stream ended: {describe_end(ev)}"
            other.apply(ev[2])
            never(foreign[other.name], other.name)(other)
        assert other.words == other_before, (
            f"step {step}: {other.name}'s filter changed in buckets {sorted(touched(other, other_before))} "
            f"for a PUT into {mine.name}'s pool")
    # a last PUT into each pool, after every other one: once each replica holds it, it holds
    # everything published into its pool before, which must be its own hashes only
    put_new(rs, "a-last", a_last, TOK_A)
    put_new(rs, "b-last", b_last, TOK_B)
    drain(rd_a, rep_a, holding(ha + a_last), "A's last block", each=never(hb + b_last, "A"))
    drain(rd_b, rep_b, holding(hb[:2] + b_last), "B's last block", each=never(ha + a_last, "B"))
    assert (occupied_slots(rep_a.words), occupied_slots(rep_b.words)) == (4, 3), (
        occupied_slots(rep_a.words), occupied_slots(rep_b.words))


# ---------------------------------------------------------------------------------------------
# 7. Warm restart


@pytest.fixture
def seg_path():
    p = Path("/dev/shm") / f"kvrelay-e2e-pools-{uuid.uuid4().hex[:12]}.seg"
    yield p
    p.unlink(missing_ok=True)


def test_a_warm_restart_keeps_every_block_in_its_namespace_and_pool(relay, tmp_path, seg_path):
    """Blocks of A (models m1 and --model), of B and of the default namespace; SIGTERM; a
    restart on the same segment with the tenants file's lines reordered (B first). The catalog lists the same pools with the same pool ids (only producer_incarnation
    and layout_generation may change), each pool's filter holds exactly its own hashes again,
    and every block is back in its namespace."""
    path = tmp_path / "tenants"
    path.write_text(tenants_text())
    args = (*BASE_ARGS, "--memory", "64M", "--segment-path", str(seg_path), "--tenants", str(path),
            "--admin-token", ADMIN)
    groups = {  # label: (token, prefix, model header, hashes)
        (NS_A, "m1"): (TOK_A, "a-m1", "m1", hashes("warm/a-m1", 3)),
        (NS_A, MODEL): (TOK_A2, "a-def", None, hashes("warm/a-def", 2)),
        (NS_B, MODEL): (TOK_B, "b-def", None, hashes("warm/b-def", 3)),
        DEFAULT_POOL: (ADMIN, "d-def", None, hashes("warm/d-def", 1)),
    }
    rs = relay(*args)
    keys = {}
    for lab, (token, prefix, model, hs) in groups.items():
        keys[lab] = put_new(rs, prefix, hs, token, model)
    before = catalog_until(rs, ADMIN, set(groups), "the admin's catalog before the restart")
    assert set(before) == set(groups), sorted(before)
    inc0 = check_envelope(info(rs, ADMIN))
    assert rs.srv.stop() == 0, rs.srv.log_tail(30)
    rs.close()

    # the lines reordered: B first, A's digest line before its token
    sha_a2 = hashlib.sha256(TOK_A2.encode()).hexdigest()
    path.write_text(f"team-b {TOK_B}\nteam-a\tsha256:{sha_a2}\nteam-a {TOK_A}\n")
    rs = relay(*args)
    assert check_envelope(info(rs, ADMIN)) != inc0, "a restart is a new relay incarnation"
    after = catalog_until(rs, ADMIN, set(groups), "the admin's catalog after the restart")
    assert set(after) == set(before), f"pools before {sorted(before)}, after {sorted(after)}"
    for lab in groups:
        assert pool_key(after[lab]) == pool_key(before[lab]), f"{lab}: the pool id changed across the restart"
        b, a = before[lab], after[lab]
        assert (a.serving_endpoint, list(a.registrations), a.query_semantics) == (
            b.serving_endpoint, list(b.registrations), b.query_semantics), lab
    a_pools = catalog_until(rs, TOK_A, {(NS_A, "m1"), (NS_A, MODEL)}, "A's catalog after the restart")
    assert set(a_pools) == {(NS_A, "m1"), (NS_A, MODEL)}, sorted(a_pools)

    allh = [h for *_, hs in groups.values() for h in hs]
    for lab, (token, _prefix, _model, hs) in groups.items():
        assert_pool_holds(rs, after[lab], token, hs, [h for h in allh if h not in hs], f"{lab} after the restart")
        for key in keys[lab]:
            r = rs.srv.request("GET", kv_path(key), token=token)
            assert r.status == 200 and r.body.startswith(f"<{key}>".encode()), (lab, key, r)
    # no block of A is B's, none of the default namespace's is A's
    assert rs.srv.request("GET", kv_path(keys[(NS_A, "m1")][0]), token=TOK_B).status == 404
    assert rs.srv.request("GET", kv_path(keys[DEFAULT_POOL][0]), token=TOK_A).status == 404


# ---------------------------------------------------------------------------------------------
# 8. Without --tenants


def test_without_tenants_the_default_pool_is_unchanged_and_models_add_pools(relay):
    """No --tenants: a caller needs no token. Before any PUT the catalog lists the one default
    pool with the golden identity of --model/--endpoint/--dc-id (the single-pool relay's); a PUT
    with X-KV-Model m1 adds an m1 pool (its own cache digest, the same routing scope) and leaves
    the default pool's id as it was; PUTs without the header go to the default pool."""
    rs = relay(*BASE_ARGS)
    check_envelope(rs.relay_info())
    first = catalog_until(rs, None, {DEFAULT_POOL}, "the catalog before any PUT")
    assert set(first) == {DEFAULT_POOL}, sorted(first)
    d0 = first[DEFAULT_POOL]
    assert pool_key(d0) == pool_key(rs.catalog().snapshot.pools[0]) == producer_key(rs.producer())[0]
    assert (cache_hex(d0), route_hex(d0), d0.producer.pool_id.dc_id) == (GOLDEN_CACHE, GOLDEN_ROUTE, GOLDEN_DC)
    assert d0.registrations[0].canonical_model_id == MODEL

    hd, h1 = hashes("plain/default", 3), hashes("plain/m1", 2)
    put_new(rs, "d", hd, None)
    put_new(rs, "m1", h1, None, "m1")
    m1 = (EP_NS, "m1")
    pools = catalog_until(rs, None, {DEFAULT_POOL, m1}, "the catalog with the m1 pool")
    assert set(pools) == {DEFAULT_POOL, m1}, sorted(pools)
    assert pool_key(pools[DEFAULT_POOL]) == pool_key(d0), "the default pool's id moved"
    assert cache_hex(pools[m1]) != GOLDEN_CACHE and route_hex(pools[m1]) == GOLDEN_ROUTE, (
        cache_hex(pools[m1]), route_hex(pools[m1]))
    assert_pool_holds(rs, pools[DEFAULT_POOL], None, hd, h1, "the default pool")
    assert_pool_holds(rs, pools[m1], None, h1, hd, "the m1 pool")


# ---------------------------------------------------------------------------------------------
# 9. Load streams


def test_load_streams_list_only_the_callers_pools(relay, tmp_path):
    """SubscribeKvPoolLoad and SubscribeServingLoad under A's token list A's pools only (both of
    its models), under B's B's only, under the admin's every pool; every window passes the
    consumer's checks."""
    rs = start_tenants(relay, tmp_path, "--load-window", "200ms")
    pb = rs.s.pb
    put_new(rs, "a", hashes("load/a", 2), TOK_A)
    put_new(rs, "a-m1", hashes("load/a-m1", 1), TOK_A, "m1")
    put_new(rs, "b", hashes("load/b", 1), TOK_B)
    every = catalog_until(rs, ADMIN, {(NS_A, MODEL), (NS_A, "m1"), (NS_B, MODEL), DEFAULT_POOL},
                          "the admin's catalog")
    ids = {lab: pool_key(d) for lab, d in every.items()}
    cases = (
        (TOK_A, {ids[(NS_A, MODEL)], ids[(NS_A, "m1")]}),
        (TOK_B, {ids[(NS_B, MODEL)]}),
        (ADMIN, set(ids.values())),
    )
    for token, want in cases:
        for method, req, serving in (
                ("SubscribeKvPoolLoad", pb.SubscribeKvPoolLoadRequest, False),
                ("SubscribeServingLoad", pb.SubscribeServingLoadRequest, True)):
            call = getattr(rs.new_stub(), method)(
                req(subscriber_id=f"load-{method}", contract_marker=CONTRACT_MARKER),
                timeout=STREAM_DEADLINE, metadata=md(token))
            rd = rs.reader(call, f"{method} under {token}")
            chk = LoadWindowChecker(f"{method} under {token}", serving=serving)
            try:
                deadline = time.monotonic() + 5 * SLOW
                full = 0
                while full < 3:  # three windows listing exactly the caller's pools
                    left = deadline - time.monotonic()
                    assert left > 0, f"{method} under {token}: no three windows listing its {len(want)} pools"
                    m = rd.next_msg(left, "a load window")
                    chk.apply(m)
                    got = {producer_key(p.producer)[0] for p in m.pools}
                    stray = sorted(lab for lab, k in ids.items() if k in got - want)
                    assert got <= want, f"{method} under {token} lists pools not the caller's: {stray} ({len(got - want)})"
                    full += got == want
            finally:
                rd.cancel()


# ---------------------------------------------------------------------------------------------
# A reload ends the relay streams of a removed token


def test_a_removed_token_ends_its_relay_streams(relay, tmp_path):
    """B watches its catalog and follows its pool; the tenants file loses B's token and the
    server gets SIGHUP: both streams end UNAUTHENTICATED within a second (as B's HTTP requests get
    401), while A's watch goes on."""
    rs = start_tenants(relay, tmp_path)
    put_new(rs, "b", hashes("reload/b", 1), TOK_B)
    b_lab = (NS_B, MODEL)
    b_d = catalog_until(rs, TOK_B, {b_lab}, "B's catalog")[b_lab]
    mk = lambda token, sid: rs.new_stub().WatchKvPoolCatalog(  # noqa: E731
        rs.s.pb.WatchKvPoolCatalogRequest(subscriber_id=sid, contract_marker=CONTRACT_MARKER),
        timeout=STREAM_DEADLINE, metadata=md(token))
    b_watch, a_watch = rs.reader(mk(TOK_B, "b-watch"), "b-watch"), rs.reader(mk(TOK_A, "a-watch"), "a-watch")
    _, b_pool = follow(rs, b_d, TOK_B, "b-pool")
    try:
        b_watch.next_msg(5 * SLOW, "B's first catalog")
        a_watch.next_msg(5 * SLOW, "A's first catalog")
        b_pool.next_msg(5 * SLOW, "B's first snapshot chunk")
        rs.tenants_path.write_text(tenants_text().replace(f"team-b {TOK_B}\n", ""))
        t0 = time.monotonic()
        os.kill(rs.srv.pid, signal.SIGHUP)
        for what, r in (("B's catalog watch", b_watch), ("B's pool stream", b_pool)):
            ev = r.wait_end(5 * SLOW)
            assert ev is not None, f"{what} still open 5 s after the reload"
            assert ev[0] == "err" and rpc_status(ev[2])[0] == "UNAUTHENTICATED", f"{what}: {describe_end(ev)}"
        took = time.monotonic() - t0
        assert took < 1.0 * SLOW, f"B's streams ended {took:.2f} s after SIGHUP"
        assert a_watch.wait_end(0.5) is None, "A's watch ended too"
        assert rs.srv.request("GET", "/kv/stats", token=TOK_B).status == 401
    finally:
        for r in (b_watch, a_watch, b_pool):
            r.cancel()
