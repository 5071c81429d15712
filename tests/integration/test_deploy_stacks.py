"""deploy/ for the stacks operators run, each rendered and validated as its stack would:

- the production-stack and llm-d-modelservice overlays rendered by Helm's own engine (its Go SDK,
  helm-python-sdk) with copies of the real charts (tests/data/charts), values checked against each
  chart's values.schema.json, every rendered object by kubernetes-validate (strict), and the
  rendered pre-flight init container run here: vLLM's `--config` gets the pre-flight's KV size;
- the KServe LLMInferenceServiceConfig fragment, the AIBrix ModelClaim and the monitoring objects
  against their CRDs (tests/crds.py); the ModelClaim is `memest export aibrix`'s output and its
  per-GPU cost is the accounting's figures; the dashboard ConfigMap is `memest export grafana`'s
  and holds the packaged dashboard byte for byte;
- the GitHub workflows against the workflow schema check-jsonschema vendors.
"""

from __future__ import annotations

import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml

from memest._version import __version__
from memest.estimate import account
from memest.files import load_report
from memest.vllm_versions import SUPPORTED
from tests import crds, deploy_init
from tests.conftest import require_tool

pytestmark = pytest.mark.deploy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHARTS = ROOT / "tests" / "data" / "charts"
DEMO_REPORT = ROOT / "memest" / "demo" / "h200" / "call22.S_llama8b_s128_t4096.apply.json"
MIB = 2**20


