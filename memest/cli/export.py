"""Write what a deployment stack needs from memest: an AIBrix ModelClaim, the Grafana ConfigMap.

memest export aibrix REPORT [REPORT ...] --pool POOL [--name NAME] [--model-name NAME]
                     [--artifact-url URL]
memest export grafana [--name NAME]

aibrix: an AIBrix ModelClaim (model.aibrix.ai/v1alpha1) for the model of one measured start, its
per-GPU cost (spec.perGPU, as AIBrix's placement admission declares it) filled from the start's
figures as memest accounts them (memest.estimate.account, the figures every surface shows):
maximumFootprint is the start's usage (device memory in use at the end of init plus what
serving's first full-size step reserves) and kvFloor the KV cache it allocated, each the largest
over the ranks given (the reports of one run, one per rank) and rounded up to a whole MiB;
declaring more than an instance needs is safe, less is not. spec.engineConfig.args holds the
engine flags of that start, since the figures hold only for them. POOL is the warm pool's
pool.aibrix.ai/name; the served model name defaults to the report's model, the artifact to
huggingface://MODEL-NAME.

grafana: a ConfigMap holding memest's Grafana dashboard (the packaged
memest/service/grafana/memest-dashboard.json), labelled grafana_dashboard=1 for Grafana's
dashboard sidecar; deploy/kubernetes/monitoring/grafana-dashboard.yaml is its output.
"""

from __future__ import annotations

import argparse
import json
import re
from importlib.resources import files
from pathlib import Path

from memest.cli._reports import load_report
from memest.errors import CommandError
from memest.estimate import account
from memest.schema import RunReport

MIB = 2**20
DASHBOARD = "memest-dashboard.json"
_NAME_RUN = re.compile(r"[^a-z0-9-]+")


def _quantity(value: int) -> str:
    """Bytes as a Kubernetes quantity in whole MiB, rounded up."""
    return f"{-(-value // MIB)}Mi"


def _dns_name(text: str) -> str:
    """``text`` as a DNS-1123 object name (lowercase, dashes, at most 63 characters)."""
    name = _NAME_RUN.sub("-", text.lower().replace("/", "-")).strip("-")[:63].strip("-")
    if not name:
        raise CommandError(f"--name: no object name can be made from {text!r}; pass --name")
    return name


def _scalar(value: str) -> str:
    """A YAML double-quoted scalar (a JSON string is one)."""
    return json.dumps(value)


def engine_args(report: RunReport) -> dict[str, str]:
    """The `vllm serve` flags of the start that sized the figures (those the report records)."""
    cfg = report.config
    flags = {
        "--max-num-seqs": cfg.max_num_seqs,
        "--max-num-batched-tokens": cfg.max_num_batched_tokens,
        "--max-model-len": cfg.max_model_len,
        "--gpu-memory-utilization": cfg.gpu_memory_utilization,
        "--tensor-parallel-size": cfg.tensor_parallel_size
        if cfg.tensor_parallel_size > 1
        else None,
        "--kv-cache-dtype": cfg.kv_cache_dtype
        if cfg.kv_cache_dtype not in (None, "auto")
        else None,
        "--quantization": cfg.quantization,
    }
    return {flag: str(value) for flag, value in flags.items() if value is not None}


def per_gpu_cost(reports: list[tuple[Path, RunReport]]) -> tuple[int, int]:
    """(maximum footprint, KV floor) in bytes: the accounting's usage and KV cache, largest rank."""
    footprints, kv = [], []
    for path, report in reports:
        figures = account(report)
        if figures.usage_bytes is None or figures.kv_cache_bytes is None:
            raise CommandError(f"{path}: the report has no measured usage or KV cache size")
        footprints.append(figures.usage_bytes)
        kv.append(figures.kv_cache_bytes)
    return max(footprints), max(kv)


def model_claim(
    reports: list[tuple[Path, RunReport]],
    pool: str,
    name: str | None = None,
    model_name: str | None = None,
    url: str | None = None,
) -> str:
    """The ModelClaim YAML for one run's reports."""
    runs = {r.run_id for _, r in reports}
    if len(runs) != 1:
        raise CommandError(
            f"REPORT: the reports are of {len(runs)} runs; give the ranks of one run"
        )
    first = reports[0][1]
    model = model_name or first.model
    footprint, kv_floor = per_gpu_cost(reports)
    args = "".join(f"\n      {_scalar(k)}: {_scalar(v)}" for k, v in engine_args(first).items())
    return (
        "apiVersion: model.aibrix.ai/v1alpha1\n"
        "kind: ModelClaim\n"
        "metadata:\n"
        f"  name: {_dns_name(name or model.rsplit('/', 1)[-1])}\n"
        "  annotations:\n"
        f"    memest.dev/run-id: {_scalar(first.run_id)}\n"
        f"    memest.dev/build: {_scalar(first.build.label or '')}\n"
        "spec:\n"
        f"  modelName: {_scalar(model)}\n"
        "  podSelector:\n"
        "    matchLabels:\n"
        f"      pool.aibrix.ai/name: {_scalar(pool)}\n"
        f"  artifactURL: {_scalar(url or 'huggingface://' + model)}\n"
        "  engine: vllm\n"
        "  replicas: 1\n"
        "  engineConfig:\n"
        f"    args:{args or ' {}'}\n"
        "  # Measured by memest on this start; see `memest export --help`.\n"
        "  perGPU:\n"
        f"    maximumFootprint: {_quantity(footprint)}\n"
        f"    kvFloor: {_quantity(kv_floor)}\n"
    )


def grafana_config_map(name: str) -> str:
    """The ConfigMap YAML holding the packaged Grafana dashboard, byte for byte."""
    text = files("memest.service").joinpath("grafana", DASHBOARD).read_text(encoding="utf-8")
    body = "".join(f"    {line}\n" if line else "\n" for line in text.rstrip("\n").split("\n"))
    return (
        "# Generated by `memest export grafana` from memest/service/grafana/memest-dashboard.json.\n"
        "apiVersion: v1\n"
        "kind: ConfigMap\n"
        "metadata:\n"
        f"  name: {_dns_name(name)}\n"
        "  labels:\n"
        '    grafana_dashboard: "1"\n'
        "data:\n"
        f"  {DASHBOARD}: |\n" + body
    )


class _Export:
    name = "export"
    help = __doc__ or ""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        sub = parser.add_subparsers(dest="target", metavar="TARGET", required=True)
        aibrix = sub.add_parser(
            "aibrix", help="an AIBrix ModelClaim with the measured per-GPU cost"
        )
        aibrix.add_argument("reports", nargs="+", type=Path, metavar="REPORT", help="run reports")
        aibrix.add_argument("--pool", required=True, help="the warm pool's pool.aibrix.ai/name")
        aibrix.add_argument("--name", help="the ModelClaim's name (default: from the model)")
        aibrix.add_argument("--model-name", help="served model name (default: the report's)")
        aibrix.add_argument("--artifact-url", help="default huggingface://MODEL-NAME")
        grafana = sub.add_parser("grafana", help="the Grafana dashboard as a ConfigMap")
        grafana.add_argument("--name", default="memest-grafana-dashboard")

    def run(self, args: argparse.Namespace) -> int:
        if args.target == "grafana":
            print(grafana_config_map(args.name), end="")
            return 0
        reports = [(path, load_report(path)) for path in args.reports]
        claim = model_claim(reports, args.pool, args.name, args.model_name, args.artifact_url)
        print(claim, end="")
        return 0


COMMAND = _Export()
