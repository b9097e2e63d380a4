"""A compact structural check of the Kubernetes manifests in ``clusters/kuberay/``.

CI has no cluster and no network, and we do not vendor the KubeRay CRDs, so this module encodes
the part of them we use: for RayService / RayJob (``ray.io/v1``), PersistentVolumeClaim and
NetworkPolicy, the required keys, the value types and the allowed keys at every level our
manifests touch. Field names follow the KubeRay v1 CRDs (``ray.io_rayservices.yaml``,
``ray.io_rayjobs.yaml``) and the Kubernetes core/networking APIs. Levels we do not use are typed
``ANY``; a key that is not in the allowed set of a level we do use is an error (a typo such as
``workerGroupSpec`` or ``rayStartParam`` fails here instead of being pruned by the API server).

``serveConfigV2`` is parsed and checked with Ray Serve's own ``ServeDeploySchema``.

Usage::

    python clusters/kuberay/schema.py clusters/kuberay/*.yaml
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import yaml

__all__ = ["ManifestError", "check_manifest", "check_file", "check_serve_config", "SCHEMAS"]


class ManifestError(ValueError):
    """A manifest does not match the schema; ``problems`` lists every mismatch with its path."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


# --- a tiny schema language --------------------------------------------------------------------


class _Node:
    def check(self, value: Any, path: str, out: list[str]) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class _Scalar(_Node):
    types: tuple[type, ...]
    name: str
    choices: tuple[Any, ...] = ()

    def check(self, value: Any, path: str, out: list[str]) -> None:
        # bool is an int in Python; keep them apart.
        if isinstance(value, bool) and bool not in self.types:
            out.append(f"{path}: expected {self.name}, got a boolean")
        elif not isinstance(value, self.types):
            out.append(f"{path}: expected {self.name}, got {type(value).__name__}")
        elif self.choices and value not in self.choices:
            out.append(f"{path}: {value!r} is not one of {list(self.choices)}")


@dataclass(frozen=True)
class _Any(_Node):
    def check(self, value: Any, path: str, out: list[str]) -> None:
        return


@dataclass(frozen=True)
class Obj(_Node):
    """An object with known keys: ``fields`` maps key -> schema; ``required`` must be present."""

    fields: Mapping[str, _Node]
    required: tuple[str, ...] = ()

    def check(self, value: Any, path: str, out: list[str]) -> None:
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for key in self.required:
            if key not in value:
                out.append(f"{path}: missing required key {key!r}")
        for key, sub in value.items():
            if key not in self.fields:
                out.append(f"{path}: unknown key {key!r} (allowed: {sorted(self.fields)})")
            else:
                self.fields[key].check(sub, f"{path}.{key}", out)


@dataclass(frozen=True)
class Map(_Node):
    """An object with free keys (labels, rayStartParams, resource lists)."""

    values: _Node

    def check(self, value: Any, path: str, out: list[str]) -> None:
        if not isinstance(value, dict):
            out.append(f"{path}: expected an object, got {type(value).__name__}")
            return
        for key, sub in value.items():
            if not isinstance(key, str):
                out.append(f"{path}: key {key!r} is not a string")
            self.values.check(sub, f"{path}.{key}", out)


@dataclass(frozen=True)
class List(_Node):
    items: _Node

    def check(self, value: Any, path: str, out: list[str]) -> None:
        if not isinstance(value, list):
            out.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, sub in enumerate(value):
            self.items.check(sub, f"{path}[{i}]", out)


ANY: _Node = _Any()
STR = _Scalar((str,), "a string")
INT = _Scalar((int,), "an integer")
BOOL = _Scalar((bool,), "a boolean")
NUM = _Scalar((int, float), "a number")
QUANTITY = _Scalar((int, float, str), "a quantity (int or string)")
STR_MAP = Map(STR)

# --- Kubernetes core types (only the levels our manifests use are typed) ----------------------

