"""
The image and the StatefulSet's pod under a real container runtime (issue 13): podman.

  1. a minimal Debian 12 root (`mmdebstrap --variant=minbase bookworm`, cached as a tarball)
     imported with `podman import`; the Containerfile built on it with `podman build`;
  2. the pod template of deploy/memory/'s StatefulSet run under `podman kube play`, with its
     ConfigMap (--configmap) and its token Secret (a podman secret made by kube play);
  3. the probes' endpoints answer (/healthz, /readyz, grpc.health.v1 Check on the relay port);
     kvrelay-supervisor is PID 1 of the container, runs as uid 10001, the root is read-only;
  4. a PUT/GET through the pod works, with the bearer token from the mounted Secret;
  5. killing the container's main process (SIGKILL: every process of the container dies) and
     starting the pod again keeps every block (the segment file re-attached and repaired);
  6. stopped, the container exits 0 within terminationGracePeriodSeconds (SIGTERM, drain);
     `podman kube down` then removes the pod with exit status 0. (podman before 5.1 SIGKILLs
     on kube down - podman issue 22397 - so the SIGTERM comes from `podman pod stop` first.)

What this podman (4.3, Debian 12) cannot take as Kubernetes would, and how the pod is adapted
(everything else is the rendered template, unchanged):
  - a StatefulSet: its spec.template becomes a Pod named kvrelay-0, as the first replica;
  - emptyDir: podman 4.3 makes it a disk volume, which --segment-path refuses (memory only),
    so the segment volume is a hostPath on a fresh tmpfs directory (/dev/shm) - what medium:
    Memory gives in Kubernetes - kept across the container's restart like an emptyDir;
  - seccompProfile: podman 4.3 ignores securityContext.seccompProfile; it applies its own
    default profile, which is what RuntimeDefault means under podman. That profile is used
    unmodified (checked against its Debian package with dpkg --verify); it denies
    io_uring_setup, so the test also checks that the supervisor logged the epoll engine and
    why (--io-engine auto, docs/dataplane.md "I/O engines") and that a seccomp filter is on;
  - networking: hostNetwork with the ConfigMap's binds moved to loopback ephemeral ports and
    KVRELAY_MEMORY to 64M (this test's traffic stays on loopback and small); the container's
    ports list dropped (podman 4.3 maps containerPorts, which hostNetwork forbids) and the
    probes' port names replaced by those ports' numbers;
  - probes: podman turns httpGet probes into curl healthchecks run by systemd timers, which
    neither this image (no curl) nor this host (no systemd) has; the test asks the probes'
    endpoints itself, as the kubelet would.

Runs where podman is installed (scripts/install-deps.sh --container), as root, with
`--runtime runc` and a containers.conf of `[containers] default_ulimits = []` and
`[engine] cgroup_manager = "cgroupfs"` (crun refuses this host's hybrid cgroups; the default
ulimits cannot be raised here). Skipped, with that reason, only where podman is missing.
Environment: KVRELAY_IMAGE_ROOT (the root tarball, default
/var/cache/kvrelay/bookworm-minbase-image.tar, built with mmdebstrap when missing).
"""

import base64
import copy
import json
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import msgpack
import pytest
import yaml

from conftest import REPO, http_request, kv_path
from harness import SLOW, wait_until
from test_deploy_manifests import DEPLOY, by_kind, render

PODMAN = shutil.which("podman")
ROOT_TAR = Path(os.environ.get("KVRELAY_IMAGE_ROOT", "/var/cache/kvrelay/bookworm-minbase-image.tar"))
BASE = "localhost/kvrelay-base:bookworm"
IMAGE = "localhost/kvrelay:e2e"
POD = "kvrelay-0"
CTR = f"{POD}-kvrelay"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTAINERS_CONF = """[containers]
default_ulimits = []

[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
events_logger = "file"
"""

