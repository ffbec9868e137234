"""
deploy/grafana/kvrelay.json proven against a live scrape (issue 27): the real kvrelay-supervisor
serves real traffic (PUT new blocks, dedup hits, a length conflict, GET hits and misses, HEAD,
DELETE, evictions out of a small arena) to a real relay subscriber (build/kvrelay-watch); Debian's
Prometheus scrapes its /metrics every second with the namespace and pod labels the Prometheus
Operator would set; then every query of every panel, with the dashboard's variables substituted
as Grafana would, goes through Prometheus's HTTP API and must succeed with at least one series.
A panel that returns nothing fails the test, and so does a variable whose values do not list
the scraped server.

Prometheus listens on 127.0.0.1:0 (its log names the port), keeps its TSDB in the test's
tmp_path and is stopped by PID. Every wait is bounded.
"""

import json
import math
import re
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import pytest

from conftest import BINARY, REPO, SLOW, _die_with_parent, kv_path, make_block, unique_key
from test_deploy_manifests import promql_names

DASHBOARD = REPO / "deploy" / "grafana" / "kvrelay.json"
PROMETHEUS = "/usr/bin/prometheus"
NAMESPACE = "kvrelay-e2e"
POD = "kvrelay-0"
# Grafana's $__rate_interval is max($__interval + scrape interval, 4 x scrape interval); with a
# 1 s scrape any window of a few seconds holds enough samples for rate().
RATE_INTERVAL = "15s"
DS = {"type": "prometheus", "uid": "${datasource}"}
ROWS = ["Traffic", "Store", "Relay", "Processes"]

KiB = 1 << 10
BLOCK = 256 * KiB


def load_dashboard():
    with open(DASHBOARD) as f:
        return json.load(f)


def all_panels(dash):
    """Every panel, rows included, with the panels of collapsed rows after their row."""
    out = []
    for p in dash["panels"]:
        out.append(p)
        out += p.get("panels", [])
    return out


def query_panels(dash):
    return [p for p in all_panels(dash) if p["type"] != "row"]


def substitute(expr, pod=POD):
    """expr with the dashboard's variables as Grafana interpolates them for one pod (or .*)."""
    out = expr.replace("$__rate_interval", RATE_INTERVAL)
    for name, value in (("namespace", NAMESPACE), ("pod", pod)):
        out = out.replace("${%s}" % name, value).replace("$" + name, value)
    assert "$" not in out, f"a variable left in {out!r}"
    return out


# ---------------------------------------------------------------------------------------------
# The dashboard as a file


def test_dashboard_loads_in_the_current_schema_with_its_variables():
    dash = load_dashboard()
    assert dash["schemaVersion"] >= 39 and dash["uid"] == "kvrelay" and dash["id"] is None
    tv = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(tv) == {"datasource", "namespace", "pod"}, tv.keys()
    assert tv["datasource"]["type"] == "datasource" and tv["datasource"]["query"] == "prometheus"
    for name in ("namespace", "pod"):
        v = tv[name]
        assert v["type"] == "query" and v["datasource"] == DS, v
        assert v["query"]["query"] == v["definition"] and v["definition"].startswith("label_values("), v
    assert tv["pod"]["multi"] and tv["pod"]["includeAll"] and tv["pod"]["allValue"] == ".*"
    assert [p["title"] for p in all_panels(dash) if p["type"] == "row"] == ROWS

    ids = [p["id"] for p in all_panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for p in all_panels(dash):
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        assert p["datasource"] == DS, f"{p['title']}: datasource {p.get('datasource')!r}"
    for p in query_panels(dash):
        assert p["targets"], p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DS, f"{p['title']} {t['refId']}: datasource {t.get('datasource')!r}"
            assert 'namespace="$namespace"' in t["expr"] and 'pod=~"$pod"' in t["expr"], (p["title"], t["expr"])


# ---------------------------------------------------------------------------------------------
# Prometheus


class Prometheus:
    def __init__(self, tmp_path, target):
        self.dir = tmp_path / "prometheus"
        self.dir.mkdir()
        self.cfg = self.dir / "prometheus.yml"
        self.cfg.write_text(
            "global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: kvrelay\n"
            "    static_configs:\n"
            f"      - targets: ['{target}']\n"
            f"        labels: {{namespace: {NAMESPACE}, pod: {POD}}}\n"
        )
        self.log_path = self.dir / "prometheus.log"
        self.proc = None
        self.base = None

    def start(self, limit=30.0):
        argv = [PROMETHEUS, f"--config.file={self.cfg}", f"--storage.tsdb.path={self.dir / 'data'}",
                "--web.listen-address=127.0.0.1:0", "--storage.tsdb.retention.time=1h", "--log.level=info"]
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + limit * SLOW
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited {self.proc.returncode}:\n{self.log()}"
            if self.base is None:
                m = re.search(r'msg="Listening on" address=(127\.0\.0\.1:\d+)', self.log())
                if m:
                    self.base = f"http://{m.group(1)}"
            elif self._ready():
                return self
            time.sleep(0.1)  # poll interval of this bounded wait for readiness
        raise AssertionError(f"prometheus not ready after {limit * SLOW:.0f}s:\n{self.log()}")

    def _ready(self):
        try:
            with urllib.request.urlopen(self.base + "/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def log(self):
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def api(self, path, params):
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10 * SLOW) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 400 for a query that does not parse: the body says why
            return json.loads(e.read() or b"{}") or {"status": "error", "error": str(e)}

    def query(self, expr):
        return self.api("query", {"query": expr})

    def values(self, expr):
        """The sample values of an instant query (asserting it succeeded)."""
        r = self.query(expr)
        assert r.get("status") == "success", (expr, r)
        return [float(s["value"][1]) for s in r["data"]["result"]]

    def wait(self, what, expr, cond, limit=60.0):
        deadline = time.monotonic() + limit * SLOW
        vals = []
        while time.monotonic() < deadline:
            vals = self.values(expr)
            if vals and cond(vals):
                return vals
            time.sleep(0.25)  # poll interval of this bounded wait for the query's condition
        raise AssertionError(f"{what}: {expr} gave {vals} after {limit * SLOW:.0f}s\n{self.log()[-3000:]}")

    def stop(self):
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20 * SLOW)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self._log.close()


