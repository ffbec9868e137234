"""
/metrics: Prometheus text that passes `promtool check metrics`, with the named families and
values that match the traffic sent (exact request counts, summed over both workers).
"""

import math
import re
import shutil
import subprocess
import time

import pytest

from conftest import SLOW, MiB, kv_path, make_block

LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text):
    """Returns (types, samples): types {family: type}, samples {(name, frozenset(labels)): value}."""
    types, samples = {}, {}
    for ln in text.splitlines():
        if ln.startswith("# TYPE "):
            _, _, fam, typ = ln.split(None, 3)
            types[fam] = typ.strip()
            continue
        if not ln.strip() or ln.startswith("#"):
            continue
        m = LINE.match(ln)
        assert m, f"unparsable metrics line: {ln!r}"
        labels = frozenset(LABEL.findall(m.group(2) or ""))
        key = (m.group(1), labels)
        assert key not in samples, f"duplicate sample {ln!r}"
        samples[key] = float(m.group(3))
    return types, samples


def value(samples, name, **labels):
    """Sum of the samples of `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def requests(samples, method, status):
    v = value(samples, "kvrelay_http_requests_total", method=method, status=str(status))
    if method not in ("GET", "PUT", "HEAD", "DELETE"):
        v += value(samples, "kvrelay_http_requests_total", method="other", status=str(status))
    return v


def promtool_check(text):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (Debian package prometheus)"
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60)
    return p.returncode, (p.stdout + p.stderr).decode()


def test_metrics_families_and_values(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2")
    before_text = srv.metrics_text()
    rc, out = promtool_check(before_text)
    assert rc == 0, f"promtool check metrics failed on an idle server:\n{out}"
    _, before = parse(before_text)

    put_bytes = get_bytes = 0
    blocks = {f"m{i}": make_block(1000 * (i + 1), f"m{i}") for i in range(7)}
    for k, d in blocks.items():  # 7 x PUT 201
        assert srv.put(k, d).status == 201
        put_bytes += len(d)
    for k in ("m0", "m1", "m2"):  # 3 x PUT 200
        assert srv.put(k, blocks[k]).status == 200
        put_bytes += len(blocks[k])
    for k in ("m3", "m4"):  # 2 x PUT 409
        assert srv.put(k, b"short").status == 409
        put_bytes += 5
    for k in ("m0", "m1", "m2", "m5", "m6"):  # 5 x GET 200
        r = srv.get(k)
        assert r.status == 200
        get_bytes += len(r.body)
    for i in range(4):  # 4 x GET 404
        assert srv.get(f"missing{i}").status == 404
    for k in ("m5", "m6"):  # 2 x HEAD 200
        assert srv.request("HEAD", kv_path(k)).status == 200
    for k in ("m5", "m6"):  # 2 x DELETE 200
        assert srv.delete(k).status == 200
    assert srv.delete("missing").status == 404  # 1 x DELETE 404
    for _ in range(3):  # 3 x GET 400
        assert srv.request("GET", "/kv/%zz").status == 400
    assert srv.request("POST", "/kv/m0", body=b"x").status == 405  # 1 x POST 405

    exact = {("PUT", 201): 7, ("PUT", 200): 3, ("PUT", 409): 2, ("GET", 404): 4, ("HEAD", 200): 2,
             ("DELETE", 200): 2, ("DELETE", 404): 1, ("GET", 400): 3, ("POST", 405): 1}
    # a request is counted once its worker reaps the send's completion, which can come a moment
    # after the client has read the answer (on either worker): the scrape is repeated, bounded,
    # until every request above shows; the counts are then compared exactly
    deadline = time.monotonic() + 5 * SLOW
    scrapes = 0
    while True:
        text = srv.metrics_text()
        scrapes += 1
        types, after = parse(text)
        if all(requests(after, m, st) - requests(before, m, st) >= n
               for (m, st), n in [*exact.items(), (("GET", 200), 5)]) or time.monotonic() > deadline:
            break
        time.sleep(0.05)  # poll interval of this bounded wait for the counters to catch up
    rc, out = promtool_check(text)
    assert rc == 0, f"promtool check metrics failed:\n{out}"

    for fam, typ in {
        "kvrelay_http_requests_total": "counter",
        "kvrelay_http_request_duration_seconds": "histogram",
        "kvrelay_resident_bytes": "gauge",
        "kvrelay_capacity_bytes": "gauge",
        "kvrelay_evictions_total": "counter",
        "kvrelay_dedup_hits_total": "counter",
    }.items():
        assert types.get(fam) == typ, f"{fam}: TYPE {types.get(fam)!r}, want {typ}"

    for (m, st), n in exact.items():
        delta = requests(after, m, st) - requests(before, m, st)
        assert delta == n, f'kvrelay_http_requests_total{{method="{m}",status="{st}"}} rose by {delta}, want {n}'
    delta = requests(after, "GET", 200) - requests(before, "GET", 200)
    assert 5 <= delta <= 6 + scrapes, f"GET 200 rose by {delta} (5 block GETs + at most the {1 + scrapes} scrapes)"

    # histogram: cumulative buckets, +Inf == _count, counts match the requests
    h = "kvrelay_http_request_duration_seconds"
    by_method = {}
    for (n, ls), v in after.items():
        if n == h + "_bucket":
            d = dict(ls)
            by_method.setdefault(d.get("method"), []).append((float(d["le"]), v))
    assert by_method, "no histogram buckets"
    for m, buckets in by_method.items():
        buckets.sort()
        counts = [v for _, v in buckets]
        assert counts == sorted(counts), f"{h} buckets of {m} not cumulative: {buckets}"
        assert math.isinf(buckets[-1][0]), f"{h} lacks le=+Inf for {m}"
        assert buckets[-1][1] == value(after, h + "_count", method=m), m
    for m, n in (("PUT", 12), ("DELETE", 3), ("HEAD", 2)):
        delta = value(after, h + "_count", method=m) - value(before, h + "_count", method=m)
        assert delta == n, f"{h}_count{{method={m}}} rose by {delta}, want {n}"
    assert value(after, h + "_sum", method="PUT") > value(before, h + "_sum", method="PUT")

    st = srv.stats()
    assert value(after, "kvrelay_resident_bytes") == st["resident_bytes"]
    assert value(after, "kvrelay_capacity_bytes") == 64 * MiB == st["capacity_bytes"]
    assert value(after, "kvrelay_dedup_hits_total") - value(before, "kvrelay_dedup_hits_total") == 3
    assert value(after, "kvrelay_evictions_total") == st["evictions"] == 0
    rx = value(after, "kvrelay_http_received_bytes_total") - value(before, "kvrelay_http_received_bytes_total")
    tx = value(after, "kvrelay_http_sent_bytes_total") - value(before, "kvrelay_http_sent_bytes_total")
    assert rx >= put_bytes, f"bytes in rose by {rx}, PUT bodies were {put_bytes}"
    assert tx >= get_bytes, f"bytes out rose by {tx}, GET bodies were {get_bytes}"
    assert value(after, "kvrelay_workers") == 2


def test_metrics_evictions(kvrelay):
    srv = kvrelay("--memory", "64M", "--workers", "2")
    conn = srv.connection()
    try:
        for i in range(72):
            assert srv.request("PUT", kv_path(f"e{i}"), body=make_block(MiB, f"e{i}"), conn=conn).status == 201
    finally:
        conn.close()
    text = srv.metrics_text()
    rc, out = promtool_check(text)
    assert rc == 0, out
    _, m = parse(text)
    st = srv.stats()
    assert st["evictions"] >= 8, st
    assert value(m, "kvrelay_evictions_total") == st["evictions"]
    if ("kvrelay_evicted_bytes_total", frozenset()) in m:
        assert value(m, "kvrelay_evicted_bytes_total") == st["evicted_bytes"]
    assert value(m, "kvrelay_resident_bytes") == st["resident_bytes"] <= 64 * MiB


@pytest.mark.parametrize("mode", ["curl-h2c", "py"])
def test_metrics_requires_token(kvrelay, mode):
    srv = kvrelay("--memory", "64M", "--workers", "1", "--token", "mtok")
    if mode == "py":
        assert srv.request("GET", "/metrics").status == 401
        r = srv.request("GET", "/metrics", token="mtok")
    else:
        assert srv.curl(mode, "GET", "/metrics").status == 401
        r = srv.curl(mode, "GET", "/metrics", token="mtok")
    assert r.status == 200 and b"kvrelay_http_requests_total" in r.body, r
    assert r.header("content-type", "").startswith("text/plain"), r
