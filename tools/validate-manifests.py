#!/usr/bin/env python3
"""Validates the Kubernetes manifests under deploy/kubernetes offline, and proves it can fail.

    PYTHONPATH=target/py-k8s python3 tools/validate-manifests.py [DIR]       # validate
    PYTHONPATH=target/py-k8s python3 tools/validate-manifests.py --self-test # + broken copies

1. Every kustomization.yaml under DIR is checked against a schema written here (and rendered
   with `kubectl kustomize` where kubectl is installed), and every YAML file under DIR must be
   one of them or listed in one (no file escapes validation).
2. Kubernetes' own kinds are validated strictly (unknown fields are errors) with the
   kubernetes-validate package against the oldest and the newest Kubernetes we claim, VERSIONS.
   That package only warns about kinds it has no schema for and passes them; here a kind with
   no schema is an error unless OWN_SCHEMAS has one.
3. OWN_SCHEMAS: the InferencePool of the Gateway API Inference Extension, as a JSON schema
   written from its v1 CRD (release v1.6.0), its validation rules included.
4. Checks across files that no schema can make: the selectors find the Deployment's pods, the
   ports and the claim named exist, and terminationGracePeriodSeconds covers the preStop sleep
   plus the server's --shutdown-timeout (the drain).

--self-test then breaks copies of the manifests one way at a time and fails unless each broken
copy is refused with the expected message.
"""

import copy
import glob
import os
import shutil
import subprocess
import sys

import jsonschema
import kubernetes_validate
import yaml

VERSIONS = ["1.28.0", "1.37.0"]
# the server's default --shutdown-timeout, when the Deployment does not pass one
DEFAULT_SHUTDOWN_TIMEOUT = 25
# seconds the grace period must leave past the preStop sleep and the drain, for the exit itself
EXIT_MARGIN = 5

LABEL_VALUE = {"type": "string", "maxLength": 63, "pattern": r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"}
DNS_SUBDOMAIN = {"type": "string", "minLength": 1, "maxLength": 253,
                 "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"}
PORT = {"type": "object", "additionalProperties": False, "required": ["number"],
        "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 65535}}}
METADATA = {"type": "object", "required": ["name"],
            "properties": {"name": DNS_SUBDOMAIN, "namespace": {"type": "string"},
                           "labels": {"type": "object", "additionalProperties": LABEL_VALUE},
                           "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}

# inference.networking.k8s.io/v1 InferencePool, spec as the CRD of gateway-api-inference-extension
# v1.6.0 defines it: selector.matchLabels (1 to 64), targetPorts (1 to 8, numbers unique: the CRD's
# CEL rule, here uniqueItems), appProtocol, and endpointPickerRef (optional since v1.5.0) whose
# port is required when kind is Service or left out (the CRD's CEL rule, here if/then)
INFERENCE_POOL = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "inference.networking.k8s.io/v1"},
        "kind": {"const": "InferencePool"},
        "metadata": METADATA,
        "spec": {
            "type": "object", "additionalProperties": False, "required": ["selector", "targetPorts"],
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "required": ["matchLabels"],
                             "properties": {"matchLabels": {"type": "object", "minProperties": 1, "maxProperties": 64,
                                                            "additionalProperties": LABEL_VALUE}}},
                "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8, "uniqueItems": True, "items": PORT},
                "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
                "endpointPickerRef": {
                    "type": "object", "additionalProperties": False, "required": ["name"],
                    "properties": {
                        "group": {"type": "string", "maxLength": 253,
                                  "pattern": r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
                        "kind": {"type": "string", "minLength": 1, "maxLength": 63, "pattern": r"^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$"},
                        "name": {"type": "string", "minLength": 1, "maxLength": 253},
                        "port": PORT,
                        "failureMode": {"enum": ["FailOpen", "FailClose"]},
                    },
                    "if": {"anyOf": [{"not": {"required": ["kind"]}}, {"properties": {"kind": {"const": "Service"}}}]},
                    "then": {"required": ["port"]},
                },
            },
        },
    },
}

# kustomize.config.k8s.io/v1beta1 Kustomization: the fields these manifests use
KUSTOMIZATION = {
    "type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "resources"],
    "properties": {
        "apiVersion": {"const": "kustomize.config.k8s.io/v1beta1"},
        "kind": {"const": "Kustomization"},
        "namespace": {"type": "string"},
        "resources": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "images": {"type": "array", "items": {
            "type": "object", "additionalProperties": False, "required": ["name"],
            "properties": {"name": {"type": "string"}, "newName": {"type": "string"}, "newTag": {"type": "string"},
                           "digest": {"type": "string"}}}},
    },
}