pytestmark = pytest.mark.skipif(PODMAN is None, reason="podman is not installed (scripts/install-deps.sh --container)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    try:
        return s.getsockname()[1]
    finally:
        s.close()


class Podman:
    def __init__(self, conf):
        self.env = dict(os.environ, CONTAINERS_CONF=str(conf))

    def run(self, *args, timeout=120, check=True, input=None):
        p = subprocess.run([PODMAN, *args], env=self.env, capture_output=True, timeout=timeout, input=input)
        if check and p.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)}: rc {p.returncode}\n{p.stdout.decode(errors='replace')}"
                                 f"\n{p.stderr.decode(errors='replace')[-3000:]}")
        return p

    def out(self, *args, **kw):
        return self.run(*args, **kw).stdout.decode().strip()


def ensure_root_tarball():
    if ROOT_TAR.is_file() and ROOT_TAR.stat().st_size > 0:
        return
    mm = shutil.which("mmdebstrap")
    assert mm, f"no {ROOT_TAR} and no mmdebstrap to build it (scripts/install-deps.sh --container)"
    # the machine's own mirror, as scripts/fresh-machine-check.sh does (deb822 first)
    cands = [Path("/etc/apt/sources.list.d/debian.sources"), *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
             Path("/etc/apt/sources.list")]
    src = next((str(p) for p in cands if p.is_file() and p.stat().st_size > 0), None)
    assert src, "no apt sources to build the root from"
    ROOT_TAR.parent.mkdir(parents=True, exist_ok=True)
    tmp = ROOT_TAR.with_suffix(".tmp")
    subprocess.run([mm, "--quiet", "--format=tar", "--variant=minbase", "bookworm", str(tmp), src],
                   check=True, timeout=600)
    tmp.rename(ROOT_TAR)


def ensure_images(pm):
    ensure_root_tarball()
    st = ROOT_TAR.stat()
    stamp = f"kvrelay root {ROOT_TAR} {st.st_size} {int(st.st_mtime)}"
    have = pm.run("image", "inspect", "--format", "{{.Comment}}", BASE, check=False)
    if have.returncode != 0 or have.stdout.decode().strip() != stamp:
        pm.run("import", "--change", f"ENV {PATH_ENV}", "--message", stamp, str(ROOT_TAR), BASE, timeout=300)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    t0 = time.monotonic()
    pm.run("build", "--network", "host", "--build-arg", f"BASE={BASE}", "--build-arg", f"KVR_GIT_COMMIT={commit}",
           "-t", IMAGE, "-f", str(REPO / "Containerfile"), str(REPO), timeout=900)
    return time.monotonic() - t0


DEFAULT_SECCOMP = Path("/usr/share/containers/seccomp.json")


def check_default_seccomp_profile():
    """podman's default profile, as its Debian package shipped it, denies io_uring_setup: the
    pod below runs under it, so this test proves the image works under a runtime default."""
    owner = subprocess.run(["dpkg-query", "-S", str(DEFAULT_SECCOMP)], capture_output=True, text=True, timeout=30)
    assert owner.returncode == 0, f"{DEFAULT_SECCOMP} belongs to no package: {owner.stderr}"
    pkg = owner.stdout.split(":")[0].strip()
    verify = subprocess.run(["dpkg", "--verify", pkg], capture_output=True, text=True, timeout=60)
    assert str(DEFAULT_SECCOMP) not in verify.stdout, f"{DEFAULT_SECCOMP} differs from {pkg}'s: {verify.stdout}"
    prof = json.loads(DEFAULT_SECCOMP.read_text())
    assert not any("io_uring_setup" in s.get("names", []) and s.get("action") == "SCMP_ACT_ALLOW"
                   for s in prof["syscalls"]), "podman's default allows io_uring: this test no longer shows epoll"
    return pkg


