#!/usr/bin/python3
"""Checks a rendered chart (helm_render's output) without a cluster.

  validate.py RENDERED.yaml [--values-json V.json --schema values.schema.json]
              [--k8s-models DIR] [--config-out cluster.yaml]

1. Every document parses as YAML and is a mapping with apiVersion, kind and metadata.name.
2. apiVersion/kind is one this chart may emit (a fixed list; anything else fails).
3. Built-in kinds are checked against the Kubernetes API schema, as the Kubernetes Python
   client's generated models encode it (DIR: an unpacked `kubernetes` wheel, release-1.31 API):
   every field must exist on its object type, values must have the field's type (string,
   integer, boolean, list, map, object), and required fields must be present. Unknown fields
   fail (the API server would drop them silently or, with strict field validation, refuse).
4. The Prometheus Operator's ServiceMonitor/PodMonitor (CRDs, not in the client) are checked
   structurally: the fields this chart uses, their types and the required ones.
5. Cross-object checks Kubernetes does at admission or that only show up at run time: DNS-1123
   names, label syntax, Deployment selectors match their pod labels, Services/PDBs select some
   Deployment's pods, volume mounts name volumes, ConfigMap volumes name a rendered ConfigMap (or
   are allowed to be external), named probe ports exist, HPA targets exist, ServiceMonitor
   selects a Service that has its port; with --restricted, the Pod Security Standard
   "restricted" rules a pod spec shows (and a read-only root filesystem).
6. Optionally the merged values validate against values.schema.json (python3-jsonschema).
7. Optionally writes the ConfigMap's cluster.yaml to --config-out (for the C++ config test).

Not checked: anything a cluster decides (quota, admission webhooks, the image existing, CRDs being
installed, the NVIDIA device plugin), value constraints the API server enforces beyond types
(e.g. resource quantity syntax is checked by a regex only, port ranges by a range check).
"""
import argparse
import json
import re
import sys
import types

import yaml

KNOWN = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "PersistentVolumeClaim"): "V1PersistentVolumeClaim",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("networking.k8s.io/v1", "Ingress"): "V1Ingress",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): None,
    ("monitoring.coreos.com/v1", "PodMonitor"): None,
}

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[mkMGTPE])?$")

errors = []


def err(where, msg):
    errors.append(f"{where}: {msg}")


# --- Kubernetes API schema through the Python client's models ---------------------------------

class Schema:
    def __init__(self, models_dir):
        sys.path.insert(0, models_dir)
        # Import the models without the client package's __init__ (which needs its HTTP and auth
        # dependencies): the models need only six and the Configuration class.
        for name, sub in (("kubernetes", "kubernetes"), ("kubernetes.client", "kubernetes/client")):
            mod = types.ModuleType(name)
            mod.__path__ = [f"{models_dir}/{sub}"]
            sys.modules[name] = mod
        import kubernetes.client.models as models
        from kubernetes.client.configuration import Configuration
        self.models = models
        self.config = Configuration()
        self.config.client_side_validation = True
        self.required_cache = {}

    def required(self, cls):
        if cls not in self.required_cache:
            req = set()
            for attr in cls.openapi_types:
                obj = cls.__new__(cls)
                obj.local_vars_configuration = self.config
                try:
                    setattr(obj, attr, None)
                except ValueError:
                    req.add(cls.attribute_map[attr])
                except Exception:
                    pass
            self.required_cache[cls] = req
        return self.required_cache[cls]

    def check(self, where, value, typ):
        if typ == "object":  # IntOrString, RawExtension, free-form JSON
            return
        if typ.startswith("list["):
            if not isinstance(value, list):
                return err(where, f"want a list ({typ}), got {type(value).__name__}")
            for i, v in enumerate(value):
                self.check(f"{where}[{i}]", v, typ[5:-1])
            return
        if typ.startswith("dict("):
            if not isinstance(value, dict):
                return err(where, f"want a map ({typ}), got {type(value).__name__}")
            inner = typ[typ.index(",") + 1:-1].strip()
            for k, v in value.items():
                if inner == "str" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    # Resource quantities (limits: {nvidia.com/gpu: 1}) are strings in the client
                    # and accept YAML numbers in the API.
                    continue
                self.check(f"{where}.{k}", v, inner)
            return
        if typ == "str":
            if not isinstance(value, str):
                err(where, f"want a string, got {type(value).__name__} {value!r}")
            return
        if typ == "int":
            if not isinstance(value, int) or isinstance(value, bool):
                err(where, f"want an integer, got {type(value).__name__} {value!r}")
            return
        if typ == "float":
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                err(where, f"want a number, got {value!r}")
            return
        if typ == "bool":
            if not isinstance(value, bool):
                err(where, f"want a boolean, got {type(value).__name__} {value!r}")
            return
        if typ == "datetime":
            return
        cls = getattr(self.models, typ, None)
        if cls is None:
            return err(where, f"unknown model type {typ}")
        if not isinstance(value, dict):
            return err(where, f"want an object ({typ}), got {type(value).__name__} {value!r}")
        by_json = {j: a for a, j in cls.attribute_map.items()}
        for k, v in value.items():
            if k not in by_json:
                err(where, f"unknown field {k!r} in {typ}")
                continue
            if v is None:
                continue
            self.check(f"{where}.{k}", v, cls.openapi_types[by_json[k]])
        for r in self.required(cls):
            if value.get(r) is None:
                err(where, f"missing required field {r!r} of {typ}")


