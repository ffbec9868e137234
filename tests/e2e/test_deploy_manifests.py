"""
deploy/ validated offline (issue 13), in `make test`:

  - kustomize rendering of deploy/ (huge pages), deploy/memory/ (tmpfs) and the optional
    deploy/grafana/ (the dashboard as a ConfigMap for Grafana's sidecar) by a small renderer of
    the features deploy/ uses (resources, namespace, labels, images, JSON 6902 patches, a
    configMapGenerator of files without name hashes); where kubectl is installed its own
    `kubectl kustomize` must produce the same objects;
  - every object validated against the Kubernetes API types of Debian's python3-kubernetes
    (22.6, Kubernetes 1.22: every field known, every type right, every required field present by
    the models' own setters; those models carry no enums, so the enum-valued strings deploy/
    sets are checked against the API's values in ENUMS) plus Probe.grpc (GA in Kubernetes 1.27, newer than
    those models: {port: int32, required; service: string}); the Prometheus Operator's
    ServiceMonitor and PrometheusRule against the subset of their monitoring.coreos.com/v1 CRD
    schemas that deploy/ uses, written down below (no other field allowed);
  - the wiring: selectors match the pod template, Service and probe ports name container
    ports, the ConfigMap's KVRELAY_* settings and the container's args are accepted by the real
    binary (--print-config), and the resources hold the segment the binary computes for
    KVRELAY_MEMORY (hugepages-2Mi in deploy/, memory on top of the processes' own in
    deploy/memory/);
  - the PrometheusRule's groups pass `promtool check rules`, and every metric name in the alert
    expressions (and every label matcher's label) is one a started server's /metrics exposes.
"""

import copy
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from conftest import REPO, run_binary

DEPLOY = REPO / "deploy"
MiB = 1 << 20


# ---------------------------------------------------------------------------------------------
# A kustomize of the features deploy/ uses (anything else is refused, never ignored)

KUSTOMIZATION_KEYS = {"apiVersion", "kind", "namespace", "labels", "resources", "images", "patches",
                      "configMapGenerator", "generatorOptions"}