def pod_manifests(tmp, segdir, http, grpc, token_b64, events=None):
    objs = render(DEPLOY / "memory")
    sts = by_kind(objs, "StatefulSet")
    cm = copy.deepcopy(by_kind(objs, "ConfigMap"))
    cm["metadata"].pop("namespace", None)
    cm["data"].update(KVRELAY_HTTP_BIND=f"127.0.0.1:{http}", KVRELAY_GRPC_BIND=f"127.0.0.1:{grpc}",
                      KVRELAY_MEMORY="64M")
    if events is not None:  # the KV events' PUB and replay ports, on loopback as the others
        cm["data"].update(KVRELAY_KV_EVENTS_BIND=f"tcp://127.0.0.1:{events[0]}",
                          KVRELAY_KV_EVENTS_REPLAY_BIND=f"tcp://127.0.0.1:{events[1]}")
    tpl = copy.deepcopy(sts["spec"]["template"])
    spec = tpl["spec"]
    spec["hostNetwork"] = True
    c = spec["containers"][0]
    c["image"] = IMAGE
    # with hostNetwork podman 4.3 refuses containerPorts (it maps them); the probes name them
    assert {p["name"] for p in c.pop("ports")} == {"http", "grpc", "kv-events", "kv-replay"}
    named = {"http": http, "grpc": grpc}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        for kind in ("httpGet", "grpc"):
            if kind in c.get(probe, {}) and isinstance(c[probe][kind]["port"], str):
                c[probe][kind]["port"] = named[c[probe][kind]["port"]]
            elif kind == "grpc" and kind in c.get(probe, {}):
                c[probe][kind]["port"] = grpc
    for v in spec["volumes"]:
        if v["name"] == "segment":
            assert v.pop("emptyDir")["medium"] == "Memory"
            v["hostPath"] = {"path": str(segdir), "type": "Directory"}
    meta = {"name": POD, "labels": tpl["metadata"]["labels"]}  # no seccomp annotation: podman's default
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}
    secret_name = next(v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v)
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name}, "type": "Opaque",
              "data": {"token": token_b64}}
    paths = {}
    for name, obj in (("pod", pod), ("configmap", cm), ("secret", secret)):
        paths[name] = tmp / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(obj))
    return paths, sts, c


def wait_http(port, path, want, limit, token=None):
    h = {"Authorization": f"Bearer {token}"} if token else {}

    last = []

    def answered():
        r = http_request("127.0.0.1", port, "GET", path, headers=h, timeout=2)
        last[:] = [r]
        return r if r.status == want else None

    def what():  # the last answer's body says why (/readyz names the process that is not serving)
        return f"GET {path} to answer {want}" + (f" (last: {last[0].status} {last[0].body[:200]!r})" if last else "")

    return wait_until(answered, limit * SLOW, interval=0.2, what=what)


def grpc_health(port, service=""):
    import grpc

    req = b"\x0a" + bytes([len(service)]) + service.encode() if service else b""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        call = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None, response_deserializer=None)
        resp = call(req, timeout=5)
    # HealthCheckResponse{status = 1 (SERVING)}
    return {b"\x08\x01": "SERVING", b"\x08\x02": "NOT_SERVING"}.get(resp, resp)


