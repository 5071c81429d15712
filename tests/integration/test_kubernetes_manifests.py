"""deploy/kubernetes: every manifest passes kubernetes-validate in strict mode (as written and as
`kubectl kustomize` renders it), the service is set up as the README says (three token scopes,
liveness apart from readiness, no proxy trusted by default, a NetworkPolicy), and the vLLM pod's
pre-flight init container, run here, hands vLLM the KV size memest predicts for the pod's flags
from the model's own config.json, then, once a start has measured its startup plan, none.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from memest._version import __version__
from tests import crds, deploy_init
from tests.conftest import require_tool

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
FLAGS_FILE = KUBE / "vllm" / "serve-flags.env"


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _manifest_files() -> list[Path]:
    return sorted(p for p in KUBE.rglob("*.yaml") if p.name != "kustomization.yaml")


def _kustomizations() -> list[Path]:
    return sorted(p.parent for p in KUBE.rglob("kustomization.yaml"))


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """What `kubectl kustomize deploy/kubernetes` renders (generated ConfigMaps, images set)."""
    require_tool("kubectl", command=True)
    done = subprocess.run(
        ["kubectl", "kustomize", str(KUBE)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def _validate(doc: dict[str, Any]) -> None:
    if crds.is_custom(doc):  # ServiceMonitor, PodMonitor: against the Prometheus Operator's CRDs
        crds.validate(doc)
        return
    require_tool("kubernetes_validate")
    import kubernetes_validate

    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].startswith(name)]
    return found


def test_kustomizations_list_every_manifest() -> None:
    """Each manifest is in exactly one kustomization: its folder's, or the one above it."""
    listed = set()
    for folder in _kustomizations():
        for name in yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]:
            listed.add((folder / name).relative_to(KUBE).as_posix())
    assert listed == {p.relative_to(KUBE).as_posix() for p in _manifest_files()}


@pytest.mark.parametrize("path", _manifest_files(), ids=lambda p: p.relative_to(KUBE).as_posix())
def test_manifest_validates_strictly(path: Path) -> None:
    docs = _docs(path.read_text())
    assert docs
    for doc in docs:
        _validate(doc)


def test_rendered_kustomization_validates_strictly(rendered: list[dict[str, Any]]) -> None:
    kinds = sorted(d["kind"] for d in rendered)
    assert kinds == sorted(
        ["Namespace", "ConfigMap", "Service", "Service", "NetworkPolicy", "NetworkPolicy"]
        + ["PersistentVolumeClaim", "PersistentVolumeClaim", "Deployment", "Deployment"]
    )
    # The model's config.json is read from the model, never pasted into a ConfigMap.
    (flags,) = [d for d in rendered if d["kind"] == "ConfigMap"]
    assert set(flags["data"]) == set(_flags())
    for doc in rendered:
        _validate(doc)