OWN_SCHEMAS = {("inference.networking.k8s.io/v1", "InferencePool"): ("the InferencePool CRD v1 (v1.6.0)", INFERENCE_POOL)}


def schema_errors(schema, doc):
    """The messages of a JSON schema's violations, each with its path."""
    validator = jsonschema.Draft202012Validator(schema)
    return ["%s: %s" % (".".join(str(p) for p in e.absolute_path) or "(top)", e.message)
            for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))]


def load(root):
    """The kustomizations under root and the documents they list: [(file, doc)] each, in order.
    Errors for YAML no kustomization lists, and for listed files that are missing."""
    errors, kustomizations, docs, listed = [], [], [], set()
    files = sorted(glob.glob(os.path.join(root, "**", "*.yaml"), recursive=True) +
                   glob.glob(os.path.join(root, "**", "*.yml"), recursive=True))
    for path in files:
        if os.path.basename(path) != "kustomization.yaml":
            continue
        with open(path) as f:
            k = yaml.safe_load(f)
        kustomizations.append((path, k))
        listed.add(path)
        for res in (k or {}).get("resources", []) if isinstance(k, dict) else []:
            target = os.path.normpath(os.path.join(os.path.dirname(path), res))
            if not os.path.isfile(target):
                errors.append("%s: resource %s is not a file (this script follows files only: list a directory's files)" % (path, res))
                continue
            listed.add(target)
            with open(target) as f:
                for doc in yaml.safe_load_all(f):
                    if doc is not None:
                        docs.append((target, doc))
    for path in files:
        if path not in listed:
            errors.append("%s: no kustomization.yaml lists it, so nothing validates it" % path)
    return kustomizations, docs, errors


