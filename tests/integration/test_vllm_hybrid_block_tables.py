"""vLLM is the oracle for a hybrid model's block tables: one per KV-cache group.

vLLM 0.33.0's Model Runner V2 sizes each group's row as its runner does
(``spec.max_num_blocks_per_req`` then ``get_block_table_width`` with the spec's token alignment,
gpu/model_runner.py) and builds ``BlockTables`` (gpu/block_table.py) on the meta device, its
pinned host staging buffers stubbed (no GPU here; they are host memory). Every device tensor
sized by the grid (more elements than groups) is counted, each rounded to PyTorch's 512-B block:
memest's block-table buffer must be that, to the byte, for every hybrid config and grid of the
KV-group oracle.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from memest.estimate.runner_buffers import ALLOC_ROUND_BYTES
from memest.preflight import predict
from tests.integration.test_vllm_hybrid_oracle import (  # noqa: F401  (the vllm fixture)
    CASES,
    MODELS,
    _align_block,
    _cfg,
    _stand_in,
    _vllm_kinds,
    _vllm_specs,
    vllm,
)

pytestmark = pytest.mark.vllm

SEQS = 128


def _device_tensors(obj: Any, depth: int = 0) -> dict[int, Any]:
    import torch

    out: dict[int, Any] = {}
    if depth > 3:
        return out
    if isinstance(obj, torch.Tensor):
        return {id(obj): obj} if obj.device.type == "meta" else {}
    if isinstance(obj, (list, tuple)):
        for x in obj:
            out.update(_device_tensors(x, depth + 1))
    elif hasattr(obj, "__dict__") and not isinstance(obj, type):
        for x in vars(obj).values():
            out.update(_device_tensors(x, depth + 1))
    return out


def _vllm_block_tables(
    v: types.SimpleNamespace, vc: Any, groups: list[Any], monkeypatch: pytest.MonkeyPatch
) -> int:
    import vllm.v1.worker.gpu.block_table as bt
    import vllm.v1.worker.gpu.buffer_utils as bu
    from vllm.v1.worker.block_table import get_block_table_width

    class HostStub:  # pinned host staging: no device memory
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    monkeypatch.setattr(bu, "UvaBufferPool", HostStub)
    monkeypatch.setattr(bt, "UvaBackedTensor", HostStub)
    mml = vc.model_config.max_model_len
    widths = []
    for g in groups:
        spec = g.kv_cache_spec
        n = spec.max_num_blocks_per_req(vc, mml)
        widths.append(
            get_block_table_width(
                n, spec.block_size, token_alignment=spec.block_table_token_alignment
            )
        )
    tables = bt.BlockTables(
        block_sizes=[g.kv_cache_spec.block_size for g in groups],
        max_num_reqs=SEQS,
        max_num_batched_tokens=vc.scheduler_config.max_num_batched_tokens,
        max_num_blocks_per_group=widths,
        device=v.torch.device("meta"),
    )
    sized = [t for t in _device_tensors(tables).values() if t.numel() > len(groups)]
    step = ALLOC_ROUND_BYTES
    return sum(-(-t.numel() * t.element_size() // step) * step for t in sized)


@pytest.mark.parametrize(("name", "grid"), CASES, ids=[f"{n}-{g[0]}" for n, g in CASES])
def test_block_tables_are_vllms_per_group(
    vllm: types.SimpleNamespace,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    grid: tuple[int, int, int],
) -> None:
    v = vllm
    cfg = _cfg(name)
    grid = (min(grid[0], cfg["max_position_embeddings"]), *grid[1:])
    arch = MODELS[name][0]
    kinds = _vllm_kinds(v, name, cfg)
    vc = _stand_in(v, cfg, arch, grid, mla="mla" in kinds)
    _align_block(v, vc, kinds, arch, monkeypatch)
    groups = v.planning.get_kv_cache_groups(vc, _vllm_specs(v, vc, kinds, arch, cfg))
    want = _vllm_block_tables(v, vc, groups, monkeypatch)

    fields = {
        "model_config_json": cfg,
        "gpu": "h200",
        "max_model_len": grid[0],
        "max_num_batched_tokens": grid[1],
        "max_num_seqs": SEQS,
    }
    s = predict.setup(predict.request_from(fields))
    assert len(s.kv_tables) == len(groups)
    assert s.buffer_sizes["block_tables"] == want