@pytest.fixture
def prometheus(tmp_path):
    started = []

    def start(target):
        p = Prometheus(tmp_path, target)
        started.append(p)
        return p.start()

    yield start
    for p in started:
        p.stop()


# ---------------------------------------------------------------------------------------------
# Traffic


class Traffic:
    """Every kind of request the panels count, once, then a steady mix in a thread (bounded)
    so that the rates over the last window are not all zero while the panels are evaluated."""

    def __init__(self, srv):
        self.srv = srv
        self.stop_ev = threading.Event()
        self.errors = []
        self.thread = None
        self.n = 0

    def once(self):
        srv = self.srv
        keys = [unique_key("dash") for _ in range(4)]
        blocks = [make_block(BLOCK, k) for k in keys]
        for k, b in zip(keys, blocks):
            assert srv.put(k, b).status == 201
        assert srv.put(keys[0], blocks[0]).status == 200  # a dedup hit
        assert srv.put(keys[0], blocks[0][:-1]).status == 409  # another length under the key
        assert srv.get(keys[1]).status == 200
        assert srv.get(unique_key("absent")).status == 404
        assert srv.request("HEAD", kv_path(keys[2])).status == 200
        assert srv.delete(keys[3]).status == 200
        self.hot = (keys[1], blocks[1])

    def _run(self, deadline):
        srv = self.srv
        while not self.stop_ev.is_set() and time.monotonic() < deadline:
            k = unique_key("fill")
            r = srv.put(k, make_block(BLOCK, k))  # a small arena: these evict
            if r.status != 201:
                self.errors.append(f"PUT {r!r}")
            for r, want in ((srv.put(*self.hot), (200, 201)), (srv.get(self.hot[0]), (200,)),
                            (srv.get(unique_key("absent")), (404,))):
                if r.status not in want:
                    self.errors.append(repr(r))
            self.n += 1
            self.stop_ev.wait(0.05)

    def start(self, limit=120.0):
        self.thread = threading.Thread(target=self._run, args=(time.monotonic() + limit * SLOW,), daemon=True)
        self.thread.start()

    def stop(self):
        self.stop_ev.set()
        if self.thread is not None:
            self.thread.join(30 * SLOW)
        assert not self.errors, self.errors[:5]