def test_image_and_statefulset_pod_under_podman(tmp_path):
    t_start = time.monotonic()
    conf = tmp_path / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    pm = Podman(conf)
    build_s = ensure_images(pm)
    version = pm.out("run", "--rm", "--network", "none", "--read-only", IMAGE, "--version")
    assert version.startswith("kvrelay "), version

    segdir = Path(tempfile.mkdtemp(prefix="kvrelay-podman-", dir="/dev/shm"))
    os.chown(segdir, 10001, 10001)
    seccomp_pkg = check_default_seccomp_profile()
    http, grpc_port, ev_port, replay_port = free_port(), free_port(), free_port(), free_port()
    token = uuid.uuid4().hex
    paths, sts, c = pod_manifests(tmp_path, segdir, http, grpc_port, base64.b64encode(token.encode()).decode(),
                                  events=(ev_port, replay_port))
    grace = sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    played = False
    try:
        pm.run("secret", "rm", "kvrelay-token", check=False)
        pm.run("kube", "play", str(paths["secret"]))
        pm.run("kube", "play", "--configmap", str(paths["configmap"]), str(paths["pod"]))
        played = True
        wait_http(http, "/healthz", 200, 60)
        try:
            wait_http(http, "/readyz", 200, 60)
        except AssertionError as e:  # the server's log says which process was not ready
            lg = pm.run("logs", CTR, check=False)
            raise AssertionError(f"{e}\n{(lg.stdout + lg.stderr).decode(errors='replace')[-4000:]}") from None
        assert grpc_health(grpc_port) == "SERVING"
        assert grpc_health(grpc_port, "dynamo.kvrelay.v1.KvEventRelay") == "SERVING"

        # PID 1, uid 10001, read-only root
        pid = int(pm.out("inspect", "--format", "{{.State.Pid}}", CTR))
        status = Path(f"/proc/{pid}/status").read_text()
        nspid = [ln.split()[1:] for ln in status.splitlines() if ln.startswith("NSpid:")][0]
        assert nspid[-1] == "1", f"the supervisor is pid {nspid[-1]} in the container"
        assert os.readlink(f"/proc/{pid}/exe").endswith("/kvrelay-supervisor")
        uid = [ln.split()[1:] for ln in status.splitlines() if ln.startswith("Uid:")][0]
        assert set(uid) == {"10001"}, uid
        seccomp_mode = [ln.split()[1] for ln in status.splitlines() if ln.startswith("Seccomp:")][0]
        assert seccomp_mode == "2", f"the supervisor runs without a seccomp filter (mode {seccomp_mode})"
        lg = pm.run("logs", CTR)
        logs = lg.stdout.decode(errors="replace") + lg.stderr.decode(errors="replace")
        engine = [ln for ln in logs.splitlines() if "io engine:" in ln]
        assert len(engine) == 1 and "io engine: epoll, because io_uring_setup fails" in engine[0], engine or logs[-2000:]
        assert pm.out("inspect", "--format", "{{.HostConfig.ReadonlyRootfs}}", CTR) == "true"
        mounts = pm.out("exec", CTR, "cat", "/proc/self/mounts").splitlines()
        root_opts = [ln.split()[3].split(",") for ln in mounts if ln.split()[1] == "/"]
        assert root_opts and "ro" in root_opts[-1], f"/ is not mounted read-only: {root_opts}"
        w = pm.run("exec", CTR, "/bin/sh", "-c", "echo x > /kvrelay-write-test", check=False)
        assert w.returncode != 0, w

        # the token as the container sees it (podman 4.3 writes a Secret's data undecoded)
        seen = pm.out("exec", CTR, "cat", c["args"][c["args"].index("--token-file") + 1])
        assert seen in (token, base64.b64encode(token.encode()).decode()), seen
        assert http_request("127.0.0.1", http, "PUT", kv_path("no-token"), body=b"x").status == 401

        # a router's view: the pod's KV events (docs/kv-events.md) follow the PUTs below
        import zmq
        zctx = zmq.Context()
        sub = zctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sub.connect(f"tcp://127.0.0.1:{ev_port}")
        time.sleep(0.5)  # ZMQ sends the subscription after the connect; PUTs before it are not seen

        rng = random.Random(1304)
        blocks = {}
        auth = {"Authorization": f"Bearer {seen}"}
        for i in range(200):
            key = f"pod/{i:04d}"
            blocks[key] = rng.randbytes(rng.choice([1, 100, 4096, 5000, 65536, 300000]))
            r = http_request("127.0.0.1", http, "PUT", kv_path(key), body=blocks[key], headers=auth)
            assert r.status == 201, r
        for key, data in blocks.items():
            r = http_request("127.0.0.1", http, "GET", kv_path(key), headers=auth)
            assert r.status == 200 and r.body == data, (key, r.status)
        stored, topics, end = set(), set(), time.monotonic() + 10 * SLOW
        while len(stored) < len(blocks) and time.monotonic() < end:
            if sub.poll(200):
                topic, _seq, payload = sub.recv_multipart()
                topics.add(topic.decode())
                for ev in msgpack.unpackb(payload)[1]:
                    if ev[0] == "BlockStored":
                        stored.update(ev[1])
        sub.close(linger=0)
        zctx.term()
        assert len(stored) == len(blocks), f"{len(stored)} of {len(blocks)} BlockStored seen on {topics}"
        assert topics == {f"kv@{POD}@kvrelay"}, topics  # the backend id is the pod's name (POD_NAME)

        # SIGKILL of the main process: the kernel kills the rest of the container with it
        os.kill(pid, 9)
        # restartPolicy Always: podman may restart it itself, as the kubelet would; otherwise
        # the pod is started again by hand. Either way it is a new process on the same segment.
        deadline = time.monotonic() + 30
        how = None
        while time.monotonic() < deadline and how is None:
            st, npid, rc = pm.out("inspect", "--format", "{{.State.Status}} {{.State.Pid}} {{.State.ExitCode}}",
                                  CTR).split()
            if st == "exited":
                assert rc == "137", f"after SIGKILL of PID 1: exit {rc}"
                pm.run("pod", "start", POD)
                how = "podman pod start"
            elif st == "running" and int(npid) != pid:
                how = "restartPolicy Always"
            else:
                time.sleep(0.1)  # poll interval of this bounded wait for the exit or the restart
        assert how, f"the container neither exited nor restarted after SIGKILL: {st} {npid}"
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
        wait_http(http, "/readyz", 200, 60)
        lg = pm.run("logs", CTR)
        logs = lg.stdout.decode(errors="replace") + lg.stderr.decode(errors="replace")
        assert "re-attached" in logs and "store repair done" in logs, logs[-3000:]
        for key, data in blocks.items():
            r = http_request("127.0.0.1", http, "GET", kv_path(key), headers=auth)
            assert r.status == 200 and r.body == data, f"after the restart: {key} {r.status}"
        # A GET's pin is let go when its worker reaps the send's completion, which can come a
        # moment after the client has read the last byte; /debug/store may be answered by the
        # other worker in that moment. A pin the repair left behind would stay: polled, bounded.
        deadline = time.monotonic() + 5 * SLOW
        while True:
            d = http_request("127.0.0.1", http, "GET", "/debug/store", headers=auth).json()
            if d["pinned_blocks"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)  # poll interval of this bounded wait (asserted just below)
        assert d["ok"] is True and d["unique_blocks"] == len(blocks) and d["pinned_blocks"] == 0, d

        # Stop: SIGTERM, drain, exit 0 within the grace period. podman before 5.1 sends SIGKILL
        # on `kube down` (podman issue 22397, fixed by PR 22398), so the pod is stopped first as
        # podman's own workaround says, with the template's grace as the timeout; then kube down.
        t0 = time.monotonic()
        pm.run("pod", "stop", "-t", str(grace), POD, timeout=grace + 30)
        took = time.monotonic() - t0
        code = pm.out("inspect", "--format", "{{.State.ExitCode}}", CTR)
        lg = pm.run("logs", CTR)
        tail = (lg.stdout + lg.stderr).decode(errors="replace").splitlines()[-5:]
        assert code == "0", f"exit {code} after SIGTERM: {tail}"
        assert took < grace, f"pod stop took {took:.1f}s, grace {grace}s"
        assert any("all workers stopped; exiting" in ln for ln in tail), tail
        down = pm.run("kube", "down", str(paths["pod"]), timeout=60, check=False)
        played = False
        assert down.returncode == 0, down
        assert pm.run("pod", "exists", POD, check=False).returncode != 0, "kube down left the pod"
        print(f"podman: image built in {build_s:.0f}s; {version}; default seccomp profile of {seccomp_pkg}: "
              f"{engine[0][engine[0].index('io engine:'):][:80]}; 200 blocks kept across SIGKILL of PID 1 (back by {how}); "
              f"stopped in {took:.1f}s (grace {grace}s), exit {code}; whole test "
              f"{time.monotonic() - t_start:.0f}s")
    finally:
        if played:
            pm.run("kube", "down", str(paths["pod"]), check=False, timeout=60)
        pm.run("secret", "rm", "kvrelay-token", check=False)
        shutil.rmtree(segdir, ignore_errors=True)
