"""The TP term against figures worked out by hand from NCCL 2.30's and vLLM 0.33.0's defaults.

Every expected value below is arithmetic written out from the sources' constants (cited in
memest/estimate/parallel.py), not a value read back from the module.
"""

from __future__ import annotations

import pytest

from memest.errors import ConfigError
from memest.estimate.parallel import (
    ParallelLayout,
    check_env,
    custom_all_reduce_bytes,
    flashinfer_workspace_bytes,
    nccl_buffer_sizes,
    nccl_channels,
    parallel_bytes,
    ring_channel_bytes,
    symm_mem_bytes,
)

MiB = 1 << 20

# NCCL's default buffers: LL 8 lines x 512 threads x 8 steps x 16 B; LL128 120 x 640 x 8 x 8 B.
LL = 8 * 512 * 8 * 16  # 524,288
LL128 = 120 * 640 * 8 * 8  # 4,915,200
SIMPLE = 4 * 1024 * 1024  # 4,194,304
# P2P read: send 4096 + 4,194,304 = 4,198,400 B -> three 2 MiB pages = 6 MiB;
# recv 4096 + 524,288 + 4,915,200 = 5,443,584 B -> three pages = 6 MiB.
CHANNEL = 6 * MiB + 6 * MiB
# 24 ring channels on an H200 (6 at 60 GB/s, doubled twice).
NCCL_COMM = 24 * CHANNEL  # 288 MiB
# Custom all-reduce at TP=2: meta 2,560 B + 8 MiB -> 10 MiB; buffer max(8, 2, 16) MiB = 16 MiB.
CUSTOM_AR = 10 * MiB + 16 * MiB
# Symmetric memory at TP=2 on sm90: 64 MiB + signal pad -> 66 MiB.
SYMM = 66 * MiB
# FlashInfer trtllm workspace at TP=2, hidden 4096: max 64 MiB -> 8192 rows of 8192 B = 64 MiB;
# buffer 2 x 64 = 128 MiB, flags 2 x 256 x 4 B -> 2 MiB, lamport 3 x 2 x 64 = 384 MiB.
FLASHINFER = 128 * MiB + 2 * MiB + 384 * MiB


def test_nothing_without_a_parallel_group() -> None:
    out = parallel_bytes(ParallelLayout())
    assert out.outside_torch_bytes == 0
    assert out.uncertainty_bytes == 0
    assert out.inside_torch_bytes == 0
    assert out.parts == {}


def test_nccl_default_buffers() -> None:
    assert nccl_buffer_sizes({}) == (524_288, 4_915_200, 4_194_304)
    assert ring_channel_bytes({}) == 12 * MiB


def test_ring_channel_without_p2p_read() -> None:
    # Write mode: send 4096 B -> 2 MiB; recv 4096 + LL + LL128 + SIMPLE = 9,637,888 B -> 10 MiB.
    assert ring_channel_bytes({"NCCL_P2P_READ_ENABLE": "0"}) == 2 * MiB + 10 * MiB


def test_smaller_simple_buffer() -> None:
    # NCCL_BUFFSIZE=1 MiB: send 4096 + 1 MiB -> 2 MiB; recv unchanged 6 MiB.
    assert ring_channel_bytes({"NCCL_BUFFSIZE": str(MiB)}) == 8 * MiB


def test_channel_clamps() -> None:
    assert nccl_channels({}) == 24
    assert nccl_channels({"NCCL_MAX_NCHANNELS": "8"}) == 8
    assert nccl_channels({"NCCL_MIN_NCHANNELS": "32"}) == 32
    assert nccl_channels({"NCCL_MIN_NCHANNELS": "100"}) == 64


def test_tp2_dense_h200() -> None:
    out = parallel_bytes(ParallelLayout(tensor_parallel_size=2, hidden_size=4096))
    assert out.parts == {
        "NCCL tp (2 ranks)": NCCL_COMM,
        "custom all-reduce": CUSTOM_AR,
        "symmetric-memory all-reduce": SYMM,
        "FlashInfer all-reduce": FLASHINFER,
    }
    # 288 + 26 + 66 + 514 = 894 MiB
    assert out.outside_torch_bytes == 894 * MiB
    assert out.inside_torch_bytes == 8 * MiB  # rank_data
    # 8 channels x 12 MiB + 64 MiB not derived
    assert out.uncertainty_bytes == 96 * MiB + 64 * MiB