def test_strict_validation_refuses_a_misspelt_field(rendered: list[dict[str, Any]]) -> None:
    """Strict mode is what catches a typo: a probe spelt livenessprobe is refused."""
    require_tool("kubernetes_validate")
    import kubernetes_validate

    bad = copy.deepcopy(_one(rendered, "Deployment", "memest"))
    container = bad["spec"]["template"]["spec"]["containers"][0]
    container["livenessprobe"] = container.pop("livenessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(bad)


def test_service_deployment(rendered: list[dict[str, Any]]) -> None:
    pod = _one(rendered, "Deployment", "memest")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # Liveness is the process alone; readiness adds the database, so an outage of the database
    # takes the pod out of the Service without restarting it.
    probes = {p: container[p]["httpGet"]["path"] for p in ("livenessProbe", "startupProbe")}
    assert probes == {"livenessProbe": "/healthz", "startupProbe": "/healthz"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the Dockerfile's memest user
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert set(container["resources"]["requests"]) == {"cpu", "memory"}
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
    assert secrets["MEMEST_WRITE_TOKEN"] == {"name": "memest-tokens", "key": "write-token"}
    assert secrets["MEMEST_READ_TOKEN"]["name"] == "memest-tokens"
    assert secrets["MEMEST_PUSH_TOKEN"] == {"name": "memest-push-token", "key": "token"}
    assert secrets["MEMEST_DATABASE_URL"]["name"] == "memest-database"
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] == "memest-data"
    # No proxy is trusted unless the operator names its addresses.
    assert "args" not in container
    assert "MEMEST_FORWARDED_ALLOW_IPS" not in {e["name"] for e in container["env"]}


def test_vllm_pod_holds_only_the_push_token_and_runs_unprivileged(
    rendered: list[dict[str, Any]],
) -> None:
    pod = _one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    containers = pod["initContainers"] + pod["containers"]
    refs = [
        e["valueFrom"]["secretKeyRef"]
        for c in containers
        for e in c.get("env", [])
        if "secretKeyRef" in e.get("valueFrom", {})
    ]
    assert {r["name"] for r in refs} == {"memest-push-token", "hf-token"}
    (vllm,) = pod["containers"]
    token = [e for e in vllm["env"] if e["name"] == "MEMEST_TOKEN"]
    assert token[0]["valueFrom"]["secretKeyRef"] == {"name": "memest-push-token", "key": "token"}
    dockerfile = (KUBE / "vllm" / "Dockerfile").read_text()
    assert "--uid 10001" in dockerfile and "USER 10001" in dockerfile
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    for container in containers:
        assert container["securityContext"]["allowPrivilegeEscalation"] is False
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_vllm_caches_persist_and_feed_the_startup_plan(rendered: list[dict[str, Any]]) -> None:
    pod = _one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    (vllm,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert env["VLLM_ENABLE_STARTUP_PLAN"] == "1"
    assert env["MEMEST_ENABLE"] == "1"
    assert env["MEMEST_SERVICE_URL"] == "http://memest:8000"
    claims = {v["name"]: v for v in pod["volumes"] if "persistentVolumeClaim" in v}
    persistent = [m["mountPath"] for m in vllm["volumeMounts"] if m["name"] in claims]
    for var in ("HF_HOME", "VLLM_CACHE_ROOT", "MEMEST_OUTPUT_DIR"):
        assert any(env[var].startswith(path + "/") for path in persistent), (var, env[var])


def test_network_policies_admit_the_clients(rendered: list[dict[str, Any]]) -> None:
    policy = _one(rendered, "NetworkPolicy", "memest")["spec"]
    service_pod = _one(rendered, "Deployment", "memest")["spec"]["template"]["metadata"]
    assert policy["podSelector"]["matchLabels"].items() <= service_pod["labels"].items()
    vllm_labels = _one(rendered, "Deployment", "vllm")["spec"]["template"]["metadata"]["labels"]
    selectors = [
        rule["podSelector"].get("matchLabels", {}) for rule in policy["ingress"][0]["from"]
    ]
    assert any(s and s.items() <= vllm_labels.items() for s in selectors)
    assert policy["ingress"][0]["ports"] == [{"port": "http", "protocol": "TCP"}]


def test_image_tags_are_memests_version(rendered: list[dict[str, Any]]) -> None:
    images = {
        c["image"]
        for d in rendered
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"].get("initContainers", [])
        + d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"memest:{__version__}", f"vllm-memest:0.33.0-memest-{__version__}"}


def _flags() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in FLAGS_FILE.read_text().splitlines() if line.strip())
    return {key: value for key, value in pairs}


def _mounts(pod: dict[str, Any], tmp_path: Path) -> dict[str, Path]:
    """Every volume of the pod as a local folder, by each container's mount path."""
    mounts: dict[str, Path] = {}
    for container in pod["initContainers"] + pod["containers"]:
        for mount in container.get("volumeMounts", []):
            local = tmp_path / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
    return mounts


def test_preflight_init_container_hands_its_kv_size_to_vllm(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    """The init container, run with the pod's variables, reads the model's config.json from the
    Hugging Face cache on the claim and gives vLLM's `--config` the pre-flight's KV size; after a
    start has written its measured startup plan there, it gives none, so vLLM applies the plan."""
    pod = _one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (vllm,) = pod["containers"]
    for container in (init, vllm):  # every ConfigMap the containers read is the flags one
        (ref,) = container["envFrom"]
        assert ref["configMapRef"]["name"].startswith("vllm-serve-flags")
    mounts = _mounts(pod, tmp_path)
    flags = _flags()
    env = deploy_init.container_env(init, flags)
    hub = Path(deploy_init.relocate(env["HF_HOME"], mounts)) / "hub"
    deploy_init.hub_cache(hub, flags["MODEL"])
    done = deploy_init.run_init(init["command"], env, mounts, tmp_path)
    assert done.returncode == 0, done.stderr
    argv = [
        deploy_init.kubelet_expand(a, deploy_init.container_env(vllm, flags))
        for a in vllm["command"] + vllm["args"]
    ]
    assert argv[:3] == ["vllm", "serve", flags["MODEL"]]
    args = deploy_init.vllm_config_args(argv[1:], mounts)
    kv_bytes = deploy_init.preflight_kv_bytes(flags)
    assert deploy_init.flag(args, "--kv-cache-memory-bytes") == str(kv_bytes)
    assert f"--kv-cache-memory-bytes {kv_bytes}" in done.stdout
    assert kv_bytes > 100 * 2**30  # an 8B model on a 141 GiB H200 at 0.85 keeps over 100 GiB
    for var, option in (("MAX_NUM_SEQS", "--max-num-seqs"), ("MAX_MODEL_LEN", "--max-model-len")):
        assert deploy_init.flag(args, option) == flags[var]
    # A start with these flags measured its plan: the next init leaves the KV size to it.
    cache_root = Path(deploy_init.relocate(env["VLLM_CACHE_ROOT"], mounts))
    deploy_init.write_measured_plan(cache_root)
    again = deploy_init.run_init(init["command"], env, mounts, tmp_path)
    assert again.returncode == 0, again.stderr
    args = deploy_init.vllm_config_args(argv[1:], mounts)
    assert deploy_init.flag(args, "--kv-cache-memory-bytes") is None
    assert deploy_init.flag(args, "--gpu-memory-utilization") == flags["GPU_MEMORY_UTILIZATION"]
    # Other flags: a first start again, sized by the pre-flight.
    changed = {**env, "MAX_NUM_SEQS": "64"}
    third = deploy_init.run_init(init["command"], changed, mounts, tmp_path)
    assert third.returncode == 0, third.stderr
    args = deploy_init.vllm_config_args(argv[1:], mounts)
    expected = deploy_init.preflight_kv_bytes({**flags, "MAX_NUM_SEQS": "64"})
    assert deploy_init.flag(args, "--kv-cache-memory-bytes") == str(expected)


def test_preflight_init_container_names_a_model_it_cannot_read(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    pod = _one(rendered, "Deployment", "vllm")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    env = deploy_init.container_env(init, _flags())
    done = deploy_init.run_init(init["command"], env, _mounts(pod, tmp_path), tmp_path)
    assert done.returncode != 0
    assert "meta-llama/Meta-Llama-3-8B-Instruct" in done.stderr


def test_compose_binds_loopback_and_has_no_default_password() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    grafana_env = compose["services"]["grafana"]["environment"]
    assert grafana_env["GF_SECURITY_ADMIN_PASSWORD"].endswith(":?set GRAFANA_ADMIN_PASSWORD}")
    assert "memest" not in json.dumps(compose["services"]["db"]["environment"]["POSTGRES_PASSWORD"])