def start_subscriber(srv):
    """build/kvrelay-watch subscribed to the pool stream, like a Dynamo router."""
    watch = BINARY.parent / "kvrelay-watch"
    assert watch.is_file(), f"{watch} is not built"
    return subprocess.Popen([str(watch), "--grpc", srv.grpc, "--duration", str(int(180 * SLOW)), "--quiet",
                             "--subscriber-id", "dashboard-e2e"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=_die_with_parent)


def stop_pid(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10 * SLOW)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def exported_names(text):
    names = set()
    for ln in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", ln)
        if m:
            names.add(m.group(1))
            if m.group(2) == "histogram":
                names |= {m.group(1) + s for s in ("_bucket", "_sum", "_count")}
    return names


# Panels whose numbers the traffic above fixes, beyond "at least one series": title -> check of
# the values of the panel's first query (for the one pod).
VALUE_CHECKS = {
    "Requests/s by method and status": lambda v: sum(v) > 0,
    "GET hit ratio": lambda v: all(0 < x < 1 for x in v),
    "Arena fill": lambda v: all(0.5 < x <= 1 for x in v),
    "Evictions/s": lambda v: sum(v) > 0,
    "Subscribers": lambda v: v[0] >= 1,
    "Generation": lambda v: v[0] >= 1,
    "Workers running": lambda v: v == [1.0],
    "Uptime": lambda v: all(0 < x < 3600 for x in v),
    "Streams opened/s by stream": lambda v: len(v) == 5,  # one series per stream type
    "Latency p50 / p99 by method": lambda v: any(math.isfinite(x) and x > 0 for x in v),
}


def test_every_panel_returns_data_from_a_live_scrape(kvrelay, prometheus):
    dash = load_dashboard()
    srv = kvrelay("--grpc-bind", "127.0.0.1:0", "--memory", "4M", "--workers", "1")
    names = exported_names(srv.metrics_text())
    for p in query_panels(dash):
        for t in p["targets"]:
            used, _ = promql_names(substitute(t["expr"]))
            assert used <= names, f"{p['title']}: {sorted(used - names)} are not in /metrics"

    sub = start_subscriber(srv)
    traffic = Traffic(srv)
    try:
        traffic.once()
        traffic.start()
        prom = prometheus(f"127.0.0.1:{srv.port}")
        sel = f'namespace="{NAMESPACE}", pod="{POD}"'
        # scraped often enough for every window, and after the traffic and the subscriber
        prom.wait("scrapes", f"count_over_time(kvrelay_workers{{{sel}}}[1m])", lambda v: v[0] >= 5)
        prom.wait("evictions", f"kvrelay_evictions_total{{{sel}}}", lambda v: v[0] > 0)
        prom.wait("dedup hits", f"kvrelay_dedup_hits_total{{{sel}}}", lambda v: v[0] > 0)
        prom.wait("the subscriber", f'kv_dc_relay_subscribers{{{sel}, stream="pool"}}', lambda v: v[0] >= 1)
        prom.wait("its stream counted", f'kvrelay_relay_streams_opened_total{{{sel}, stream="pool"}}',
                  lambda v: v[0] >= 1)
        prom.wait("deltas seen by two scrapes",
                  f"increase(kvrelay_relay_deltas_published_total{{{sel}}}[{RATE_INTERVAL}])", lambda v: v[0] > 0)

        # the checks below can fail: an unknown name returns no series, a broken query an error
        assert prom.query(f"kvrelay_no_such_family{{{sel}}}")["data"]["result"] == []
        assert prom.query("sum(rate(kvrelay_evictions_total[15s])")["status"] == "error"

        failures, report = [], []
        for v in dash["templating"]["list"]:
            if v["type"] != "query":
                continue
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["definition"])
            assert m, v["definition"]
            r = prom.api(f"label/{m.group(2)}/values", {"match[]": substitute(m.group(1))})
            want = {"namespace": NAMESPACE, "pod": POD}[v["name"]]
            if r.get("status") != "success" or want not in r["data"]:
                failures.append(f"variable {v['name']}: {v['definition']} -> {r}")
        for p in query_panels(dash):
            for t in p["targets"]:
                for pod in (POD, ".*"):  # one pod, and the variable's All
                    expr = substitute(t["expr"], pod)
                    r = prom.query(expr)
                    res = r.get("data", {}).get("result", [])
                    if r.get("status") != "success" or not res:
                        failures.append(f"{p['title']} [{t['refId']}] pod={pod}: {expr}\n  -> {r}")
                        continue
                    if pod == POD:
                        report.append(f"{p['title']} [{t['refId']}]: {len(res)} series, "
                                      f"{[s['value'][1] for s in res][:4]}")
            check = VALUE_CHECKS.get(p["title"])
            if check is not None:
                vals = prom.values(substitute(p["targets"][0]["expr"]))
                if not check(vals):
                    failures.append(f"{p['title']}: values {vals} are not what the traffic made")
        print("\n".join(report))
        assert not failures, "\n".join(failures)
        assert set(VALUE_CHECKS) <= {p["title"] for p in query_panels(dash)}
    finally:
        traffic.stop()
        stop_pid(sub)
    assert sub.returncode in (0, -signal.SIGTERM), sub.stderr.read().decode(errors="replace")