def test_custom_all_reduce_off() -> None:
    on = parallel_bytes(ParallelLayout(tensor_parallel_size=2, hidden_size=4096))
    off = parallel_bytes(
        ParallelLayout(tensor_parallel_size=2, hidden_size=4096, custom_all_reduce=False)
    )
    assert on.outside_torch_bytes - off.outside_torch_bytes == 26 * MiB
    assert off.inside_torch_bytes == 0


def test_custom_all_reduce_world_sizes() -> None:
    assert custom_all_reduce_bytes(ParallelLayout(tensor_parallel_size=3)) == 0
    # With multicast at TP=8 on sm90 max_size drops to 256 KiB: meta 2,560 B + 256 KiB -> 2 MiB.
    eight = ParallelLayout(tensor_parallel_size=8)
    assert custom_all_reduce_bytes(eight, multicast=True) == 2 * MiB + 16 * MiB
    assert custom_all_reduce_bytes(eight) == 10 * MiB + 16 * MiB


def test_flashinfer_workspace_follows_hidden() -> None:
    # hidden 5120: 64 MiB // 10,240 B = 6553 rows -> 67,102,720 B per rank's share;
    # buffer 2 x 67,102,720 = 134,205,440 -> 64 pages (134,217,728);
    # lamport 6 x 67,102,720 = 402,616,320 -> 192 pages (402,653,184); flags 2 MiB.
    layout = ParallelLayout(tensor_parallel_size=2, hidden_size=5120)
    assert flashinfer_workspace_bytes(layout) == 134_217_728 + 2 * MiB + 402_653_184
    # TP=4 on sm90: 2 MiB max -> buffer 4 x 2 = 8 MiB, flags 4 KiB -> 2 MiB, lamport 24 MiB.
    four = ParallelLayout(tensor_parallel_size=4, hidden_size=4096)
    assert flashinfer_workspace_bytes(four) == 8 * MiB + 2 * MiB + 24 * MiB


def test_vllm_switches_off() -> None:
    env = {"VLLM_ALLREDUCE_USE_SYMM_MEM": "0", "VLLM_ALLREDUCE_USE_FLASHINFER": "0"}
    layout = ParallelLayout(tensor_parallel_size=2, hidden_size=4096, env=env)
    assert symm_mem_bytes(layout) == 0
    assert flashinfer_workspace_bytes(layout) == 0
    assert parallel_bytes(layout).outside_torch_bytes == NCCL_COMM + CUSTOM_AR


def test_groups_each_get_a_communicator() -> None:
    # TP=2 x PP=2 of a MoE model with DP=1: tp, pp and ep (1 x 2 ranks) communicators.
    layout = ParallelLayout(tensor_parallel_size=2, pipeline_parallel_size=2, moe=True)
    names = [k for k in parallel_bytes(layout).parts if k.startswith("NCCL")]
    assert names == ["NCCL tp (2 ranks)", "NCCL pp (2 ranks)", "NCCL ep (2 ranks)"]
    # PP alone: one communicator, no all-reduce buffers.
    pp = parallel_bytes(ParallelLayout(pipeline_parallel_size=2))
    assert pp.parts == {"NCCL pp (2 ranks)": NCCL_COMM}
    assert pp.uncertainty_bytes == 96 * MiB


def test_bad_env_is_named() -> None:
    with pytest.raises(ConfigError, match="NCCL_BUFFSIZE"):
        nccl_buffer_sizes({"NCCL_BUFFSIZE": "4M"})


def test_env_names_are_checked() -> None:
    assert check_env({"NCCL_PROTO": "Simple", "NCCL_BUFFSIZE": "1048576"})
    with pytest.raises(ConfigError, match="environment.NCCL_ALGO"):
        check_env({"NCCL_ALGO": "Ring"})
    with pytest.raises(ConfigError, match="NCCL_MAX_NCHANNELS"):
        check_env({"NCCL_MAX_NCHANNELS": "-1"})
    # NCCL_PROTO sizes nothing: p2pRecvSetup allocates every protocol's buffer.
    assert ring_channel_bytes({"NCCL_PROTO": "Simple"}) == 12 * MiB