# --- Prometheus Operator objects (structural) --------------------------------------------------

def check_monitor(where, doc):
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        return err(where, "spec: missing")
    allowed = {"selector", "namespaceSelector", "endpoints", "podMetricsEndpoints", "jobLabel",
               "targetLabels", "podTargetLabels", "sampleLimit"}
    for k in spec:
        if k not in allowed:
            err(where, f"spec.{k}: not a field this check knows")
    if not isinstance(spec.get("selector"), dict):
        err(where, "spec.selector: required (a label selector)")
    key = "endpoints" if doc["kind"] == "ServiceMonitor" else "podMetricsEndpoints"
    eps = spec.get(key)
    if not isinstance(eps, list) or not eps:
        return err(where, f"spec.{key}: required, a non-empty list")
    ep_fields = {"port", "path", "interval", "scrapeTimeout", "scheme", "relabelings",
                 "metricRelabelings", "honorLabels"}
    for i, ep in enumerate(eps):
        w = f"{where}.spec.{key}[{i}]"
        if not isinstance(ep, dict):
            err(w, "want an object")
            continue
        for k in ep:
            if k not in ep_fields:
                err(w, f"{k}: not a field this check knows")
        if not isinstance(ep.get("port"), str):
            err(w, "port: want a port name")
        for k in ("interval", "scrapeTimeout"):
            if k in ep and not re.match(r"^(\d+(ms|s|m|h))+$", str(ep[k])):
                err(w, f"{k}: {ep[k]!r} is not a Prometheus duration")
        for j, rl in enumerate(ep.get("relabelings") or []):
            if not isinstance(rl.get("sourceLabels", []), list):
                err(f"{w}.relabelings[{j}]", "sourceLabels: want a list")


# --- cross-object checks -----------------------------------------------------------------------

def labels_ok(where, labels):
    for k, v in (labels or {}).items():
        name = k.split("/")[-1]
        prefix = k[: -len(name) - 1] if "/" in k else ""
        if len(name) > 63 or not LABEL_NAME.match(name) or (prefix and not DNS1123_SUBDOMAIN.match(prefix)):
            err(where, f"label key {k!r} is not valid")
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            err(where, f"label {k}={v!r}: value must be a string of <= 63 label characters")


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector or {}).items())


def check_pod(where, pod, configmaps):
    spec = pod.get("spec", {})
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    for v in volumes.values():
        cm = v.get("configMap")
        if cm and cm.get("name") not in configmaps and not cm.get("optional"):
            err(where, f"volume {v['name']}: ConfigMap {cm.get('name')!r} is not rendered")
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        w = f"{where}.containers[{c.get('name')}]"
        ports = {p.get("name"): p for p in c.get("ports", [])}
        for p in ports.values():
            if not 1 <= int(p.get("containerPort", 0)) <= 65535:
                err(w, f"containerPort {p.get('containerPort')} out of range")
            if p.get("name") and len(p["name"]) > 15:
                err(w, f"port name {p['name']!r} longer than 15")
        for m in c.get("volumeMounts", []):
            if m.get("name") not in volumes:
                err(w, f"volumeMount {m.get('name')!r} names no volume")
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            pr = c.get(probe)
            if not pr:
                continue
            handlers = [h for h in ("exec", "httpGet", "tcpSocket", "grpc") if h in pr]
            if len(handlers) != 1:
                err(w, f"{probe}: needs exactly one handler, has {handlers}")
            for h in handlers:
                port = pr[h].get("port") if isinstance(pr[h], dict) else None
                if isinstance(port, str) and port not in ports:
                    err(w, f"{probe}.{h}.port {port!r} names no container port")
        for kind in ("limits", "requests"):
            for k, q in ((c.get("resources") or {}).get(kind) or {}).items():
                if not QUANTITY.match(str(q)):
                    err(w, f"resources.{kind}.{k}: {q!r} is not a quantity")
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            err(w, "privileged container")


