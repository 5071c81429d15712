"""The calibration a pre-flight prediction reads: fitted coefficients per GPU kind and vLLM version.

Coefficients are fitted from measured starts (lab/fit.py, refit and published by
``python lab/preflight_fit.py``) and stored as JSON next to this module, one file per GPU kind and
vLLM version: ``data/<gpu>-vllm-<version>.json``.
"""

from __future__ import annotations

import json
from functools import cached_property
from importlib import resources
from typing import Any

from pydantic import Field

from memest.errors import ConfigError
from memest.estimate.terms.coefficients import Coefficients
from memest.estimate.whatif.models import WhatIfCalibration
from memest.schema import RunReport
from memest.schema._base import MemestModel
from memest.schema.preflight import VllmOvershoot
from memest.units import fmt_gib

#: Calibration files shipped with memest, by GPU kind.
CALIBRATIONS = {"h200": "h200-vllm-0.33.0.json"}


class Calibration(MemestModel):
    """Coefficients, their per-term uncertainty and what the measured starts covered."""

    gpu: str
    vllm_version: str
    cuda_version: str
    torch_version: str
    total_bytes: int = Field(ge=1, description="CUDA total memory of one GPU")
    coefficients: Coefficients
    uncertainty_bytes: dict[str, int] = Field(
        default_factory=dict, description="Per term: largest fit residual (half-width)"
    )
    measured_architectures: list[str] = Field(default_factory=list)
    measured_drafters: list[str] = Field(default_factory=list)
    measured_tensor_parallel_sizes: list[int] = Field(default_factory=list)
    unmeasured_widening: dict[str, float] = Field(
        default_factory=dict,
        description="Prior relative half-widths for a family or setting no start measured",
    )
    vllm_overshoot: VllmOvershoot | None = Field(
        default=None,
        description="vLLM's own KV estimate minus the exact budget, over the starts it sized",
    )
    starts: list[str] = Field(default_factory=list, description="Report ids fitted")
    command: str = ""

    @cached_property
    def label(self) -> str:
        """What the calibration models (read on every surface of a prediction: computed once)."""
        return f"{self.gpu} + vLLM {self.vllm_version} + CUDA {self.cuda_version}"


def load_calibration(gpu: str) -> Calibration:
    """The shipped calibration of GPU kind ``gpu``.

    Raises:
        ConfigError: no calibration for that GPU kind.
    """
    name = CALIBRATIONS.get(gpu.lower()) if isinstance(gpu, str) else None
    if name is None:
        raise ConfigError(
            "gpu", gpu, f"no calibration for this GPU kind; calibrated: {', '.join(CALIBRATIONS)}"
        )
    text = resources.files("memest.preflight").joinpath("data", name).read_text()
    data: dict[str, Any] = json.loads(text)
    return Calibration.model_validate(data)


def calibration_of(gpu_name: str) -> Calibration | None:
    """The shipped calibration whose GPU kind a device name holds ("NVIDIA H200" -> h200), else
    None (a what-if on a start of an uncalibrated GPU leaves out what only the fit knows)."""
    name = gpu_name.lower()
    kind = next((k for k in CALIBRATIONS if k in name), None)
    return load_calibration(kind) if kind is not None else None


def what_if_calibration(report: RunReport) -> WhatIfCalibration:
    """What the what-if takes from the fit for a start's GPU kind: the drafter factor of
    memest.estimate.activation (what it adds or removes for a drafter the start does not have or
    drops); every factor None when the GPU kind is uncalibrated."""
    cal = calibration_of(report.gpu.name if report.gpu is not None else "")
    if cal is None:
        return WhatIfCalibration()
    return WhatIfCalibration(drafter_activation_factor=cal.coefficients.activation_drafter_factor)


def overshoot_line(o: VllmOvershoot) -> str:
    """The text every surface shows for vLLM's own estimate beside the exact budget."""
    span = fmt_gib(o.min_bytes, signed=True)
    if o.max_bytes != o.min_bytes:
        span += f" to {fmt_gib(o.max_bytes, signed=True)}"
    starts = "start" if o.starts == 1 else "starts"
    return (
        f"vLLM's own estimate minus the exact budget: {span} GiB on the {o.starts} calibration "
        f"{starts} whose KV cache vLLM sized itself (in the others memest sized it, and vLLM's "
        "figure is a recomputation, not a budget vLLM allocated)"
    )