OBJECT_META = Obj(
    {k: ANY for k in ("generateName", "finalizers", "ownerReferences")}
    | {"name": STR, "namespace": STR, "labels": STR_MAP, "annotations": STR_MAP}
)
# PodTemplateSpec.metadata in the KubeRay CRDs allows only these keys.
TEMPLATE_META = Obj({"name": STR, "namespace": STR, "labels": STR_MAP, "annotations": STR_MAP, "finalizers": List(STR)})

RESOURCES = Obj({"limits": Map(QUANTITY), "requests": Map(QUANTITY), "claims": ANY})
CONTAINER_PORT = Obj(
    {"containerPort": INT, "name": STR, "protocol": _Scalar((str,), "a protocol", ("TCP", "UDP", "SCTP")),
     "hostIP": STR, "hostPort": INT},
    required=("containerPort",),
)
VOLUME_MOUNT = Obj(
    {"name": STR, "mountPath": STR, "readOnly": BOOL, "subPath": STR, "subPathExpr": STR,
     "mountPropagation": STR, "recursiveReadOnly": STR},
    required=("name", "mountPath"),
)
ENV_VAR = Obj({"name": STR, "value": STR, "valueFrom": ANY}, required=("name",))
CONTAINER = Obj(
    {k: ANY for k in (
        "envFrom", "lifecycle", "livenessProbe", "readinessProbe", "resizePolicy", "restartPolicy",
        "restartPolicyRules", "securityContext", "startupProbe", "stdin", "stdinOnce",
        "terminationMessagePath", "terminationMessagePolicy", "tty", "volumeDevices")}
    | {"name": STR, "image": STR, "imagePullPolicy": STR, "command": List(STR), "args": List(STR),
       "workingDir": STR, "env": List(ENV_VAR), "ports": List(CONTAINER_PORT), "resources": RESOURCES,
       "volumeMounts": List(VOLUME_MOUNT)},
    required=("name",),
)
VOLUME = Obj(
    {k: ANY for k in (
        "awsElasticBlockStore", "azureDisk", "azureFile", "cephfs", "cinder", "csi", "downwardAPI",
        "ephemeral", "fc", "flexVolume", "flocker", "gcePersistentDisk", "gitRepo", "glusterfs",
        "hostPath", "image", "iscsi", "nfs", "photonPersistentDisk", "portworxVolume", "projected",
        "quobyte", "rbd", "scaleIO", "secret", "storageos", "vsphereVolume")}
    | {
        "name": STR,
        "configMap": Obj({"name": STR, "optional": BOOL, "defaultMode": INT,
                          "items": List(Obj({"key": STR, "path": STR, "mode": INT}, required=("key", "path")))}),
        "persistentVolumeClaim": Obj({"claimName": STR, "readOnly": BOOL}, required=("claimName",)),
        "emptyDir": Obj({"medium": STR, "sizeLimit": QUANTITY}),
    },
    required=("name",),
)
TOLERATION = Obj({"key": STR, "operator": STR, "value": STR, "effect": STR, "tolerationSeconds": INT})
POD_SPEC = Obj(
    {k: ANY for k in (
        "activeDeadlineSeconds", "affinity", "automountServiceAccountToken", "dnsConfig", "dnsPolicy",
        "enableServiceLinks", "ephemeralContainers", "hostAliases", "hostIPC", "hostNetwork", "hostPID",
        "hostUsers", "hostname", "hostnameOverride", "imagePullSecrets", "nodeName", "os", "overhead", "preemptionPolicy",
        "priority", "priorityClassName", "readinessGates", "resourceClaims", "resources", "restartPolicy",
        "runtimeClassName", "schedulerName", "schedulingGates", "schedulingGroup", "securityContext", "serviceAccount",
        "serviceAccountName", "setHostnameAsFQDN", "shareProcessNamespace", "subdomain",
        "terminationGracePeriodSeconds", "topologySpreadConstraints")}
    | {"containers": List(CONTAINER), "initContainers": List(CONTAINER), "volumes": List(VOLUME),
       "nodeSelector": STR_MAP, "tolerations": List(TOLERATION)},
    required=("containers",),
)
POD_TEMPLATE = Obj({"metadata": TEMPLATE_META, "spec": POD_SPEC})