def _docs(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _render(chart: str, values: Path) -> list[dict[str, Any]]:
    """`helm template` of ``chart`` with ``values``: Helm's engine, the chart's schema checked."""
    require_tool("helm_python")
    import helm_python as helm

    overlay = yaml.safe_load(values.read_text())
    with helm.Chart.load(str(CHARTS / chart)) as loaded:
        loaded.validate_schema(overlay)
        out = loaded.render(overlay, name="memest", namespace="memest")
    return [doc for text in out.values() for doc in _docs(text)]


def _kube_validate(doc: dict[str, Any]) -> None:
    require_tool("kubernetes_validate")
    import kubernetes_validate

    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def _pod(docs: list[dict[str, Any]], suffix: str) -> dict[str, Any]:
    (deployment,) = [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"].endswith(suffix)
    ]
    spec: dict[str, Any] = deployment["spec"]["template"]["spec"]
    return spec


def _by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [c for c in items if c["name"] == name]
    return found


def _mounts(pod: dict[str, Any], tmp_path: Path) -> dict[str, Path]:
    mounts: dict[str, Path] = {}
    for container in pod.get("initContainers", []) + pod["containers"]:
        for mount in container.get("volumeMounts", []):
            local = tmp_path / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[mount["mountPath"]] = local
    return mounts


def _check_pod_preflight(pod: dict[str, Any], vllm_argv: list[str], tmp_path: Path) -> None:
    """Run the pod's init container here and read the vLLM arguments it feeds."""
    init = _by_name(pod["initContainers"], "memest-preflight")
    env = deploy_init.container_env(init, {})
    mounts = _mounts(pod, tmp_path)
    hub = env.get("HF_HUB_CACHE") or env["HF_HOME"] + "/hub"
    deploy_init.hub_cache(Path(deploy_init.relocate(hub, mounts)), env["MODEL"])
    done = deploy_init.run_init(init["command"], env, mounts, tmp_path)
    assert done.returncode == 0, done.stderr
    args = deploy_init.vllm_config_args(vllm_argv, mounts)
    assert deploy_init.flag(args, "--kv-cache-memory-bytes") == str(
        deploy_init.preflight_kv_bytes(env)
    )
    # The flags the pre-flight sized from are the ones vLLM starts with.
    for var, option in (
        ("MAX_MODEL_LEN", "--max-model-len"),
        ("MAX_NUM_SEQS", "--max-num-seqs"),
        ("MAX_NUM_BATCHED_TOKENS", "--max-num-batched-tokens"),
    ):
        assert deploy_init.flag(args, option) == env[var], option


def _check_vllm_env(container: dict[str, Any]) -> None:
    env = {e["name"]: e for e in container["env"]}
    assert env["MEMEST_ENABLE"]["value"] == "1"
    assert env["VLLM_ENABLE_STARTUP_PLAN"]["value"] == "1"
    assert env["MEMEST_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "memest-push-token",
        "key": "token",
    }
    assert container["image"] == f"vllm-memest:0.33.0-memest-{__version__}" or container[
        "image"
    ].endswith(f"vllm-memest:0.33.0-memest-{__version__}")


def test_production_stack_overlay(tmp_path: Path) -> None:
    docs = _render("vllm-stack", DEPLOY / "production-stack" / "values-memest.yaml")
    for doc in docs:
        _kube_validate(doc)
    pod = _pod(docs, "-deployment-vllm")  # the chart's engine Deployment, beside its router
    vllm = _by_name(pod["containers"], "vllm")
    _check_vllm_env(vllm)
    # Non-root in every container: the chart's containerSecurityContext overridden.
    assert pod["securityContext"]["runAsUser"] == 10001
    for container in pod["initContainers"] + pod["containers"]:
        assert container["securityContext"]["runAsNonRoot"] is True
    # The HF cache and vLLM's cache (its startup plans) live on the model's claim.
    claim = [v["name"] for v in pod["volumes"] if "persistentVolumeClaim" in v]
    mounted = {m["mountPath"]: m["name"] for m in vllm["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert mounted["/data"] in claim and env["HF_HOME"] == "/data"
    assert env["VLLM_CACHE_ROOT"].startswith("/data/")
    _check_pod_preflight(pod, vllm["command"][1:], tmp_path)


def test_llm_d_modelservice_overlay(tmp_path: Path) -> None:
    docs = _render("llm-d-modelservice", DEPLOY / "llm-d" / "values-memest.yaml")
    for doc in docs:
        _kube_validate(doc)
    deployments = {
        d["metadata"]["name"].rsplit("-", 1)[-1]: d for d in docs if d["kind"] == "Deployment"
    }
    assert set(deployments) == {"decode", "prefill"}
    for role, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        vllm = _by_name(pod["containers"], "vllm")
        _check_vllm_env(vllm)
        assert pod["securityContext"]["runAsNonRoot"] is True
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert labels["memest.dev/client"] == "true" and labels["llm-d.ai/role"] == role
        _check_pod_preflight(pod, vllm["command"][1:] + vllm["args"], tmp_path / role)


def test_kserve_config_fragment(tmp_path: Path) -> None:
    (doc,) = _docs((DEPLOY / "kserve" / "llminferenceserviceconfig-memest.yaml").read_text())
    crds.validate(doc)
    pod = doc["spec"]["template"]
    main = _by_name(pod["containers"], "main")  # the name KServe's template gives vLLM
    _check_vllm_env(main)
    # The template runs `vllm serve /mnt/models ... ${VLLM_ADDITIONAL_ARGS}`.
    env = deploy_init.container_env(main, {})
    extra = env["VLLM_ADDITIONAL_ARGS"].split()
    assert "$(" not in env["VLLM_ADDITIONAL_ARGS"]
    _check_pod_preflight(pod, ["serve", "/mnt/models", *extra], tmp_path)


def test_crd_validation_refuses_an_unknown_field() -> None:
    """What catches a typo in a custom resource: an unknown spec field is refused."""
    import jsonschema

    (doc,) = _docs((DEPLOY / "kserve" / "llminferenceserviceconfig-memest.yaml").read_text())
    doc["spec"]["template"]["initContainer"] = doc["spec"]["template"].pop("initContainers")
    with pytest.raises(jsonschema.ValidationError):
        crds.validate(doc)


def _export(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "memest", "export", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_aibrix_model_claim_is_the_exported_one() -> None:
    path = DEPLOY / "aibrix" / "modelclaim-llama-3-8b.yaml"
    exported = _export(
        "aibrix", str(DEMO_REPORT), "--pool", "h200-pool", "--model-name",
        "meta-llama/Meta-Llama-3-8B-Instruct",
    )  # fmt: skip
    assert path.read_text() == exported
    (claim,) = _docs(exported)
    crds.validate(claim)
    # The per-GPU cost is the accounting's usage and KV cache, rounded up to whole MiB.
    figures = account(load_report(DEMO_REPORT))
    assert figures.usage_bytes is not None and figures.kv_cache_bytes is not None
    footprint = int(claim["spec"]["perGPU"]["maximumFootprint"].removesuffix("Mi")) * MIB
    kv_floor = int(claim["spec"]["perGPU"]["kvFloor"].removesuffix("Mi")) * MIB
    assert 0 <= footprint - figures.usage_bytes < MIB
    assert 0 <= kv_floor - figures.kv_cache_bytes < MIB
    assert kv_floor < footprint
    args = claim["spec"]["engineConfig"]["args"]
    assert args["--max-num-seqs"] == str(load_report(DEMO_REPORT).config.max_num_seqs)


def test_aibrix_export_refuses_reports_of_two_runs(tmp_path: Path) -> None:
    other = ROOT / "memest" / "demo" / "h200" / "call24.V_llama8b_defaults.apply.json"
    done = subprocess.run(
        [sys.executable, "-m", "memest", "export", "aibrix", str(DEMO_REPORT), str(other)]
        + ["--pool", "p"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "2 runs" in done.stderr


@pytest.fixture(scope="module")
def monitoring() -> list[dict[str, Any]]:
    require_tool("kubectl", command=True)
    done = subprocess.run(
        ["kubectl", "kustomize", str(DEPLOY / "kubernetes" / "monitoring")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return _docs(done.stdout)


def test_monitoring_objects_validate(monitoring: list[dict[str, Any]]) -> None:
    assert sorted(d["kind"] for d in monitoring) == ["ConfigMap", "PodMonitor", "ServiceMonitor"]
    for doc in monitoring:
        if crds.is_custom(doc):
            crds.validate(doc)
        else:
            _kube_validate(doc)
    kube = DEPLOY / "kubernetes"
    service = _docs((kube / "memest-service.yaml").read_text())
    (svc,) = [d for d in service if d["kind"] == "Service"]
    (monitor,) = [d for d in monitoring if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] in {p["name"] for p in svc["spec"]["ports"]}


def test_dashboard_config_map_is_the_packaged_dashboard(monitoring: list[dict[str, Any]]) -> None:
    path = DEPLOY / "kubernetes" / "monitoring" / "grafana-dashboard.yaml"
    assert path.read_text() == _export("grafana")
    (config_map,) = [d for d in monitoring if d["kind"] == "ConfigMap"]
    packaged = files("memest.service").joinpath("grafana", "memest-dashboard.json").read_text()
    assert config_map["data"]["memest-dashboard.json"] == packaged
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


@pytest.mark.parametrize(
    "workflow", sorted((ROOT / ".github" / "workflows").glob("*.yml")), ids=lambda p: p.name
)
def test_workflow_validates(workflow: Path) -> None:
    require_tool("check_jsonschema")
    done = subprocess.run(
        [sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows"]
        + [str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_release_workflow_tests_then_publishes_by_trusted_publishing() -> None:
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "release.yml").read_text())
    jobs = wf["jobs"]
    assert "bash scripts/build_release.sh dist" in [s.get("run") for s in jobs["build"]["steps"]]
    assert jobs["test-wheel"]["strategy"]["matrix"]["vllm"] == list(SUPPORTED)
    assert any(
        "tests/integration/test_wheel.py" in str(s.get("run")) for s in jobs["test-wheel"]["steps"]
    )
    publish = jobs["publish"]
    assert publish["needs"] == ["build", "test-wheel"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any(
        str(s.get("uses", "")).startswith("pypa/gh-action-pypi-publish") for s in publish["steps"]
    )
    assert not any("password" in str(s.get("with", {})) for s in publish["steps"])
    images = yaml.safe_load((ROOT / ".github" / "workflows" / "images.yml").read_text())
    assert images["jobs"]["vllm"]["strategy"]["matrix"]["vllm"] == list(SUPPORTED)