def _load_docs(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def _json_pointer(doc, path):
    parts = [p.replace("~1", "/").replace("~0", "~") for p in path.lstrip("/").split("/")]
    parent = doc
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    return parent, parts[-1]


def _apply_6902(doc, ops):
    for op in ops:
        assert set(op) <= {"op", "path", "value"}, op
        parent, key = _json_pointer(doc, op["path"])
        if isinstance(parent, list):
            idx = len(parent) if key == "-" else int(key)
            if op["op"] == "add":
                parent.insert(idx, copy.deepcopy(op["value"]))
            elif op["op"] == "replace":
                assert idx < len(parent), op
                parent[idx] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[idx]
            else:
                raise AssertionError(f"unsupported patch op {op}")
        else:
            if op["op"] in ("add", "replace"):
                if op["op"] == "replace":
                    assert key in parent, f"replace of a missing {op['path']}"
                parent[key] = copy.deepcopy(op["value"])
            elif op["op"] == "remove":
                del parent[key]
            else:
                raise AssertionError(f"unsupported patch op {op}")


def _generate_configmaps(root, k):
    """configMapGenerator entries of files, with generatorOptions' labels; names unhashed."""
    opts = k.get("generatorOptions", {})
    assert set(opts) <= {"disableNameSuffixHash", "labels"}, f"generatorOptions {set(opts)} not supported here"
    out = []
    for g in k.get("configMapGenerator", []):
        assert set(g) <= {"name", "files"}, f"configMapGenerator with {set(g)} is not supported here"
        assert opts.get("disableNameSuffixHash") is True, "hashed generator names are not rendered here"
        data = {}
        for f in g["files"]:
            key, _, path = f.rpartition("=")
            data[key or Path(path).name] = (root / path).read_text()
        meta = {"name": g["name"]}
        if opts.get("labels"):
            meta["labels"] = dict(opts["labels"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return out


def render(root):
    """The objects `kubectl kustomize root` would produce (for deploy/'s feature set)."""
    root = Path(root)
    k = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert k["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and k["kind"] == "Kustomization", k
    unknown = set(k) - KUSTOMIZATION_KEYS
    assert not unknown, f"{root}/kustomization.yaml uses {unknown}, which this renderer does not know"
    objs = []
    for r in k.get("resources", []):
        p = (root / r).resolve()
        objs += render(p) if p.is_dir() else _load_docs(p)
    objs += _generate_configmaps(root, k)
    for lab in k.get("labels", []):
        assert set(lab) == {"pairs"}, f"labels with {set(lab)} are not supported here"
        for o in objs:
            o.setdefault("metadata", {}).setdefault("labels", {}).update(lab["pairs"])
    if "namespace" in k:
        for o in objs:
            if o["kind"] != "Namespace":
                o["metadata"]["namespace"] = k["namespace"]
    for im in k.get("images", []):
        for o in objs:
            spec = o.get("spec", {}).get("template", {}).get("spec", {})
            for c in spec.get("containers", []) + spec.get("initContainers", []):
                name, _, tag = c["image"].partition(":")
                if name == im["name"]:
                    c["image"] = f"{im.get('newName', name)}:{im.get('newTag', tag or 'latest')}"
    for pt in k.get("patches", []):
        assert set(pt) == {"target", "patch"}, pt
        ops = yaml.safe_load(pt["patch"])
        assert isinstance(ops, list), "only JSON 6902 patches are supported here"
        hits = [o for o in objs if all(o.get("kind") == v if f == "kind" else o["metadata"].get(f) == v
                                       for f, v in pt["target"].items())]
        assert len(hits) == 1, f"patch target {pt['target']} matches {len(hits)} objects"
        _apply_6902(hits[0], ops)
    return objs


VARIANTS = {"hugepages": DEPLOY, "memory": DEPLOY / "memory", "tenants": DEPLOY / "tenants", "ssd": DEPLOY / "ssd"}
GRAFANA = DEPLOY / "grafana"  # optional, applied on its own into Grafana's namespace


def by_kind(objs, kind, name=None):
    hits = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(hits) == 1, f"{kind} {name or ''}: {len(hits)} objects"
    return hits[0]


# ---------------------------------------------------------------------------------------------
# Validation against the API types


def _models():
    import kubernetes.client.models as m
    from kubernetes.client import Configuration

    cfg = Configuration()
    cfg.client_side_validation = True
    return m, cfg


# Fields newer than Debian's models (Kubernetes 1.22), as the later API defines them.
EXTRA_FIELDS = {
    ("V1Probe", "grpc"): {"port": ("int", True), "service": ("str", False)},
}

# The enum-valued string fields (the Kubernetes API reference's values), by model and field.
ENUMS = {
    ("V1Container", "imagePullPolicy"): {"Always", "IfNotPresent", "Never"},
    ("V1Container", "terminationMessagePolicy"): {"File", "FallbackToLogsOnError"},
    ("V1PodSpec", "restartPolicy"): {"Always", "OnFailure", "Never"},
    ("V1PodSpec", "dnsPolicy"): {"ClusterFirst", "ClusterFirstWithHostNet", "Default", "None"},
    ("V1ContainerPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServicePort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1NetworkPolicyPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServiceSpec", "type"): {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
    ("V1ServiceSpec", "sessionAffinity"): {"ClientIP", "None"},
    ("V1StatefulSetSpec", "podManagementPolicy"): {"OrderedReady", "Parallel"},
    ("V1StatefulSetUpdateStrategy", "type"): {"RollingUpdate", "OnDelete"},
    ("V1EmptyDirVolumeSource", "medium"): {"", "Memory", "HugePages"},
    ("V1SeccompProfile", "type"): {"RuntimeDefault", "Localhost", "Unconfined"},
    ("V1HTTPGetAction", "scheme"): {"HTTP", "HTTPS"},
    ("V1LabelSelectorRequirement", "operator"): {"In", "NotIn", "Exists", "DoesNotExist"},
    ("V1NetworkPolicySpec", "policyTypes"): {"Ingress", "Egress"},
}

ROOT_TYPES = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Pod"): "V1Pod",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
}

# monitoring.coreos.com/v1, the fields deploy/ uses (the CRD allows more; we allow no more).
_OBJ_META = {"name": ("str", True), "namespace": ("str", False), "labels": ("dict(str, str)", False),
             "annotations": ("dict(str, str)", False)}
_SELECTOR = {"matchLabels": ("dict(str, str)", False),
             "matchExpressions": ([{"key": ("str", True), "operator": ("enum:In,NotIn,Exists,DoesNotExist", True),
                                    "values": ("list[str]", False)}], False)}
CRDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "apiVersion": ("str", True), "kind": ("str", True), "metadata": (_OBJ_META, True),
        "spec": ({
            "selector": (_SELECTOR, True),
            "namespaceSelector": ({"any": ("bool", False), "matchNames": ("list[str]", False)}, False),
            "endpoints": ([{
                "port": ("str", False), "path": ("str", False), "scheme": ("enum:http,https", False),
                "interval": ("duration", False), "scrapeTimeout": ("duration", False),
                "bearerTokenSecret": ({"name": ("str", False), "key": ("str", True),
                                       "optional": ("bool", False)}, False),
            }], False),
        }, True),
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "apiVersion": ("str", True), "kind": ("str", True), "metadata": (_OBJ_META, True),
        "spec": ({
            "groups": ([{
                "name": ("str", True), "interval": ("duration", False),
                "rules": ([{
                    "alert": ("str", False), "record": ("str", False), "expr": ("str", True),
                    "for": ("duration", False), "labels": ("dict(str, str)", False),
                    "annotations": ("dict(str, str)", False),
                }], False),
            }], False),
        }, True),
    },
}

DURATION_RE = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def _scalar_ok(t, v):
    if t == "str":
        return isinstance(v, str)
    if t == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "bool":
        return isinstance(v, bool)
    if t == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "object":  # IntOrString (ports, maxUnavailable) and free-form
        return isinstance(v, (str, int)) and not isinstance(v, bool) or isinstance(v, dict)
    raise AssertionError(f"unknown scalar type {t}")


def _check_model(name, data, path, errs):
    m, cfg = _models()
    cls = getattr(m, name)
    if not isinstance(data, dict):
        errs.append(f"{path}: expected an object ({name}), got {type(data).__name__}")
        return
    json_to_py = {j: p for p, j in cls.attribute_map.items()}
    kwargs = {}
    for key, val in data.items():
        extra = EXTRA_FIELDS.get((name, key))
        if extra is not None:
            _check_schema(extra, val, f"{path}.{key}", errs)
            continue
        if key not in json_to_py:
            errs.append(f"{path}: unknown field {key!r} for {name}")
            continue
        py = json_to_py[key]
        _check_type(cls.openapi_types[py], val, f"{path}.{key}", errs)
        allowed = ENUMS.get((name, key))
        if allowed is not None:
            for x in val if isinstance(val, list) else [val]:
                if x not in allowed:
                    errs.append(f"{path}.{key}: {x!r} not one of {sorted(allowed)}")
        kwargs[py] = val
    try:  # required fields and enums: the models' own setters
        cls(local_vars_configuration=cfg, **kwargs)
    except (ValueError, TypeError) as e:
        errs.append(f"{path}: {name}: {e}")


def _check_type(t, v, path, errs):
    if t.startswith("list["):
        if not isinstance(v, list):
            errs.append(f"{path}: expected a list ({t}), got {type(v).__name__}")
            return
        for i, x in enumerate(v):
            _check_type(t[5:-1], x, f"{path}[{i}]", errs)
    elif t.startswith("dict("):
        if not isinstance(v, dict):
            errs.append(f"{path}: expected a map ({t}), got {type(v).__name__}")
            return
        inner = t[5:-1].split(", ", 1)[1]
        for k, x in v.items():
            if not isinstance(k, str):
                errs.append(f"{path}: key {k!r} is not a string")
            _check_type(inner, x, f"{path}.{k}", errs)
    elif t in ("str", "int", "bool", "float", "object"):
        if not _scalar_ok(t, v):
            errs.append(f"{path}: expected {t}, got {type(v).__name__} {v!r}")
    elif t in ("datetime", "date"):
        if not isinstance(v, str):
            errs.append(f"{path}: expected a timestamp string")
    else:
        _check_model(t, v, path, errs)


def _check_schema(schema, v, path, errs):
    """schema: {field: (type, required)}, type a scalar name, 'list[str]', 'dict(str, str)',
    'duration', 'enum:a,b', a nested schema dict, or [schema] for a list of objects."""
    if not isinstance(v, dict):
        errs.append(f"{path}: expected an object, got {type(v).__name__}")
        return
    for key in v:
        if key not in schema:
            errs.append(f"{path}: unknown field {key!r}")
    for key, (t, req) in schema.items():
        if key not in v:
            if req:
                errs.append(f"{path}: required field {key!r} missing")
            continue
        x = v[key]
        if isinstance(t, dict):
            _check_schema(t, x, f"{path}.{key}", errs)
        elif isinstance(t, list):
            if not isinstance(x, list):
                errs.append(f"{path}.{key}: expected a list")
                continue
            for i, y in enumerate(x):
                _check_schema(t[0], y, f"{path}.{key}[{i}]", errs)
        elif t == "duration":
            if not (isinstance(x, str) and DURATION_RE.match(x) and x):
                errs.append(f"{path}.{key}: {x!r} is not a Prometheus duration")
        elif t.startswith("enum:"):
            if x not in t[5:].split(","):
                errs.append(f"{path}.{key}: {x!r} not in {t[5:]}")
        elif t.startswith("list[") or t.startswith("dict("):
            _check_type(t, x, f"{path}.{key}", errs)
        elif not _scalar_ok(t, x):
            errs.append(f"{path}.{key}: expected {t}, got {type(x).__name__} {x!r}")


def validate(obj):
    """A list of problems (empty: valid)."""
    errs = []
    key = (obj.get("apiVersion"), obj.get("kind"))
    where = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    if key in ROOT_TYPES:
        _check_model(ROOT_TYPES[key], obj, where, errs)
    elif key in CRDS:
        _check_schema(CRDS[key], obj, where, errs)
    else:
        errs.append(f"{where}: no schema for apiVersion/kind {key}")
    return errs


# ---------------------------------------------------------------------------------------------
# The tests


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_manifest_is_valid_against_the_api_types(variant):
    objs = render(VARIANTS[variant])
    kinds = sorted(o["kind"] for o in objs)
    assert kinds == sorted(["Namespace", "ConfigMap", "StatefulSet", "Service", "Service", "PodDisruptionBudget",
                            "NetworkPolicy", "ServiceMonitor", "PrometheusRule"]), kinds
    problems = [p for o in objs for p in validate(o)]
    assert not problems, "\n".join(problems)
    for o in objs:
        assert o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "kvrelay", o["metadata"]
        if o["kind"] != "Namespace":
            assert o["metadata"]["namespace"] == "kvrelay", o["metadata"]


def test_the_validator_rejects_unknown_fields_wrong_types_and_missing_fields():
    """The checks above would catch a mistake: each mutation of a valid object is refused."""
    objs = render(DEPLOY)
    sts = by_kind(objs, "StatefulSet")
    assert validate(sts) == []

    def broken(mutate, obj=sts):
        o = copy.deepcopy(obj)
        mutate(o)
        return validate(o)

    c = lambda o: o["spec"]["template"]["spec"]["containers"][0]  # noqa: E731
    assert any("unknown field 'imagePullPolice'" in e for e in broken(lambda o: c(o).update(imagePullPolice="Always")))
    assert any("expected int" in e for e in broken(lambda o: o["spec"].update(replicas="3")))
    assert any("expected a list" in e for e in broken(lambda o: c(o).update(args="--x")))
    assert any("expected str" in e for e in broken(lambda o: c(o)["resources"]["limits"].update(memory=2)))
    assert any("must not be `None`" in e for e in broken(lambda o: c(o).pop("name")))
    assert any("unknown field 'servce'" in e
               for e in broken(lambda o: c(o)["startupProbe"]["grpc"].update(servce="x")))
    assert any("required field 'port'" in e for e in broken(lambda o: c(o)["startupProbe"]["grpc"].pop("port")))
    assert any("unknown field 'emptyDirr'" in e
               for e in broken(lambda o: o["spec"]["template"]["spec"]["volumes"][0].update(emptyDirr={})))
    rule = by_kind(objs, "PrometheusRule")
    assert any("unknown field 'expression'" in e
               for e in broken(lambda o: o["spec"]["groups"][0]["rules"][0].update(expression="up"), rule))
    assert any("not a Prometheus duration" in e
               for e in broken(lambda o: o["spec"]["groups"][0]["rules"][1].update({"for": "10 minutes"}), rule))
    sm = by_kind(objs, "ServiceMonitor")
    assert any("unknown field 'bearerTokenFile'" in e
               for e in broken(lambda o: o["spec"]["endpoints"][0].update(bearerTokenFile="/x"), sm))
    assert any("'Sometimes' not one of" in e for e in broken(lambda o: c(o).update(imagePullPolicy="Sometimes")))
    assert any("'Disk' not one of" in e
               for e in broken(lambda o: o["spec"]["template"]["spec"]["volumes"][0]["emptyDir"].update(medium="Disk")))
    assert validate({"apiVersion": "v9", "kind": "Frob", "metadata": {"name": "x"}}) != []


def test_kubectl_kustomize_renders_the_same_objects_where_installed():
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (not a Debian 12 package); the renderer above is used alone")
    for variant, root in {**VARIANTS, "grafana": GRAFANA}.items():
        p = subprocess.run([kubectl, "kustomize", str(root)], capture_output=True, timeout=60)
        assert p.returncode == 0, p.stderr.decode()
        theirs = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(p.stdout) if o}
        ours = {(o["kind"], o["metadata"]["name"]): o for o in render(root)}
        assert theirs.keys() == ours.keys(), (variant, theirs.keys(), ours.keys())
        for k in ours:
            assert json.dumps(ours[k], sort_keys=True) == json.dumps(theirs[k], sort_keys=True), (variant, k)


def test_grafana_overlay_is_the_dashboard_json_as_a_sidecar_configmap():
    """deploy/grafana/: one ConfigMap generated from kvrelay.json (the one source), labelled for
    Grafana's sidecar, no namespace of its own (kubectl -n decides), small enough for a
    client-side `kubectl apply` (its last-applied annotation is capped at 256 KiB)."""
    objs = render(GRAFANA)
    assert [o["kind"] for o in objs] == ["ConfigMap"], objs
    cm = objs[0]
    assert validate(cm) == []
    meta = cm["metadata"]
    assert meta["name"] == "kvrelay-dashboard" and "namespace" not in meta, meta
    assert meta["labels"] == {"grafana_dashboard": "1", "app.kubernetes.io/part-of": "kvrelay"}, meta
    src = (GRAFANA / "kvrelay.json").read_text()
    assert cm["data"] == {"kvrelay.json": src}
    dash = json.loads(cm["data"]["kvrelay.json"])
    assert dash["uid"] == "kvrelay" and dash["id"] is None, "a fixed uid, no instance id"
    assert len(json.dumps(cm)) < 256 * 1024
    assert "grafana" not in yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"], \
        "optional: not part of the default tree"


def _container(objs):
    sts = by_kind(objs, "StatefulSet")
    return sts, sts["spec"]["template"]["spec"], sts["spec"]["template"]["spec"]["containers"][0]


def test_wiring_selectors_ports_probes_and_secret():
    objs = render(DEPLOY)
    sts, pod, c = _container(objs)
    labels = sts["spec"]["template"]["metadata"]["labels"]
    sel = sts["spec"]["selector"]["matchLabels"]
    assert sel.items() <= labels.items()
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 9130, "grpc": 5561, "kv-events": 5557, "kv-replay": 5558}
    headless = by_kind(objs, "Service", "kvrelay-headless")
    assert sts["spec"]["serviceName"] == "kvrelay-headless" and headless["spec"]["clusterIP"] == "None"
    # the KV events are per pod (a router subscribes to each): only the headless Service names them
    for svc, names in ((headless, set(ports)), (by_kind(objs, "Service", "kvrelay"), {"http", "grpc"})):
        assert svc["spec"]["selector"].items() <= labels.items()
        assert {p["targetPort"] for p in svc["spec"]["ports"]} == names
        assert all(p.get("type", "ClusterIP") == "ClusterIP" for p in [svc["spec"]])
    # ZMQ has no authentication: the events' ports admit only the policy's client pods
    rules = by_kind(objs, "NetworkPolicy")["spec"]["ingress"]
    for port in (5557, 5558):
        allowed = [r for r in rules if any(p["port"] == port for p in r["ports"])]
        assert len(allowed) == 1 and allowed[0]["from"][0]["podSelector"]["matchLabels"] == {"kvrelay.io/client": "true"}
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert by_kind(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert by_kind(objs, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["startupProbe"]["grpc"]["port"] == ports["grpc"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert vols.keys() == mounts.keys()
    tok = c["args"][c["args"].index("--token-file") + 1]
    assert tok.startswith(mounts["token"] + "/") and vols["token"]["secret"]["secretName"] == "kvrelay-token"
    sm = by_kind(objs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["bearerTokenSecret"] == {"name": "kvrelay-token", "key": "token"}
    assert sm["spec"]["endpoints"][0]["port"] in ports
    cm = by_kind(objs, "ConfigMap")
    assert cm["data"]["KVRELAY_SEGMENT_PATH"].startswith(mounts["segment"] + "/")
    assert cm["data"]["KVRELAY_KV_EVENTS_BIND"] == f"tcp://0.0.0.0:{ports['kv-events']}"
    assert cm["data"]["KVRELAY_KV_EVENTS_REPLAY_BIND"] == f"tcp://0.0.0.0:{ports['kv-replay']}"
    grace = pod["terminationGracePeriodSeconds"]
    assert grace > int(cm["data"]["KVRELAY_SHUTDOWN_GRACE"].rstrip("s")) + 1


def test_the_tenants_variant_mounts_the_file_as_a_directory_and_scrapes_as_admin(tmp_path):
    """deploy/tenants/: --tenants names a file inside a whole-Secret mount (no subPath, so the
    kubelet's update reaches the running pod), the admin token comes from its own Secret, and
    Prometheus scrapes with it. The binary starts with these settings and a tenants file."""
    objs = render(DEPLOY / "tenants")
    _sts, pod, c = _container(objs)
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert vols.keys() == mounts.keys() and "token" not in vols
    path = c["args"][c["args"].index("--tenants") + 1]
    assert path.startswith(mounts["tenants"]["mountPath"] + "/") and "subPath" not in mounts["tenants"]
    assert vols["tenants"]["secret"]["secretName"] == "kvrelay-tenants"
    env = {e["name"]: e for e in c["env"]}
    assert env["KVRELAY_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "kvrelay-admin-token", "key": "token"}
    sm = by_kind(objs, "ServiceMonitor")
    assert sm["spec"]["endpoints"][0]["bearerTokenSecret"] == {"name": "kvrelay-admin-token", "key": "token"}
    # the binary takes them
    from conftest import require_binary, server_env

    tenants = tmp_path / "tenants"
    tenants.write_text("team-a tok-a\n")
    cfg_env = dict(by_kind(objs, "ConfigMap")["data"], KVRELAY_ADMIN_TOKEN="tok-admin")
    cfg_env.pop("KVRELAY_SEGMENT_PATH", None)
    p = subprocess.run([require_binary(), "--print-config", "--tenants", str(tenants)], env=server_env(cfg_env),
                       capture_output=True, text=True, timeout=20)
    assert p.returncode == 0, p.stderr
    assert f"tenants={tenants}" in p.stdout and "admin-token=<set>" in p.stdout, p.stdout


def _segment_bytes(env):
    """The segment size the binary computes for these settings (its start-up log line)."""
    import signal as _signal
    import time

    from conftest import require_binary, server_env

    env = dict(env)
    env.pop("KVRELAY_SEGMENT_PATH", None)  # a memfd: same layout, nothing written to a file
    env.update(KVRELAY_HTTP_BIND="127.0.0.1:0", KVRELAY_GRPC_BIND="off", KVRELAY_WORKERS="1",
               KVRELAY_HUGEPAGES="off", KVRELAY_LOG_FORMAT="text")
    p = subprocess.Popen([require_binary()], env=server_env(env), stderr=subprocess.PIPE,
                         stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        for line in p.stderr:
            m = re.search(rb"segment: (\d+) bytes", line)
            if m:
                return int(m.group(1))
            assert time.monotonic() < deadline
        raise AssertionError("no segment line")
    finally:
        p.send_signal(_signal.SIGTERM)
        p.wait(20)


def _qty(s):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi)?", s)
    assert m, s
    return int(m.group(1)) << {None: 0, "Ki": 10, "Mi": 20, "Gi": 30}[m.group(2)]


def test_the_binary_accepts_the_settings_and_the_resources_hold_its_segment(tmp_path):
    objs = render(DEPLOY)
    _sts, pod, c = _container(objs)
    env = by_kind(objs, "ConfigMap")["data"]
    assert all(k.startswith("KVRELAY_") for k in env), env
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    args = [str(token) if a.startswith("/var/run/kvrelay/token/") else a for a in c["args"]]
    p = run_binary(args + ["--print-config"], env=env)
    assert p.returncode == 0, p.stderr.decode()
    cfg = dict(ln.split("=", 1) for ln in p.stdout.decode().splitlines() if "=" in ln)
    for k, v in env.items():
        flag = k[len("KVRELAY_"):].lower().replace("_", "-")
        assert flag in cfg, f"{k} is no flag's twin"
    assert cfg["memory"] == str(4 << 30) and cfg["token-source"] == "token-file", cfg
    assert cfg["segment-path"] == env["KVRELAY_SEGMENT_PATH"]

    seg = _segment_bytes(env)
    hp = c["resources"]
    assert hp["requests"]["hugepages-2Mi"] == hp["limits"]["hugepages-2Mi"]  # Kubernetes requires it
    assert _qty(hp["limits"]["hugepages-2Mi"]) >= seg, (hp, seg)
    assert _qty(hp["limits"]["hugepages-2Mi"]) % (2 * MiB) == 0
    assert _qty(hp["limits"]["hugepages-2Mi"]) - seg < 16 * MiB, "sized from the segment, not guessed"
    assert next(v for v in pod["volumes"] if v["name"] == "segment")["emptyDir"] == {"medium": "HugePages"}
    own = _qty(hp["limits"]["memory"])

    _s, mpod, mc = _container(render(DEPLOY / "memory"))
    vol = next(v for v in mpod["volumes"] if v["name"] == "segment")["emptyDir"]
    assert vol["medium"] == "Memory" and _qty(vol["sizeLimit"]) >= seg
    r = mc["resources"]
    assert "hugepages-2Mi" not in r["requests"] and "hugepages-2Mi" not in r["limits"]
    assert r["requests"]["memory"] == r["limits"]["memory"]
    assert _qty(r["limits"]["memory"]) >= seg + own, (r, seg, own)
    print(f"segment for KVRELAY_MEMORY={env['KVRELAY_MEMORY']}: {seg} bytes ({seg / MiB:.0f} MiB); "
          f"hugepages-2Mi {hp['limits']['hugepages-2Mi']}, memory variant {r['limits']['memory']}")


def test_the_ssd_variant_claims_a_local_volume_and_its_huge_pages_hold_the_disk_index(tmp_path):
    """deploy/ssd/: the tier's file on a node-local claim mounted where KVRELAY_SSD_PATH points,
    the claim larger than the file, and the huge pages grown by the disk index: the binary's
    own segment size for KVRELAY_SSD_SLOTS (the file itself made small here: the slots, not the
    file, size the segment)."""
    objs = render(DEPLOY / "ssd")
    sts, pod, c = _container(objs)
    env = by_kind(objs, "ConfigMap")["data"]
    mount = next(m for m in c["volumeMounts"] if m["name"] == "ssd")
    assert env["KVRELAY_SSD_PATH"].startswith(mount["mountPath"] + "/"), (env, mount)
    claim = next(t for t in sts["spec"]["volumeClaimTemplates"] if t["metadata"]["name"] == "ssd")
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"] and claim["spec"]["storageClassName"]
    size = _qty(env["KVRELAY_SSD_SIZE"].replace("G", "Gi"))
    assert _qty(claim["spec"]["resources"]["requests"]["storage"]) > size, (claim, size)
    assert int(env["KVRELAY_SSD_SLOTS"]) == size // (64 << 10), "one slot per 64 KiB, the binary's default"

    token = tmp_path / "token"
    token.write_text("t0ken\n")
    args = [str(token) if a.startswith("/var/run/kvrelay/token/") else a for a in c["args"]]
    p = run_binary(args + ["--print-config"], env=env)
    assert p.returncode == 0, p.stderr.decode()
    assert f"ssd-path={env['KVRELAY_SSD_PATH']}" in p.stdout.decode(), p.stdout.decode()

    seg = _segment_bytes(dict(env, KVRELAY_SSD_PATH=str(tmp_path / "tier"), KVRELAY_SSD_SIZE="64M",
                              KVRELAY_SSD_PAGE_SIZE="16M"))
    base = _segment_bytes(by_kind(render(DEPLOY), "ConfigMap")["data"])
    hp = c["resources"]
    assert hp["requests"]["hugepages-2Mi"] == hp["limits"]["hugepages-2Mi"]
    assert _qty(hp["limits"]["hugepages-2Mi"]) >= seg, (hp, seg)
    assert _qty(hp["limits"]["hugepages-2Mi"]) - seg < 16 * MiB, "sized from the segment, not guessed"
    assert seg - base >= int(env["KVRELAY_SSD_SLOTS"]) * 64, (seg, base)
    print(f"segment with {env['KVRELAY_SSD_SLOTS']} disk index slots: {seg / MiB:.0f} MiB "
          f"({(seg - base) / MiB:.0f} MiB more); hugepages-2Mi {hp['limits']['hugepages-2Mi']}")


# ---------------------------------------------------------------------------------------------
# The PrometheusRule against promtool and a live /metrics

PROMQL_FUNCS = {"rate", "increase", "sum", "histogram_quantile", "max", "min", "avg", "count", "irate",
                "delta", "abs", "clamp_min", "clamp_max", "absent", "time", "vector", "scalar", "label_replace"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "le"}


def promql_names(expr):
    """(metric names, {metric: label names in its matchers}) of a PromQL expression."""
    names, labels = set(), {}
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    for m in re.finditer(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?\s*(\()?", s):
        word, matchers, call = m.group(1), m.group(2), m.group(3)
        if call and not matchers:
            assert word in PROMQL_FUNCS, f"unknown PromQL function {word} in {expr!r}"
            continue
        if word in PROMQL_WORDS:
            continue
        names.add(word)
        if matchers:
            labels.setdefault(word, set()).update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers))
    return names, labels


def test_prometheus_rules_pass_promtool(tmp_path):
    rule = by_kind(render(DEPLOY), "PrometheusRule")
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    p = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, timeout=60)
    out = (p.stdout + p.stderr).decode()
    assert p.returncode == 0, out
    assert "SUCCESS: 5 rules found" in out, out
    alerts = {r["alert"] for r in rule["spec"]["groups"][0]["rules"]}
    assert alerts == {"KvrelayWorkerRestarts", "KvrelayInsufficientStorage", "KvrelayEvictionPressure",
                      "KvrelayRelaySubscribersLagged", "KvrelayPublicationLatencyHigh"}


def test_alert_expressions_use_only_metrics_that_metrics_exposes(kvrelay):
    srv = kvrelay("--grpc-bind", "127.0.0.1:0", "--memory", "16M", "--workers", "1")
    # a 507 and a PUT, so that the status label of the requests family has been seen
    assert srv.put("m-key", b"m" * 1000).status == 201
    text = srv.metrics_text()
    families, sample_labels = {}, {}
    for ln in text.splitlines():
        m = re.match(r"# TYPE (\S+) (\S+)", ln)
        if m:
            families[m.group(1)] = m.group(2)
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{([^}]*)\})? ", ln)
        if m and not ln.startswith("#"):
            sample_labels.setdefault(m.group(1), set()).update(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(3) or ""))
    exposed = set()
    for name, typ in families.items():
        exposed.add(name)
        if typ == "histogram":
            exposed |= {name + "_bucket", name + "_sum", name + "_count"}
    rule = by_kind(render(DEPLOY), "PrometheusRule")
    used = {}
    for r in rule["spec"]["groups"][0]["rules"]:
        names, labels = promql_names(r["expr"])
        assert names, r
        missing = names - exposed
        assert not missing, f"{r['alert']}: {sorted(missing)} not in /metrics"
        for metric, labs in labels.items():
            assert labs <= sample_labels.get(metric, set()), (
                f"{r['alert']}: labels {sorted(labs - sample_labels.get(metric, set()))} of {metric} not in /metrics")
        used[r["alert"]] = sorted(names)
    assert "kvrelay_relay_publication_latency_seconds_bucket" in used["KvrelayPublicationLatencyHigh"]
    print(used)


def test_promql_name_extraction_is_not_vacuous():
    names, labels = promql_names('sum by (pod, le) (rate(foo_bucket{status="507", x=~"a"}[5m])) / bar > 0.5 * baz')
    assert names == {"foo_bucket", "bar", "baz"} and labels == {"foo_bucket": {"status", "x"}}
    with pytest.raises(AssertionError):
        promql_names("frobnicate(up)")