# --- KubeRay v1 ---------------------------------------------------------------------------------

# rayStartParams is map[string]string in the CRD: "0", not 0.
RAY_START_PARAMS = Map(STR)
SERVICE_TYPE = _Scalar((str,), "a Service type", ("ClusterIP", "NodePort", "LoadBalancer"))
HEAD_GROUP = Obj(
    {k: ANY for k in ("enableIngress", "headService", "ingressOptions", "labels", "resources")}
    | {"rayStartParams": RAY_START_PARAMS, "serviceType": SERVICE_TYPE, "template": POD_TEMPLATE},
    required=("template",),
)
WORKER_GROUP = Obj(
    {k: ANY for k in ("idleTimeoutSeconds", "labels", "numOfHosts", "priority", "resources",
                      "scaleStrategy", "suspend")}
    | {"groupName": STR, "replicas": INT, "minReplicas": INT, "maxReplicas": INT,
       "rayStartParams": RAY_START_PARAMS, "template": POD_TEMPLATE},
    required=("groupName", "minReplicas", "maxReplicas", "template"),
)
RAY_CLUSTER_SPEC = Obj(
    {k: ANY for k in ("authOptions", "autoscalerOptions", "gcsFaultToleranceOptions",
                      "headServiceAnnotations", "historyServerOptions", "managedBy", "networkPolicy",
                      "suspend", "tlsOptions", "upgradeStrategy")}
    | {"rayVersion": STR, "enableInTreeAutoscaling": BOOL, "headGroupSpec": HEAD_GROUP,
       "workerGroupSpecs": List(WORKER_GROUP)},
    required=("headGroupSpec",),
)
RAY_SERVICE_SPEC = Obj(
    {k: ANY for k in ("excludeHeadPodFromServeSvc", "managedBy", "suspend", "upgradeStrategy")}
    | {"serveConfigV2": STR, "rayClusterConfig": RAY_CLUSTER_SPEC,
       "serveService": Obj({"apiVersion": STR, "kind": STR, "metadata": TEMPLATE_META, "status": ANY,
                            "spec": Obj({"type": SERVICE_TYPE, "ports": ANY, "selector": STR_MAP})}),
       "deploymentUnhealthySecondThreshold": INT, "serviceUnhealthySecondThreshold": INT,
       "rayClusterDeletionDelaySeconds": INT},
    required=("rayClusterConfig",),
)
RAY_JOB_SPEC = Obj(
    {k: ANY for k in ("clusterSelector", "deletionStrategy", "managedBy", "metadata",
                      "submitterConfig", "submitterPodTemplate", "entrypointResources", "jobId",
                      "preRunningDeadlineSeconds")}
    | {"entrypoint": STR, "runtimeEnvYAML": STR, "rayClusterSpec": RAY_CLUSTER_SPEC,
       "shutdownAfterJobFinishes": BOOL, "ttlSecondsAfterFinished": INT, "activeDeadlineSeconds": INT,
       "backoffLimit": INT, "suspend": BOOL, "entrypointNumCpus": NUM, "entrypointNumGpus": NUM,
       "submissionMode": _Scalar((str,), "a submission mode",
                                 ("K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"))},
    required=("entrypoint",),
)

# --- core/v1 PVC and networking/v1 NetworkPolicy -----------------------------------------------

