"""What tensor/pipeline/data parallelism adds outside PyTorch on one rank (vLLM 0.33.0, NCCL 2.30).

A TP=1 start creates no communicator: every figure here is 0 when each parallel size is 1.
Otherwise each rank holds, outside PyTorch's caching allocator (cudaMalloc / cuMem directly, so
the memory shows in cudaMemGetInfo, not in torch's reserved bytes):

==================================  ===========================================================
term                                derivation (source, function)
==================================  ===========================================================
NCCL communicator per group         vLLM distributed/parallel_state.py:initialize_model_parallel
                                    builds the groups tp, dcp, pcp, pp, dp and (MoE models) ep;
                                    GroupCoordinator.__init__ gives each group of more than one
                                    rank a device communicator (the world group gets none:
                                    init_world_group, use_device_communicator=False).
                                    device_communicators/cuda_communicator.py:CudaCommunicator
                                    creates one PyNcclCommunicator per such group;
                                    pynccl.py:PyNcclCommunicator.__init__ runs a one-element
                                    all_reduce as warm-up, so NCCL (runtime connect,
                                    init.cc NCCL_RUNTIME_CONNECT=1) connects its ring.
 bytes per ring channel             One send and one receive connection per channel, whatever
                                    the group size (a ring). transport/p2p.cc:p2pSendSetup /
                                    p2pRecvSetup, with P2P read (NVLink, the default there):
                                    send = align(4096 [ncclSendMem] + SIMPLE, 2 MiB),
                                    recv = align(4096 [ncclRecvMem] + LL + LL128, 2 MiB)
                                    (without read SIMPLE moves to the receive side; the total
                                    is computed the same way). CUDA_IPC_MIN = 2 MiB (comm.h).
 buffer sizes                       init.cc:computeBuffSizes: SIMPLE = NCCL_BUFFSIZE (4 MiB),
                                    LL = 8 lines x 512 threads x 8 steps x 16 B = 512 KiB,
                                    LL128 = 120 x 640 threads x 8 steps x 8 B = 4,915,200 B
                                    (NCCL_LL_BUFFSIZE / NCCL_LL128_BUFFSIZE override them).
                                    NCCL_PROTO does not change them: p2pRecvSetup sizes every
                                    protocol's buffer.
 channels                           graph/search.cc:ncclTopoCompute picks the ring count from
                                    the topology at run time: on an H200 (NVLink 4, 18 links x
                                    20.6 GB/s = 370.8 GB/s) the SM90 speed array gives 6
                                    channels at 60 GB/s, ncclTopoDupChannels doubles them to
                                    12, graph/connect.cc:ncclTopoPostset doubles again: 24
                                    (the count NCCL commonly logs on H100 NVSwitch nodes). The
                                    result is clamped to [NCCL_MIN_NCHANNELS, NCCL_MAX_NCHANNELS]
                                    (graph/connect.cc:ncclMin/MaxNchannels, MAXCHANNELS 64).
custom all-reduce (TP group)        custom_all_reduce.py:CustomAllreduce.__init__ (world sizes
                                    2, 4, 6, 8, 16; not with --disable-custom-all-reduce):
                                    meta = cudaMalloc(meta_size + max_size), buffer =
                                    cudaMalloc(max(max_size, 2 MiB all-gather, 16 MiB
                                    reduce-scatter)); max_size 8 MiB, lowered to
                                    all_reduce_utils.py CUSTOM_ALL_REDUCE_MAX_SIZES only when
                                    torch symmetric memory has multicast. cudaMalloc maps 2 MiB
                                    pages, so meta counts align(2,560 B + max_size, 2 MiB).
                                    rank_data (8 MiB, torch.empty) is inside PyTorch:
                                    :attr:`ParallelBytes.inside_torch_bytes`.
torch symmetric-memory buffer (TP)  symm_mem.py:SymmMemCommunicator.__init__
                                    (VLLM_ALLREDUCE_USE_SYMM_MEM=1 by default):
                                    torch_symm_mem.empty(SYMM_MEM_ALL_REDUCE_MAX_SIZES[cc][tp]);
                                    the buffer stays allocated even when multicast is missing
                                    and the communicator disables itself. Its signal pad (2 to
                                    9 KiB) rounds it up one 2 MiB granule.
FlashInfer all-reduce workspace     flashinfer_all_reduce.py:FlashInferAllReduce
(TP group)                          (VLLM_ALLREDUCE_USE_FLASHINFER=1 by default), created on
                                    the first all-reduce of the profile run. Without NVLink
                                    multicast the "mnnvl" backend fails and the "trtllm" one is
                                    built (flashinfer comm/trtllm_ar.py:trtllm_create_ipc_
                                    workspace_for_all_reduce_fusion): buffer tp x M, flags
                                    tp x 256 x 4 B, lamport 3 x tp x M, each rounded to 2 MiB,
                                    where M = (max_size // (hidden x 2)) x hidden x 2 and
                                    max_size = compilation/passes/fusion/allreduce_rms_fusion.py
                                    FI_ALLREDUCE_FUSION_MAX_SIZE_MB[cc][tp].
==================================  ===========================================================

Not derivable without the GPU (the uncertainty): the channel count (24 is the documented H200
value; the search could end on 16 or 32 on another node; NCCL_MIN/MAX_NCHANNELS pin it); the
tree's extra connections for groups of more than two ranks (a two-rank tree reuses the ring's
peer); NCCL's device code and per-channel device structures (a few MiB); torch's own NCCL
process groups, created lazily (the pp group's broadcast of sampled tokens); with NVLink
multicast on (NVLS), the NVLS buffers and the FlashInfer "mnnvl" and custom all-reduce
multicast workspaces instead of the ones above. :data:`CHANNEL_SPREAD` channels per communicator
and :data:`UNDERIVED_BYTES` per rank with a TP group make the stated half-width.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from memest.errors import ConfigError
from memest.schema import GpuInfo, RunConfig, RunReport
from memest.units import KiB, MiB

#: NCCL's pipeline depth (include/device.h NCCL_STEPS).
NCCL_STEPS = 8
#: LL protocol buffer: NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS x steps x 16-B line.
NCCL_LL_BUFFSIZE = 8 * 512 * NCCL_STEPS * 16
#: LL128 buffer: NCCL_LL128_ELEMS_PER_THREAD x NCCL_LL128_MAX_NTHREADS x steps x 8 B.
NCCL_LL128_BUFFSIZE = 120 * 640 * NCCL_STEPS * 8
#: SIMPLE buffer: DEFAULT_BUFFSIZE (1 << 22).
NCCL_SIMPLE_BUFFSIZE = 4 * MiB
#: ncclSendMem / ncclRecvMem: a union padded to MEM_ALIGN (include/comm.h).
NCCL_CONN_HEADER_BYTES = 4096
#: CUDA_IPC_MIN: p2p.cc aligns every connection buffer to it; also the driver's page for
#: cudaMalloc and the cuMem granularity the symmetric-memory buffers round to.
IPC_ALIGN_BYTES = 2 * MiB
#: NCCL's hard channel limit (include/device.h MAXCHANNELS).
NCCL_MAX_CHANNELS = 64
#: Ring channels NCCL's topology search gives two or more H200s on one NVSwitch node.
DOCUMENTED_CHANNELS = 24
#: Channels either side of the documented value the stated uncertainty covers.
CHANNEL_SPREAD = 8
#: NCCL's device code and device-side structures, torch symmetric-memory signal pads: not sized
#: here, carried as uncertainty per rank that has a TP group.
UNDERIVED_BYTES = 64 * MiB

#: vLLM's custom all-reduce: world sizes it supports, default max_size, the all-gather and
#: reduce-scatter sizes its legacy buffer also serves, and rank_data (custom_all_reduce.py).
CUSTOM_AR_WORLD_SIZES = (2, 4, 6, 8, 16)
CUSTOM_AR_MAX_SIZE = 8 * MiB
CUSTOM_AR_ALL_GATHER_SIZE = 2 * MiB
CUSTOM_AR_REDUCE_SCATTER_SIZE = 16 * MiB
CUSTOM_AR_RANK_DATA = 8 * MiB
#: csrc/custom_all_reduce.cuh sizeof(Signal): start and end flags 36 blocks x 8 x 4 B each, and
#: 36 x 4 B of flags padded to 128 B.
CUSTOM_AR_META_SIZE = 1152 + 1152 + 256
#: all_reduce_utils.py CUSTOM_ALL_REDUCE_MAX_SIZES (used only with symmetric-memory multicast).
CUSTOM_AR_MULTICAST_MAX_SIZES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
}
#: all_reduce_utils.py SYMM_MEM_ALL_REDUCE_MAX_SIZES.
SYMM_MEM_MAX_SIZES = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
}
#: allreduce_rms_fusion.py FI_ALLREDUCE_FUSION_MAX_SIZE_MB, in bytes.
FLASHINFER_AR_MAX_SIZES = {
    "9.0": {2: 64 * MiB, 4: 2 * MiB, 8: 512 * KiB},
    "10.0": {2: 64 * MiB, 4: 32 * MiB, 8: 1 * MiB, 16: 64 * MiB},
}
#: flashinfer trtllm_ar.py BarrierFlagCount (int32 flags per rank).
FLASHINFER_BARRIER_FLAGS = 256

#: Environment variables that change these figures (the rest are ignored).
NCCL_ENV = (
    "NCCL_BUFFSIZE",
    "NCCL_LL_BUFFSIZE",
    "NCCL_LL128_BUFFSIZE",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_P2P_READ_ENABLE",
    "NCCL_PROTO",
)
VLLM_ENV = ("VLLM_ALLREDUCE_USE_SYMM_MEM", "VLLM_ALLREDUCE_USE_FLASHINFER")


def _align(size: int, to: int = IPC_ALIGN_BYTES) -> int:
    return -(-size // to) * to


@dataclass(frozen=True)
class ParallelLayout:
    """The parallel sizes and switches of one start (vLLM's flags and environment)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    data_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    moe: bool = False  # vLLM builds the ep group (dp x tp ranks) for MoE models only
    custom_all_reduce: bool = True  # --disable-custom-all-reduce turns it off
    compute_capability: str = "9.0"  # H200
    hidden_size: int | None = None  # sizes FlashInfer's workspace; None: its upper bound
    env: Mapping[str, str] = field(default_factory=dict)

    @property
    def is_parallel(self) -> bool:
        return max(self.group_sizes().values(), default=1) > 1

    def group_sizes(self) -> dict[str, int]:
        """Each group that gets a device communicator, by vLLM's name, with its size."""
        tp = self.tensor_parallel_size
        groups = {
            "tp": tp,
            "dcp": self.decode_context_parallel_size,
            "pp": self.pipeline_parallel_size,
            "dp": self.data_parallel_size,
        }
        if self.moe:
            groups["ep"] = self.data_parallel_size * tp
        return {name: size for name, size in groups.items() if size > 1}


@dataclass(frozen=True)
class ParallelBytes:
    """One rank's bytes outside PyTorch from parallelism, by part, and their half-width."""

    parts: dict[str, int]
    uncertainty_bytes: int
    inside_torch_bytes: int  # custom all-reduce's rank_data (a torch tensor)
    channels: int

    @property
    def outside_torch_bytes(self) -> int:
        return sum(self.parts.values())

    def describe(self) -> str:
        """The parts in words, for a law column or a note."""
        return ", ".join(f"{name} {size / MiB:.0f} MiB" for name, size in self.parts.items())


def check_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables, refused by name when this module does not read them.

    Raises:
        ConfigError: a name outside :data:`NCCL_ENV` and :data:`VLLM_ENV`, or a value that is
            not a non-negative integer (NCCL_PROTO: any text; it sizes nothing).
    """
    for name, value in env.items():
        if name not in NCCL_ENV + VLLM_ENV:
            raise ConfigError(
                f"environment.{name}",
                value,
                f"not read; expected one of {', '.join(NCCL_ENV + VLLM_ENV)}",
            )
        if name != "NCCL_PROTO":
            _env_int(env, name)
    return dict(env)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, raw, "expected an integer") from None
    if value < 0:
        raise ConfigError(name, raw, "must not be negative")
    return value


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    value = _env_int(env, name)
    return default if value is None else bool(value)


def nccl_buffer_sizes(env: Mapping[str, str]) -> tuple[int, int, int]:
    """(LL, LL128, SIMPLE) buffer bytes per connection (init.cc:computeBuffSizes)."""
    return (
        _env_int(env, "NCCL_LL_BUFFSIZE") or NCCL_LL_BUFFSIZE,
        _env_int(env, "NCCL_LL128_BUFFSIZE") or NCCL_LL128_BUFFSIZE,
        _env_int(env, "NCCL_BUFFSIZE") or NCCL_SIMPLE_BUFFSIZE,
    )


def nccl_channels(env: Mapping[str, str]) -> int:
    """Ring channels: the documented H200 value clamped as graph/connect.cc clamps it."""
    lo = min(_env_int(env, "NCCL_MIN_NCHANNELS") or 0, NCCL_MAX_CHANNELS)
    hi = min(_env_int(env, "NCCL_MAX_NCHANNELS") or NCCL_MAX_CHANNELS, NCCL_MAX_CHANNELS)
    return max(min(DOCUMENTED_CHANNELS, max(hi, 1)), lo)


def ring_channel_bytes(env: Mapping[str, str]) -> int:
    """One rank's send and receive connection buffers of one ring channel (p2p.cc)."""
    ll, ll128, simple = nccl_buffer_sizes(env)
    read = _env_flag(env, "NCCL_P2P_READ_ENABLE", True)
    send = NCCL_CONN_HEADER_BYTES + (simple if read else 0)
    recv = NCCL_CONN_HEADER_BYTES + ll + ll128 + (0 if read else simple)
    return _align(send) + _align(recv)


def custom_all_reduce_bytes(layout: ParallelLayout, *, multicast: bool = False) -> int:
    """The custom all-reduce's meta and IPC buffer (cudaMalloc), 0 when it is off."""
    tp = layout.tensor_parallel_size
    if not layout.custom_all_reduce or tp not in CUSTOM_AR_WORLD_SIZES:
        return 0
    max_size = CUSTOM_AR_MAX_SIZE
    if multicast:
        table = CUSTOM_AR_MULTICAST_MAX_SIZES.get(layout.compute_capability, {})
        max_size = min(table.get(tp, max_size), max_size)
    legacy = max(max_size, CUSTOM_AR_ALL_GATHER_SIZE, CUSTOM_AR_REDUCE_SCATTER_SIZE)
    return _align(CUSTOM_AR_META_SIZE + max_size) + _align(legacy)


def symm_mem_bytes(layout: ParallelLayout) -> int:
    """torch symmetric memory's all-reduce buffer plus its signal pad, 0 when not created."""
    if not _env_flag(layout.env, "VLLM_ALLREDUCE_USE_SYMM_MEM", True):
        return 0
    size = SYMM_MEM_MAX_SIZES.get(layout.compute_capability, {}).get(layout.tensor_parallel_size)
    return _align(size + 1) if size else 0  # +1: any signal pad takes one more granule


def flashinfer_workspace_bytes(layout: ParallelLayout) -> int:
    """FlashInfer's trtllm all-reduce workspace (buffer, flags, lamport), 0 when not built."""
    if not _env_flag(layout.env, "VLLM_ALLREDUCE_USE_FLASHINFER", True):
        return 0
    tp = layout.tensor_parallel_size
    max_size = FLASHINFER_AR_MAX_SIZES.get(layout.compute_capability, {}).get(tp)
    if not max_size:
        return 0
    row = 2 * layout.hidden_size if layout.hidden_size else 1  # bf16 rows of hidden
    per_rank = max_size // row * row
    flags = tp * FLASHINFER_BARRIER_FLAGS * 4
    return _align(tp * per_rank) + _align(flags) + _align(3 * tp * per_rank)


def parallel_bytes(layout: ParallelLayout) -> ParallelBytes:
    """One rank's bytes outside PyTorch that parallelism adds (all 0 without a parallel group).

    Raises:
        ConfigError: an NCCL_* / VLLM_ALLREDUCE_* variable is not a non-negative integer.
    """
    env = layout.env
    groups = layout.group_sizes()
    channels = nccl_channels(env)
    per_channel = ring_channel_bytes(env)
    parts = {f"NCCL {name} ({size} ranks)": channels * per_channel for name, size in groups.items()}
    spread = len(groups) * CHANNEL_SPREAD * per_channel
    inside = 0
    if "tp" in groups:
        tp_parts = {
            "custom all-reduce": custom_all_reduce_bytes(layout),
            "symmetric-memory all-reduce": symm_mem_bytes(layout),
            "FlashInfer all-reduce": flashinfer_workspace_bytes(layout),
        }
        parts.update({k: v for k, v in tp_parts.items() if v})
        inside = CUSTOM_AR_RANK_DATA if tp_parts["custom all-reduce"] else 0
        spread += UNDERIVED_BYTES
    return ParallelBytes(parts, spread, inside, channels if groups else 0)


def start_layout(config: RunConfig, gpu: GpuInfo | None) -> ParallelLayout:
    """The layout of a recorded start: its TP size, the model's recorded dimensions, the GPU's
    compute capability; vLLM's defaults for what a report does not record (custom all-reduce
    on, pipeline and data parallel size 1, no NCCL_* variables)."""
    dims = config.model_dims
    experts = dims and (dims.num_experts or dims.n_routed_experts or dims.num_local_experts)
    capability = gpu.compute_capability if gpu is not None else None
    return ParallelLayout(
        tensor_parallel_size=config.tensor_parallel_size,
        moe=bool(experts),
        compute_capability=capability or "9.0",
        hidden_size=dims.hidden_size if dims is not None else None,
    )


def run_parallel_bytes(reports: Sequence[RunReport]) -> ParallelBytes | None:
    """What TP adds outside PyTorch on each rank of a run at TP > 1 (None at TP 1), derived from
    its lowest rank's start: the same on every rank of the group (``memest analyze --run``)."""
    first = min(reports, key=lambda r: r.rank)
    if first.config.tensor_parallel_size <= 1:
        return None
    return parallel_bytes(start_layout(first.config, first.gpu))
