"""Cluster definitions: Ray cluster-launcher YAMLs and KubeRay manifests (issues "Clusters", "Security").

The launcher YAMLs are validated by Ray's own validator (``prepare_config`` fills the provider's
defaults, then ``validate_config`` applies ``ray-schema.json``); the KubeRay manifests by
``clusters/kuberay/schema.py`` (our compact CRD check) and Ray Serve's ``ServeDeploySchema``.
No network, no cloud credentials, CPU only.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

pytest.importorskip("jsonschema")  # ray's validate_config needs it
from ray.autoscaler._private.util import prepare_config, validate_config  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CLUSTERS = ROOT / "clusters"
LAUNCHER_YAMLS = ["aws-p5en.yaml", "gcp-a3-ultragpu.yaml", "onprem.yaml"]
KUBERAY_YAMLS = ["rayservice.yaml", "rayjob.yaml", "storage.yaml"]


def _load_schema_module():
    spec = importlib.util.spec_from_file_location("clusters_kuberay_schema", CLUSTERS / "kuberay" / "schema.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look the module up while the class is built
    spec.loader.exec_module(mod)
    return mod


schema = _load_schema_module()


def _launcher(name: str) -> dict[str, Any]:
    return yaml.safe_load((CLUSTERS / name).read_text())


def _manifests(name: str) -> list[dict[str, Any]]:
    return schema.load_documents(str(CLUSTERS / "kuberay" / name))


def _walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every (path, scalar-or-key) in a parsed document, keys included."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield f"{path}.{k}", k
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, value


def _flags(commands: list[str]) -> dict[str, str]:
    """`--key=value` / `--key value` flags of the `ray start` in a list of shell commands."""
    out: dict[str, str] = {}
    for cmd in commands:
        words = shlex.split(cmd.replace(";", " ; "))
        if "ray" not in words or "start" not in words:
            continue
        it = iter(words[words.index("start") + 1:])
        for w in it:
            if w.startswith("--"):
                k, eq, v = w[2:].partition("=")
                out[k] = v if eq else ""
    return out


# --- cluster launcher -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_launcher_yaml_passes_rays_validator(name: str) -> None:
    config = _launcher(name)
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["head_node_type"] in prepared["available_node_types"]


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_launcher_head_does_no_gpu_work_and_dashboard_is_loopback(name: str) -> None:
    config = _launcher(name)
    flags = _flags(config["head_start_ray_commands"])
    assert "head" in flags
    assert flags.get("dashboard-host") == "127.0.0.1"
    assert flags.get("num-gpus") == "0" and flags.get("num-cpus") == "0"
    if config["provider"]["type"] != "local":
        head = config["available_node_types"][config["head_node_type"]]
        assert head["resources"].get("GPU") == 0 and head["resources"].get("CPU") == 0
    for cmd in config["worker_start_ray_commands"]:
        assert "dashboard-host" not in cmd


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_launcher_installs_project_with_lmdeploy_extra_and_fa3(name: str) -> None:
    config = _launcher(name)
    setup = " ".join(config["setup_commands"])
    workers = " ".join(config["worker_setup_commands"])
    assert "pip install -e" in setup and "mtp-autotune" in setup
    assert "mtp-autotune[gpu]" in workers  # the extra that pins lmdeploy
    assert "flash_attn_interface" in workers and "hopper" in workers
    assert "mtp-autotune[gpu]" not in " ".join(config["head_setup_commands"])
    assert config["file_mounts"].get("~/mtp-autotune") == "."


@pytest.mark.parametrize("name", LAUNCHER_YAMLS)
def test_launcher_worker_autoscaling_bounds(name: str) -> None:
    config = _launcher(name)
    if config["provider"]["type"] == "local":
        # One implicit node type: the global bounds, capped by the listed hosts.
        assert config["provider"]["head_ip"] and config["provider"]["worker_ips"]
        assert 0 <= config["min_workers"] <= config["max_workers"] <= len(config["provider"]["worker_ips"])
        return
    workers = {k: v for k, v in config["available_node_types"].items() if k != config["head_node_type"]}
    assert workers
    for node_type in workers.values():
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"] <= config["max_workers"]
        assert node_type["resources"]["GPU"] == 8


def test_aws_nodes_use_our_security_group_not_rays_default() -> None:
    # Ray's auto-created security group opens SSH to 0.0.0.0/0; naming ours keeps Ray's hands off.
    config = _launcher("aws-p5en.yaml")
    for node_type in config["available_node_types"].values():
        assert node_type["node_config"]["SecurityGroupIds"]
    assert config["available_node_types"]["ray.worker.p5en"]["node_config"]["InstanceType"] == "p5en.48xlarge"
    assert "security_group" not in config["provider"]


def test_gcp_workers_have_no_external_ip() -> None:
    config = _launcher("gcp-a3-ultragpu.yaml")
    worker = config["available_node_types"]["ray_worker_a3u"]["node_config"]
    assert worker["machineType"] == "a3-ultragpu-8g"
    assert all("accessConfigs" not in nic for nic in worker["networkInterfaces"])
    assert worker["scheduling"]["onHostMaintenance"] == "TERMINATE"


# --- KubeRay --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KUBERAY_YAMLS)
def test_kuberay_manifests_match_schema(name: str) -> None:
    docs = schema.check_file(str(CLUSTERS / "kuberay" / name))
    assert docs


def _kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc


def _cluster_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["rayClusterConfig" if doc["kind"] == "RayService" else "rayClusterSpec"]


@pytest.mark.parametrize("name,kind", [("rayservice.yaml", "RayService"), ("rayjob.yaml", "RayJob")])
def test_kuberay_head_has_no_gpus_and_workers_have_8(name: str, kind: str) -> None:
    spec = _cluster_spec(_kind(_manifests(name), kind))
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-gpus"] == "0"
    for c in head["template"]["spec"]["containers"]:
        for section in ("limits", "requests"):
            assert "nvidia.com/gpu" not in c.get("resources", {}).get(section, {})
    for group in spec["workerGroupSpecs"]:
        assert group["minReplicas"] <= group["maxReplicas"]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == 8


def test_rayservice_serves_the_routing_table_from_its_configmap() -> None:
    svc = _kind(_manifests("rayservice.yaml"), "RayService")
    serve = yaml.safe_load(svc["spec"]["serveConfigV2"])
    (app,) = serve["applications"]
    assert app["import_path"] == "orchestrator.serve.app:app_builder"
    table = Path(app["args"]["routing_table"])
    spec = _cluster_spec(svc)
    pods = [spec["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in spec["workerGroupSpecs"]]
    for pod in pods:  # every node may build the app or host the router
        vols = {v["name"]: v for v in pod["volumes"]}
        mounts = [m for m in pod["containers"][0]["volumeMounts"] if Path(m["mountPath"]) == table.parent]
        assert mounts, "routing table directory is not mounted"
        cm = vols[mounts[0]["name"]]["configMap"]
        assert any(i["path"] == table.name for i in cm["items"])


def test_rayjob_runs_the_sweep_and_writes_to_a_pvc() -> None:
    docs = _manifests("rayjob.yaml")
    job = _kind(docs, "RayJob")
    assert job["spec"]["shutdownAfterJobFinishes"] is True
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:3] == ["python", "-m", "tuning.sweep"]
    opts = dict(zip(argv[3::2], argv[4::2]))
    assert opts["--address"] == "auto" and opts["--model"].startswith("/models/")
    head = _cluster_spec(job)["headGroupSpec"]["template"]["spec"]
    pvc_mounts = {
        m["mountPath"]
        for m in head["containers"][0]["volumeMounts"]
        for v in head["volumes"]
        if v["name"] == m["name"] and "persistentVolumeClaim" in v and not m.get("readOnly")
    }
    for flag in ("--run-dir", "--routing-table"):
        assert any(opts[flag].startswith(p + "/") for p in pvc_mounts), flag
    claims = {d["metadata"]["name"] for d in _manifests("storage.yaml")}
    used = {v["persistentVolumeClaim"]["claimName"] for v in head["volumes"] if "persistentVolumeClaim" in v}
    assert used <= claims


@pytest.mark.parametrize(
    "mutate, expected",
    [
        (lambda d: d["spec"]["rayClusterConfig"].__setitem__("workerGroupSpec", []), "unknown key 'workerGroupSpec'"),
        (lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"]["rayStartParams"].__setitem__("num-gpus", 0),
         "expected a string"),
        (lambda d: d["spec"]["rayClusterConfig"]["workerGroupSpecs"][0].pop("maxReplicas"),
         "missing required key 'maxReplicas'"),
        (lambda d: d["spec"].__setitem__("serveConfigV2", "applications: [{name: x}]"), "serveConfigV2"),
        (lambda d: d["spec"]["rayClusterConfig"]["headGroupSpec"].__setitem__("serviceType", "Public"),
         "is not one of"),
        (lambda d: d.__setitem__("apiVersion", "ray.io/v1alpha1"), "unsupported apiVersion/kind"),
    ],
)
def test_schema_rejects_broken_rayservice(mutate, expected: str) -> None:
    doc = copy.deepcopy(_kind(_manifests("rayservice.yaml"), "RayService"))
    mutate(doc)
    problems = schema.check_manifest(doc)
    assert any(expected in p for p in problems), problems


# --- security: nothing public ---------------------------------------------------------------------


def _all_documents() -> list[tuple[str, Any]]:
    docs: list[tuple[str, Any]] = [(n, _launcher(n)) for n in LAUNCHER_YAMLS]
    docs += [(f"kuberay/{n}", d) for n in KUBERAY_YAMLS for d in _manifests(n)]
    return docs


def test_every_cluster_file_is_covered() -> None:
    found = {str(p.relative_to(CLUSTERS)) for p in CLUSTERS.rglob("*.yaml")}
    assert found == set(LAUNCHER_YAMLS) | {f"kuberay/{n}" for n in KUBERAY_YAMLS}


@pytest.mark.parametrize("name,doc", _all_documents())
def test_nothing_opens_ports_to_the_world(name: str, doc: Any) -> None:
    for path, value in _walk(doc):
        text = str(value)
        assert "0.0.0.0/0" not in text and "::/0" not in text, f"{name}{path}"
        assert not re.search(r"\b(LoadBalancer|NodePort)\b", text), f"{name}{path}: public Service type"
        assert "--dashboard-host=0.0.0.0" not in text, f"{name}{path}"
        if path.endswith((".hostNetwork", ".hostPort")):
            pytest.fail(f"{name}{path}: host networking exposes Ray's ports on the node")
    if isinstance(doc, dict) and doc.get("kind") == "Service":
        assert doc["spec"].get("type", "ClusterIP") == "ClusterIP"


@pytest.mark.parametrize("name,doc", _all_documents())
def test_trust_remote_code_is_never_set(name: str, doc: Any) -> None:
    for path, value in _walk(doc):
        assert not re.search(r"trust[-_]remote[-_]code", str(value), re.I), f"{name}{path}"


@pytest.mark.parametrize("name,kind", [("rayservice.yaml", "RayService"), ("rayjob.yaml", "RayJob")])
def test_kuberay_services_cluster_internal_and_pods_behind_a_network_policy(name: str, kind: str) -> None:
    docs = _manifests(name)
    ray = _kind(docs, kind)
    spec = _cluster_spec(ray)
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    if kind == "RayService":
        assert ray["spec"].get("serveService", {}).get("spec", {}).get("type", "ClusterIP") == "ClusterIP"
    # The dashboard must listen on the pod network for KubeRay's operator (it calls the dashboard API
    # through the head Service); then a NetworkPolicy must select every Ray pod and admit no one else.
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    assert policies, "Ray pods with a non-loopback dashboard need a NetworkPolicy"
    templates = [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]
    for tmpl in templates:
        labels = tmpl["metadata"]["labels"]
        selecting = [
            p for p in policies
            if "Ingress" in p["spec"]["policyTypes"]
            and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
        ]
        assert selecting, f"no NetworkPolicy selects pods labelled {labels}"
        for policy in selecting:
            for rule in policy["spec"]["ingress"]:
                assert rule.get("from"), "an ingress rule without `from` admits every source"
                for peer in rule["from"]:
                    assert "ipBlock" not in peer
                    assert peer.get("podSelector", {}).get("matchLabels"), "namespace-wide peers admit any pod"


def test_serve_config_binds_where_the_service_can_reach_it() -> None:
    svc = _kind(_manifests("rayservice.yaml"), "RayService")
    serve = yaml.safe_load(svc["spec"]["serveConfigV2"])
    assert serve["http_options"]["port"] == 8000
    assert serve["http_options"]["host"] in {"0.0.0.0", "127.0.0.1"}