PVC_SPEC = Obj(
    {k: ANY for k in ("dataSource", "dataSourceRef", "selector", "volumeAttributesClassName",
                      "volumeMode", "volumeName")}
    | {"accessModes": List(_Scalar((str,), "an access mode",
                                   ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"))),
       "storageClassName": STR, "resources": RESOURCES},
    required=("accessModes", "resources"),
)
LABEL_SELECTOR = Obj({"matchLabels": STR_MAP, "matchExpressions": ANY})
NP_PEER = Obj({"podSelector": LABEL_SELECTOR, "namespaceSelector": LABEL_SELECTOR, "ipBlock": ANY})
NP_PORT = Obj({"protocol": STR, "port": _Scalar((int, str), "a port"), "endPort": INT})
NP_SPEC = Obj(
    {"podSelector": LABEL_SELECTOR, "policyTypes": List(_Scalar((str,), "a policy type", ("Ingress", "Egress"))),
     "ingress": List(Obj({"from": List(NP_PEER), "ports": List(NP_PORT)})),
     "egress": List(Obj({"to": List(NP_PEER), "ports": List(NP_PORT)}))},
    required=("podSelector",),
)


def _resource(spec: Obj) -> Obj:
    return Obj({"apiVersion": STR, "kind": STR, "metadata": OBJECT_META, "spec": spec},
               required=("apiVersion", "kind", "metadata", "spec"))


#: (apiVersion, kind) -> schema of the whole document.
SCHEMAS: dict[tuple[str, str], Obj] = {
    ("ray.io/v1", "RayService"): _resource(RAY_SERVICE_SPEC),
    ("ray.io/v1", "RayJob"): _resource(RAY_JOB_SPEC),
    ("v1", "PersistentVolumeClaim"): _resource(PVC_SPEC),
    ("v1", "ConfigMap"): Obj({"apiVersion": STR, "kind": STR, "metadata": OBJECT_META, "data": STR_MAP,
                              "binaryData": STR_MAP, "immutable": BOOL},
                             required=("apiVersion", "kind", "metadata")),
    ("networking.k8s.io/v1", "NetworkPolicy"): _resource(NP_SPEC),
}


def check_serve_config(text: str) -> list[str]:
    """Problems with a ``serveConfigV2`` string, using Ray Serve's ``ServeDeploySchema``."""
    from pydantic import ValidationError
    from ray.serve.schema import ServeDeploySchema

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [f"serveConfigV2: not YAML: {e}"]
    try:
        ServeDeploySchema.model_validate(data)
    except ValidationError as e:
        return [f"serveConfigV2: {err['loc']}: {err['msg']}" for err in e.errors()]
    return []


def check_manifest(doc: Mapping[str, Any]) -> list[str]:
    """Every problem with one manifest document (empty when it is fine)."""
    if not isinstance(doc, dict):
        return [f"document is {type(doc).__name__}, not an object"]
    key = (doc.get("apiVersion"), doc.get("kind"))
    schema = SCHEMAS.get(key)  # type: ignore[arg-type]
    if schema is None:
        return [f"unsupported apiVersion/kind {key}; known: {sorted(SCHEMAS)}"]
    out: list[str] = []
    name = (doc.get("metadata") or {}).get("name", "?")
    schema.check(doc, f"{key[1]}/{name}", out)
    if key[1] == "RayService" and not out:
        out += check_serve_config(doc["spec"].get("serveConfigV2", ""))
    return out


def load_documents(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def check_file(path: str) -> list[dict[str, Any]]:
    """Load every document of a manifest file and check it; raise ManifestError on any problem."""
    docs = load_documents(path)
    problems = [f"{path}: {p}" for d in docs for p in check_manifest(d)]
    if problems:
        raise ManifestError(problems)
    return docs


def main(paths: Iterable[str]) -> int:
    rc = 0
    for p in paths:
        try:
            docs = check_file(p)
        except ManifestError as e:
            rc = 1
            print("\n".join(e.problems), file=sys.stderr)
        else:
            print(f"{p}: {len(docs)} document(s) OK")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
