"""Torch stand-ins for vLLM 0.33.0's FP8 quantization ops, for FP8 checkpoints on the lab's H200.

The carried vLLM has no `_C` extension: its shim registers the op schemas and raises for the
rest. An FP8 checkpoint's linears reach three `_C` ops through `vllm._custom_ops.scaled_fp8_quant`
(csrc/quantization/w8a8/fp8/common.cu in vLLM's source):

- `static_scaled_fp8_quant(result, input, scale, group_shape)`: result = fp8(clamp(input / scale));
  `requantize_with_max_scale` calls it on every fused weight at load time;
- `dynamic_scaled_fp8_quant(result, input, scale)`: scale = max(|input|) / FP8_MAX, written into
  the one-element `scale`, then the static rule;
- `dynamic_per_token_scaled_fp8_quant(result, input, scale, scale_ub)`: one scale per row of the
  last dimension, max(|row|) clamped to scale_ub, over FP8_MAX, at least 1 / (FP8_MAX * 512).

Like the real kernels, the CUDA stand-ins allocate nothing the size of the input: the maxima come
from `torch.linalg.vector_norm(ord=inf)` (one reduction kernel) and the quantization from one
Triton kernel that writes `result` in place, so the profile run's activation peak is the model's.
The CPU kernels are the reference, in plain torch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.library import Library

_OPS = ("static_scaled_fp8_quant", "dynamic_scaled_fp8_quant", "dynamic_per_token_scaled_fp8_quant")
# vLLM's MIN_SCALING_FACTOR rule for dynamic scales: 1 / (FP8_MAX * 512)
_MIN_SCALE_DIVISOR = 512.0


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The tensor as [rows, last dimension] (a view when its rows are contiguous)."""
    return t.reshape(-1, t.shape[-1]) if t.dim() != 2 else t


def _reference(result: torch.Tensor, inp: torch.Tensor, scale: torch.Tensor) -> None:
    """result = fp8(clamp(input / scale)), scale broadcast over the rows (CPU; the reference)."""
    limit = fp8_max(result.dtype)
    rows = _rows(inp).float()
    s = scale.float().reshape(-1, 1) if scale.numel() == rows.shape[0] else scale.float()
    _rows(result).copy_((rows / s).clamp(-limit, limit).to(result.dtype))


_KERNEL: Any = None


def _triton_kernel() -> Any:
    global _KERNEL
    if _KERNEL is not None:
        return _KERNEL
    import triton
    import triton.language as tl

    @triton.jit  # type: ignore[misc]
    def quant(x_ptr, out_ptr, scale_ptr, n_cols, x_stride, out_stride, per_row: tl.constexpr,
              limit: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0).to(tl.float32)
        if per_row:
            s = tl.load(scale_ptr + row)
        else:
            s = tl.load(scale_ptr)
        y = tl.minimum(tl.maximum(x / s, -limit), limit)
        tl.store(out_ptr + row * out_stride + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    _KERNEL = quant
    return quant


def _quantize(result: torch.Tensor, inp: torch.Tensor, scale: torch.Tensor) -> None:
    if not inp.is_cuda:
        _reference(result, inp, scale)
        return
    x, out = _rows(inp), _rows(result)
    per_row = scale.numel() != 1
    if (per_row and scale.numel() != x.shape[0]) or x.stride(-1) != 1 or out.stride(-1) != 1:
        _reference(result, inp, scale)  # a group shape the lab's models do not use
        return
    block = 1024
    grid = (x.shape[0], math.ceil(x.shape[1] / block))
    _triton_kernel()[grid](
        x, out, scale, x.shape[1], x.stride(0), out.stride(0), per_row, fp8_max(result.dtype), block
    )


def static_scaled_fp8_quant(
    result: torch.Tensor, inp: torch.Tensor, scale: torch.Tensor, group_shape: Any = None
) -> None:
    _quantize(result, inp, scale)


def _dynamic_scale(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = fp8_max(dtype)
    return (amax.float() / limit).clamp(min=1.0 / (limit * _MIN_SCALE_DIVISOR))


def dynamic_scaled_fp8_quant(result: torch.Tensor, inp: torch.Tensor, scale: torch.Tensor) -> None:
    amax = torch.linalg.vector_norm(inp, ord=math.inf)
    scale.copy_(_dynamic_scale(amax, result.dtype).reshape(scale.shape))
    _quantize(result, inp, scale)


def dynamic_per_token_scaled_fp8_quant(
    result: torch.Tensor, inp: torch.Tensor, scale: torch.Tensor, scale_ub: torch.Tensor | None
) -> None:
    amax = torch.linalg.vector_norm(_rows(inp), ord=math.inf, dim=-1).float()
    if scale_ub is not None:
        amax = amax.clamp(max=scale_ub.float())
    scale.copy_(_dynamic_scale(amax, result.dtype).reshape(scale.shape))
    _quantize(result, inp, scale)


_LIBRARIES: dict[str, Library] = {}


def register(dispatch_keys: tuple[str, ...] = ("CUDA", "CPU")) -> list[str]:
    """Implement the three ops on the schemas the carry's shim defined (no-op where a kernel
    exists); return "_C::name" of each."""
    lib = _LIBRARIES.setdefault("_C", Library("_C", "FRAGMENT"))
    done = []
    for name in _OPS:
        for key in dispatch_keys:
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"_C::{name}", key):
                lib.impl(name, globals()[name], key)
        done.append(f"_C::{name}")
    return done