def check_kinds(kustomizations, docs):
    """Steps 1 to 3: each kustomization and each document against its schema."""
    errors, notes = [], []
    for path, k in kustomizations:
        errors += ["%s: %s" % (path, e) for e in schema_errors(KUSTOMIZATION, k)]
    for path, doc in docs:
        if not isinstance(doc, dict) or "apiVersion" not in doc or "kind" not in doc:
            errors.append("%s: a document without apiVersion and kind" % path)
            continue
        what = "%s/%s" % (doc["kind"], (doc.get("metadata") or {}).get("name", "?"))
        own = OWN_SCHEMAS.get((doc["apiVersion"], doc["kind"]))
        if own:
            found = schema_errors(own[1], doc)
            errors += ["%s: %s: %s" % (path, what, e) for e in found]
            if not found:
                notes.append("ok %s %s (%s)" % (path, what, own[0]))
            continue
        bad = False
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                errors.append("%s: %s (Kubernetes %s): %s: %s" % (path, what, e.version, ".".join(map(str, e.path)), e.message))
                bad = True
                break
            except kubernetes_validate.SchemaNotFoundError as e:
                errors.append("%s: %s: %s, and this script has none either (add one to OWN_SCHEMAS)" % (path, what, e.message))
                bad = True
                break
        if not bad:
            notes.append("ok %s %s (Kubernetes %s, strict)" % (path, what, " and ".join(VERSIONS)))
    return errors, notes


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def check_links(docs):
    """Step 4: what the manifests say about each other, and the drain's timing (on documents
    that passed their schemas)."""
    errors = []
    by_kind = {}
    for path, doc in docs:
        if isinstance(doc, dict) and "kind" in doc:
            by_kind.setdefault(doc["kind"], []).append((path, doc))
    deployments = by_kind.get("Deployment", [])
    claims = {d["metadata"]["name"] for _, d in by_kind.get("PersistentVolumeClaim", [])}
    pods = []
    for path, d in deployments:
        name, spec = d["metadata"]["name"], d.get("spec", {})
        template = spec.get("template", {})
        labels = template.get("metadata", {}).get("labels", {})
        if not matches(spec.get("selector", {}).get("matchLabels", {}), labels):
            errors.append("%s: Deployment/%s: its selector does not match its pod template's labels" % (path, name))
        pod = template.get("spec", {})
        pods.append((name, labels, pod))
        ports = {}
        for c in pod.get("containers", []):
            for p in c.get("ports", []):
                ports[p.get("name")] = ports[p["containerPort"]] = p["containerPort"]
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                port = c.get(probe, {}).get("httpGet", {}).get("port")
                if port is not None and port not in ports:
                    errors.append("%s: Deployment/%s: %s's port %s is no container port" % (path, name, probe, port))
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    errors.append("%s: Deployment/%s: volumeMount %s has no volume" % (path, name, m["name"]))
            # the drain: preStop sleep, then SIGTERM and at most --shutdown-timeout seconds
            args = c.get("args", [])
            timeout = int(args[args.index("--shutdown-timeout") + 1]) if "--shutdown-timeout" in args else DEFAULT_SHUTDOWN_TIMEOUT
            command = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
            if len(command) == 2 and command[0] == "sleep":
                sleep = int(command[1])
            grace = pod.get("terminationGracePeriodSeconds", 30)
            if grace < sleep + timeout + EXIT_MARGIN:
                errors.append("%s: Deployment/%s: terminationGracePeriodSeconds %d does not cover preStop %d s + --shutdown-timeout %d s + %d s to exit"
                              % (path, name, grace, sleep, timeout, EXIT_MARGIN))
            # a liveness probe must not restart a draining pod (/health answers 503 then)
            live = c.get("livenessProbe")
            if live and live.get("periodSeconds", 10) * live.get("failureThreshold", 3) <= grace:
                errors.append("%s: Deployment/%s: the liveness probe gives up after %d s, within the grace period (%d s): it would kill a draining pod"
                              % (path, name, live.get("periodSeconds", 10) * live.get("failureThreshold", 3), grace))
        for v in pod.get("volumes", []):
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claims and claim not in claims:
                errors.append("%s: Deployment/%s: volume %s claims %s, which no PersistentVolumeClaim here is" % (path, name, v["name"], claim))

    def pod_ports(pod):
        return {p.get("name") for c in pod.get("containers", []) for p in c.get("ports", [])} | \
               {p["containerPort"] for c in pod.get("containers", []) for p in c.get("ports", [])}

    def selected(selector):
        return [(n, pod) for n, labels, pod in pods if matches(selector, labels)]

    for path, s in by_kind.get("Service", []):
        found = selected(s["spec"].get("selector", {}))
        if not found:
            errors.append("%s: Service/%s: its selector finds no Deployment's pods" % (path, s["metadata"]["name"]))
        for p in s["spec"].get("ports", []):
            if any(p.get("targetPort", p["port"]) not in pod_ports(pod) for _, pod in found):
                errors.append("%s: Service/%s: targetPort %s is no container port" % (path, s["metadata"]["name"], p.get("targetPort")))
    for path, b in by_kind.get("PodDisruptionBudget", []):
        if not selected(b["spec"].get("selector", {}).get("matchLabels", {})):
            errors.append("%s: PodDisruptionBudget/%s: its selector finds no Deployment's pods" % (path, b["metadata"]["name"]))
    for path, h in by_kind.get("HorizontalPodAutoscaler", []):
        ref = h["spec"]["scaleTargetRef"]
        if ref["kind"] != "Deployment" or ref["name"] not in {d["metadata"]["name"] for _, d in deployments}:
            errors.append("%s: HorizontalPodAutoscaler/%s: scales %s/%s, which is not here" % (path, h["metadata"]["name"], ref["kind"], ref["name"]))
    for path, ip in by_kind.get("InferencePool", []):
        spec = ip.get("spec", {})
        found = selected(spec.get("selector", {}).get("matchLabels", {}))
        if not found:
            errors.append("%s: InferencePool/%s: its selector finds no Deployment's pods" % (path, ip["metadata"]["name"]))
        for p in spec.get("targetPorts", []):
            if any(p.get("number") not in pod_ports(pod) for _, pod in found):
                errors.append("%s: InferencePool/%s: target port %s is no container port" % (path, ip["metadata"]["name"], p.get("number")))
    return errors


def render(kustomizations):
    """Each kustomization rendered by kubectl's kustomize when kubectl is here (it catches what
    only kustomize sees, e.g. a base that contains its overlay); a note says so when it is not."""
    kubectl = shutil.which("kubectl")
    if not kubectl:
        return [], ["note: no kubectl here: the kustomizations were checked against their schema, not rendered"]
    errors, notes = [], []
    for path, _ in kustomizations:
        out = subprocess.run([kubectl, "kustomize", os.path.dirname(path)], capture_output=True, text=True)
        if out.returncode != 0:
            errors.append("%s: kubectl kustomize fails: %s" % (path, out.stderr.strip()[-500:]))
        else:
            notes.append("ok %s renders (kubectl kustomize)" % path)
    return errors, notes


def validate(root, quiet=False):
    kustomizations, docs, errors = load(root)
    render_errors, notes = render(kustomizations)
    errors += render_errors
    kind_errors, kind_notes = check_kinds(kustomizations, docs)
    errors += kind_errors
    notes += kind_notes
    # the links assume documents of the right shape
    if not errors:
        errors += check_links(docs)
    if not quiet:
        for n in notes:
            print(n)
    return kustomizations, docs, errors


