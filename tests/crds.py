"""Custom resources validated against their CustomResourceDefinitions (tests/data/crds/).

Each CRD version's openAPIV3Schema, with unknown fields refused wherever the schema lists
properties and does not preserve unknown fields: what `kubectl apply` does with strict field
validation on a cluster that has the CRD installed.
"""

from __future__ import annotations

import gzip
from functools import cache
from pathlib import Path
from typing import Any

import yaml

CRDS = Path(__file__).resolve().parent / "data" / "crds"
FILES = {
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml.gz",
    ("monitoring.coreos.com", "PodMonitor"): "monitoring.coreos.com_podmonitors.yaml.gz",
    ("serving.kserve.io", "LLMInferenceServiceConfig"): (
        "serving.kserve.io_llminferenceserviceconfigs.yaml.gz"
    ),
    ("model.aibrix.ai", "ModelClaim"): "model.aibrix.ai_modelclaims.yaml.gz",
}
#: spec.perGPU as AIBrix's placement admission declares it (vllm-project/aibrix pull request
#: 2647): two required Kubernetes quantities, per instance and GPU.
AIBRIX_PER_GPU = {
    "type": "object",
    "required": ["maximumFootprint", "kvFloor"],
    "properties": {
        "maximumFootprint": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [
                {"type": "integer"},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"},
            ],
        },
        "kvFloor": {
            "x-kubernetes-int-or-string": True,
            "anyOf": [
                {"type": "integer"},
                {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|k|M|G|T)?$"},
            ],
        },
    },
}


def is_custom(doc: dict[str, Any]) -> bool:
    return (str(doc.get("apiVersion", "")).split("/")[0], doc.get("kind")) in FILES


def _strict(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@cache
def _schema(group: str, kind: str, version: str) -> dict[str, Any]:
    crd = yaml.safe_load(gzip.decompress((CRDS / FILES[(group, kind)]).read_bytes()))
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema: dict[str, Any] = found["schema"]["openAPIV3Schema"]
    if kind == "ModelClaim":
        schema["properties"]["spec"]["properties"]["perGPU"] = AIBRIX_PER_GPU
        schema["properties"]["spec"].setdefault("required", []).append("perGPU")
    # metadata is an ObjectMeta, which the CRD leaves to the API server.
    schema["properties"]["metadata"] = {"type": "object"}
    return _strict(schema)  # type: ignore[no-any-return]


def validate(doc: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError when ``doc`` is not a valid instance of its CRD."""
    import jsonschema

    group, version = str(doc["apiVersion"]).split("/")
    jsonschema.validate(doc, _schema(group, doc["kind"], version))
