"""The lab's FP8 quantization stand-ins against vLLM's kernel rules, worked by hand."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "lab"))
import fp8_standins as fp8  # noqa: E402

E4M3 = torch.float8_e4m3fn


def test_fp8_max_is_e4m3s_448() -> None:
    assert fp8.fp8_max(E4M3) == 448.0


def test_static_divides_by_the_scale_and_saturates() -> None:
    x = torch.tensor([[1.0, -2.0, 900.0, -1000.0]], dtype=torch.bfloat16)
    out = torch.empty_like(x, dtype=E4M3)
    fp8.static_scaled_fp8_quant(out, x, torch.tensor([2.0]))
    assert out.float().tolist() == [[0.5, -1.0, 448.0, -448.0]]


def test_dynamic_scale_is_the_absolute_maximum_over_fp8_max() -> None:
    x = torch.tensor([[224.0, -448.0], [112.0, 0.0]], dtype=torch.bfloat16)
    out = torch.empty_like(x, dtype=E4M3)
    scale = torch.empty(1)
    fp8.dynamic_scaled_fp8_quant(out, x, scale)
    assert scale.item() == 1.0  # 448 / 448
    assert out.float().tolist() == [[224.0, -448.0], [112.0, 0.0]]


def test_per_token_scales_each_row_and_respects_the_upper_bound() -> None:
    x = torch.tensor([[4.0, -8.0], [448.0, 896.0], [0.0, 0.0]], dtype=torch.bfloat16)
    out = torch.empty_like(x, dtype=E4M3)
    scale = torch.empty(3, 1)
    fp8.dynamic_per_token_scaled_fp8_quant(out, x, scale, torch.tensor(448.0))
    # row maxima 8, 896 (clamped to the bound 448), 0 (the floor 1 / (448 * 512))
    assert scale[:, 0].tolist() == pytest.approx([8 / 448, 1.0, 1 / (448 * 512)])
    assert out.float().tolist() == [[224.0, -448.0], [448.0, 448.0], [0.0, 0.0]]


def test_three_dimensional_input_is_quantized_row_by_row() -> None:
    x = torch.full((2, 3, 4), 3.0, dtype=torch.bfloat16)
    out = torch.empty_like(x, dtype=E4M3)
    fp8.static_scaled_fp8_quant(out, x, torch.tensor([1.5]))
    assert out.float().unique().tolist() == [2.0]
    assert not math.isnan(out.float().sum().item())
