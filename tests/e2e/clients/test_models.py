"""
The kvrelay package names the model of what it PUTs (X-KV-Model), so the server publishes each
model's blocks in that model's relay pool (docs/tenancy.md, "Pools").

One server; each adapter driven as its engine drives it (the stand-ins of the adapter tests next
to this file). A pool is observed where the server announces it: the worker's log line
`relay: pool N is namespace "...", model "..."` when a PUT makes it, and /debug/relay's count.

  plain client     Client(model=...), and KVRELAY_MODEL without model=; an invalid model raises
  LMCache remote   ?model= in the kvrelay:// URL, else the engine metadata's model_name
                   (LMCacheEngineMetadata.model_name upstream)
  SGLang HiCache   extra_config {"model": ...}, else HiCacheStorageConfig.model_name; a name the
                   server would refuse is left out, and the blocks go to the default pool
"""

import json
import re

import pytest

from .conftest import KiB, pattern
from .engines import engine
from .test_lmcache_generations import Key, create_connector, fill, lmcache_config, newer_metadata, run
from .test_sglang import HiCacheStorageConfig, HostPool
from .test_sglang import make_backend as make_sglang

from conftest import SLOW, module_server  # noqa: E402  (tests/e2e/conftest.py)
from harness import wait_until  # noqa: E402  (tests/e2e/harness.py)

POOL_LINE = re.compile(r'relay: pool (\d+) is namespace "([^"]*)", model "([^"]*)"')


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = module_server(tmp_path_factory, "models", args=("--memory", "128M", "--workers", "2", "--max-pools", "16",
                                                        "--max-pools-per-namespace", "16"))
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _no_model_from_env(monkeypatch):
    monkeypatch.delenv("KVRELAY_MODEL", raising=False)


def pools(srv):
    """{model: pool id} of namespace default, as the server announced them."""
    return {m.group(3): int(m.group(1)) for m in POOL_LINE.finditer(srv.log_text()) if m.group(2) == "default"}


def assert_pool(srv, model):
    """The server made a pool for model, and the publisher took it on (/debug/relay counts it)."""
    got = pools(srv)
    assert model in got, f"no pool of {model!r}: {got}"
    wait_until(lambda: json.loads(srv.request("GET", "/debug/relay").body)["pools"] > got[model], 10 * SLOW,
               what=f"the publisher to take pool {got[model]} on")


def test_plain_client_model_and_env(srv, monkeypatch):
    from kvrelay import Client

    c = Client(url=srv.base_url, model="m-plain", timeout_s=5.0 * SLOW)
    try:
        assert "m-plain" not in pools(srv)
        assert c.put("models/plain/0", bytes(pattern(4 * KiB, "p0")))
        assert_pool(srv, "m-plain")
        assert c.get("models/plain/0") == bytes(pattern(4 * KiB, "p0"))  # reads name no model
    finally:
        c.close()
    monkeypatch.setenv("KVRELAY_MODEL", "m-env")
    e = Client(url=srv.base_url, timeout_s=5.0 * SLOW)
    try:
        assert e.model == "m-env" and e.put("models/env/0", b"x" * 100)
        assert_pool(srv, "m-env")
    finally:
        e.close()
    for bad in ("", "has space", "x" * 129, "tab\there"):
        with pytest.raises(ValueError):
            Client(url=srv.base_url, model=bad)


def test_lmcache_remote_url_model_then_metadata_model_name(srv):
    with engine("lmcache_newer") as (mod, imp):
        mm = imp("lmcache.v1.memory_management")
        md = newer_metadata(imp)
        md.model_name = "meta-llama/Llama-3.1-8B"  # LMCacheEngineMetadata.model_name upstream
        cfg = lmcache_config()
        backend = imp("lmcache.v1.storage_backend.local_cpu_backend").LocalCPUBackend(cfg, md)
        base = f"kvrelay://127.0.0.1:{srv.port}?timeout_s={10 * SLOW}"

        async def scenario(loop):
            obj = mm.MemoryObj(md.get_shapes(), md.get_dtypes(), mm.MemoryFormat.KV_2LTD)
            fill(obj, 1)
            by_url = create_connector(imp, base + "&model=m-url", loop, backend, cfg, md)
            await by_url.put(Key(1, "models-url"), obj)
            assert by_url.put_failures == 0 and by_url.puts_stored == 1
            assert_pool(srv, "m-url")
            by_md = create_connector(imp, base, loop, backend, cfg, md)
            await by_md.put(Key(2, "models-md"), obj)
            assert by_md.put_failures == 0 and by_md.puts_stored == 1
            assert_pool(srv, "meta-llama/Llama-3.1-8B")
            await by_url.close()
            await by_md.close()

        run(scenario)


def test_sglang_extra_config_model_then_storage_config_model_name(srv):
    host = HostPool(pages=8)
    for p in range(4):
        host.fill(p, f"models-sg-{p}")
    hashes = [f"{0x5000 + i:064x}" for i in range(4)]
    b = make_sglang(srv, host)  # HiCacheStorageConfig.model_name "Qwen/Qwen3-8B"
    try:
        assert b.batch_set_v1(hashes[:2], host.indices(0, 2)) == [True, True]
        assert_pool(srv, "Qwen/Qwen3-8B")
    finally:
        b.close()
    b = make_sglang(srv, host, model="m-sglang")
    try:
        assert b.batch_set_v1(hashes[2:], host.indices(2, 2)) == [True, True]
        assert_pool(srv, "m-sglang")
    finally:
        b.close()
    # a model name the server would refuse (a space) is left out: the default pool, no 400
    before = pools(srv)

    cfg = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                               is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
                               model_name="not a model", extra_config={"url": srv.base_url, "timeout_s": 5.0 * SLOW})
    from kvrelay.sglang import KvrelayHiCacheStorage

    bad = KvrelayHiCacheStorage(cfg, {})
    try:
        assert bad.store.model is None
        assert bad.set("models/bad-name", b"v" * 64) is True
        assert pools(srv) == before, "no pool for a model the server refuses"
    finally:
        bad.close()
