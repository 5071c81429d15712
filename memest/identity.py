"""What a report is about: the model's public name, the build label, the configuration fingerprint.

Run ids (one per launch) are derived inside vLLM by the plugin; these are the launch-independent
parts, pure functions of what the report holds, so every consumer computes them the same way.
"""

from __future__ import annotations

import hashlib
import json
import re

from memest.schema import BuildInfo, RunConfig, RunReport

#: A Hugging Face cache folder, with POSIX or Windows separators.
_HF_CACHE_DIR = re.compile(r"(?:^|[/\\])models--([^/\\]+?)--([^/\\]+)(?:[/\\]|$)")
_SEPARATORS = re.compile(r"[/\\]+")
#: A Windows drive (``C:/models/x``); a Hugging Face id holds no colon.
_DRIVE = re.compile(r"[A-Za-z]:[/\\]")
FINGERPRINT_HEX_CHARS = 16
#: RunConfig fields the fingerprint leaves out (they follow from the model).
_DERIVED_FIELDS = {"model_dims", "drafter_dims"}
#: RunConfig fields added after reports were first fingerprinted: left out while a report does not
#: record them (None), so a report written before them keeps the fingerprint it had.
_LATER_FIELDS = ("kv_cache_dtype", "quantization", "mla_decode_backend", "gdn_prefill_backend")


def config_fingerprint(config: RunConfig) -> str:
    """A stable hash of everything in ``config``: equal for launches of the same setup.

    Canonical JSON (sorted keys) of the whole RunConfig. The model's dimensions are left out:
    they follow from the model, so they never tell two setups apart, and a report written before
    the plugin recorded them keeps its fingerprint; so do the later fields a report leaves unset.
    """
    fields = config.model_dump(mode="json", exclude=_DERIVED_FIELDS)
    for name in _LATER_FIELDS:
        if fields[name] is None:
            del fields[name]
    canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:FINGERPRINT_HEX_CHARS]


def public_model_name(served_name: object, model: object) -> str:
    """The model as users know it: the served name, else the Hugging Face id, never a local path.

    vLLM's ``served_model_name`` defaults to ``model``, which may be a folder: a Hugging Face
    cache folder (``.../models--org--name/snapshots/<hash>``) gives ``org/name``; another folder
    gives its own name (a Windows path's too), so no home directory or mount point leaks into a
    report.
    """
    if isinstance(served_name, list | tuple):
        served_name = served_name[0] if served_name else None
    served = str(served_name or "").strip()
    path = str(model or "").strip()
    if served and served != path:
        return served
    name = path or served
    if not name:
        return "unknown"
    if not _looks_like_path(name):
        return name  # already an id such as meta-llama/Llama-3.1-8B
    cached = _HF_CACHE_DIR.search(name)
    if cached:
        return f"{cached.group(1)}/{cached.group(2)}"
    parts = [p for p in _SEPARATORS.split(name) if p not in ("", ".")]
    return parts[-1] if parts else "unknown"


def model_display_name(model: str) -> str:
    """The model as stored and shown: a path-like name (a report from before the plugin named
    models by their served name) becomes its Hugging Face id or its folder's name; any other name
    is kept as it is. Ingest stores this name; pages show it for rows stored before."""
    return public_model_name(None, model)


def _looks_like_path(name: str) -> bool:
    """A Hugging Face id is ``org/name`` or ``name``; anything else is a filesystem path."""
    return (
        name.startswith(("/", "./", "../", "~"))
        or name.count("/") > 1
        or "\\" in name
        or _DRIVE.match(name) is not None
    )


def build_label(vllm_version: str | None, memest_version: str | None) -> str:
    """The default build label: ``vllm-0.33.0+memest-0.1.0`` (parts that are known)."""
    parts = []
    if vllm_version:
        parts.append(f"vllm-{vllm_version}")
    if memest_version:
        parts.append(f"memest-{memest_version}")
    return "+".join(parts)


def with_default_label(build: BuildInfo) -> BuildInfo:
    """``build`` with its label defaulted to :func:`build_label` when none was given."""
    if build.label:
        return build
    return build.model_copy(update={"label": build_label(build.vllm_version, build.memest_version)})


def with_display_model(report: RunReport) -> RunReport:
    """``report`` stored under its model's display name (memest.identity.model_display_name): a
    local path becomes the folder's name or the Hugging Face id. The original name stays in the
    stored report: in ``config.model`` (vLLM's model argument), else in a note."""
    name = model_display_name(report.model)
    if name == report.model:
        return report
    notes = report.notes
    if report.config.model != report.model:
        notes = [*notes, f"model as reported: {report.model}"]
    return report.model_copy(update={"model": name, "notes": notes})


def stored_form(report: RunReport) -> RunReport:
    """``report`` as the service stores it: under its model's display name
    (:func:`with_display_model`) and with its build label defaulted (:func:`with_default_label`),
    so the API, the pages and /metrics name a build as the plugin does
    (``vllm-0.33.0+memest-0.1.0`` when the report gives no label)."""
    report = with_display_model(report)
    if report.build.label:
        return report
    return report.model_copy(update={"build": with_default_label(report.build)})