def check_restricted(where, pod):
    """The Pod Security Standard "restricted" profile's rules, as far as a pod spec shows them."""
    spec = pod.get("spec", {})
    psc = spec.get("securityContext") or {}
    for key in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(key):
            err(where, f"restricted: {key}")
    for v in spec.get("volumes", []):
        allowed = {"name", "configMap", "emptyDir", "persistentVolumeClaim", "secret", "projected",
                   "downwardAPI", "csi", "ephemeral"}
        if set(v) - allowed:
            err(where, f"restricted: volume {v['name']} of type {sorted(set(v) - allowed)}")
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        w = f"{where}.containers[{c.get('name')}]"
        sc = c.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            err(w, "restricted: allowPrivilegeEscalation must be false")
        if "ALL" not in ((sc.get("capabilities") or {}).get("drop") or []):
            err(w, "restricted: capabilities must drop ALL")
        if set((sc.get("capabilities") or {}).get("add") or []) - {"NET_BIND_SERVICE"}:
            err(w, "restricted: capabilities added")
        if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot"))):
            err(w, "restricted: runAsNonRoot must be true")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            err(w, "restricted: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            err(w, "restricted: seccompProfile must be RuntimeDefault or Localhost")
        if not sc.get("readOnlyRootFilesystem"):
            err(w, "readOnlyRootFilesystem is not set (this chart's own rule, not the profile's)")


def cross_checks(docs, restricted):
    configmaps = {d["metadata"]["name"] for d in docs if d["kind"] == "ConfigMap"}
    deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    services = [d for d in docs if d["kind"] == "Service"]
    pod_labels = [d["spec"]["template"]["metadata"].get("labels", {}) for d in deployments.values()]
    names = set()
    for d in docs:
        md = d["metadata"]
        where = f"{d['kind']}/{md['name']}"
        if (d["kind"], md["name"]) in names:
            err(where, "rendered twice")
        names.add((d["kind"], md["name"]))
        limit = 63 if d["kind"] == "Service" else 253
        pattern = DNS1123_LABEL if d["kind"] == "Service" else DNS1123_SUBDOMAIN
        if len(md["name"]) > limit or not pattern.match(md["name"]):
            err(where, f"name is not a DNS-1123 {'label' if limit == 63 else 'subdomain'}")
        labels_ok(where, md.get("labels"))
        if d["kind"] == "Deployment":
            sel = d["spec"]["selector"].get("matchLabels", {})
            tl = d["spec"]["template"]["metadata"].get("labels", {})
            labels_ok(where + ".template", tl)
            if not selects(sel, tl):
                err(where, "spec.selector does not match the pod template's labels")
            check_pod(where, d["spec"]["template"], configmaps)
            if restricted:
                check_restricted(where, d["spec"]["template"])
        if d["kind"] in ("Service", "PodDisruptionBudget"):
            sel = d["spec"].get("selector", {})
            if d["kind"] == "PodDisruptionBudget":
                sel = sel.get("matchLabels", {})
            if not any(selects(sel, pl) for pl in pod_labels):
                err(where, "selector matches no rendered Deployment's pods")
            if d["kind"] == "Service":
                for p in d["spec"].get("ports", []):
                    if not 1 <= int(p.get("port", 0)) <= 65535:
                        err(where, f"port {p.get('port')} out of range")
        if d["kind"] == "HorizontalPodAutoscaler":
            ref = d["spec"]["scaleTargetRef"]
            if ref.get("kind") != "Deployment" or ref.get("name") not in deployments:
                err(where, f"scaleTargetRef {ref} is not a rendered Deployment")
            if d["spec"].get("minReplicas", 1) > d["spec"]["maxReplicas"]:
                err(where, "minReplicas > maxReplicas")
            for m in d["spec"].get("metrics", []):
                obj = (m.get("object") or {}).get("describedObject")
                if obj and not any(s["metadata"]["name"] == obj.get("name") for s in services):
                    err(where, f"describedObject {obj} is not a rendered Service")
        if d["kind"] == "Ingress":
            for r in d["spec"].get("rules", []):
                for p in (r.get("http") or {}).get("paths", []):
                    svc = p["backend"]["service"]["name"]
                    if not any(s["metadata"]["name"] == svc for s in services):
                        err(where, f"backend Service {svc!r} is not rendered")
        if d["kind"] == "ServiceMonitor":
            sel = d["spec"]["selector"].get("matchLabels", {})
            port = d["spec"]["endpoints"][0].get("port")
            hit = [s for s in services if selects(sel, s["metadata"].get("labels", {}))
                   and any(p.get("name") == port for p in s["spec"].get("ports", []))]
            if not hit:
                err(where, f"selects no Service with a port named {port!r}")
            elif len(hit) != 3:
                err(where, f"selects {len(hit)} Services, want the 3 headless ones")
        if d["kind"] == "PodMonitor":
            sel = d["spec"]["selector"].get("matchLabels", {})
            if not any(selects(sel, pl) for pl in pod_labels):
                err(where, "selects no rendered pods")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rendered")
    ap.add_argument("--k8s-models", help="directory holding an unpacked kubernetes wheel")
    ap.add_argument("--values-json")
    ap.add_argument("--schema")
    ap.add_argument("--config-out")
    ap.add_argument("--restricted", action="store_true",
                    help="pods must meet the Pod Security Standard 'restricted' (and read-only root)")
    ap.add_argument("--expect-kinds", default="", help="comma-separated kinds that must appear")
    a = ap.parse_args()

    with open(a.rendered) as f:
        text = f.read()
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        print(f"{a.rendered}: not YAML: {e}")
        return 1
    for i, d in enumerate(docs):
        if not isinstance(d, dict) or not all(k in d for k in ("apiVersion", "kind", "metadata")) \
                or not isinstance(d["metadata"], dict) or not d["metadata"].get("name"):
            err(f"document {i}", "not an object with apiVersion, kind and metadata.name")
    if errors:
        print("\n".join(errors))
        return 1

    schema = Schema(a.k8s_models) if a.k8s_models else None
    for d in docs:
        where = f"{d['kind']}/{d['metadata']['name']}"
        key = (d["apiVersion"], d["kind"])
        if key not in KNOWN:
            err(where, f"{d['apiVersion']} {d['kind']} is not a known apiVersion/kind")
            continue
        if KNOWN[key] is None:
            check_monitor(where, d)
        elif schema:
            schema.check(where, d, KNOWN[key])
    if not errors:
        cross_checks(docs, a.restricted)

    if a.schema and a.values_json:
        import jsonschema
        with open(a.schema) as f:
            s = json.load(f)
        with open(a.values_json) as f:
            v = json.load(f)
        for e in sorted(jsonschema.Draft7Validator(s).iter_errors(v), key=str):
            err("values", f"{'.'.join(map(str, e.path)) or '(root)'}: {e.message}")

    kinds = {d["kind"] for d in docs}
    for k in filter(None, a.expect_kinds.split(",")):
        if k not in kinds:
            err("render", f"no {k} rendered")

    if a.config_out:
        cms = [d for d in docs if d["kind"] == "ConfigMap" and "cluster.yaml" in d.get("data", {})]
        if len(cms) != 1:
            err("render", f"want one ConfigMap with cluster.yaml, found {len(cms)}")
        else:
            with open(a.config_out, "w") as f:
                f.write(cms[0]["data"]["cluster.yaml"])

    if errors:
        print("\n".join(errors))
        return 1
    counts = {}
    for d in docs:
        counts[d["kind"]] = counts.get(d["kind"], 0) + 1
    print(f"{a.rendered}: {len(docs)} objects ok ({', '.join(f'{v} {k}' for k, v in sorted(counts.items()))})"
          f"{'' if schema else ' [Kubernetes schema check SKIPPED: no models]'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