def self_test(kustomizations, docs):
    """Breaks a copy of the manifests one way at a time; each must be refused with its message."""
    def doc(docs, kind):
        return next(d for _, d in docs if d.get("kind") == kind)

    def container(docs):
        return doc(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]

    def set_arg(docs, flag, value):
        args = container(docs)["args"]
        args[args.index(flag) + 1] = value

    breaks = [
        ("a container port that is not a number", "containerPort",
         lambda k, d: container(d)["ports"][0].__setitem__("containerPort", "eighty")),
        ("a misspelt field (strict)", "imagePullPolicyy",
         lambda k, d: container(d).__setitem__("imagePullPolicyy", "Always")),
        ("an HPA without its target", "scaleTargetRef",
         lambda k, d: doc(d, "HorizontalPodAutoscaler")["spec"].pop("scaleTargetRef")),
        ("a PDB of the wrong type", "maxUnavailable",
         lambda k, d: doc(d, "PodDisruptionBudget")["spec"].__setitem__("maxUnavailable", ["1"])),
        ("an InferencePool port out of range", "70000",
         lambda k, d: doc(d, "InferencePool")["spec"]["targetPorts"][0].__setitem__("number", 70000)),
        ("an InferencePool endpoint picker Service without a port", "'port' is a required property",
         lambda k, d: doc(d, "InferencePool")["spec"]["endpointPickerRef"].pop("port")),
        ("an InferencePool in the alpha API's shape (extensionRef)", "extensionRef",
         lambda k, d: doc(d, "InferencePool")["spec"].__setitem__("extensionRef", {"name": "x"})),
        ("an InferencePool failure mode not in the enum", "FailSoft",
         lambda k, d: doc(d, "InferencePool")["spec"]["endpointPickerRef"].__setitem__("failureMode", "FailSoft")),
        ("a kind nobody has a schema for", "add one to OWN_SCHEMAS",
         lambda k, d: d.append(("x.yaml", {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}))),
        ("a grace period shorter than the drain", "does not cover",
         lambda k, d: doc(d, "Deployment")["spec"]["template"]["spec"].__setitem__("terminationGracePeriodSeconds", 20)),
        ("a drain longer than the grace period", "does not cover",
         lambda k, d: set_arg(d, "--shutdown-timeout", "60")),
        ("a liveness probe that kills draining pods", "kill a draining pod",
         lambda k, d: container(d)["livenessProbe"].__setitem__("failureThreshold", 2)),
        ("a Service that selects nothing", "Service/qwen3-vl: its selector",
         lambda k, d: doc(d, "Service")["spec"]["selector"].__setitem__("app.kubernetes.io/name", "qwen3vl")),
        ("an InferencePool that selects nothing", "InferencePool/qwen3-vl: its selector",
         lambda k, d: doc(d, "InferencePool")["spec"]["selector"]["matchLabels"].__setitem__("app.kubernetes.io/name", "other")),
        ("a probe on a port that is not there", "readinessProbe's port",
         lambda k, d: container(d)["readinessProbe"]["httpGet"].__setitem__("port", "metrics")),
        ("a kustomization with an unknown field", "commonLabelz",
         lambda k, d: k[0][1].__setitem__("commonLabelz", {"a": "b"})),
    ]
    failed = 0
    for what, expected, breaker in breaks:
        ks, ds = copy.deepcopy(kustomizations), copy.deepcopy(docs)
        breaker(ks, ds)
        errors = check_kinds(ks, ds)[0]
        errors = errors or check_links(ds)
        hit = [e for e in errors if expected in e]
        if hit:
            print("refused as expected, %s: %s" % (what, hit[0]))
        else:
            print("NOT REFUSED, %s (expected a message with %r; got %s)" % (what, expected, errors or "no error"))
            failed += 1
    return failed


def main():
    args = [a for a in sys.argv[1:] if a != "--self-test"]
    root = args[0] if args else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy", "kubernetes")
    root = os.path.relpath(root)
    kustomizations, docs, errors = validate(root)
    for e in errors:
        print("ERROR " + e)
    if errors:
        print("%d problems in %s" % (len(errors), root))
        return 1
    print("%s: %d kustomizations and %d manifests valid" % (root, len(kustomizations), len(docs)))
    if "--self-test" in sys.argv[1:]:
        failed = self_test(kustomizations, docs)
        if failed:
            print("self-test: %d broken manifests were not refused" % failed)
            return 1
        print("self-test: every broken manifest was refused")
    return 0


if __name__ == "__main__":
    sys.exit(main())
